package collector

import (
	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/stream"
	"github.com/offcpu/offcpu/runtimes/golang"
	"github.com/offcpu/offcpu/schema"
)

// goOpen marks a streamed goroutine wait still open at the window's end
// (drain's, not the probe's: above GO_BEFORE_START).
const goOpen = 0x8000

// goTimeline is what a recording's timeline needs of the goroutine
// stream: its waits, the stacks they name (go_stacks ids), their label
// sets and the wait reasons' names.
type goTimeline struct {
	waits  stream.View[bpf.GoroutinesGoWaitEvent]
	stacks map[uint64][]uint64
	labels func(tgid uint32, link uint64) map[string]string
	reason func(tgid uint32, reason uint16) string
	lost   uint64 // the ring had no room for them
}

// openGoWait is a goroutine wait still open at end, from park on.
func openGoWait(tgid uint32, p *bpf.GoroutinesGoPark, park, end uint64) bpf.GoroutinesGoWaitEvent {
	e := bpf.GoroutinesGoWaitEvent{Goid: p.Goid, ParkNs: park, ReadyNs: end, RunNs: end, Stack: p.Stack,
		Startpc: p.Startpc, Link: p.Link, Tgid: tgid, Tid: p.Tid, Reason: uint16(p.Reason), Flags: uint16(p.Flags) | goOpen}
	if p.ReadyNs != 0 && p.ReadyNs <= end {
		e.ReadyNs = max(p.ReadyNs, park)
		e.WakerStack, e.WakerGoid, e.WakerTid = p.WakerStack, p.WakerGoid, p.WakerTid
	}
	return e
}

// closeStream reads what the goroutine stream still holds and stops it.
func (r *goRecorder) closeStream() {
	if r.stream != nil && !r.closed {
		r.closed = true
		r.stream.Close()
	}
}

// finish drains the goroutine waits of a one-window recording, and
// gives d the stream's for its timeline.
func (r *goRecorder) finish(d *recording, start, end uint64) ([]goWait, map[uint64][]uint64) {
	waits, stacks := r.drain(start, end)
	d.goroutines = r.timelineData(true, stacks)
	return waits, stacks
}

// timelineData is the goroutine stream for a timeline: the waits sent
// (all, or a flight recorder's kept ones) and those drain found open,
// with stacks read by drain or readStacks.
func (r *goRecorder) timelineData(final bool, stacks map[uint64][]uint64) *goTimeline {
	if r.stream == nil {
		return nil
	}
	var v stream.View[bpf.GoroutinesGoWaitEvent]
	var overflow uint64
	if final {
		r.closeStream()
		for _, e := range r.open {
			r.stream.Add(e)
		}
		r.open = nil
		v = r.stream.Take()
	} else {
		v, overflow = r.stream.Kept()
	}
	return &goTimeline{waits: v, stacks: stacks, labels: r.labelMap, lost: r.statsCopy().StreamLost + overflow,
		reason: func(tgid uint32, reason uint16) string { return r.runtime(tgid).Reason(reason) }}
}

// runtime is a process's runtime (nil: not known).
func (r *goRecorder) runtime(pid uint32) *golang.Runtime {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.procs[pid]
}

// labelMap is a label set by the program's keys (nil: not read).
func (r *goRecorder) labelMap(tgid uint32, link uint64) map[string]string {
	r.linkMu.Lock()
	defer r.linkMu.Unlock()
	l, ok := r.labels[bpf.GoroutinesGoLinkKey{Tgid: tgid, Id: link}]
	if !ok {
		return nil
	}
	m := make(map[string]string, len(l.pairs))
	for _, kv := range l.pairs {
		m[schema.ProgramLabelKey(kv[0])] = kv[1]
	}
	return m
}

// addGoroutines adds the goroutine waits in the window: a track per
// goroutine, woken by a goroutine or (the scheduler: netpoll, timers) by
// a thread.
func (tb *timelineBuilder) addGoroutines(g *goTimeline, from, to uint64) {
	tb.t.Lost += int64(g.lost)
	goroutines := map[[2]uint64]int32{}
	for i, th := range tb.t.Threads {
		if th.GoID != 0 {
			goroutines[[2]uint64{uint64(th.PID), uint64(th.GoID)}] = int32(i)
		}
	}
	gor := func(tgid uint32, goid, startpc uint64) int32 {
		k := [2]uint64{uint64(tgid), goid}
		i, ok := goroutines[k]
		if !ok {
			i = int32(len(tb.t.Threads))
			goroutines[k] = i
			tb.t.Threads = append(tb.t.Threads, schema.TimelineThread{PID: int64(tgid), GoID: int64(goid),
				Process: processName(tb.d, tgid, tb.sym.Procs)})
		}
		if th := &tb.t.Threads[i]; th.Name == "" && startpc != 0 {
			if fr := goFunc(tb.sym, tgid, startpc); fr.Func != "" {
				th.Name = fr.Func
			}
		}
		return i
	}
	goStack := func(tgid uint32, id uint64) int32 {
		if id == 0 {
			return 0
		}
		return tb.stack([3]int64{-(1 << 32) - int64(tgid), int64(id), 0}, func() []*profile.Location {
			return tb.b.stack(tgid, nil, g.stacks[id], 0, true)
		})
	}
	labels := map[[2]uint64]map[string]string{}
	g.waits.Each(func(e *bpf.GoroutinesGoWaitEvent) {
		if e.RunNs < from || e.ParkNs > to || e.Goid == 0 {
			return
		}
		reason := g.reason(e.Tgid, e.Reason)
		w := schema.Wait{Thread: gor(e.Tgid, e.Goid, e.Startpc), Out: int64(e.ParkNs), Wake: int64(e.ReadyNs), In: int64(e.RunNs),
			State: reason, Class: GoReasonClass(reason), Open: e.Flags&goOpen != 0, Waker: -1,
			Stack: goStack(e.Tgid, e.Stack), WakerStack: goStack(e.Tgid, e.WakerStack),
			OutThread: tb.threadOrNone(e.Tgid, e.Tid), InThread: tb.threadOrNone(e.Tgid, e.RunTid)}
		if w.Open {
			w.InThread = -1
		}
		switch {
		case e.WakerGoid != 0 && e.WakerGoid != ^uint64(0):
			w.Waker = gor(e.Tgid, e.WakerGoid, 0)
		case e.WakerTid != 0:
			w.Waker = tb.thread(e.Tgid, e.WakerTid)
		}
		if e.Link != 0 {
			k := [2]uint64{uint64(e.Tgid), e.Link}
			l, ok := labels[k]
			if !ok {
				l = g.labels(e.Tgid, e.Link)
				labels[k] = l
			}
			w.Labels = l
		}
		tb.t.Waits = append(tb.t.Waits, w)
	})
}

// threadOrNone is a thread's index, -1 for tid 0 (not known).
func (tb *timelineBuilder) threadOrNone(tgid, tid uint32) int32 {
	if tid == 0 {
		return -1
	}
	return tb.thread(tgid, tid)
}
