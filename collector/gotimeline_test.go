package collector

import (
	"slices"
	"sort"
	"strconv"
	"testing"
	"time"

	"golang.org/x/exp/trace"

	"github.com/offcpu/offcpu/schema"
)

// traceWait is a goroutine's wait as Go's execution tracer saw it: park,
// ready (by Waker, trace.NoGoroutine for the scheduler) and run.
type traceWait struct {
	park, ready, run int64
	waker            trace.GoID
}

// traceGoWaits reads each goroutine's waits from an execution trace, in
// order (times are CLOCK_MONOTONIC, as the recorder's).
func traceGoWaits(t *testing.T, path string) (map[int64][]traceWait, int64, int64) {
	t.Helper()
	open := map[trace.GoID]*traceWait{}
	out := map[int64][]traceWait{}
	var first, last int64
	eachGoTransition(t, path, func(ev *trace.Event, st trace.StateTransition, id trace.GoID, from, to trace.GoState) {
		at := int64(ev.Time())
		if first == 0 {
			first = at
		}
		last = at
		switch {
		case from == trace.GoRunning && to == trace.GoWaiting:
			open[id] = &traceWait{park: at, waker: trace.NoGoroutine}
		case (from == trace.GoRunning || from == trace.GoSyscall) && to == trace.GoRunnable: // requeued: ready at once
			open[id] = &traceWait{park: at, ready: at, waker: trace.NoGoroutine}
		case from == trace.GoWaiting && to == trace.GoRunnable:
			if w := open[id]; w != nil {
				w.ready, w.waker = at, ev.Goroutine()
			}
		case from == trace.GoRunnable && to == trace.GoRunning:
			if w := open[id]; w != nil && w.ready != 0 {
				w.run = at
				out[int64(id)] = append(out[int64(id)], *w)
				delete(open, id)
			}
		}
	})
	return out, first, last
}

// The goroutine timeline of a real server (Debian's Prometheus under
// queries) against Go's own execution trace of the same seconds: each
// goroutine wait of 1 ms or more the timeline holds inside the trace is
// the trace's (as long blocked and runnable), woken by the same goroutine,
// or by none (the scheduler) where the timeline names a thread.
func TestGoroutineTimelineMatchesTrace(t *testing.T) {
	requireBPF(t)
	srv, base := startPrometheus(t)
	stop := make(chan struct{})
	wait := queryLoad(4, stop, base+"/api/v1/query?query=up", base+"/metrics")
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wait()
	}()
	tl, tr, asked := timelineBesideTrace(t, srv.Process.Pid, base+"/debug/pprof/trace?seconds=6")
	truth, first, last := traceGoWaits(t, tr)
	if tl == nil || len(truth) == 0 {
		t.Fatalf("timeline %v, %d goroutines in the trace", tl != nil, len(truth))
	}
	// A trace by go1.21 or older (Debian 12's Prometheus: go1.19) counts
	// from its start, not on CLOCK_MONOTONIC.
	at := alignTrace(tl, truth, asked, first)
	first, last = at(first), at(last)
	for _, ws := range truth {
		for i := range ws {
			ws[i].park, ws[i].ready, ws[i].run = at(ws[i].park), at(ws[i].ready), at(ws[i].run)
		}
	}
	// Found: the park of the same goroutine nearest to the timeline's,
	// within 100 µs; agreeing: as long blocked (within 5% or 50 µs), as
	// long runnable (50 µs), woken by the same goroutine or by none.
	const tol = 100_000
	near := func(a, b int64) bool { return a-b <= tol && b-a <= tol }
	same := func(a, b int64) bool { return abs(a-b) <= max(abs(b)/20, 50_000) }
	var n, matched, agree int
	missing, differ := map[string]int{}, map[string]int{}
	for _, w := range tl.Waits {
		th := tl.Threads[w.Thread]
		if th.GoID == 0 || w.Open || w.Out <= tl.Start || w.Out < first || w.In > last || w.State == "preempted" {
			continue // a GC suspension: the tracer has no event for it
		}
		n++
		ws := truth[th.GoID]
		i := sort.Search(len(ws), func(i int) bool { return ws[i].park >= w.Out })
		if i > 0 && (i == len(ws) || w.Out-ws[i-1].park < ws[i].park-w.Out) {
			i--
		}
		if i == len(ws) || !near(ws[i].park, w.Out) {
			missing[w.State]++
			continue
		}
		matched++
		tw := ws[i]
		wakerOK := tw.waker == trace.NoGoroutine && (w.Waker < 0 || tl.Threads[w.Waker].GoID == 0) ||
			w.Waker >= 0 && tl.Threads[w.Waker].GoID == int64(tw.waker)
		blockedOK, runqOK := same(w.Wake-w.Out, tw.ready-tw.park), same(w.In-w.Wake, tw.run-tw.ready)
		switch {
		case !blockedOK:
			differ["blocked"]++
		case !runqOK:
			differ["runnable"]++
		case !wakerOK:
			differ["waker"]++
		}
		if blockedOK && runqOK && wakerOK {
			agree++
		} else if matched-agree < 5 || testing.Verbose() {
			t.Logf("goroutine %d: timeline %d..%d..%d woken by %v; trace %d..%d..%d by goroutine %d", th.GoID,
				w.Out, w.Wake, w.In, wakerName(tl, w.Waker), tw.park, tw.ready, tw.run, tw.waker)
		}
	}
	t.Logf("trace %d..%d, timeline %d..%d", first, last, tl.Start, tl.End)
	t.Logf("not found, by state: %v; found but differing: %v", missing, differ)
	t.Logf("%d goroutine waits inside the trace: %d found there, %d of them with the same wake-up, run and waker", n, matched, agree)
	if n < 100 || matched < n*9/10 || agree < matched*95/100 {
		t.Errorf("%d waits, %d found in the trace, %d agree: want 90%% found, 95%% of those agreeing", n, matched, agree)
	}
}

