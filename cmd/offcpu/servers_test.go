package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/offcpu/offcpu/bench"
	"github.com/offcpu/offcpu/schema"
)

// A real server A/B with a known cause, nobody here wrote the server: a
// key-value server with an fdatasync per write (baseline) against one a
// second on a background thread (candidate), under its own benchmark tool
// on loopback. The report must name io as the largest cause and change,
// draw it, keep the server threads' off-CPU time as their own schedstat
// accounts it, and keep the shell and the load generator out of the
// headline; a --fail-on gate fails on the A/B reversed and passes on A/A.
func TestBenchRealServerAB(t *testing.T) {
	requireRoot(t)
	for _, tool := range []string{"redis-server", "redis-cli", "redis-benchmark"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s not installed (apt-get install redis-server)", tool)
			}
			t.Skipf("%s not installed (apt-get install redis-server)", tool)
		}
	}
	script, err := filepath.Abs("../../bench/testdata/redis-ab.sh")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	side := func(fsync string) string {
		return `SCHEDSTAT_OUT="$(dirname "$OFFCPU_METRICS")/schedstat.txt" sh ` + script + " " + fsync
	}
	_, err = run(t, "bench", "--out", out, "--runs", "2", "--profiled-runs", "3", "--cooldown-idle", "0",
		"--baseline-cmd", side("always"), "--candidate-cmd", side("everysec"), "--target", "redis-server")
	if err != nil {
		t.Fatal(err)
	}
	var res bench.Result
	b, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	dr := res.Diff
	if dr == nil || dr.BaseReport == nil || dr.CandReport == nil {
		t.Fatalf("no profiled comparison in report.json")
	}
	// io is the baseline's largest cause and the category that changed most.
	cat, share := dr.Headline()
	if cat != "io" || share == nil {
		t.Errorf("headline category %q, want io", cat)
	}
	if most := dr.MostChangedCategory(); most == nil {
		t.Error("no category changed")
	} else if most.Name != "io" || most.CandMean > most.BaseMean/10 {
		t.Errorf("category that changed most: %s (%v → %v ns), want io down tenfold or more", most.Name, most.BaseMean, most.CandMean)
	}
	stmts := strings.Join(dr.Statements, "\n")
	if !strings.Contains(stmts, "io, the largest cause in the baseline") {
		t.Errorf("statements do not name io as the largest cause:\n%s", stmts)
	}
	for _, harness := range []string{"redis-benchmark", "dash", " sh"} {
		if strings.Contains(stmts, harness) {
			t.Errorf("the statements mention %q:\n%s", harness, stmts)
		}
	}
	// The graphs show the wait: the baseline's blocked time in the
	// append-only flush, and the diff draws it.
	for _, f := range []string{"baseline.svg", "diff.svg", "cpu-baseline.svg"} {
		svg, err := os.ReadFile(filepath.Join(out, f))
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if f != "cpu-baseline.svg" && !strings.Contains(string(svg), "fdatasync") {
			t.Errorf("%s does not draw fdatasync", f)
		}
	}
	// The server threads' off-CPU time, profile against schedstat.
	for _, r := range res.Runs {
		if r.Failed {
			t.Errorf("%s failed: %s", r.Name, r.Error)
		}
		if r.Profiled {
			checkServerKept(t, r.Dir)
		}
	}

	// Gates: the A/B reversed is a regression in io; A/A is not.
	glob := func(s string) string { return filepath.Join(out, "runs", s+"-profiled-*") }
	// Three runs a side: a side whose io is a few milliseconds varies by
	// run enough that the paired test missed 0.05 once in CI.
	_, err = run(t, "diff", "--fail-on", "io>+50%", "--fail-alpha", "0.2", glob("candidate"), glob("baseline"))
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 3 {
		t.Errorf("io>+50%% on the reversed A/B: err = %v, want exit status 3", err)
	}
	aa := t.TempDir()
	if _, err := run(t, "bench", "--out", aa, "--runs", "0", "--profiled-runs", "3", "--cooldown-idle", "0",
		"--baseline-cmd", side("always"), "--candidate-cmd", side("always"), "--target", "redis-server",
		"--fail-on", "io>+50%,app_blocked>+50%"); err != nil {
		t.Errorf("A/A with io>+50%%: %v", err)
	}
}

// checkServerKept compares a profiled run's off-CPU time of the server's
// threads with what their schedstat says just before the server stopped
// (alive − on a CPU): the profile runs to the threads' exit, up to
// "after" seconds later, so it may hold up to that much more per thread,
// and never less than 95%.
func checkServerKept(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "schedstat.txt"))
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, schema.RunLogFile))
		t.Errorf("%s: %v; the run's log:\n%s", dir, err, log)
		return
	}
	truth := map[int64]float64{}
	var sum, after float64
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == "after" {
			after, _ = strconv.ParseFloat(f[1], 64)
			continue
		}
		if len(f) != 4 {
			t.Fatalf("schedstat line %q", line)
		}
		tid, _ := strconv.ParseInt(f[0], 10, 64)
		alive, _ := strconv.ParseFloat(f[1], 64)
		cpu, _ := strconv.ParseFloat(f[2], 64)
		truth[tid] = alive*1e9 - cpu
		sum += truth[tid]
	}
	p := readProfile(t, filepath.Join(dir, schema.ProfileFile))
	idx := -1
	for i, st := range p.SampleType {
		if st.Type == schema.OffCPU {
			idx = i
		}
	}
	var got float64
	for _, s := range p.Sample {
		if tid := s.NumLabel[schema.LabelTID]; len(tid) == 1 {
			if _, ok := truth[tid[0]]; ok {
				got += float64(s.Value[idx])
			}
		}
	}
	// /proc/uptime and a thread's start time tick in 10 ms: 20 ms a thread.
	upper := sum + float64(len(truth))*(after+0.02)*1e9
	if ratio := got / sum; ratio < 0.95 || got > upper {
		t.Errorf("%s: the profile holds %.1f ms of the server threads' off-CPU time, schedstat says %.1f ms (%.1f%%; at most %.1f ms with the %.0f ms the %d threads lived after)",
			filepath.Base(dir), got/1e6, sum/1e6, 100*ratio, upper/1e6, after*1e3, len(truth))
	} else {
		t.Logf("%s: server threads off-CPU: profile %.1f ms, schedstat %.1f ms (%.1f%%; threads lived %.0f ms after)", filepath.Base(dir), got/1e6, sum/1e6, 100*ratio, after*1e3)
	}
}
