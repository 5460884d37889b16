package collector

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/schema"
)

// pyThreadsResult is what testdata/python/threads.py says of itself.
type pyThreadsResult struct {
	AcquireS float64          `json:"acquire_s"`
	TIDs     map[string]int64 `json:"tids"`
}

// Debian's python3 recorded with no flag: its Python frames are in the
// stacks, the CPU threads' waits are GIL waits held by each other, the
// lock waiter's time is under its function and agrees with its own
// clock, and the queue waiter is idle.
// Both attach modes: GIL waits are read at the switch-out in each.
func TestPythonThreads(t *testing.T) {
	requireBPF(t)
	// OFFCPU_PYTHON: another interpreter to check (CI runs Debian's).
	python := os.Getenv("OFFCPU_PYTHON")
	if python == "" {
		python = requireServer(t, "/usr/bin/python3", "python3")
	}
	// --cpu-hz's default: samples name the GIL's holders' stacks.
	t.Run("tp_btf", func(t *testing.T) { pythonThreads(t, python, Options{CPUHz: 99}) })
	t.Run("tracepoint", func(t *testing.T) { pythonThreads(t, python, Options{ForceTracepoint: true}) })
}

func pythonThreads(t *testing.T, python string, opts Options) {
	out := filepath.Join(t.TempDir(), "threads.json")
	cmd := exec.Command(python, "testdata/python/threads.py", "4", out)
	cmd.Stderr = os.Stderr
	p, s := recordCommand(t, opts, cmd)
	var res pyThreadsResult
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	if st := runtimeStats(s.Stats(), "cpython"); st.Processes != 1 || st.Named == 0 {
		t.Fatalf("python stats %+v: want one process and its code objects named", st)
	}
	acquireLine := sourceLine(t, "testdata/python/threads.py", "lock.acquire()")

	// Per thread: off-CPU, blocked (not waiting for a CPU), under a
	// Python frame of the program's own, in acquire by the line, GIL waits
	// and who held the GIL.
	type tally struct{ off, blocked, underFn, acquire, gil, gilByOther int64 }
	by := map[int64]*tally{}
	for _, smp := range p.Sample {
		tid := smp.NumLabel[schema.LabelTID][0]
		tl := by[tid]
		if tl == nil {
			tl = &tally{}
			by[tid] = tl
		}
		off, runq := smp.Value[0], smp.Value[4]
		tl.off += off
		tl.blocked += off - runq
		if fn, line := pyFrame(smp, "threads."); fn != "" {
			tl.underFn += off
			if fn == "threads.wait_for_lock" && line == acquireLine {
				tl.acquire += off
			}
		}
		if len(smp.Label[schema.LabelGIL]) > 0 {
			tl.gil += off - runq
			if h := smp.NumLabel[schema.LabelGILHolderTID]; len(h) > 0 && h[0] != tid {
				tl.gilByOther += off - runq
			}
		}
	}
	lock := by[res.TIDs["py-lockwait"]]
	if lock == nil || lock.off == 0 {
		t.Fatalf("the lock waiter (tid %d) was not recorded", res.TIDs["py-lockwait"])
	}
	t.Logf("lock waiter: %.3f s off-CPU, %.0f%% under threads.wait_for_lock; in acquire %.3f s, its own clock %.3f s",
		float64(lock.off)/1e9, 100*float64(lock.underFn)/float64(lock.off), float64(lock.acquire)/1e9, res.AcquireS)
	if float64(lock.underFn) < 0.9*float64(lock.off) {
		t.Errorf("lock waiter: %.0f%% of its off-CPU time under its Python function, want at least 90%%", 100*float64(lock.underFn)/float64(lock.off))
	}
	if r := float64(lock.acquire) / 1e9 / res.AcquireS; r < 0.85 || r > 1.15 {
		t.Errorf("lock waiter: %.3f s in acquire, its own clock says %.3f s: want within 15%%", float64(lock.acquire)/1e9, res.AcquireS)
	}
	for _, name := range []string{"py-cpu-1", "py-cpu-2"} {
		c := by[res.TIDs[name]]
		if c == nil || c.blocked == 0 {
			t.Fatalf("%s was not recorded blocked", name)
		}
		t.Logf("%s: %.3f s blocked, %.0f%% GIL waits, %.0f%% of them held by another thread",
			name, float64(c.blocked)/1e9, 100*float64(c.gil)/float64(c.blocked), 100*float64(c.gilByOther)/float64(max(c.gil, 1)))
		if float64(c.gil) < 0.8*float64(c.blocked) || float64(c.gilByOther) < 0.8*float64(c.gil) {
			t.Errorf("%s: GIL waits %.0f%% of its blocked time (want 80%%), held by another thread %.0f%% (want 80%%)",
				name, 100*float64(c.gil)/float64(c.blocked), 100*float64(c.gilByOther)/float64(max(c.gil, 1)))
		}
	}
	// The holder named is the other CPU thread, in its loop.
	other := map[string]bool{}
	var gil1, inSpin int64
	for _, smp := range p.Sample {
		if smp.NumLabel[schema.LabelTID][0] != res.TIDs["py-cpu-1"] || len(smp.Label[schema.LabelGILHolder]) == 0 {
			continue
		}
		other[smp.Label[schema.LabelGILHolder][0]] = true
		gil1 += smp.Value[0]
		if strings.Contains(strings.Join(smp.Label[schema.LabelGILHolderStack], ";"), "threads.spin") {
			inSpin += smp.Value[0]
		}
	}
	if !other["py-cpu-2"] {
		t.Errorf("py-cpu-1's GIL holders %v: want py-cpu-2 among them", other)
	}
	// Every thread but the two spinning ones sleeps or waits without the
	// GIL; a holder's stack outside spin is read at its hand-over code.
	t.Logf("py-cpu-1's GIL waits: %.1f%% with the holder in threads.spin", 100*float64(inSpin)/float64(max(gil1, 1)))
	if float64(inSpin) < 0.9*float64(gil1) {
		t.Errorf("py-cpu-1's GIL waits: %.1f%% with the holder's stack in threads.spin, want at least 90%%", 100*float64(inSpin)/float64(max(gil1, 1)))
	}

	// The queue waiter is idle, by the rules and verdicts.
	rules, err := analysis.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	d := loadRecorded(t, p)
	var qAll, qIdle int64
	for i := range d.Stacks {
		st := &d.Stacks[i]
		if st.Kind != schema.KindOffCPU || st.TID != res.TIDs["py-queue"] || st.WaitsForCPU() {
			continue
		}
		qAll += st.Value
		if rules.IsIdle(rules.Categorize(st)[0]) {
			qIdle += st.Value
		}
	}
	t.Logf("queue waiter: %.0f%% of %.3f s blocked idle", 100*float64(qIdle)/float64(max(qAll, 1)), float64(qAll)/1e9)
	if qAll == 0 || float64(qIdle) < 0.9*float64(qAll) {
		t.Errorf("queue waiter: %.0f%% idle, want at least 90%%", 100*float64(qIdle)/float64(max(qAll, 1)))
	}
}