func wakerName(tl *schema.Timeline, i int32) string {
	if i < 0 {
		return "none"
	}
	th := tl.Threads[i]
	if th.GoID != 0 {
		return "goroutine " + strconv.FormatInt(th.GoID, 10)
	}
	return "thread " + strconv.FormatInt(th.TID, 10)
}

// timelineBesideTrace records pid's timeline (goroutines too) for 2 s
// inside an execution trace of 6 s it asks traceURL for; it returns the
// timeline, the trace's file and when it was asked (CLOCK_MONOTONIC).
func timelineBesideTrace(t *testing.T, pid int, traceURL string) (*schema.Timeline, string, int64) {
	t.Helper()
	time.Sleep(time.Second)
	s, tr, asked := recordInsideTrace(t, traceURL, Options{PIDs: []int{pid}, Goroutines: true, Stream: true}, 2*time.Second)
	return s.Profiles().Timeline, tr, int64(asked)
}

// alignTrace maps a trace's times onto the timeline's clock: itself for
// a trace on CLOCK_MONOTONIC (go1.22 on); else (counted from the trace's
// start, by the CPU's cycle counter) a line through two points, each the
// median distance from a wait of 1 ms or more to the one park of its
// goroutine in the trace, within 50 ms, that lasted as long (1%), over
// each half of those waits; the trace's start put at its request (asked)
// to begin with.
func alignTrace(tl *schema.Timeline, truth map[int64][]traceWait, asked, first int64) func(int64) int64 {
	if first > asked-int64(time.Hour) {
		return func(t int64) int64 { return t }
	}
	coarse := asked - first
	type pair struct{ at, d int64 }
	var pairs []pair
	for _, w := range tl.Waits {
		g, blocked := tl.Threads[w.Thread].GoID, w.Wake-w.Out
		if g == 0 || blocked < 1_000_000 {
			continue
		}
		at, n, d := w.Out-coarse, 0, int64(0)
		for _, x := range truth[g] {
			if abs(x.park-at) < 50_000_000 && abs(x.ready-x.park-blocked) <= max(blocked/100, 20_000) {
				n, d = n+1, x.park-at
			}
		}
		if n == 1 {
			pairs = append(pairs, pair{at + d, d})
		}
	}
	if len(pairs) < 2 {
		return func(t int64) int64 { return t + coarse }
	}
	sort.Slice(pairs, func(i, j int) bool { return pairs[i].at < pairs[j].at })
	median := func(ps []pair) (at, d float64) {
		ds := make([]int64, len(ps))
		for i, p := range ps {
			ds[i] = p.d
		}
		slices.Sort(ds)
		return float64(ps[len(ps)/2].at), float64(ds[len(ds)/2])
	}
	x1, d1 := median(pairs[:len(pairs)/2])
	x2, d2 := median(pairs[len(pairs)/2:])
	slope := (d2 - d1) / (x2 - x1)
	return func(t int64) int64 { return t + coarse - int64(d1+slope*(float64(t)-x1)) }
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
