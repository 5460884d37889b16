package collector

import (
	"fmt"
	"sort"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/collector/goroutines"
	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/symtab"
	"github.com/offcpu/offcpu/schema"
)

// goPart: the goroutine recorder attaches to a recorded process when it
// is added or runs a new program (a Go program, or not), and counts in
// the session's window; its figures come with its own drain
// (finishGoroutines, cut), not the threads'.
type goPart struct {
	quietPart
	*goroutines.Recorder
}

func (g goPart) processAdded(pid uint32)            { g.Add(pid) }
func (g goPart) processExec(pid uint32)             { g.Add(pid) }
func (g goPart) processExit(pid uint32)             { g.Exit(pid) }
func (g goPart) window(open bool, ns uint64) error  { return g.SetWindow(open, ns) }
func (g goPart) halt()                              { g.Detach() }
func (g goPart) programs() map[string]*ebpf.Program { return g.Programs() }
func (g goPart) close()                             { g.Close() }

// finishGoroutines drains the goroutine waits of a one-window recording,
// and gives d the stream's for its timeline.
func finishGoroutines(r *goroutines.Recorder, d *recording, start, end uint64) ([]goroutines.Wait, map[uint64][]uint64) {
	waits, stacks := r.Drain(start, end)
	d.goroutines = r.Timeline(true, stacks)
	return waits, stacks
}

// goProfile builds the goroutine profile: a sample per row, at the park's
// stack, with the goroutine, its reason, the waker goroutine and its
// stack as labels.
func goProfile(r *goroutines.Recorder, sym *symbolize.Symbolizer, waits []goroutines.Wait, stacks map[uint64][]uint64, start time.Time, dur time.Duration) (*profile.Profile, error) {
	b := newProfBuilder(sym, &profile.ValueType{Type: schema.GoroutineBlocked, Unit: schema.Nanoseconds},
		&profile.ValueType{Type: schema.GoroutineRunQueue, Unit: schema.Nanoseconds},
		&profile.ValueType{Type: schema.GoroutineWaits, Unit: schema.Count},
		&profile.ValueType{Type: schema.WakerWaiting, Unit: schema.Nanoseconds})
	sort.Slice(waits, func(i, j int) bool { return waits[i].Val.BlockedNs > waits[j].Val.BlockedNs })
	folded := map[[2]uint64]string{}
	fold := func(pid uint32, h uint64) string {
		f, ok := folded[[2]uint64{uint64(pid), h}]
		if !ok {
			f = schema.FoldFrames(schema.Frames(b.stack(pid, nil, stacks[h], 0, true)))
			folded[[2]uint64{uint64(pid), h}] = f
		}
		return f
	}
	funcs := map[[2]uint64]symtab.Frame{}
	funcAt := func(pid uint32, pc uint64) symtab.Frame {
		k := [2]uint64{uint64(pid), pc}
		if _, ok := funcs[k]; !ok {
			funcs[k] = goroutines.Func(sym, pid, pc)
		}
		return funcs[k]
	}
	creators := map[[2]uint64]string{}
	creatorAt := func(pid uint32, pc uint64) string {
		k := [2]uint64{uint64(pid), pc}
		if _, ok := creators[k]; !ok {
			creators[k] = goroutines.Creator(sym, pid, pc)
		}
		return creators[k]
	}
	unnamed := 0
	for _, w := range waits {
		pid := w.Key.Tgid
		locs := b.stack(pid, nil, stacks[w.Key.Stack], 0, true)
		if len(locs) == 0 {
			locs = append(locs, b.marker("[goroutine stack: not walked]"))
		}
		s := &profile.Sample{Location: locs, Value: []int64{int64(w.Val.BlockedNs), int64(w.Val.RunqNs), int64(w.Val.Count), int64(w.Val.WakerWaitNs)},
			Label: map[string][]string{
				schema.LabelReason:  {r.Reason(pid, w.Key.Reason)},
				schema.LabelProcess: {processName(&recording{}, pid, sym.Procs)},
			},
			NumLabel: map[string][]int64{schema.LabelGoid: {int64(w.Key.Goid)}, schema.LabelPID: {int64(pid)},
				schema.LabelWakerGoid: {int64(w.Key.WakerGoid)}},
		}
		if w.Key.WakerStack != 0 {
			s.Label[schema.LabelWakerStack] = []string{fold(pid, w.Key.WakerStack)}
		}
		if w.Key.WakerWaitStack != 0 && w.Val.WakerWaitNs > 0 {
			s.Label[schema.LabelWakerWaitStack] = []string{fold(pid, w.Key.WakerWaitStack)}
		}
		if w.Key.Gopc != 0 { // a return address: the go statement is before it
			s.Label[schema.LabelGoCreator] = []string{creatorAt(pid, w.Key.Gopc-1)}
		}
		if fr := funcAt(pid, w.Key.Startpc); w.Key.Startpc != 0 && !fr.Wrapper {
			s.Label[schema.LabelGoStart] = []string{fr.Func}
		}
		if iv := goroutines.Interval(w); iv != "" {
			s.Label[schema.LabelInterval] = []string{iv}
		}
		if w.Key.Link != 0 && !putGoLabels(r, s, pid, w.Key.Link) {
			unnamed++
		}
		b.p.Sample = append(b.p.Sample, s)
	}
	p := b.p
	p.Mapping = p.Mapping[1:] // no kernel frames: the executable's mapping comes first, as pprof's main file
	p.TimeNanos, p.DurationNanos = start.UnixNano(), int64(dur)
	p.Comments = append(p.Comments, r.Stats().Comments()...)
	if unnamed > 0 {
		p.Comments = append(p.Comments, fmt.Sprintf("offcpu goroutines: %d rows whose label set was not read", unnamed))
	}
	if err := p.CheckValid(); err != nil {
		return nil, fmt.Errorf("building the goroutine profile: %w", err)
	}
	return p, nil
}

// putGoLabels puts label set link of process pid on s; false: the set
// was not read.
func putGoLabels(r *goroutines.Recorder, s *profile.Sample, pid uint32, link uint64) bool {
	pairs, ok := r.Labels(pid, link)
	for _, kv := range pairs {
		s.Label[schema.ProgramLabelKey(kv[0])] = []string{kv[1]}
	}
	return ok
}
