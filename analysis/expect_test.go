package analysis

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/offcpu/offcpu/schema"
)

// expectData is a recording of 10 s of judged waits: 6 s of nginx's
// event loop, 2 s reading a file, 1 s of a cache thread's sleep, 0.9 s
// in one site nobody stated (two threads of a group, two kernel paths)
// and 0.1 s in two small sites; a preempted stack and a wake-up that are
// not judged.
func expectData() *Data {
	d := &Data{}
	add := func(folded string, ns int64, state string) {
		s := schema.FoldedStack(folded)
		s.Value, s.State = ns, state
		d.Stacks = append(d.Stacks, s)
	}
	add("nginx;main;ngx_process_events_and_timers;epoll_wait;-;do_epoll_wait", 6e9, "sleeping")
	add("nginx;main;ngx_http_read_file;pread64;-;io_schedule", 2e9, "uninterruptible")
	add("cache;main;cache_loop;nanosleep;-;hrtimer_nanosleep", 1e9, "sleeping")
	add("worker-3;main;do_work;mystery_wait;-;schedule", 5e8, "sleeping")
	add("worker-4;main;do_work;mystery_wait;-;do_other;schedule", 4e8, "sleeping")
	add("tiny;main;x;-;schedule", 5e7, "sleeping")
	add("cache;main;ngx_process_events_and_timers;epoll_wait;-;do_epoll_wait", 5e7, "sleeping") // not an nginx thread
	add("nginx;main;ngx_process_events_and_timers;epoll_wait;-;do_epoll_wait", 5e9, "preempted")
	w := schema.FoldedStack("nginx;main;ngx_http_read_file;-;try_to_wake_up")
	w.Kind, w.Value = KindWakeup, 7e9
	d.Stacks = append(d.Stacks, w)
	return d
}

const nginxExpect = `program: nginx test
expect:
  - site: 'ngx_process_events_and_timers'
    thread: '^nginx'
    verdict: idle
    category: event-loop-idle
    why: "ngx_event.c: the worker's loop waits in epoll_wait between events"
  - site: 'ngx_http_read_file'
    verdict: blocked
    why: "a file read on a cold cache"
  - site: 'cache_loop'
    verdict: blocked   # wrong on purpose: the rules say sleep-timer (idle)
    why: "pretend"
  - site: 'never_seen'
    verdict: idle
    why: "a site this recording has not"
`

func mustRules(t *testing.T) *Rules {
	t.Helper()
	r, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// ruleLine is the line of the built-in rules a Decided string names.
func ruleLine(t *testing.T, decided string) (int, string) {
	t.Helper()
	rest, ok := strings.CutPrefix(decided, "default rules:")
	if !ok {
		t.Fatalf("decided %q: not a built-in rule", decided)
	}
	n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ' ')])
	if err != nil {
		t.Fatalf("decided %q: %v", decided, err)
	}
	lines := strings.Split(string(DefaultRules()), "\n")
	return n, lines[n-1]
}

