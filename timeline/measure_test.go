package timeline

import (
	"fmt"
	"io"
	"math/rand"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"testing"
	"time"

	"github.com/offcpu/offcpu/schema"
)

// busyTimeline is n waits of a busy node: pairs of threads in 4 processes
// ping-ponging over futexes and pipes (each wait woken by its partner),
// with preemptions, timer wake-ups by an interrupt, open waits at the end,
// requests (a span of 25 waits of a pair, 2 in 3 with one) and 300 stacks 12 to 40
// frames deep, kernel under user, some of a JVM.
func busyTimeline(n, threads int) *schema.Timeline {
	r := rand.New(rand.NewSource(int64(n)))
	const start = 20 * 86400 * 1e9 // 20 days up, in CLOCK_MONOTONIC ns
	tl := &schema.Timeline{Start: start, Lost: 7}
	for i := range threads {
		pid := int64(1000 + 100*(i%4))
		tl.Threads = append(tl.Threads, schema.TimelineThread{PID: pid, TID: pid + int64(i) + 1,
			Process: "svc-" + strconv.Itoa(i%4), Name: "worker-" + strconv.Itoa(i)})
	}
	tl.Stacks = append(tl.Stacks, nil)
	for s := range 300 {
		var st []schema.Frame
		depth := 12 + r.Intn(29)
		for d := range depth {
			f := schema.Frame{Name: fmt.Sprintf("pkg%d.func%d", s%37, d*7+s%11), Module: "/usr/bin/svc"}
			switch {
			case d >= depth-6:
				f = schema.Frame{Name: fmt.Sprintf("kfunc_%d", (s+d)%60), Module: "vmlinux", Kernel: true}
			case s%5 == 0 && d < depth/2:
				f = schema.Frame{Name: fmt.Sprintf("com.example.C%d.m%d", s%13, d), Module: "[java]", Runtime: "jvm"}
			}
			st = append(st, f)
		}
		tl.Stacks = append(tl.Stacks, st)
	}
	states := []string{"sleeping", "sleeping", "sleeping", "uninterruptible"}
	classes := []string{"futex", "pipe/socket", "futex", "epoll"}
	now, pairWaits := make([]int64, threads), make([]int, threads/2+1)
	for i := range now {
		now[i] = start + int64(r.Intn(1000))
	}
	for i := range n {
		th := r.Intn(threads)
		partner := th ^ 1
		out := now[th] + int64(2000+r.Intn(50000))
		w := schema.Wait{Thread: int32(th), Out: out, Stack: int32(1 + r.Intn(300)), Waker: -1}
		switch k := r.Intn(20); {
		case k == 0: // preempted
			w.State, w.Wake = "preempted", out
		case k == 1: // a timer, an interrupt's
			w.State, w.Class, w.IRQ, w.Wake = "sleeping", "timer", true, out+int64(r.Intn(1e6))
		default:
			w.State, w.Class = states[k%4], classes[k%4]
			w.Wake, w.Waker, w.WakerStack = out+int64(1000+r.Intn(200000)), int32(partner), int32(1+r.Intn(300))
		}
		w.In = w.Wake + int64(r.Intn(30000))
		k := pairWaits[th/2] / 25
		pairWaits[th/2]++
		if span := k % 3; span != 0 {
			id := strconv.Itoa(k*threads + th/2)
			w.Labels = map[string]string{schema.LabelTraceID: "t" + id, schema.LabelSpanID: "s" + id,
				"span_name": "GET /api/" + strconv.Itoa(span)}
		}
		if i%97 == 0 {
			w.Category = "lock contention"
		}
		now[th] = w.In
		tl.Waits = append(tl.Waits, w)
	}
	tl.Sort()
	for i := range tl.Waits {
		tl.End = max(tl.End, tl.Waits[i].In)
	}
	for th := range min(threads, 2) { // open at the end
		tl.Waits = append(tl.Waits, schema.Wait{Thread: int32(th), Out: tl.End, Wake: tl.End, In: tl.End,
			State: "sleeping", Stack: 1, Waker: -1, Open: true})
	}
	return tl
}

// countingWriter counts what is written and keeps none of it.
type countingWriter struct{ n int64 }

func (c *countingWriter) Write(b []byte) (int, error) { c.n += int64(len(b)); return len(b), nil }

