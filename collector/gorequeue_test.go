package collector

import (
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"golang.org/x/exp/trace"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/collector/goroutines"
	"github.com/offcpu/offcpu/internal/testenv"
	"github.com/offcpu/offcpu/runtimes/golang"
	"github.com/offcpu/offcpu/schema"
)

// On one P, goroutines preempted, yielding and back from a system call
// without their P wait for it without parking: each one's time waiting
// for the P (its "runnable" waits) matches the execution trace's time
// runnable after running or a system call, within 5%. Built with the
// building toolchain (exitsyscallNoP: running -> runnable) and Debian's
// Go 1.19 (exitsyscall0: in a system call -> runnable).
func TestGoroutineRequeuesMatchTrace(t *testing.T) {
	requireBPF(t)
	tools := map[string]string{"current": "go"}
	if haveGo119(t) {
		tools["go1.19"] = go119Bin
	}
	for name, gobin := range tools {
		t.Run(name, func(t *testing.T) {
			bin := buildGoTestdata(t, "gorequeue", gobin)
			tr := filepath.Join(t.TempDir(), "trace.out")
			checkRequeues(t, recordGoCommand(t, bin, tr, "1s"), tr)
		})
	}
}

func checkRequeues(t *testing.T, s *Session, tr string) {
	gp := s.Profiles().Goroutines
	if gp == nil {
		t.Fatal("no goroutine profile")
	}
	st := s.Stats().Goroutines
	t.Logf("goroutine stats %+v", *st)
	if st.Requeues == 0 || st.LostParks+st.LostWaits+st.LostStack != 0 {
		t.Errorf("requeues %d (want some), lost %d/%d/%d", st.Requeues, st.LostParks, st.LostWaits, st.LostStack)
	}
	want, created := traceRequeues(t, tr)
	got, fnOf := offcpuRequeues(gp)
	// The probe stamps a goroutine runnable as its status changes, the
	// tracer a few calls later on a system call's way out: a thread
	// preempted in between counts for offcpu, not for the trace. Logged
	// for when main.syscaller disagrees (+8.2% once in a 6.1 guest; 1.6 to
	// 28 ms preempted there in 6 runs that agreed within 1.1%).
	exitRunq := preemptedUnder(s.Profiles().OffCPU, "runtime.exitsyscall")
	t.Logf("threads preempted on a system call's way out: %.2f ms", float64(exitRunq)/1e6)
	compared := map[string]bool{}
	for goid, w := range want {
		fn := fnOf[goid]
		if !created[goid] || !strings.HasPrefix(fn, "main.") || strings.HasPrefix(fn, "main.main") {
			continue
		}
		g := got[goid]
		diff := float64(g-w) / float64(max(w, 1))
		t.Logf("goroutine %d %-16s trace %8.2f ms runnable  offcpu %8.2f ms  %+6.2f%%", goid, fn, float64(w)/1e6, float64(g)/1e6, 100*diff)
		if w < int64(20*time.Millisecond) || diff > 0.05 || diff < -0.05 {
			t.Errorf("goroutine %d (%s): offcpu %.2f ms waiting for a P, trace %.2f ms: off by %+.1f%%", goid, fn, float64(g)/1e6, float64(w)/1e6, 100*diff)
		}
		compared[fn] = true
	}
	for _, fn := range []string{"main.spinA", "main.spinB", "main.yielder", "main.syscaller"} {
		if !compared[fn] {
			t.Errorf("%s: no wait for a P compared (offcpu's goroutines %v)", fn, fnOf)
		}
	}
	// Analyzed, it is waiting for a CPU, none of it blocked.
	d := loadRecorded(t, gp)
	for i := range d.Stacks {
		if st := &d.Stacks[i]; st.Reason == golang.ReasonRunnable && !st.WaitsForCPU() {
			t.Errorf("a runnable wait analyzed as blocked: %v in state %q", time.Duration(st.Value), st.State)
		}
	}
}

