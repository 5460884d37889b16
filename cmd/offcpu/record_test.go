package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/offcpu/offcpu/collector"
	"github.com/offcpu/offcpu/internal/testenv"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

var requireRoot = testenv.RequireRoot

func TestRecordBadInput(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "x.pb.gz")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"record", "--bogus"}, "unknown flag"},
		{[]string{"record", "-d", "soon"}, "invalid argument"},
		{[]string{"record", "-o", out, "stray"}, "after --"},
		{[]string{"record", "-o", "/nonexistent-dir/x.pb.gz", "-d", "1s"}, "cannot write /nonexistent-dir/x.pb.gz"},
		{[]string{"record", "-o", out, "-p", "1073741823", "-d", "1s"}, "pid 1073741823 not found"},
		{[]string{"record", "-o", out, "--state", "dozing"}, `unknown state "dozing"`},
		{[]string{"record", "-o", out, "--user-only", "--kernel-only"}, "exclude each other"},
		{[]string{"record", "-o", out, "--goroutines", "-d", "1s"}, "--goroutines needs the Go programs to record"},
		{[]string{"record", "-o", out, "--goroutines-folded", out + ".f", "-d", "1s"}, "need --goroutines"},
		{[]string{"record", "-o", out, "--budget", "200%", "-d", "1s"}, "--budget \"200%\""},
		{[]string{"record", "-o", out, "--budget", "lots", "-d", "1s"}, "such as 1% or 0.01"},
		{[]string{"record", "-o", out, "--walk-threshold", "5ms", "-d", "1s"}, "--walk-threshold 5ms out of range"},
		{[]string{"record", "-o", out, "--walk-threshold", "100us", "--tracepoint", "-d", "1s"}, "drop --tracepoint"},
	} {
		_, err := run(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it to mention %q", tc.args, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error spans lines: %q", tc.args, err)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a failed record left an output file behind")
	}
}

// --budget on a command: the summary states the threshold, what was
// below it and the estimate's error, and the profile says so too.
func TestRecordBudget(t *testing.T) {
	requireRoot(t)
	out := filepath.Join(t.TempDir(), "b.pb.gz")
	summary, err := run(t, "record", "-o", out, "--budget", "1%", "--", "sh", "-c", "for i in $(seq 300); do sleep 0.001; done")
	if err != nil {
		t.Fatalf("record: %v\n%s", err, summary)
	}
	for _, want := range []string{"walk threshold: ", "for --budget 1% of a CPU", "below it: ", "(2σ"} {
		if !strings.Contains(summary, want) {
			t.Errorf("summary lacks %q:\n%s", want, summary)
		}
	}
	p := readProfile(t, out)
	if !slices.ContainsFunc(p.Comments, func(c string) bool { return strings.HasPrefix(c, "walk_threshold=") }) {
		t.Errorf("profile comments lack the walk threshold: %q", p.Comments)
	}
}

func TestRecordCommand(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	out := filepath.Join(dir, "sleep.pb.gz")
	folded := filepath.Join(dir, "sleep.folded")
	summary, err := run(t, "record", "-o", out, "--folded", folded, "--stats", "--", "sleep", "0.2")
	if err != nil {
		t.Fatalf("record: %v\n%s", err, summary)
	}
	for _, want := range []string{"off-CPU intervals", "losses: 0", "mean", "wrote " + out} {
		if !strings.Contains(summary, want) {
			t.Errorf("summary lacks %q:\n%s", want, summary)
		}
	}
	p := readProfile(t, out)
	var slept int64
	for _, s := range p.Sample {
		if s.Label["thread"][0] == "sleep" {
			slept += s.Value[0]
		}
	}
	if slept < 190e6 {
		t.Errorf("sleep 0.2 recorded %dns off-CPU", slept)
	}
	b, err := os.ReadFile(folded)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "sleep;") || !strings.Contains(string(b), ";-;") || !strings.Contains(string(b), "nanosleep") {
		t.Errorf("folded output lacks the sleep stack:\n%s", b)
	}
}

// A Go program's goroutine waits, from the command line: the goroutine
// profile and the folded file, with the reason as a frame.
func TestRecordGoroutines(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "goroutines")
	if out, err := exec.Command("go", "build", "-o", bin, "../../collector/testdata/goroutines").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, folded := filepath.Join(dir, "go.pb.gz"), filepath.Join(dir, "go.folded")
	summary, err := run(t, "record", "--goroutines", "--goroutines-folded", folded, "-o", out, "--", bin, filepath.Join(dir, "trace.out"), "500ms")
	if err != nil {
		t.Fatalf("record: %v\n%s", err, summary)
	}
	if !strings.Contains(summary, "goroutines: 1 Go processes") {
		t.Errorf("summary lacks the goroutine line:\n%s", summary)
	}
	p := readProfile(t, filepath.Join(dir, "go.goroutines.pb.gz"))
	var types []string
	for _, st := range p.SampleType {
		types = append(types, st.Type)
	}
	if want := []string{"goroutine_blocked", "goroutine_runqueue", "goroutine_waits", "waker_waiting"}; !slices.Equal(types, want) {
		t.Errorf("sample types %v, want %v", types, want)
	}
	b, err := os.ReadFile(folded)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{";[sync.Mutex.Lock];", "main.mutexWait;", ";[IO wait];", "main.netClient;"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("folded goroutine waits lack %q", want)
		}
	}
	// analyze, flamegraph and diff read the goroutine profile.
	gp := filepath.Join(dir, "go.goroutines.pb.gz")
	rep, err := run(t, "analyze", gp)
	if err != nil {
		t.Fatalf("analyze: %v\n%s", err, rep)
	}
	for _, want := range []string{"goroutines by start function", "chan-send", "join-wait", "monitor-wait", "queue-wait (idle)"} {
		if !strings.Contains(rep, want) {
			t.Errorf("analyze of the goroutine profile lacks %q:\n%s", want, rep)
		}
	}
	svg := filepath.Join(dir, "blocked.svg")
	if out, err := run(t, "flamegraph", "--blocked", "-o", svg, gp); err != nil {
		t.Fatalf("flamegraph: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(svg); err != nil || !strings.Contains(string(b), "[sync.Mutex.Lock]") || strings.Contains(string(b), "[chan receive]") {
		t.Errorf("blocked goroutine flame graph: want the mutex waits' reason and no idle channel receives (err %v)", err)
	}
	if out, err := run(t, "diff", gp, gp); err != nil || !strings.Contains(out, "chan-send") {
		t.Errorf("diff of the goroutine profile with itself: %v\n%s", err, out)
	}
}