// pyFrame returns the innermost Python frame of a sample whose function
// starts with prefix, and its line.
func pyFrame(smp *profile.Sample, prefix string) (string, int64) {
	for _, l := range smp.Location {
		for _, ln := range l.Line {
			if strings.HasPrefix(ln.Function.Name, prefix) && strings.HasSuffix(ln.Function.Filename, ".py") {
				return ln.Function.Name, ln.Line
			}
		}
	}
	return "", 0
}

// A Python thread blocked since before the recording started (a server's
// idle master, a worker waiting for work): its stack, walked from the
// sleepable iterator at the start through another task's memory, has its
// Python frames too.
func TestPythonBlockedBeforeStart(t *testing.T) {
	requireBPF(t)
	python := requireServer(t, "/usr/bin/python3", "python3")
	cmd := startReady(t, exec.Command(python, "testdata/python/parked.py"))
	time.Sleep(200 * time.Millisecond) // in its sleep
	s, err := Start(context.Background(), Options{PIDs: []int{cmd.Process.Pid}})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	time.Sleep(time.Second)
	p, err := s.Stop()
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	sleepLine := sourceLine(t, "testdata/python/parked.py", "time.sleep(600)")
	var whole, named int64
	for _, smp := range p.Sample {
		if smp.NumLabel[schema.LabelTID][0] != int64(cmd.Process.Pid) || len(smp.Label[schema.LabelInterval]) == 0 {
			continue
		}
		whole += smp.Value[0]
		if fn, line := pyFrame(smp, "parked."); fn == "parked.parked" && line == sleepLine {
			named += smp.Value[0]
		}
	}
	t.Logf("blocked since before the start: %v, %v of it under parked.parked at line %d", time.Duration(whole), time.Duration(named), sleepLine)
	if whole < int64(900*time.Millisecond) {
		t.Fatalf("the parked thread: %v recorded as blocked since before the start, want the whole second", time.Duration(whole))
	}
	if named < whole*99/100 {
		t.Errorf("the parked thread: %v of %v under parked.parked at its sleep, want all of it", time.Duration(named), time.Duration(whole))
	}
}