func TestCheckExpectations(t *testing.T) {
	r := mustRules(t)
	e, err := ParseExpectations("nginx.yaml", []byte(nginxExpect), r)
	if err != nil {
		t.Fatal(err)
	}
	if e.MinAgreement != 95 || e.MinSite != 1 {
		t.Errorf("defaults: min_agreement %v, min_site %v; want 95, 1", e.MinAgreement, e.MinSite)
	}
	rep := CheckExpectations(expectData(), r, e)
	if rep.JudgedNs != 10e9 || rep.CoveredNs != 9e9 || rep.AgreeingNs != 8e9 || rep.UncoveredNs != 1e9 {
		t.Errorf("judged %d, covered %d, agreeing %d, uncovered %d; want 10e9, 9e9, 8e9, 1e9", rep.JudgedNs, rep.CoveredNs, rep.AgreeingNs, rep.UncoveredNs)
	}
	if want := (Confusion{IdleAsIdle: 6e9, BlockedAsBlocked: 2e9, BlockedAsIdle: 1e9}); rep.Confusion != want {
		t.Errorf("confusion %+v, want %+v", rep.Confusion, want)
	}
	if rep.Agreement < 88.8 || rep.Agreement > 88.9 {
		t.Errorf("agreement %.2f%%, want 88.89%%", rep.Agreement)
	}
	for i, want := range [][2]int64{{6e9, 6e9}, {2e9, 2e9}, {1e9, 0}, {0, 0}} {
		if got := rep.Expectations[i]; got.TimeNs != want[0] || got.AgreeingNs != want[1] {
			t.Errorf("expectation %d (%s): time %d agreeing %d, want %v", i, got.At, got.TimeNs, got.AgreeingNs, want)
		}
	}
	if at := rep.Expectations[2].At; at != "nginx.yaml:11" {
		t.Errorf("third expectation at %s, want nginx.yaml:11", at)
	}
	// The sleep is the one mismatch, decided by the built-in sleep-timer rule.
	if len(rep.Mismatches) != 1 {
		t.Fatalf("mismatches %+v, want one", rep.Mismatches)
	}
	m := rep.Mismatches[0]
	if m.TimeNs != 1e9 || m.GotVerdict != "idle" || m.GotCategory != "sleep-timer" || m.Expected != "blocked" || !strings.HasSuffix(m.DecidedBy, " (sleep-timer, rule)") ||
		!strings.Contains(m.Example, "cache_loop") {
		t.Errorf("mismatch %+v", m)
	}
	if _, line := ruleLine(t, m.DecidedBy); !strings.Contains(line, "sleep-timer") {
		t.Errorf("%s names the line %q", m.DecidedBy, line)
	}
	// The two worker threads are one uncovered site; the small ones are
	// summed, the nginx site on a cache thread among them.
	if len(rep.Uncovered) != 1 {
		t.Fatalf("uncovered %+v, want one site", rep.Uncovered)
	}
	u := rep.Uncovered[0]
	if u.Thread != "worker-N" || u.Frames != "main;do_work;mystery_wait" || u.TimeNs != 9e8 || u.Share != 9 || u.GotCategory != "other" || u.IdleNs != 0 {
		t.Errorf("uncovered %+v", u)
	}
	if rep.SmallUncovered != 2 || rep.SmallUncoveredNs != 1e8 {
		t.Errorf("small uncovered: %d sites, %d ns; want 2, 1e8", rep.SmallUncovered, rep.SmallUncoveredNs)
	}
	if !rep.Failed() || len(rep.Failures) != 2 || rep.Failures[0] != "agreement 88.9% < 95%" || !strings.HasPrefix(rep.Failures[1], "1 uncovered site ≥ 1%") {
		t.Errorf("failures %q", rep.Failures)
	}
	if len(rep.Warnings) != 1 || !strings.Contains(rep.Warnings[0], "nginx.yaml:14") || !strings.Contains(rep.Warnings[0], "never_seen") {
		t.Errorf("warnings %q: want the expectation that matched nothing", rep.Warnings)
	}

	var out bytes.Buffer
	if err := rep.Write(&out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"program: nginx test", "expected idle", "6.00 s (66.7%)", "agreement: 88.9%", "decided by default rules:",
		"worker-N", "main;do_work;mystery_wait", "2 smaller uncovered sites", "warning: nginx.yaml:14", "FAIL: agreement 88.9% < 95%; 1 uncovered site"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	b, err := json.Marshal(rep)
	if err != nil || !bytes.Contains(b, []byte(`"blocked_as_idle_ns":1000000000`)) || !bytes.Contains(b, []byte(`"decided_by":"default rules:`)) {
		t.Errorf("JSON (%v): %s", err, b)
	}

	// Looser thresholds pass, the warning stays a warning.
	loose := strings.Replace(nginxExpect, "expect:", "min_agreement: 80\nmin_site: 10\nexpect:", 1)
	e, err = ParseExpectations("nginx.yaml", []byte(loose), r)
	if err != nil {
		t.Fatal(err)
	}
	rep = CheckExpectations(expectData(), r, e)
	out.Reset()
	rep.Write(&out)
	if rep.Failed() || len(rep.Uncovered) != 0 || rep.SmallUncovered != 3 || !strings.Contains(out.String(), "PASS") {
		t.Errorf("loose thresholds: failures %q, uncovered %d+%d\n%s", rep.Failures, len(rep.Uncovered), rep.SmallUncovered, out.String())
	}

	// A category must agree too where given: the file read is io, not a
	// lock wait.
	strict := strings.Replace(nginxExpect, "    verdict: blocked\n    why: \"a file", "    verdict: blocked\n    category: monitor-wait\n    why: \"a file", 1)
	e, err = ParseExpectations("nginx.yaml", []byte(strict), r)
	if err != nil {
		t.Fatal(err)
	}
	rep = CheckExpectations(expectData(), r, e)
	if rep.AgreeingNs != 6e9 || rep.Confusion.BlockedAsBlocked != 2e9 || len(rep.Mismatches) != 2 || rep.Mismatches[0].GotCategory != "io" ||
		rep.Mismatches[0].Expected != "blocked (monitor-wait)" {
		t.Errorf("category mismatch: agreeing %d, confusion %+v, mismatches %+v", rep.AgreeingNs, rep.Confusion, rep.Mismatches)
	}
	if n, line := ruleLine(t, rep.Mismatches[0].DecidedBy); !strings.Contains(line, "io") {
		t.Errorf("io decided at line %d: %q", n, line)
	}
}

// Nothing judged, or nothing covered, fails whatever the thresholds.
func TestExpectNothingCovered(t *testing.T) {
	r := mustRules(t)
	e, err := ParseExpectations("x.yaml", []byte("min_agreement: 0\nmin_site: 100\nexpect:\n  - {site: nowhere, verdict: idle, why: none}\n"), r)
	if err != nil {
		t.Fatal(err)
	}
	if rep := CheckExpectations(expectData(), r, e); !rep.Failed() || !strings.Contains(rep.Failures[0], "no judged wait matched") {
		t.Errorf("failures %q", rep.Failures)
	}
	if rep := CheckExpectations(&Data{}, r, e); !rep.Failed() || !strings.Contains(rep.Failures[0], "no judged off-CPU time") {
		t.Errorf("failures %q", rep.Failures)
	}
}

// Decided names the verdict that overrode the frames, the rule of a
// user's file, or no rule; its category is always Categorize's first.
func TestDecided(t *testing.T) {
	r := mustRules(t)
	lock := offStack("backend;main;ServerLoop;ProcSleep;WaitLatch;WaitEventSetWait;epoll_wait;-;do_epoll_wait;schedule", 10, "dbserver", "backend", 11, "dbserver", "other",
		"main;exec_simple_query;CommitTransaction;LockReleaseAll;ProcLockWakeup;SetLatch;kill;-;__x64_sys_kill;try_to_wake_up")
	d := r.Decided(lock)
	if !strings.HasSuffix(d, " (monitor-wait, verdict)") {
		t.Errorf("lock wait decided by %q, want a monitor-wait verdict", d)
	}
	n, line := ruleLine(t, d)
	verdicts := strings.Index(string(DefaultRules()), "\nverdicts:")
	if before := strings.Count(string(DefaultRules())[:verdicts], "\n") + 2; n < before || !strings.Contains(line, "monitor-wait") {
		t.Errorf("%s: line %q (verdicts start at line %d)", d, line, before)
	}
	// The same epoll_wait woken by the client keeps its rule.
	read := offStack("backend;main;ServerLoop;ReadCommand;secure_read;WaitEventSetWait;epoll_wait;-;do_epoll_wait;schedule", 10, "dbserver", "client", 20, "loadgen", "pipe/socket", "main;send;-;tcp_sendmsg;sock_def_readable;try_to_wake_up")
	if d := r.Decided(read); !strings.HasPrefix(d, "default rules:") || !strings.HasSuffix(d, " (event-loop-idle, rule)") {
		t.Errorf("read decided by %q", d)
	}
	mystery := schema.FoldedStack("worker-3;main;do_work;mystery_wait;-;schedule")
	mystery.Value = 1
	if d := r.Decided(&mystery); d != "no rule (other)" {
		t.Errorf("mystery decided by %q", d)
	}
	user, err := ParseRules("rules.yaml", []byte("rules:\n  - category: io\n    frames: ['^mystery_wait$']\n"))
	if err != nil {
		t.Fatal(err)
	}
	if d := user.Decided(&mystery); d != "rules.yaml:2 (io, rule)" {
		t.Errorf("with a user's rule, decided by %q", d)
	}
	for _, s := range []*Stack{lock, read, &mystery} {
		for _, rr := range []*Rules{r, user} {
			d := rr.Decided(s)
			if cat := rr.Categorize(s)[0]; !strings.Contains(d, "("+cat+",") && d != "no rule (other)" {
				t.Errorf("%s: decided %q, categorized %s", s.Folded(), d, cat)
			}
		}
	}
}

// A long example keeps its thread and its leaf, where the wait is.
func TestExpectCut(t *testing.T) {
	long := "thread;" + strings.Repeat("frame;", 100) + "-;leaf_wait"
	if c := cut(long, 200); len(c) > 200 || !strings.HasPrefix(c, "thread;...;") || !strings.HasSuffix(c, ";-;leaf_wait") {
		t.Errorf("cut to %d: %q", len(c), c)
	}
	if c := cut("a;b", 200); c != "a;b" {
		t.Errorf("a short stack cut to %q", c)
	}
}

func TestExpectParseErrors(t *testing.T) {
	r := mustRules(t)
	head := "program: p\nexpect:\n  - site: a\n    verdict: idle\n    why: w\n"
	for _, c := range []struct{ yaml, want string }{
		{head + "  - site: '(unclosed'\n    verdict: idle\n    why: w\n", "x.yaml:6: bad regexp"},
		{head + "  - site: b\n    thread: '[z-a]'\n    verdict: idle\n    why: w\n", "x.yaml:7: bad regexp"},
		{head + "  - site: b\n    verdict: sleepy\n    why: w\n", `x.yaml:7: unknown verdict "sleepy"`},
		{head + "  - site: b\n    verdict: idle\n    category: napping\n    why: w\n", `x.yaml:8: unknown category "napping"`},
		{head + "  - site: b\n    verdict: idle\n    category: io\n    why: w\n", "x.yaml:8: category io is blocked, the verdict says idle"},
		{head + "  - verdict: idle\n    why: w\n", "x.yaml:6: expectation without a site"},
		{head + "  - site: b\n    why: w\n", "x.yaml:6: expectation without a verdict"},
		{head + "  - site: b\n    verdict: blocked\n", "x.yaml:6: expectation without a why"},
		{head + "  - site: b\n    verdict: [idle]\n    why: w\n", "x.yaml:7:"},
		{head + "  - site: b\n    verdict: blocked\n    why: w\n    becuase: typo\n", `x.yaml:9: unknown field "becuase"`},
		{"min_agreement: 150\n" + head, "x.yaml:1: min_agreement 150"},
		{"program: p\n", "no expectations"},
	} {
		_, err := ParseExpectations("x.yaml", []byte(c.yaml), r)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: error %v, want one line with %q", c.yaml, err, c.want)
		}
	}
	if _, err := LoadExpectations("/nonexistent/x.yaml", r); err == nil || !strings.Contains(err.Error(), "reading expectations") {
		t.Errorf("missing file: %v", err)
	}
}
