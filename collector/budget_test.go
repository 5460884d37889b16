package collector

import (
	"context"
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/schema"
)

func TestCalibrate(t *testing.T) {
	d := &recording{oncpu: map[[2]uint32]cpuTotal{}}
	// Thread 1: three sampled records (estimates 300 µs, 100 µs, 200 µs of
	// 6 intervals) and one exact walked one; exactly 480 µs in 40 intervals
	// below the threshold.
	d.records = []record{
		{tgid: 1, tid: 1, state: StateSleeping, ns: 300e3, count: 3, runq: 30e3, sampled: true},
		{tgid: 1, tid: 1, state: StateSleeping, ns: 100e3, count: 1, sampled: true},
		{tgid: 1, tid: 1, state: StateSleeping, ns: 200e3, count: 2, sampled: true},
		{tgid: 1, tid: 1, state: StateSleeping, ns: 5e6, count: 1},
	}
	var t1 cpuTotal
	t1.tgid = 1
	t1.belowNs[StateSleeping], t1.belowN[StateSleeping] = 480e3, 40
	// Thread 2: preempted below the threshold, none drawn.
	var t2 cpuTotal
	t2.tgid = 1
	t2.belowNs[StatePreempted], t2.belowN[StatePreempted] = 70e3, 9
	d.oncpu[[2]uint32{1, 0}], d.oncpu[[2]uint32{2, 0}] = t1, t2

	dn, dns, drunq := d.calibrate()
	var ns, n uint64
	for _, r := range d.records[:3] {
		ns += r.ns
		n += r.count
	}
	if ns != 480e3 || n != 40 {
		t.Errorf("thread 1 below the threshold: %d ns in %d, want 480000 in 40", ns, n)
	}
	if r := d.records[0]; r.ns != 240e3 || r.runq != 24e3 {
		t.Errorf("scaled record: %d ns, runq %d; want 240000 and 24000", r.ns, r.runq)
	}
	if d.records[3].ns != 5e6 || d.records[3].count != 1 {
		t.Errorf("a walked interval above the threshold changed: %+v", d.records[3])
	}
	if len(d.records) != 5 {
		t.Fatalf("%d records, want a marker added for thread 2", len(d.records))
	}
	m := d.records[4]
	if m.tid != 2 || m.ns != 70e3 || m.count != 9 || m.runq != 70e3 || m.userErr != errNotWalked || m.state != StatePreempted {
		t.Errorf("marker record: %+v", m)
	}
	if dn != 40-6+9 || dns != time.Duration(480e3-600e3+70e3) || drunq != time.Duration(24e3-30e3+70e3) {
		t.Errorf("changes: %d intervals, %v, runq %v", dn, dns, drunq)
	}
}

