package collector

import (
	"fmt"
	"sort"
	"time"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/schema"
)

// build symbolizes what was drained into the off-CPU profile (with
// on-CPU samples) and, unless wake-ups were off, the wake-up and offwake
// profiles.
func (s *Session) build(d *recording) (Profiles, Stats, error) {
	s.snapshotLive(d)
	return build(d, s.withJIT(symbolize.NewSymbolizer(s.procs)), s.buildOptions(s.stats, s.start, s.opts.NoOffwake))
}

// withJIT names the runtimes' code in sym (their own symbols).
func (s *Session) withJIT(sym *symbolize.Symbolizer) *symbolize.Symbolizer {
	if s.unw != nil {
		sym.JIT = runtimeNames(s.unw.rts)
	}
	return sym
}

// buildOptions are the session's options for building a recording.
func (s *Session) buildOptions(st Stats, start time.Time, noOffwake bool) buildOptions {
	o := buildOptions{stats: st, start: start, cpuHz: s.opts.CPUHz, wakeups: !s.opts.NoWakeups, noOffwake: noOffwake, exitedDetail: s.opts.ExitedDetail, window: [2]uint64{s.startMono, s.stopMono}}
	if s.tctx != nil {
		o.links = s.tctx.Labels()
		o.links.Take()
	}
	return o
}

// build builds a recording into profiles: a function of the recording,
// the symbolizer and the options alone (names of threads outside the
// recorded set come from /proc); it returns o.stats with stack
// completeness and wake-up classes counted.
func build(d *recording, sym *symbolize.Symbolizer, o buildOptions) (Profiles, Stats, error) {
	d.o = o
	st := &d.o.stats
	names := &threadNames{d: d, procs: sym.Procs}
	d.fold = d.foldedPIDs(o.exitedDetail)
	var ps Profiles
	ps.OffCPU = d.offCPUProfile(sym, names)
	if err := d.finish(ps.OffCPU, "profile"); err != nil {
		return Profiles{}, *st, err
	}
	if d.streamed {
		ps.Timeline = d.timeline(sym, names)
		st.StreamWaits += uint64(d.waits.Len())
		if g := d.goroutines; g != nil {
			st.StreamWaits += uint64(g.Waits.Len())
			st.StreamLost += g.Lost
		}
	}
	if !o.wakeups {
		return ps, *st, nil
	}
	ps.Wakeups = d.wakeupProfile(sym, names)
	if err := d.finish(ps.Wakeups, "wake-up profile"); err != nil {
		return Profiles{}, *st, err
	}
	if o.noOffwake {
		return ps, *st, nil
	}
	ps.Offwake = d.offwakeProfile(sym, names)
	if err := d.finish(ps.Offwake, "offwake profile"); err != nil {
		return Profiles{}, *st, err
	}
	return ps, *st, nil
}

func (d *recording) finish(p *profile.Profile, what string) error {
	d.finishProfile(p)
	if err := p.CheckValid(); err != nil {
		return fmt.Errorf("building the %s: %w", what, err)
	}
	return nil
}

// snapshotLive reads the mappings of live processes once more: covers
// execs, late mappings and wakers outside the recorded set.
func (s *Session) snapshotLive(d *recording) {
	// An agent's cuts read the maps of a process at most every
	// liveSnapshotAge: the symbolizer reads them again for an address in
	// none of them (Symbolizer.UserFrames).
	var age time.Duration
	if s.cont != nil {
		age = liveSnapshotAge
	}
	seen := map[uint32]bool{}
	snap := func(tgid uint32) {
		if tgid != 0 && !seen[tgid] {
			seen[tgid] = true
			if (age == 0 || !s.procs.Fresh(tgid, age)) && symbolize.ProcessExists(int(tgid)) {
				s.procs.Snapshot(tgid)
			}
		}
	}
	for _, r := range d.records {
		snap(r.tgid)
		snap(r.waker.tgid)
	}
	for _, w := range d.wakes {
		snap(w.waker.tgid)
	}
}

// liveSnapshotAge is how long a continuous recording trusts a live
// process's mappings read from /proc.
const liveSnapshotAge = 30 * time.Second

