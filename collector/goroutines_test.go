package collector

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
	"golang.org/x/exp/trace"

	"github.com/offcpu/offcpu/schema"
)

// The runtime's offsets for the toolchain that builds this project are in
// the table, and equal to its DWARF: what a stripped binary of that
// release is read with.
func TestGoOffsetsTable(t *testing.T) {
	dir := t.TempDir()
	withDWARF, without := filepath.Join(dir, "with"), filepath.Join(dir, "without")
	build(t, "go", "build", "-o", withDWARF, "./testdata/goroutines")
	build(t, "go", "build", "-ldflags=-s -w", "-o", without, "./testdata/goroutines")
	a, err := readGoRuntime(withDWARF)
	if err != nil {
		t.Fatal(err)
	}
	b, err := readGoRuntime(without)
	if err != nil {
		t.Fatalf("stripped: %v", err)
	}
	if !a.fromDWARF || b.fromDWARF {
		t.Fatalf("DWARF read %v for the plain build, %v for the stripped one", a.fromDWARF, b.fromDWARF)
	}
	if a.offsets != b.offsets {
		t.Errorf("%s: table %+v, DWARF %+v", a.version, b.offsets, a.offsets)
	}
	if a.casgstatus == 0 || a.casgstatus != b.casgstatus {
		t.Errorf("runtime.casgstatus at %#x (symbols), %#x (pclntab)", a.casgstatus, b.casgstatus)
	}
	for _, rt := range []*goRuntime{a, b} {
		if len(rt.reasons) < 20 || rt.reasons[2] != "IO wait" || !contains(rt.reasons, "chan receive") {
			t.Errorf("wait reasons %q", rt.reasons)
		}
	}
	if _, err := readGoRuntime("/bin/sh"); err != errNotGo {
		t.Errorf("/bin/sh: %v, want errNotGo", err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// goWaitKey is a wait's innermost function of package main and the class
// of its reason.
type goWaitKey struct{ fn, class string }

// traceReasonClass maps the execution trace's block reasons onto
// GoReasonClass's classes.
func traceReasonClass(r string) string {
	switch {
	case strings.HasPrefix(r, "chan "):
		return "chan"
	case r == "select":
		return "select"
	case strings.HasPrefix(r, "sync"):
		return "sync"
	case r == "network":
		return "network"
	case r == "sleep":
		return "sleep"
	case strings.Contains(strings.ToLower(r), "gc"):
		return "gc"
	}
	return "other"
}

// traceWaits sums, from an execution trace, the time goroutines spent
// waiting (from their block to being made runnable) by goWaitKey.
func traceWaits(t *testing.T, path string) (map[goWaitKey]int64, map[[2]int64]int64) {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := trace.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	type open struct {
		at  trace.Time
		key goWaitKey
	}
	blocked := map[trace.GoID]open{}
	out := map[goWaitKey]int64{}
	wakes := map[[2]int64]int64{} // (goroutine, the goroutine that made it runnable; 0: none) -> count
	for {
		ev, err := r.ReadEvent()
		if err != nil {
			break
		}
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		id := st.Resource.Goroutine()
		from, to := st.Goroutine()
		switch {
		case from == trace.GoRunning && to == trace.GoWaiting:
			fn := ""
			for fr := range st.Stack.Frames() {
				if strings.HasPrefix(fr.Func, "main.") {
					fn = fr.Func
					break
				}
			}
			blocked[id] = open{ev.Time(), goWaitKey{fn, traceReasonClass(st.Reason)}}
		case from == trace.GoWaiting:
			if o, ok := blocked[id]; ok {
				out[o.key] += int64(ev.Time() - o.at)
				delete(blocked, id)
				waker := int64(ev.Goroutine())
				if ev.Goroutine() == trace.NoGoroutine {
					waker = 0
				}
				wakes[[2]int64{int64(id), waker}]++
			}
		}
	}
	return out, wakes
}

// offcpuWaits sums the goroutine profile's blocked time by goWaitKey.
func offcpuWaits(p *profile.Profile) map[goWaitKey]int64 {
	out := map[goWaitKey]int64{}
	for _, s := range p.Sample {
		fn := ""
	find:
		for _, l := range s.Location {
			for _, ln := range l.Line {
				if strings.HasPrefix(ln.Function.Name, "main.") {
					fn = ln.Function.Name
					break find
				}
			}
		}
		out[goWaitKey{fn, GoReasonClass(s.Label[schema.LabelReason][0])}] += s.Value[0]
	}
	return out
}

// A Go program waits in every common way with the runtime's execution
// trace on: the goroutine waits recorded from outside match the trace's,
// per innermost function and reason, within 5%.
func TestGoroutineWaitsMatchTrace(t *testing.T) {
	requireBPF(t)
	dir := t.TempDir()
	bin, tr := filepath.Join(dir, "goroutines"), filepath.Join(dir, "trace.out")
	build(t, "go", "build", "-o", bin, "./testdata/goroutines")
	s, err := Start(context.Background(), Options{TargetsOnly: true, NoWakeups: true, Goroutines: true})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	cmd := exec.Command(bin, tr, "1500ms")
	cmd.Stderr = os.Stderr
	if err := s.StartCommand(cmd); err != nil {
		s.Stop()
		t.Fatal(err)
	}
	runErr := cmd.Wait()
	if _, err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if runErr != nil {
		t.Fatalf("the program: %v", runErr)
	}
	gp := s.Goroutines()
	if gp == nil {
		t.Fatal("no goroutine profile")
	}
	st := s.Stats().Goroutines
	t.Logf("goroutine stats %+v", *st)
	if st.Processes != 1 || st.LostParks+st.LostWaits+st.LostStack != 0 {
		t.Errorf("processes %d, lost %d/%d/%d", st.Processes, st.LostParks, st.LostWaits, st.LostStack)
	}
	want, wakes := traceWaits(t, tr)
	wakers := offcpuWakers(gp)
	got := offcpuWaits(gp)
	var total int64
	for _, v := range want {
		total += v
	}
	var keys []goWaitKey
	for k := range want {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return want[keys[i]] > want[keys[j]] })
	compared := 0
	for _, k := range keys {
		w, g := want[k], got[k]
		diff := float64(g-w) / float64(w)
		t.Logf("%-24s %-8s trace %8.2f ms  offcpu %8.2f ms  %+6.2f%%", k.fn, k.class, float64(w)/1e6, float64(g)/1e6, 100*diff)
		if k.fn == "" || float64(w) < 0.01*float64(total) {
			continue // runtime goroutines, and what is too small to hold to 5%
		}
		compared++
		if diff > 0.05 || diff < -0.05 {
			t.Errorf("%s (%s): offcpu %.2f ms, trace %.2f ms: off by %+.1f%%", k.fn, k.class, float64(g)/1e6, float64(w)/1e6, 100*diff)
		}
	}
	if compared < 8 {
		t.Errorf("%d kinds of wait compared, want every kind the program has (8 or more)", compared)
	}
	// Who made each goroutine runnable: the same goroutine as the trace's
	// unblocking one, or like it none (network poller, timers).
	var all, same int64
	for k, n := range wakes {
		all += n
		same += min(n, wakers[k])
	}
	if all == 0 || float64(same) < 0.95*float64(all) {
		t.Errorf("the waker matches the trace's for %d of %d wake-ups, want ≥ 95%%", same, all)
	}
	t.Logf("trace: %d wake-ups, %.1f ms blocked; waker as in the trace for %.2f%%", all, float64(total)/1e6, 100*float64(same)/float64(max(all, 1)))
}

// offcpuWakers counts the goroutine profile's waits by (goroutine, waker).
func offcpuWakers(p *profile.Profile) map[[2]int64]int64 {
	out := map[[2]int64]int64{}
	for _, s := range p.Sample {
		out[[2]int64{s.NumLabel[schema.LabelGoid][0], s.NumLabel[schema.LabelWakerGoid][0]}] += s.Value[2]
	}
	return out
}