// preemptedUnder sums a profile's run-queue waits (state preempted) under
// a function whose name begins with prefix.
func preemptedUnder(p *profile.Profile, prefix string) int64 {
	var sum int64
	for _, smp := range p.Sample {
		if st := smp.Label[schema.LabelState]; len(st) == 0 || st[0] != "preempted" {
			continue
		}
	find:
		for _, l := range smp.Location {
			for _, ln := range l.Line {
				if strings.HasPrefix(ln.Function.Name, prefix) {
					sum += smp.Value[0]
					break find
				}
			}
		}
	}
	return sum
}

// traceRequeues sums, by goroutine, an execution trace's time runnable
// after running (preempted, yielded) or a system call (its P lost), and
// says which goroutines the trace saw created.
func traceRequeues(t *testing.T, path string) (runnable map[int64]int64, created map[int64]bool) {
	runnable, created = map[int64]int64{}, map[int64]bool{}
	since := map[trace.GoID]trace.Time{}
	eachGoTransition(t, path, func(ev *trace.Event, st trace.StateTransition, id trace.GoID, from, to trace.GoState) {
		switch {
		case from == trace.GoNotExist && to == trace.GoRunnable:
			created[int64(id)] = true
		case (from == trace.GoRunning || from == trace.GoSyscall) && to == trace.GoRunnable:
			since[id] = ev.Time()
		case from == trace.GoRunnable && to == trace.GoRunning:
			if at, ok := since[id]; ok {
				runnable[int64(id)] += int64(ev.Time() - at)
				delete(since, id)
			}
		}
	})
	return runnable, created
}

// offcpuRequeues sums the goroutine profile's runnable waits by
// goroutine, and names each goroutine by the innermost main. function
// that holds most of its waits (preempted before its first call, a
// goroutine is in its go statement's closure).
func offcpuRequeues(p *profile.Profile) (runq map[int64]int64, fnOf map[int64]string) {
	runq, fnOf = map[int64]int64{}, map[int64]string{}
	byFn := map[int64]map[string]int64{}
	for _, s := range p.Sample {
		goid := s.NumLabel[schema.LabelGoid][0]
		if byFn[goid] == nil {
			byFn[goid] = map[string]int64{}
		}
	find:
		for _, l := range s.Location {
			for _, ln := range l.Line {
				if strings.HasPrefix(ln.Function.Name, "main.") {
					byFn[goid][ln.Function.Name] += s.Value[0] + s.Value[1]
					break find
				}
			}
		}
		if s.Label[schema.LabelReason][0] == golang.ReasonRunnable {
			runq[goid] += s.Value[1]
		}
	}
	for goid, fns := range byFn {
		for fn, ns := range fns {
			if fnOf[goid] == "" || ns > fns[fnOf[goid]] {
				fnOf[goid] = fn
			}
		}
	}
	return runq, fnOf
}