// offCPUProfile has a sample per interval record and per on-CPU sample
// record; it counts complete and truncated stacks in the stats.
func (d *recording) offCPUProfile(sym *symbolize.Symbolizer, names *threadNames) *profile.Profile {
	b := newProfBuilder(sym, &profile.ValueType{Type: schema.OffCPU, Unit: schema.Nanoseconds}, &profile.ValueType{Type: schema.Switches, Unit: schema.Count},
		&profile.ValueType{Type: schema.CPU, Unit: schema.Nanoseconds},
		&profile.ValueType{Type: schema.Blocked, Unit: schema.Nanoseconds}, &profile.ValueType{Type: schema.RunQueue, Unit: schema.Nanoseconds},
		&profile.ValueType{Type: schema.WakerWaiting, Unit: schema.Nanoseconds})
	sort.Slice(d.records, func(i, j int) bool { return d.records[i].ns > d.records[j].ns })
	wakers := newWakerStacks(sym)
	for _, r := range d.records {
		th := d.threadOf(&r)
		locs := b.stack(r.tgid, trimKernel(r.kernel, sym.Kern), r.user, r.userErr, isKernelThread(r))
		if len(r.user) > 0 && len(locs) > 0 { // the last location is the outermost user frame, its last line the function
			if root := locs[len(locs)-1].Line; schema.IsThreadStart(root[len(root)-1].Function.Name) {
				d.o.stats.CompleteStacks++
				d.o.stats.CompleteTime += durationNs(r.ns)
			} else {
				d.o.stats.TruncatedStacks++
				d.o.stats.TruncatedTime += durationNs(r.ns)
			}
		}
		if r.prestart && !r.kthread && len(r.user) == 0 {
			locs = append(locs, b.marker("[user stack: blocked since before the recording]"))
		}
		smp := &profile.Sample{
			Location: locs,
			Value:    []int64{int64(r.ns), int64(r.count), 0, int64(r.ns - r.runq), int64(r.runq), int64(min(r.chain, r.ns-r.runq))},
			Label: map[string][]string{
				schema.LabelThread:  {th.comm},
				schema.LabelProcess: {processName(d, r.tgid, sym.Procs)},
				schema.LabelState:   {r.state.String()},
			},
			NumLabel: map[string][]int64{schema.LabelTID: {int64(r.tid)}, schema.LabelPID: {int64(r.tgid)}},
		}
		switch {
		case r.prestart && r.open:
			smp.Label[schema.LabelInterval] = []string{"whole"}
		case r.prestart:
			smp.Label[schema.LabelInterval] = []string{"before-start"}
		case r.open:
			smp.Label[schema.LabelInterval] = []string{"open"}
		}
		if r.gil {
			smp.Label[schema.LabelGIL] = []string{"1"}
			if r.gilHolder != 0 {
				smp.Label[schema.LabelGILHolder] = []string{names.thread(r.tgid, r.gilHolder)}
				smp.NumLabel[schema.LabelGILHolderTID] = []int64{int64(r.gilHolder)}
			}
			if len(r.gilHolderStack) > 0 {
				smp.Label[schema.LabelGILHolderStack] = []string{wakers.fold(wakers.b.stack(r.tgid, nil, r.gilHolderStack, 0, false))}
			}
		}
		if r.link != 0 && d.o.links != nil {
			d.o.links.Put(smp, r.tgid, r.link)
		}
		if r.waker.valid {
			smp.Label[schema.LabelWaker] = []string{names.waker(r.waker, sym.Kern)}
			smp.Label[schema.LabelWakeupClass] = []string{classifyWakeup(r.waker, sym.Kern)}
			smp.Label[schema.LabelWakerStack] = []string{wakers.folded(r.waker)}
			if !r.waker.irq {
				smp.Label[schema.LabelWakerProcess] = []string{processName(d, r.waker.tgid, sym.Procs)}
			}
			if r.chain > 0 {
				wait := waker{tgid: r.waker.tgid, user: r.waker.waitUser, kernel: r.waker.waitKernel, userID: r.waker.waitUserID, kernelID: r.waker.waitKernelID}
				smp.Label[schema.LabelWakerWaitStack] = []string{wakers.foldedWait(wait)}
			}
			smp.NumLabel[schema.LabelWakerTID] = []int64{int64(r.waker.tid)}
			smp.NumLabel[schema.LabelWakerPID] = []int64{int64(r.waker.tgid)}
		}
		b.add(smp, d.folds(r.tgid, r.waker))
	}
	d.onCPUSamples(b, names)
	return b.p
}

// wakerStacks folds waker stacks for the waker_stack label, once per
// distinct stack, through a builder of their own (their locations stay
// out of the off-CPU profile).
type wakerStacks struct {
	b    *profBuilder
	done map[[3]int64]string
}

func newWakerStacks(sym *symbolize.Symbolizer) *wakerStacks {
	return &wakerStacks{b: newProfBuilder(sym, &profile.ValueType{Type: schema.Wakeups, Unit: schema.Count}), done: map[[3]int64]string{}}
}

