package collector

import (
	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/goroutines"
	"github.com/offcpu/offcpu/schema"
)

// addGoroutines adds the goroutine waits in the window: a track per
// goroutine, woken by a goroutine or (the scheduler: netpoll, timers) by
// a thread.
func (tb *timelineBuilder) addGoroutines(g *goroutines.Timeline, from, to uint64) {
	tb.t.Lost += int64(g.Lost)
	byGoid := map[[2]uint64]int32{}
	for i, th := range tb.t.Threads {
		if th.GoID != 0 {
			byGoid[[2]uint64{uint64(th.PID), uint64(th.GoID)}] = int32(i)
		}
	}
	gor := func(tgid uint32, goid, startpc uint64) int32 {
		k := [2]uint64{uint64(tgid), goid}
		i, ok := byGoid[k]
		if !ok {
			i = int32(len(tb.t.Threads))
			byGoid[k] = i
			tb.t.Threads = append(tb.t.Threads, schema.TimelineThread{PID: int64(tgid), GoID: int64(goid),
				Process: processName(tb.d, tgid, tb.sym.Procs)})
		}
		if th := &tb.t.Threads[i]; th.Name == "" && startpc != 0 {
			if fr := goroutines.Func(tb.sym, tgid, startpc); fr.Func != "" {
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
			return tb.b.stack(tgid, nil, g.Stacks[id], 0, true)
		})
	}
	labels := map[[2]uint64]map[string]string{}
	g.Waits.Each(func(e *bpf.GoroutinesGoWaitEvent) {
		if e.RunNs < from || e.ParkNs > to || e.Goid == 0 {
			return
		}
		reason := g.Reason(e.Tgid, e.Reason)
		w := schema.Wait{Thread: gor(e.Tgid, e.Goid, e.Startpc), Out: int64(e.ParkNs), Wake: int64(e.ReadyNs), In: int64(e.RunNs),
			State: reason, Class: goroutines.ReasonClass(reason), Open: e.Flags&goroutines.OpenFlag != 0, Waker: -1,
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
				l = g.Labels(e.Tgid, e.Link)
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