func TestRecordExitStatus(t *testing.T) {
	requireRoot(t)
	out := filepath.Join(t.TempDir(), "x.pb.gz")
	_, err := run(t, "record", "-q", "-o", out, "--", "sh", "-c", "exit 3")
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 3 {
		t.Fatalf("err = %v, want exit status 3", err)
	}
	if _, err := os.Stat(out); err != nil {
		t.Errorf("profile not written when the command failed: %v", err)
	}
}

// Without privileges, record fails with one line naming the fix.
func TestRecordWithoutPrivileges(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to start a child as nobody")
	}
	dir, err := os.MkdirTemp("", "offcpu-nobody") // t.TempDir's parent is private
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o777)
	bin := filepath.Join(dir, "offcpu")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "record", "-d", "1s", "-o", filepath.Join(dir, "x.pb.gz"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("record as nobody: err %v, output %s", err, out)
	}
	msg := strings.TrimSpace(string(out))
	if !strings.Contains(msg, "run as root, or grant CAP_BPF") || strings.Count(msg, "\n") != 0 || strings.Contains(msg, "panic") {
		t.Errorf("output %q, want one line naming the fix", msg)
	}
}

func TestBenchFailOn(t *testing.T) {
	out := t.TempDir()
	// Four runs a side, every candidate run below every baseline run: the
	// U test's p = 2/C(8,4) = 0.029.
	args := []string{"bench", "--out", out, "--runs", "4", "--profiled-runs", "0", "--cooldown-idle", "0",
		"--baseline-cmd", `echo '{"score": 100}' > "$OFFCPU_METRICS"`,
		"--candidate-cmd", `echo '{"score": 90}' > "$OFFCPU_METRICS"`}
	_, err := run(t, append(args, "--fail-on", "score<-5%")...)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 3 || !strings.Contains(ee.msg, "score changed -10.0%") {
		t.Errorf("score<-5%% on a 10%% drop: err = %v", err)
	}
	if _, err := run(t, append(args, "--fail-on", "score<-20%")...); err != nil {
		t.Errorf("score<-20%% on a 10%% drop: err = %v", err)
	}
	// At a stricter level the same drop is not significant: no failure.
	if _, err := run(t, append(args, "--fail-on", "score<-5%", "--fail-alpha", "0.01")...); err != nil {
		t.Errorf("score<-5%% at --fail-alpha 0.01 (p=0.029): err = %v", err)
	}
	if _, err := os.Stat(filepath.Join(out, "report.md")); err != nil {
		t.Errorf("no report written: %v", err)
	}
}

// Empty input is an error, as flamegraph.pl's "No stack counts found".
func TestEmptyInput(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.folded")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"analyze", "/dev/null"},
		{"analyze", empty},
		{"flamegraph", "-o", filepath.Join(dir, "x.svg"), empty},
	} {
		_, err := run(t, args...)
		if err == nil || !strings.Contains(err.Error(), "no samples in") {
			t.Errorf("%v: err = %v, want \"no samples in\"", args, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "x.svg")); err == nil {
		t.Error("an empty flame graph was written")
	}
}

func TestAnalyzeExplain(t *testing.T) {
	out, err := run(t, "analyze", "--explain", "srv;main;loop;epoll_wait;-;do_epoll_wait")
	if err != nil || !strings.Contains(out, "counts as idle: event-loop-idle") {
		t.Errorf("err %v, output:\n%s", err, out)
	}
}

// The summary says when --budget was not met because the walks were all
// cut already, and not otherwise.
func TestPrintBudgetNotMet(t *testing.T) {
	for _, c := range []struct {
		cost, budget float64
		max          time.Duration
		want         bool
	}{
		{0.03, 0.01, collector.MaxWalkThreshold, true},
		{0.0105, 0.01, collector.MaxWalkThreshold, false},
		{0.03, 0.01, 200 * time.Microsecond, false},  // still cutting walks
		{0.03, 0, collector.MaxWalkThreshold, false}, // a fixed threshold
	} {
		var out bytes.Buffer
		printBudget(&out, &collector.BudgetStats{Budget: c.budget, Cost: c.cost, Threshold: c.max, ThresholdMin: c.max, ThresholdMax: c.max}, time.Second)
		if got := strings.Contains(out.String(), "not met"); got != c.want {
			t.Errorf("cost %.3f, budget %.3f, cap %v: warned %v, want %v:\n%s", c.cost, c.budget, c.max, got, c.want, &out)
		}
	}
}