// foldedWait folds a waker's own wait: a blocked stack, trimmed at
// __schedule as the off-CPU samples are.
func (ws *wakerStacks) foldedWait(w waker) string {
	key := [3]int64{-2 - int64(w.tgid), w.userID, w.kernelID}
	if f, ok := ws.done[key]; ok {
		return f
	}
	f := ws.fold(ws.b.stack(w.tgid, trimKernel(w.kernel, ws.b.sym.Kern), w.user, 0, true))
	ws.done[key] = f
	return f
}

func (ws *wakerStacks) folded(w waker) string {
	key := [3]int64{int64(w.tgid), w.userID, w.kernelID}
	if w.irq {
		key = [3]int64{-1, -1, w.kernelID}
	}
	if f, ok := ws.done[key]; ok {
		return f
	}
	f := ws.fold(ws.locs(w))
	ws.done[key] = f
	return f
}

// locs are a waker's stack as the waker_stack label shows it.
func (ws *wakerStacks) locs(w waker) []*profile.Location {
	user := w.user
	if w.irq {
		user = nil
	}
	// An interrupt's frames only: not the code it happened to interrupt.
	kernel := trimWaker(w.kernel, ws.b.sym.Kern)
	names := make([]string, len(kernel))
	for i, a := range kernel {
		names[i] = ws.b.sym.Kern.Lookup(a)
	}
	if cut, ok := interruptFrames(names, w.irq); ok {
		kernel = kernel[:cut]
	}
	return ws.b.stack(w.tgid, kernel, user, 0, true)
}

// fold writes locations (leaf first) as user frames root first, "-",
// kernel frames.
func (ws *wakerStacks) fold(locs []*profile.Location) string {
	return schema.FoldFrames(schema.Frames(locs))
}

// onCPUSamples adds the on-CPU samples. Where the thread's exact on-CPU
// time is known, its samples share it in proportion to their counts (the
// sampled stacks estimate where the time went, the switches say how much
// there was), and a thread that ran unsampled gets one sample of all its
// time with the frame schema.OnCPUUnsampled.
func (d *recording) onCPUSamples(b *profBuilder, names *threadNames) {
	var period int64
	if d.o.cpuHz > 0 {
		period = int64(time.Second) / int64(d.o.cpuHz)
	}
	sampled := map[[2]uint32]uint64{}
	for _, c := range d.cpu {
		sampled[[2]uint32{c.tid, c.gen}] += c.count
	}
	add := func(tgid, tid, gen uint32, locs []*profile.Location, ns int64) {
		b.add(&profile.Sample{
			Location: locs,
			Value:    []int64{0, 0, ns, 0, 0, 0},
			Label: map[string][]string{
				schema.LabelThread:  {names.threadGen(tgid, tid, gen)},
				schema.LabelProcess: {processName(d, tgid, b.sym.Procs)},
				schema.LabelState:   {"on-cpu"},
			},
			NumLabel: map[string][]int64{schema.LabelTID: {int64(tid)}, schema.LabelPID: {int64(tgid)}},
		}, d.fold[tgid])
	}
	sort.Slice(d.cpu, func(i, j int) bool { return d.cpu[i].count > d.cpu[j].count })
	for _, c := range d.cpu {
		k := [2]uint32{c.tid, c.gen}
		ns := int64(c.count) * period
		if exact, ok := d.oncpu[k]; ok {
			// The rest of its time over the rest of its samples: they add
			// up to its time exactly.
			ns = int64(exact.ns * c.count / sampled[k])
			sampled[k] -= c.count
			exact.ns -= uint64(ns)
			d.oncpu[k] = exact
		}
		add(c.tgid, c.tid, c.gen, b.stack(c.tgid, trimKernel(c.kernel, b.sym.Kern), c.user, 0, true), ns)
	}
	keys := make([][2]uint32, 0, len(d.oncpu))
	for k, t := range d.oncpu {
		if t.ns > 0 { // what no sample took
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i][0] < keys[j][0] || keys[i][0] == keys[j][0] && keys[i][1] < keys[j][1]
	})
	for _, k := range keys {
		t := d.oncpu[k]
		add(t.tgid, k[0], k[1], []*profile.Location{b.marker(schema.OnCPUUnsampled)}, int64(t.ns))
	}
}