// With a collection in a loop on two Ps, the collector suspends running
// goroutines to scan their stacks (runtime.preemptPark): each one's
// time suspended until it ran again (offcpu's waits of reason
// "preempted") matches the execution trace's (running -> waiting,
// "preempted", up to running) in count and within 10% and 0.5 ms (5 ms a
// suspension emulated), for every goroutine suspended (6 to 9 for each
// spinner here, 0.08 ms apart at most).
func TestGoroutineSuspensionsMatchTrace(t *testing.T) {
	requireBPF(t)
	bin := buildGoTestdata(t, "gorequeue", "go")
	tr := filepath.Join(t.TempDir(), "trace.out")
	s := recordGoCommand(t, bin, tr, "2s", "gc")
	gp := s.Profiles().Goroutines
	st := s.Stats().Goroutines
	t.Logf("goroutine stats %+v", *st)
	if st.Suspends == 0 || st.LostParks+st.LostWaits+st.LostStack != 0 {
		t.Fatalf("suspends %d (want some), lost %d/%d/%d", st.Suspends, st.LostParks, st.LostWaits, st.LostStack)
	}
	want, wantN := traceSuspensions(t, tr)
	got, gotN, fnOf := offcpuSuspensions(gp)
	// Every goroutine suspended, by either: on one emulated CPU the
	// spinners were never caught running (the 6.1 guest's five went to
	// others).
	goids := map[int64]bool{}
	for goid := range wantN {
		goids[goid] = true
	}
	for goid := range gotN {
		goids[goid] = true
	}
	// One emulated CPU may preempt a thread between the probe's stamp and
	// the tracer's: -3.3 to +0.7 ms a suspension in a 6.1 guest.
	var total int64
	for goid := range goids {
		g, w, gn, wn := got[goid], want[goid], gotN[goid], wantN[goid]
		t.Logf("goroutine %d %-16s trace %8.3f ms suspended in %d  offcpu %8.3f ms in %d", goid, fnOf[goid], float64(w)/1e6, wn, float64(g)/1e6, gn)
		slack := 5e5
		if testenv.Scale() > 1 {
			slack = 5e6 * float64(wn)
		}
		if math.Abs(float64(g-w)) > 0.1*float64(w)+slack || gn != wn {
			t.Errorf("goroutine %d (%s): offcpu %.3f ms suspended by the GC in %d, trace %.3f ms in %d", goid, fnOf[goid], float64(g)/1e6, gn, float64(w)/1e6, wn)
		}
		total += wn
	}
	// Here 12 to 17 in all; one emulated CPU (a 6.1 guest) caught 5.
	least := int64(3)
	if testenv.Scale() > 1 {
		least = 1
	}
	if total < least {
		t.Errorf("%d suspensions in the trace: too few to compare", total)
	}
	// Analyzed, it is the GC's: blocked, category gc.
	r, err := analysis.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	d := loadRecorded(t, gp)
	analysis.Analyze(d, r, analysis.Options{})
	for i := range d.Stacks {
		st := &d.Stacks[i]
		if st.Reason != "preempted" || st.WaitsForCPU() {
			continue
		}
		if cat := r.Categorize(st)[0]; cat != "gc" || goroutines.ReasonClass(st.Reason) != "gc" {
			t.Errorf("a GC suspension of %v: category %q, class %q", time.Duration(st.Value), cat, goroutines.ReasonClass(st.Reason))
		}
	}
}

// traceSuspensions sums and counts, by goroutine, an execution trace's
// time from a park of reason "preempted" (the collector's suspension)
// until it runs.
func traceSuspensions(t *testing.T, path string) (ns, n map[int64]int64) {
	ns, n = map[int64]int64{}, map[int64]int64{}
	since := map[trace.GoID]trace.Time{}
	eachGoTransition(t, path, func(ev *trace.Event, st trace.StateTransition, id trace.GoID, from, to trace.GoState) {
		switch {
		case from == trace.GoRunning && to == trace.GoWaiting && st.Reason == "preempted":
			since[id] = ev.Time()
		case to == trace.GoRunning:
			if at, ok := since[id]; ok {
				ns[int64(id)] += int64(ev.Time() - at)
				n[int64(id)]++
				delete(since, id)
			}
		}
	})
	return ns, n
}

// offcpuSuspensions sums and counts the goroutine profile's waits of
// reason "preempted" by goroutine, named as offcpuRequeues names them.
func offcpuSuspensions(p *profile.Profile) (ns, n map[int64]int64, fnOf map[int64]string) {
	ns, n = map[int64]int64{}, map[int64]int64{}
	for _, s := range p.Sample {
		if s.Label[schema.LabelReason][0] == "preempted" {
			g := s.NumLabel[schema.LabelGoid][0]
			ns[g] += s.Value[0] + s.Value[1]
			n[g] += s.Value[2]
		}
	}
	_, fnOf = offcpuRequeues(p)
	return ns, n, fnOf
}