// sourceLine is the line number of the first line of path holding text.
func sourceLine(t *testing.T, path, text string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, text) {
			return int64(i + 1)
		}
	}
	t.Fatalf("%s: no line holds %q", path, text)
	return 0
}

// gunicorn (Debian's) serving a WSGI app with a thread pool, under a
// load on loopback, recorded by pid: Python frames name nearly all of its
// threads' off-CPU time, the pool's waits for work are idle, and every
// thread's totals agree with the kernel's schedstat.
func TestPythonGunicorn(t *testing.T) {
	requireBPF(t)
	gunicorn := requireServer(t, "gunicorn", "gunicorn")
	port := freePort(t)
	// More threads than the load's connections: Debian's gunicorn (20.1,
	// gthread.accept) gives each new connection a thread that blocks on
	// its first request, so connections opened but not yet used (Go's
	// transport dials while another frees) can hold every thread while
	// requests wait on the others (gunicorn issue 2917): CI hung once so
	// with 8 connections on 4 threads.
	cmd := exec.Command(gunicorn, "--bind", fmt.Sprintf("127.0.0.1:%d", port), "--workers", "1", "--threads", "8",
		"--worker-class", "gthread", "--chdir", "testdata/python", "app:app")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	waitListening(t, port)
	pids := append([]int{cmd.Process.Pid}, children(t, cmd.Process.Pid)...)
	p := checkAgainstSchedstat(t, pids, func(stop <-chan struct{}) {
		httpLoad(t, fmt.Sprintf("http://127.0.0.1:%d/", port), 64, 4, stop)
	})
	var all, named int64
	for _, smp := range p.Sample {
		off := smp.Value[0]
		if off == 0 {
			continue
		}
		all += off
		if fn, _ := pyFrame(smp, ""); fn != "" {
			named += off
		}
	}
	poolAll, poolIdle := poolWaits(t, p)
	t.Logf("Python frames in %.1f%% of %.3f s off-CPU; the pool's waits for work %.3f s, %.1f%% idle",
		100*float64(named)/float64(max(all, 1)), float64(all)/1e9, float64(poolAll)/1e9, 100*float64(poolIdle)/float64(max(poolAll, 1)))
	if float64(named) < 0.95*float64(all) {
		t.Errorf("Python frames in %.1f%% of the off-CPU time, want at least 95%%", 100*float64(named)/float64(max(all, 1)))
	}
	if poolAll == 0 || float64(poolIdle) < 0.9*float64(poolAll) {
		t.Errorf("the pool's waits for work: %.1f%% idle of %.3f s, want at least 90%%", 100*float64(poolIdle)/float64(max(poolAll, 1)), float64(poolAll)/1e9)
	}
}