// wakeupProfile has a sample per waker stack and woken thread, with the
// count and the blocked time it ended; it counts wake-ups by class.
func (d *recording) wakeupProfile(sym *symbolize.Symbolizer, names *threadNames) *profile.Profile {
	// Wake-ups: the waker's stack, with the blocked time it ended.
	type wkey struct {
		target, tid uint32
		uid, kid    int64
		irq         bool
	}
	ended := map[wkey]int64{}
	for _, r := range d.records {
		if r.waker.valid {
			ended[wkey{r.tid, r.waker.tid, r.waker.userID, r.waker.kernelID, r.waker.irq}] += int64(r.ns)
		}
	}
	wb := newProfBuilder(sym, &profile.ValueType{Type: schema.Wakeups, Unit: schema.Count}, &profile.ValueType{Type: schema.OffCPU, Unit: schema.Nanoseconds})
	d.o.stats.WakeupsByClass = map[string]uint64{}
	sort.Slice(d.wakes, func(i, j int) bool { return d.wakes[i].count > d.wakes[j].count })
	for _, w := range d.wakes {
		kernel := trimWaker(w.waker.kernel, sym.Kern)
		class := classifyWakeup(w.waker, sym.Kern)
		d.o.stats.WakeupsByClass[class] += w.count
		wakerName := names.waker(w.waker, sym.Kern)
		user := w.waker.user
		if w.waker.irq {
			user = nil
		}
		target := names.threadGen(w.tgid, w.tid, w.gen)
		smp := &profile.Sample{
			Location: wb.stack(w.waker.tgid, kernel, user, 0, true),
			Value:    []int64{int64(w.count), ended[wkey{w.tid, w.waker.tid, w.waker.userID, w.waker.kernelID, w.waker.irq}]},
			Label: map[string][]string{
				schema.LabelThread:      {wakerName},
				schema.LabelTarget:      {target},
				schema.LabelWakeupClass: {class},
				schema.LabelProcess:     {processName(d, w.waker.tgid, sym.Procs)},
			},
			NumLabel: map[string][]int64{schema.LabelTargetTID: {int64(w.tid)}, schema.LabelPID: {int64(w.waker.tgid)}, schema.LabelWakerTID: {int64(w.waker.tid)}, schema.LabelTID: {int64(w.waker.tid)}},
		}
		if w.tgid != 0 { // the classic tracepoints know the woken tid only
			smp.Label[schema.LabelTargetProcess] = []string{processName(d, w.tgid, sym.Procs)}
			smp.NumLabel[schema.LabelTargetPID] = []int64{int64(w.tgid)}
		}
		wb.add(smp, d.folds(w.tgid, w.waker))
	}
	return wb.p
}

// offwakeProfile has a sample per interval with a known waker: the
// blocked stack on top of the waker's, in one sample.
func (d *recording) offwakeProfile(sym *symbolize.Symbolizer, names *threadNames) *profile.Profile {
	ob := newProfBuilder(sym, &profile.ValueType{Type: schema.OffCPU, Unit: schema.Nanoseconds}, &profile.ValueType{Type: schema.Switches, Unit: schema.Count})
	for _, r := range d.records {
		if !r.waker.valid {
			continue
		}
		// Leaf first: waker thread, waker user frames root first... see
		// Offwake's comment for the root-first reading.
		var locs []*profile.Location
		locs = append(locs, ob.marker(names.waker(r.waker, sym.Kern)))
		wuser := r.waker.user
		if r.waker.irq {
			wuser = nil
		}
		for i := len(wuser) - 1; i >= 0; i-- {
			locs = append(locs, ob.userLoc(r.waker.tgid, wuser[i], i == 0))
		}
		if len(wuser) > 0 {
			locs = append(locs, ob.marker("-"))
		}
		wk := trimWaker(r.waker.kernel, sym.Kern)
		for i := len(wk) - 1; i >= 0; i-- {
			locs = append(locs, ob.kernelLoc(wk[i]))
		}
		locs = append(locs, ob.marker("--"))
		target := ob.stack(r.tgid, trimKernel(r.kernel, sym.Kern), nil, 0, true)
		if user := ob.stack(r.tgid, nil, r.user, r.userErr, isKernelThread(r)); len(user) > 0 {
			if len(target) > 0 {
				target = append(target, ob.marker("-"))
			}
			target = append(target, user...)
		}
		locs = append(locs, target...)
		ob.add(&profile.Sample{
			Location: locs,
			Value:    []int64{int64(r.ns), int64(r.count)},
			Label:    map[string][]string{schema.LabelThread: {d.threadOf(&r).comm}, schema.LabelWaker: {names.waker(r.waker, sym.Kern)}},
			NumLabel: map[string][]int64{schema.LabelTID: {int64(r.tid)}, schema.LabelWakerTID: {int64(r.waker.tid)}},
		}, d.folds(r.tgid, r.waker))
	}
	return ob.p
}