// TestWalkThreshold records one program twice at once, every interval
// walked and with a walk threshold, and holds the second to the first:
// the same time per thread, the same long waits with their stacks, and
// each stack's time within the estimator's bound.
func TestWalkThreshold(t *testing.T) {
	requireBPF(t)
	const naps = 150
	thr := 200 * time.Microsecond
	cmd, all, some := startMix(t, naps, Options{WalkThreshold: thr})
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	pa, errA := all.Stop()
	ps, errS := some.Stop()
	if errA != nil || errS != nil {
		t.Fatal(errA, errS)
	}
	b := some.Stats().Budget
	if b == nil || b.Below == 0 || b.Walked == 0 || b.Walked*4 > b.Below {
		t.Fatalf("below-threshold intervals and walks: %+v", b)
	}
	if b.Missed > b.Walked/100 {
		t.Errorf("%d of %d walks did not run", b.Missed, b.Walked)
	}
	t.Logf("threshold %v: %d intervals below it (%v), %d walked; 2σ of their estimate %v", thr, b.Below, b.BelowTime, b.Walked, 2*b.StdDev)

	// Off-CPU time by thread (exact in both), and by stack.
	ta, ts := offByThread(pa), offByThread(ps)
	var total int64
	for tid, v := range ta {
		total += v
		if d := math.Abs(float64(ts[tid] - v)); d > 0.01*float64(v)+float64(time.Millisecond) {
			t.Errorf("thread %d: %v with the threshold, %v with every interval walked", tid, time.Duration(ts[tid]), time.Duration(v))
		}
	}
	byStack := func(p *profile.Profile) map[string]int64 {
		ns := map[string]int64{}
		for _, s := range p.Sample {
			if offCPUInWindow(s) {
				ns[schema.FoldedSample(s)] += s.Value[0]
			}
		}
		return ns
	}
	sa, ss := byStack(pa), byStack(ps)
	checked, napsSeen, worst := 0, false, 0.0
	for k, v := range sa {
		if float64(v) < 0.05*float64(total) {
			continue
		}
		checked++
		worst = max(worst, math.Abs(float64(ss[k]-v))/float64(v))
		// σ of a stack's estimate is at most sqrt(threshold × its time).
		bound := 5*math.Sqrt(float64(thr)*float64(v)) + 0.01*float64(v)
		if d := math.Abs(float64(ss[k] - v)); d > bound {
			t.Errorf("%s: %v estimated, %v walked every time (bound %v)", k, time.Duration(ss[k]), time.Duration(v), time.Duration(bound))
		}
	}
	// Every 2 ms nap with its stack, but for a walk the kernel skipped
	// (a program already running on that CPU: counted as missed). Only
	// the sleeps: a preemption inside long_naps is below the threshold
	// and estimated, not walked (CI saw 2 such).
	naps2ms := func(p *profile.Profile) (n int64) {
		for _, s := range p.Sample {
			if offCPUInWindow(s) && stackHas(s, "long_naps") && s.Label[schema.LabelState][0] == "sleeping" {
				n += s.Value[1]
			}
		}
		return n
	}
	napsAll, napsSome := naps2ms(pa), naps2ms(ps)
	napsSeen = napsAll >= naps
	// One nap short, with no walk missed, was seen in 2 of about 20 -race
	// runs (not yet explained): tolerated and logged, more is an error.
	if napsSome+int64(b.Missed)+1 == napsAll {
		t.Logf("2 ms naps: %d with the threshold, %d with every interval walked: one short", napsSome, napsAll)
	} else if napsSome > napsAll || napsSome+int64(b.Missed) < napsAll {
		t.Errorf("2 ms naps: %d with the threshold (%d walks missed), %d with every interval walked", napsSome, b.Missed, napsAll)
		for _, p := range []*profile.Profile{pa, ps} {
			for _, smp := range p.Sample {
				if offCPUInWindow(smp) && stackHas(smp, "napper") {
					t.Logf("%v %d %v %s", time.Duration(smp.Value[0]), smp.Value[1], smp.Label, schema.FoldedSample(smp))
				}
			}
			t.Log("--")
		}
	}
	t.Logf("%d stacks with 5%% of the time or more: the worst estimate %.2f%% off", checked, 100*worst)
	if checked < 2 || !napsSeen {
		t.Errorf("%d stacks with 5%% of the time, naps seen %v: the workload did not run as meant", checked, napsSeen)
	}
}

// startMix starts testdata/budget/mix.c with its rounds and naps, and two
// sessions on it, every interval walked and with opts, then lets it run.
func startMix(t *testing.T, naps int, opts Options) (*exec.Cmd, *Session, *Session) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "mix")
	runBuild(t, "gcc", "-O2", "-g", "-fno-omit-frame-pointer", "-pthread", "-o", bin, "testdata/budget/mix.c")
	cmd := exec.Command(bin, "60000", fmt.Sprint(naps))
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	pid := []int{cmd.Process.Pid}
	all, err := Start(context.Background(), Options{PIDs: pid, FollowForks: true})
	if err != nil {
		t.Fatal(err)
	}
	opts.PIDs, opts.FollowForks = pid, true
	some, err := Start(context.Background(), opts)
	if err != nil {
		all.Stop()
		t.Fatal(err)
	}
	in.Write([]byte{1})
	return cmd, all, some
}

// offByThread is the off-CPU time by tid inside the window.
func offByThread(p *profile.Profile) map[int64]int64 {
	m := map[int64]int64{}
	for _, s := range p.Sample {
		if len(s.NumLabel[schema.LabelTID]) > 0 && offCPUInWindow(s) {
			m[s.NumLabel[schema.LabelTID][0]] += s.Value[0]
		}
	}
	return m
}

// A continuous recording with a walk threshold, cut every 300 ms: each
// thread's time over the intervals is the exhaustive recording's, and
// each interval says what its estimate rests on. The workload naps 1.2 s
// at least: a cut under -race on a loaded machine can take a tick's time.
func TestWalkThresholdContinuous(t *testing.T) {
	requireBPF(t)
	cmd, all, some := startMix(t, 600, Options{WalkThreshold: 200 * time.Microsecond, Continuous: true})
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var ivs []*Interval
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for waiting := true; waiting; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			waiting = false
		case <-tick.C:
			iv, err := some.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			ivs = append(ivs, iv)
		}
	}
	pa, err := all.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := some.Stop(); err != nil {
		t.Fatal(err)
	}
	ivs = append(ivs, some.FinalInterval())
	sum := map[int64]int64{}
	var below, walked uint64
	for _, iv := range ivs {
		if iv.Stats.Budget == nil {
			t.Fatalf("interval %d: no walk statistics", iv.Seq)
		}
		below += iv.Stats.Budget.Below
		walked += iv.Stats.Budget.Walked
		for tid, v := range offByThread(iv.Profile) {
			sum[tid] += v
		}
	}
	if len(ivs) < 3 || below == 0 || walked == 0 || walked*4 > below {
		t.Fatalf("%d intervals, %d below the threshold, %d walked", len(ivs), below, walked)
	}
	for tid, v := range offByThread(pa) {
		if d := math.Abs(float64(sum[tid] - v)); d > 0.01*float64(v)+float64(time.Millisecond) {
			t.Errorf("thread %d: %v over %d intervals, %v in one exhaustive recording", tid, time.Duration(sum[tid]), len(ivs), time.Duration(v))
		}
	}
	t.Logf("%d intervals, %d intervals below the threshold, %d walked, %d threads", len(ivs), below, walked, len(sum))
}