// peakHeap runs fn while sampling the heap every millisecond: the peak of
// the bytes of heap objects (live and garbage not yet collected) above the
// level before fn; with live, instead, every 25 ms a GC's live heap.
func peakHeap(live bool, fn func()) (peak uint64) {
	metric, every := "/memory/classes/heap/objects:bytes", time.Millisecond
	if live {
		metric, every = "/gc/heap/live:bytes", 25*time.Millisecond
	}
	read := func() uint64 {
		if live {
			runtime.GC()
		}
		s := []metrics.Sample{{Name: metric}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	runtime.GC()
	base := read()
	stop, done := make(chan bool), make(chan bool)
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				v := read()
				peak = max(peak, v-min(base, v))
			}
		}
	}()
	fn()
	close(stop)
	<-done
	return peak
}

// TestMeasure reports, for WritePerfetto and WriteJSON on busyTimeline of
// 100,000 and 500,000 waits over 16 threads, bytes written, allocations
// and bytes allocated per wait, and the peak heap while writing: of all
// heap objects (GOGC as set), and live (a GC every 25 ms, a second run).
// Only with OFFCPU_MEASURE=1: it takes a while.
func TestMeasure(t *testing.T) {
	if os.Getenv("OFFCPU_MEASURE") != "1" {
		t.Skip("set OFFCPU_MEASURE=1")
	}
	writers := map[string]func(io.Writer, *schema.Timeline) error{
		"perfetto": func(w io.Writer, tl *schema.Timeline) error { return WritePerfetto(w, tl, Options{}) },
		"json":     WriteJSON,
	}
	for _, n := range []int{100_000, 500_000} {
		tl := busyTimeline(n, 16)
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		t.Logf("%d waits: heap %.1f MiB with the timeline", len(tl.Waits), float64(ms.HeapAlloc)/(1<<20))
		for _, name := range []string{"perfetto", "json"} {
			var c countingWriter
			var ms0, ms1 runtime.MemStats
			var err error
			runtime.GC()
			runtime.ReadMemStats(&ms0)
			began := time.Now()
			peak := peakHeap(false, func() { err = writers[name](&c, tl) })
			took := time.Since(began)
			runtime.ReadMemStats(&ms1)
			if err != nil {
				t.Fatal(err)
			}
			live := peakHeap(true, func() { err = writers[name](io.Discard, tl) })
			w := float64(len(tl.Waits))
			t.Logf("%s: %.1f bytes/wait, %.2f allocs/wait, %.0f bytes allocated/wait, peak heap %.1f MiB (live %.1f MiB), %d GCs, %v",
				name, float64(c.n)/w, float64(ms1.Mallocs-ms0.Mallocs)/w, float64(ms1.TotalAlloc-ms0.TotalAlloc)/w,
				float64(peak)/(1<<20), float64(live)/(1<<20), ms1.NumGC-ms0.NumGC, took.Round(time.Millisecond))
		}
	}
}

// TestWriteStreams: a busy timeline reads back as written, in a few
// hundred bytes per wait, and writing twice the waits allocates next to
// nothing more per wait (what grows with them is two indices of them, the
// spans and the label sets).
func TestWriteStreams(t *testing.T) {
	small, large := busyTimeline(20_000, 16), busyTimeline(60_000, 16)
	b := roundTrip(t, small)
	if perWait := float64(len(b)) / float64(len(small.Waits)); perWait > 250 {
		t.Errorf("%.1f bytes per wait", perWait)
	}
	for name, write := range map[string]func(io.Writer, *schema.Timeline) error{
		"WritePerfetto": func(w io.Writer, tl *schema.Timeline) error { return WritePerfetto(w, tl, Options{}) },
		"WriteJSON":     WriteJSON,
	} {
		var allocs, bytes [2]float64
		for i, tl := range []*schema.Timeline{small, large} {
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			allocs[i] = testing.AllocsPerRun(1, func() { write(io.Discard, tl) })
			runtime.ReadMemStats(&ms1)
			bytes[i] = float64(ms1.TotalAlloc-ms0.TotalAlloc) / 2 // AllocsPerRun writes twice
		}
		n := float64(len(large.Waits) - len(small.Waits))
		a, b := (allocs[1]-allocs[0])/n, (bytes[1]-bytes[0])/n
		t.Logf("%s: %.3f allocations, %.0f bytes allocated per wait more", name, a, b)
		if a > 0.1 || b > 100 {
			t.Errorf("%s: %.3f allocations, %.0f bytes allocated per wait more; want < 0.1, < 100", name, a, b)
		}
	}
}

// BenchmarkWritePerfetto writes busyTimeline's 100,000 waits, reporting
// bytes written and allocations per wait.
func BenchmarkWritePerfetto(b *testing.B) {
	tl := busyTimeline(100_000, 16)
	b.ReportAllocs()
	var c countingWriter
	for b.Loop() {
		c.n = 0
		if err := WritePerfetto(&c, tl, Options{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(c.n)/float64(len(tl.Waits)), "bytes/wait")
}