func (d *recording) finishProfile(p *profile.Profile) {
	st := &d.o.stats
	p.TimeNanos = d.o.start.UnixNano()
	p.DurationNanos = int64(st.Duration)
	p.Comments = append(p.Comments,
		fmt.Sprintf("offcpu record: attach=%s duration=%v intervals=%d off_cpu=%v keys=%d stacks=%d wakeups=%d",
			st.Attach, st.Duration.Round(time.Millisecond), st.Intervals, st.OffCPU.Round(time.Microsecond), st.Keys, st.Stacks, st.Wakeups),
		fmt.Sprintf("losses: user_stack_lost=%d kernel_stack_lost=%d user_stack_fault=%d agg_full=%d (%v) start_full=%d events_lost=%d wake_full=%d waker_stack_lost=%d switch_missed=%d missed_switch_in_recovered=%d",
			st.UserStackLost, st.KernelStackLost, st.UserStackFault, st.AggFull, st.AggFullTime, st.StartFull, st.EventsLost, st.WakeFull, st.WakerStackLost, st.SwitchMissed, st.MissedSwitchIn),
		fmt.Sprintf("stacks_reused=%d wakes_reused=%d (same syscall, argument and user registers as the thread's previous sleep or wake-up)", st.StacksReused, st.WakesReused),
		fmt.Sprintf("irq_wakes_reused=%d (an interrupt's kernel stack reused for the same interrupt-stack depth, interrupted thread and registers, and woken thread; walked again one in 128)", st.IRQWakesReused),
		fmt.Sprintf("open_intervals=%d (%v): threads still off-CPU at the end, counted up to the end", st.OpenIntervals, st.OpenTime.Round(time.Microsecond)),
	)
	if st.AggMoved > 0 || st.StacksMissing > 0 {
		p.Comments = append(p.Comments, fmt.Sprintf("agg_moved=%d (aggregation entries moved to memory between cuts, not lost) stacks_missing=%d", st.AggMoved, st.StacksMissing))
	}
	if tc := st.ThreadContext; tc != nil {
		p.Comments = append(p.Comments, fmt.Sprintf("thread_context: processes=%d records=%d lost_records=%d truncated_records=%d shed_records=%d (OpenTelemetry otel_thread_ctx_v1, read at waits whose stacks are walked)",
			tc.Processes, tc.Records, tc.Lost, tc.Truncated, tc.Shed))
		if tc.GoProcesses > 0 {
			p.Comments = append(p.Comments, fmt.Sprintf("thread_context: go_processes=%d go_label_sets=%d lost_go_label_sets=%d truncated_go_label_sets=%d (a Go thread's goroutine's pprof labels, read at waits whose stacks are walked)",
				tc.GoProcesses, tc.GoLabelSets, tc.LostGoLabelSets, tc.TruncatedGoSets))
		}
		if tc.GoIDsByAddress > 0 {
			p.Comments = append(p.Comments, fmt.Sprintf("thread_context: go_label_ids_by_address=%d (runtime.memstats not found: a label set freed can lend its id to one allocated at its address)", tc.GoIDsByAddress))
		}
	}
	if st.Budget != nil {
		p.Comments = append(p.Comments, st.Budget.Comment())
	}
	if share := st.CompleteShare(); share >= 0 {
		p.Comments = append(p.Comments, fmt.Sprintf("user stacks reaching a thread start: %.1f%% of off-CPU time; complete=%d truncated=%d distinct stacks",
			100*share, st.CompleteStacks, st.TruncatedStacks))
	}
	if u := st.Unwind; u != nil {
		p.Comments = append(p.Comments, fmt.Sprintf("unwind tables: files=%d rows=%d/%d processes=%d frame_pointer_files=%d failed=%d rows_full=%d procs_full=%d; walks=%d frames=%d reached_start=%d depth_limit=%d",
			u.Files, u.Rows, u.RowCapacity, u.Processes, u.FramePointers, u.Failed, u.RowsFull, u.ProcsFull, u.Stacks, u.Frames, u.Ends, u.DepthLimit))
	}
	for _, w := range st.Warnings {
		p.Comments = append(p.Comments, "warning: "+w)
	}
	p.Comments = append(p.Comments,
		fmt.Sprintf("before_start=%d: threads blocked since before the start, counted from the start with the stacks they had then; not measured: out_of_range=%d (%v; --min-block/--max-block)", st.NoStart, st.OutOfRange, st.OutOfRangeTime.Round(time.Microsecond)),
	)
}