// offCPUInWindow: an off-CPU sample that began after the recording did
// (the two sessions start some time apart; the workload waits for both).
func offCPUInWindow(s *profile.Sample) bool {
	return s.Label[schema.LabelState][0] != "on-cpu" && len(s.Label[schema.LabelInterval]) == 0
}

// With deferred walks the wake-ups not drawn are counted on the woken
// thread and moved to the wake-up map at a waker change, the thread's exit,
// a cut and the end: each thread's wake-ups, and each waker's, are the same
// number as in a recording of the same window that counts every one as it
// happens. The ping-pong's main thread is still blocked when the
// recordings stop (its counts move at the end or at the cut).
func TestWalkThresholdWakeCounts(t *testing.T) {
	requireBPF(t)
	bin := filepath.Join(t.TempDir(), "mix")
	runBuild(t, "gcc", "-O2", "-g", "-pthread", "-o", bin, "testdata/budget/mix.c")
	cmd := exec.Command("taskset", "-c", "0", bin, "20000", "20", "0", "1")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	ss := startOn(t, cmd.Process.Pid, Options{}, Options{WalkThreshold: 100 * time.Microsecond},
		Options{Continuous: true, WalkThreshold: DefaultContinuousWalkThreshold})
	for _, s := range ss {
		defer s.Stop()
	}
	in.Write([]byte{1})
	if _, err := out.Read(make([]byte, 5)); err != nil { // "done": blocked now
		t.Fatal(err)
	}
	type pair struct{ target, waker string }
	add := func(m map[pair]int64, p *profile.Profile) {
		for _, smp := range p.Sample {
			k := pair{fmt.Sprint(smp.NumLabel[schema.LabelTargetTID]), fmt.Sprint(smp.Label[schema.LabelThread], smp.NumLabel[schema.LabelTID])}
			m[k] += smp.Value[0]
		}
	}
	counts := make([]map[pair]int64, len(ss))
	for i, s := range ss {
		counts[i] = map[pair]int64{}
		if s.cont != nil {
			iv, err := s.Snapshot() // the cut moves the blocked main thread's count
			if err != nil {
				t.Fatal(err)
			}
			add(counts[i], iv.Wakeups)
		}
		if _, err := s.Stop(); err != nil {
			t.Fatal(err)
		}
		if s.cont != nil {
			// Every wake-up came before the cut: it has them all.
			final := map[pair]int64{}
			add(final, s.FinalInterval().Wakeups)
			for k, n := range final {
				t.Errorf("continuous: thread %s woken by %s %d times after the cut, while blocked", k.target, k.waker, n)
			}
		} else {
			add(counts[i], s.Profiles().Wakeups)
		}
	}
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	every := counts[0]
	var total int64
	for _, n := range every {
		total += n
	}
	for i, name := range []string{1: "deferred walks", 2: "continuous (deferred walks, a cut)"} {
		if i == 0 {
			continue
		}
		for k, n := range every {
			if counts[i][k] != n {
				t.Errorf("%s: thread %s woken by %s %d times, %d counted as they happened", name, k.target, k.waker, counts[i][k], n)
			}
		}
		for k, n := range counts[i] {
			if _, ok := every[k]; !ok {
				t.Errorf("%s: thread %s woken by %s %d times, never as they happened", name, k.target, k.waker, n)
			}
		}
	}
	var skipped int64
	if b := ss[1].Stats().Budget; b != nil {
		skipped = int64(b.WakersSkipped)
	}
	t.Logf("%d wake-ups in %d pairs; %d not drawn", total, len(every), skipped)
	if total < 20000 || skipped < total/2 {
		t.Errorf("%d wake-ups, %d of them not drawn: want one a round of the ping-pong's 20,000 at least, most not drawn", total, skipped)
	}
}

// startOn starts a session for each of opts on process pid and its
// children, at once, so that they record the same window.
func startOn(tb testing.TB, pid int, opts ...Options) []*Session {
	tb.Helper()
	var ss []*Session
	for _, o := range opts {
		o.PIDs, o.FollowForks = []int{pid}, true
		s, err := Start(context.Background(), o)
		if err != nil {
			tb.Fatal(err)
		}
		ss = append(ss, s)
	}
	return ss
}
