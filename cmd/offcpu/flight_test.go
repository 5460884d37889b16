package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/offcpu/offcpu/agent"
	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/internal/testenv"
)

// The flight recorder beside the C server that publishes OpenTelemetry
// thread context (collector/testdata/tctx): a trigger on its slow
// /sleep requests writes a timeline named by the request's trace and
// span; that request's critical path there has the request's own time
// off a CPU (its clocks: wall less CPU time) within max(2%, 100µs); the
// interval exported meanwhile names the file.
func TestFlightRecorderTrigger(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	bin, report, outDir := filepath.Join(dir, "server"), filepath.Join(dir, "report"), t.TempDir()
	testenv.Build(t, "gcc", "-O2", "-pthread", "-rdynamic", "-o", bin, "../../collector/testdata/tctx/server.c")
	col := newTestCollector(t)
	summary, err := run(t, "record", "--continuous", "--interval", "1s", "--output-dir", outDir,
		"--otlp-endpoint", col.grpc, "--otlp-insecure", "--flight-recorder", "5s",
		"--timeline-trigger", "http.route=/sleep>7ms", "--", bin, "3", report)
	if err != nil {
		t.Fatalf("record: %v\n%s", err, summary)
	}
	col.stop(t)
	files, _ := filepath.Glob(filepath.Join(outDir, "timeline-ab*.pftrace.gz"))
	if len(files) == 0 {
		t.Fatalf("no timeline written by the trigger:\n%s", summary)
	}
	t.Logf("%d timelines; %s", len(files), regexp.MustCompile(`(?m)^offcpu: trigger.*$`).FindString(summary))
	own := readSpanReport(t, report)
	checked, judged := 0, 0
	for _, f := range files {
		span := regexp.MustCompile(`-([0-9a-f]{16})\.pftrace\.gz$`).FindStringSubmatch(f)
		if span == nil {
			t.Fatalf("%s: not named by a span", f)
		}
		off, ok := own[span[1]]
		if !ok {
			t.Errorf("%s: span %s not in the server's report", f, span[1])
			continue
		}
		tl := readTimelineFile(t, f)
		for _, w := range tl.Waits {
			if w.Verdict != "" {
				judged++ // by the interval cut before it
				break
			}
		}
		th, start, end, err := analysis.PathFor(tl, span[1], "")
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		p, err := analysis.FollowCriticalPath(tl, th, start, end)
		if err != nil {
			t.Fatal(err)
		}
		got := end - start
		for _, s := range p.Leaves() {
			if s.Depth == 0 && s.Kind == analysis.SegRunning {
				got -= s.Duration()
			}
		}
		if abs64(got-off) > max(off/50, 100_000) {
			t.Errorf("span %s: off a CPU %d ns on its critical path, %d by its own clocks", span[1], got, off)
		}
		checked++
	}
	// Each file is named by the export of the interval it was written in,
	// if that one had samples, else by the next (none after the last).
	named := 0
	for _, m := range col.messages(t) {
		for i := 0; i < m.ResourceProfiles().Len(); i++ {
			v, ok := m.ResourceProfiles().At(i).Resource().Attributes().Get(agent.TimelinesAttribute)
			for _, f := range strings.Split(v.Str(), ",") {
				if _, err := os.Stat(f); ok && err != nil {
					t.Errorf("%s names %s: %v", agent.TimelinesAttribute, f, err)
				}
			}
			named += strings.Count(v.Str(), ".pftrace.gz")
		}
	}
	if named == 0 {
		t.Errorf("no exported interval names a timeline in %s", agent.TimelinesAttribute)
	}
	t.Logf("%d triggered requests' critical paths checked against the server's clocks; %d timelines with verdicts", checked, judged)
	if judged == 0 {
		t.Errorf("no timeline's waits have verdicts")
	}
}

// readSpanReport reads the tctx server's report: each span's own time
// off a CPU.
func readSpanReport(t *testing.T, path string) map[string]int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var span, route string
		var ns int64
		if _, err := fmt.Sscan(line, &span, &route, &ns); err != nil {
			t.Fatalf("report line %q: %v", line, err)
		}
		out[span] = ns
	}
	return out
}
