package collector

import (
	"strings"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/threadctx"
	"github.com/offcpu/offcpu/schema"
)

// timelineBuilder interns the threads and stacks the stream's waits name.
type timelineBuilder struct {
	d           *recording
	sym         *symbolize.Symbolizer
	names       *threadNames
	wakerStacks *wakerStacks
	b           *profBuilder
	t           *schema.Timeline
	threads     map[[2]uint32]int32
	stacks      map[[3]int64]int32
	labels      map[[2]uint64]map[string]string
	// wakers: each waker stack's class and whether it is an interrupt
	// its own task raised (ownSoftirq), read once.
	wakers map[[3]int64]wakerClass
}

type wakerClass struct {
	class string
	own   bool
}

// timeline builds the stream's waits into a timeline: each wait with its
// thread, stacks, waker, wake-up class and request labels.
func (d *recording) timeline(sym *symbolize.Symbolizer, names *threadNames) *schema.Timeline {
	tb := &timelineBuilder{d: d, sym: sym, names: names, wakerStacks: newWakerStacks(sym),
		b:       newProfBuilder(sym, &profile.ValueType{Type: schema.OffCPU, Unit: schema.Nanoseconds}),
		t:       &schema.Timeline{Start: int64(d.o.window[0]), End: int64(d.o.window[1]), Stacks: [][]schema.Frame{nil}},
		threads: map[[2]uint32]int32{}, stacks: map[[3]int64]int32{}, labels: map[[2]uint64]map[string]string{}, wakers: map[[3]int64]wakerClass{}}
	tb.t.Lost = int64(d.o.stats.StreamLost)
	from, to := d.o.window[0], d.o.window[1]
	if to == 0 {
		to = ^uint64(0)
	}
	tb.t.Waits = make([]schema.Wait, 0, d.waits.Len())
	d.waits.Each(func(e *bpf.OffcpuWaitEvent) {
		if e.InNs >= from && e.OutNs <= to {
			tb.add(e)
		}
	})
	if g := d.goroutines; g != nil {
		tb.addGoroutines(g, from, to)
	}
	if tb.t.End == 0 {
		for _, w := range tb.t.Waits {
			tb.t.End = max(tb.t.End, w.In)
		}
	}
	tb.t.Sort()
	return tb.t
}

func (tb *timelineBuilder) add(e *bpf.OffcpuWaitEvent) {
	d := tb.d
	w := schema.Wait{Thread: tb.thread(e.Tgid, e.Tid), Out: int64(e.OutNs), In: int64(e.InNs), Wake: int64(e.InNs - e.RunqNs),
		State: State(e.State).String(), Open: e.Open != 0, Waker: -1}
	if State(e.State) == StatePreempted {
		w.Wake = w.Out
	}
	user, kernel := d.stacks[e.Ustack], d.stacks[e.Kstack]
	kthread := len(user) == 0 && e.Ustack == -1
	w.Stack = tb.stack([3]int64{int64(e.Tgid), e.Ustack, e.Kstack}, func() []*profile.Location {
		return tb.b.stack(e.Tgid, trimKernel(kernel, tb.sym.Kern), user, min(e.Ustack, 0), kthread)
	})
	if e.Waker.Valid != 0 {
		wk := decodeWaker(e.Waker, func(id int64) []uint64 { return d.stacks[id] })
		key := [3]int64{-2 - int64(wk.tgid), wk.userID, wk.kernelID}
		if wk.irq {
			key = [3]int64{-1, -1, wk.kernelID}
		}
		c, ok := tb.wakers[key]
		if !ok {
			c = wakerClass{classifyWakeup(wk, tb.sym.Kern), wk.irq && tb.ownSoftirq(wk.kernel)}
			tb.wakers[key] = c
		}
		w.IRQ, w.Class = wk.irq, c.class
		if !wk.irq || (wk.tid != 0 && c.own) {
			w.Waker = tb.thread(wk.tgid, wk.tid)
		}
		w.WakerStack = tb.stack(key, func() []*profile.Location { return tb.wakerStacks.locs(wk) })
	}
	if e.Link != 0 && d.o.links != nil {
		w.Labels = tb.linkLabels(e.Tgid, e.Link)
	}
	tb.t.Waits = append(tb.t.Waits, w)
}

// ownSoftirq: an interrupt waker's kernel stack (the interrupt's frames
// and those of the task beneath) shows a softirq the task ran itself as
// it enabled them again (local_bh_enable: a loopback send delivers the
// packet so), not an interrupt that happened to stop it.
func (tb *timelineBuilder) ownSoftirq(kernel []uint64) bool {
	for _, a := range kernel {
		n := tb.sym.Kern.Lookup(a)
		if strings.Contains(n, "local_bh_enable") {
			return true
		}
		if strings.HasPrefix(n, "irq_exit") || strings.HasPrefix(n, "common_interrupt") || strings.HasPrefix(n, "run_ksoftirqd") {
			return false
		}
	}
	return false
}

// thread is the index of a thread, added on first sight.
func (tb *timelineBuilder) thread(tgid, tid uint32) int32 {
	k := [2]uint32{tgid, tid}
	if i, ok := tb.threads[k]; ok {
		return i
	}
	i := int32(len(tb.t.Threads))
	tb.threads[k] = i
	tb.t.Threads = append(tb.t.Threads, schema.TimelineThread{PID: int64(tgid), TID: int64(tid),
		Process: processName(tb.d, tgid, tb.sym.Procs), Name: tb.names.thread(tgid, tid)})
	return i
}

// stack is the index of a stack, symbolized on first sight.
func (tb *timelineBuilder) stack(key [3]int64, locs func() []*profile.Location) int32 {
	if i, ok := tb.stacks[key]; ok {
		return i
	}
	i := int32(len(tb.t.Stacks))
	tb.stacks[key] = i
	tb.t.Stacks = append(tb.t.Stacks, schema.Frames(locs()))
	return i
}

// linkLabels are the labels of a request record, read once.
func (tb *timelineBuilder) linkLabels(tgid uint32, link uint64) map[string]string {
	k := [2]uint64{uint64(tgid), link}
	if l, ok := tb.labels[k]; ok {
		return l
	}
	l := linkLabels(tb.d.o.links, tgid, link)
	tb.labels[k] = l
	return l
}

// linkLabels are the labels of a request record (nil: none known).
func linkLabels(links *threadctx.Labels, tgid uint32, link uint64) map[string]string {
	smp := &profile.Sample{Label: map[string][]string{}, NumLabel: map[string][]int64{}}
	if !links.Put(smp, tgid, link) {
		return nil
	}
	l := map[string]string{}
	for k, v := range smp.Label {
		if len(v) > 0 {
			l[k] = v[0]
		}
	}
	return l
}