// poolWaits are a Python thread pool's waits for work (its threads at the
// top of their loop: the innermost Python frame the pool's worker
// function) and of them those the default rules call idle. Their GIL
// waits on the way back are the GIL's (gil-wait), not waits for work: CI's
// contention made them 9% of the pool's waits.
func poolWaits(t *testing.T, p *profile.Profile) (all, idle int64) {
	t.Helper()
	rules, err := analysis.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	d := loadRecorded(t, p)
	analysis.Analyze(d, rules, analysis.Options{}) // the verdicts that need the waker's own waits
	for i := range d.Stacks {
		st := &d.Stacks[i]
		if st.Kind != schema.KindOffCPU || st.WaitsForCPU() || st.Sample == nil {
			continue
		}
		if f, _ := pyFrame(st.Sample, ""); f == "concurrent.futures.thread._worker" && st.Reason != schema.ReasonGIL {
			all += st.Value
			if rules.IsIdle(rules.Categorize(st)[0]) {
				idle += st.Value
			}
		}
	}
	return all, idle
}

// gunicorn whose handler calls a downstream HTTP service (urllib: CPython
// waits in poll() under socket.SocketIO.readinto, woken by the network):
// those waits are inside the request, blocked (downstream-wait), though
// the network woke them: they lie below the work item the pool thread
// took from its queue (schema.RequestIndex's work waits).
func TestPythonDownstream(t *testing.T) {
	requireBPF(t)
	gunicorn := requireServer(t, "gunicorn", "gunicorn")
	python := requireServer(t, "/usr/bin/python3", "python3")
	dport, port := freePort(t), freePort(t)
	down := exec.Command(python, "testdata/python/downstream.py", fmt.Sprint(dport))
	if err := down.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { down.Process.Kill(); down.Wait() }()
	waitListening(t, dport)
	// Threads to spare beyond the load's connections (see TestPythonGunicorn).
	cmd := exec.Command(gunicorn, "--bind", fmt.Sprintf("127.0.0.1:%d", port), "--workers", "1", "--threads", "8",
		"--worker-class", "gthread", "--chdir", "testdata/python", "app_down:app")
	cmd.Env = append(os.Environ(), fmt.Sprintf("DOWN_PORT=%d", dport))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	waitListening(t, port)
	pids := append([]int{cmd.Process.Pid}, children(t, cmd.Process.Pid)...)
	s, err := Start(context.Background(), Options{PIDs: pids})
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	go func() { time.Sleep(3 * time.Second); close(stop) }()
	// Fewer clients than pool threads: the pool waits for work too.
	httpLoad(t, fmt.Sprintf("http://127.0.0.1:%d/", port), 64, 3, stop)
	p, err := s.Stop()
	if err != nil {
		t.Fatal(err)
	}
	rules, err := analysis.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	d := loadRecorded(t, p)
	analysis.Analyze(d, rules, analysis.Options{})
	var downAll, downBlocked int64
	byCat := map[string]int64{}
	for i := range d.Stacks {
		st := &d.Stacks[i]
		if st.Kind != schema.KindOffCPU || st.WaitsForCPU() || st.Reason == schema.ReasonGIL || !stackHas(st.Sample, "app_down.app", "socket.SocketIO.readinto") {
			continue
		}
		c := rules.Categorize(st)[0]
		byCat[c] += st.Value
		downAll += st.Value
		if !rules.IsIdle(c) {
			downBlocked += st.Value
		}
	}
	// With fewer clients than threads, a peer taking an item from the
	// queue wakes the next idle worker for nothing (SimpleQueue's lock):
	// a release, but by a peer idle at the same place (markPassedOn).
	poolAll, poolIdle := poolWaits(t, p)
	t.Logf("the handler's downstream waits %.3f s, %.1f%% blocked %v; the pool's waits for work %.3f s, %.1f%% idle",
		float64(downAll)/1e9, 100*float64(downBlocked)/float64(max(downAll, 1)), byCat, float64(poolAll)/1e9, 100*float64(poolIdle)/float64(max(poolAll, 1)))
	if downAll == 0 || float64(downBlocked) < 0.9*float64(downAll) {
		t.Errorf("the handler's downstream waits: %.1f%% blocked of %.3f s, want at least 90%%", 100*float64(downBlocked)/float64(max(downAll, 1)), float64(downAll)/1e9)
	}
	if poolAll == 0 || float64(poolIdle) < 0.9*float64(poolAll) {
		t.Errorf("the pool's waits for work: %.1f%% idle of %.3f s, want at least 90%%", 100*float64(poolIdle)/float64(max(poolAll, 1)), float64(poolAll)/1e9)
	}
}
