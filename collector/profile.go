package collector

import (
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/pprof/profile"
	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/collector/symtab"
	"github.com/offcpu/offcpu/schema"
)

type profBuilder struct {
	p    *profile.Profile
	sym  *symbolizer
	kmap *profile.Mapping
	maps map[string]*profile.Mapping
	// Per file segment and offset (see fileLoc).
	fileMaps map[fileSeg]*profile.Mapping
	fileLocs map[fileOff]*profile.Location
	locs     map[[2]uint64]*profile.Location
	funcs    map[[2]string]*profile.Function
	unknown  map[uint32]*profile.Mapping
	markers  map[string]*profile.Location
	// wrappers: locations of compiler-generated Go wrappers, left out of
	// stacks as Go's tracebacks leave them out.
	wrappers map[*profile.Location]bool
	merger   *sampleMerger
}

// add appends a sample, merged with its twin where fold (exited.go).
func (b *profBuilder) add(smp *profile.Sample, fold bool) {
	if b.merger == nil {
		b.merger = newSampleMerger(b.p)
	}
	b.merger.add(smp, fold)
}

func newProfBuilder(sym *symbolizer, types ...*profile.ValueType) *profBuilder {
	b := &profBuilder{
		sym:      sym,
		maps:     map[string]*profile.Mapping{},
		fileMaps: map[fileSeg]*profile.Mapping{},
		fileLocs: map[fileOff]*profile.Location{},
		locs:     map[[2]uint64]*profile.Location{},
		funcs:    map[[2]string]*profile.Function{},
		unknown:  map[uint32]*profile.Mapping{},
		markers:  map[string]*profile.Location{},
		wrappers: map[*profile.Location]bool{},
	}
	b.p = &profile.Profile{SampleType: types, DefaultSampleType: types[0].Type,
		PeriodType: &profile.ValueType{Type: types[0].Type, Unit: types[0].Unit}, Period: 1}
	b.kmap = &profile.Mapping{ID: 1, File: schema.KernelMapping, HasFunctions: true}
	b.p.Mapping = append(b.p.Mapping, b.kmap)
	return b
}

// stack returns locations leaf first: kernel frames, then user frames.
func (b *profBuilder) stack(pid uint32, kernel, user []uint64, userErr int64, kthread bool) []*profile.Location {
	var locs []*profile.Location
	for _, a := range kernel {
		locs = append(locs, b.kernelLoc(a))
	}
	for i, a := range user {
		if l := b.userLoc(pid, a, i == 0); !b.wrappers[l] {
			locs = append(locs, l)
		}
	}
	if len(user) == 0 && userErr == errNotWalked {
		locs = append(locs, b.marker(schema.OffCPUNotWalked))
	} else if len(user) == 0 && userErr < 0 && !kthread {
		locs = append(locs, b.marker(fmt.Sprintf("[user stack: %s]", errnoName(userErr))))
	}
	return locs
}

// buildProfiles symbolizes what was drained into the off-CPU profile
// (with on-CPU samples), and unless wake-ups were off, the wake-up and
// offwake profiles.
func (s *Session) buildProfiles(d *recording) (off, wake, offwake *profile.Profile, err error) {
	s.snapshotLive(d)
	sym := newSymbolizer(s.procs)
	if s.unw != nil {
		sym.jvms = s.unw.jvms
	}
	d.stats, d.start, d.cpuHz, d.wakeups, d.noOffwake = &s.stats, s.start, s.opts.CPUHz, !s.opts.NoWakeups, s.opts.NoOffwake
	d.exitedDetail = s.opts.ExitedDetail
	// The profiles of a long or busy recording are most of the agent's
	// memory, built once: collect their garbage sooner (a recording of
	// 15,000 short-lived processes peaked at twice their size).
	defer debug.SetGCPercent(debug.SetGCPercent(25))
	return d.profiles(sym)
}

// profiles builds a recording into profiles: a function of the recording
// and the symbolizer alone (names of threads outside the recorded set
// come from /proc), and it counts stack completeness and wake-up classes
// in the recording's stats.
func (d *recording) profiles(sym *symbolizer) (off, wake, offwake *profile.Profile, err error) {
	names := &threadNames{d: d, procs: sym.procs}
	d.fold = d.foldedPIDs(d.exitedDetail)
	off = d.offCPUProfile(sym, names)
	if err := d.finish(off, "profile"); err != nil {
		return nil, nil, nil, err
	}
	if !d.wakeups {
		return off, nil, nil, nil
	}
	wake = d.wakeupProfile(sym, names)
	if err := d.finish(wake, "wake-up profile"); err != nil {
		return nil, nil, nil, err
	}
	if d.noOffwake {
		return off, wake, nil, nil
	}
	offwake = d.offwakeProfile(sym, names)
	if err := d.finish(offwake, "offwake profile"); err != nil {
		return nil, nil, nil, err
	}
	return off, wake, offwake, nil
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
	// none of them (symbolizer.user).
	var age time.Duration
	if s.cont != nil {
		age = liveSnapshotAge
	}
	seen := map[uint32]bool{}
	snap := func(tgid uint32) {
		if tgid != 0 && !seen[tgid] {
			seen[tgid] = true
			if (age == 0 || !s.procs.fresh(tgid, age)) && processExists(int(tgid)) {
				s.procs.snapshot(tgid)
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
func (d *recording) offCPUProfile(sym *symbolizer, names *threadNames) *profile.Profile {
	b := newProfBuilder(sym, &profile.ValueType{Type: schema.OffCPU, Unit: schema.Nanoseconds}, &profile.ValueType{Type: schema.Switches, Unit: schema.Count},
		&profile.ValueType{Type: schema.CPU, Unit: schema.Nanoseconds},
		&profile.ValueType{Type: schema.Blocked, Unit: schema.Nanoseconds}, &profile.ValueType{Type: schema.RunQueue, Unit: schema.Nanoseconds},
		&profile.ValueType{Type: schema.WakerWaiting, Unit: schema.Nanoseconds})
	sort.Slice(d.records, func(i, j int) bool { return d.records[i].ns > d.records[j].ns })
	wakers := newWakerStacks(sym)
	for _, r := range d.records {
		th := d.threadOf(&r)
		locs := b.stack(r.tgid, trimKernel(r.kernel, sym.kern), r.user, r.userErr, isKernelThread(r))
		if len(r.user) > 0 && len(locs) > 0 { // the last location is the outermost user frame, its last line the function
			if root := locs[len(locs)-1].Line; schema.IsThreadStart(root[len(root)-1].Function.Name) {
				d.stats.CompleteStacks++
				d.stats.CompleteTime += durationNs(r.ns)
			} else {
				d.stats.TruncatedStacks++
				d.stats.TruncatedTime += durationNs(r.ns)
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
				schema.LabelProcess: {processName(d, r.tgid, sym.procs)},
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
		if r.waker.valid {
			smp.Label[schema.LabelWaker] = []string{names.waker(r.waker, sym.kern)}
			smp.Label[schema.LabelWakeupClass] = []string{classifyWakeup(r.waker, sym.kern)}
			smp.Label[schema.LabelWakerStack] = []string{wakers.folded(r.waker)}
			if !r.waker.irq {
				smp.Label[schema.LabelWakerProcess] = []string{processName(d, r.waker.tgid, sym.procs)}
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

func newWakerStacks(sym *symbolizer) *wakerStacks {
	return &wakerStacks{b: newProfBuilder(sym, &profile.ValueType{Type: schema.Wakeups, Unit: schema.Count}), done: map[[3]int64]string{}}
}

// foldedWait folds a waker's own wait: a blocked stack, trimmed at
// __schedule as the off-CPU samples are.
func (ws *wakerStacks) foldedWait(w waker) string {
	key := [3]int64{-2 - int64(w.tgid), w.userID, w.kernelID}
	if f, ok := ws.done[key]; ok {
		return f
	}
	f := ws.fold(ws.b.stack(w.tgid, trimKernel(w.kernel, ws.b.sym.kern), w.user, 0, true))
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
	user := w.user
	if w.irq {
		user = nil
	}
	// An interrupt's frames only: not the code it happened to interrupt.
	kernel := trimWaker(w.kernel, ws.b.sym.kern)
	names := make([]string, len(kernel))
	for i, a := range kernel {
		names[i] = ws.b.sym.kern.Lookup(a)
	}
	if cut, ok := interruptFrames(names, w.irq); ok {
		kernel = kernel[:cut]
	}
	f := ws.fold(ws.b.stack(w.tgid, kernel, user, 0, true))
	ws.done[key] = f
	return f
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
	if d.cpuHz > 0 {
		period = int64(time.Second) / int64(d.cpuHz)
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
				schema.LabelProcess: {processName(d, tgid, b.sym.procs)},
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
		add(c.tgid, c.tid, c.gen, b.stack(c.tgid, trimKernel(c.kernel, b.sym.kern), c.user, 0, true), ns)
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
func (d *recording) wakeupProfile(sym *symbolizer, names *threadNames) *profile.Profile {
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
	d.stats.WakeupsByClass = map[string]uint64{}
	sort.Slice(d.wakes, func(i, j int) bool { return d.wakes[i].count > d.wakes[j].count })
	for _, w := range d.wakes {
		kernel := trimWaker(w.waker.kernel, sym.kern)
		class := classifyWakeup(w.waker, sym.kern)
		d.stats.WakeupsByClass[class] += w.count
		wakerName := names.waker(w.waker, sym.kern)
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
				schema.LabelProcess:     {processName(d, w.waker.tgid, sym.procs)},
			},
			NumLabel: map[string][]int64{schema.LabelTargetTID: {int64(w.tid)}, schema.LabelPID: {int64(w.waker.tgid)}, schema.LabelWakerTID: {int64(w.waker.tid)}, schema.LabelTID: {int64(w.waker.tid)}},
		}
		if w.tgid != 0 { // the classic tracepoints know the woken tid only
			smp.Label[schema.LabelTargetProcess] = []string{processName(d, w.tgid, sym.procs)}
			smp.NumLabel[schema.LabelTargetPID] = []int64{int64(w.tgid)}
		}
		wb.add(smp, d.folds(w.tgid, w.waker))
	}
	return wb.p
}

// offwakeProfile has a sample per interval with a known waker: the
// blocked stack on top of the waker's, in one sample.
func (d *recording) offwakeProfile(sym *symbolizer, names *threadNames) *profile.Profile {
	ob := newProfBuilder(sym, &profile.ValueType{Type: schema.OffCPU, Unit: schema.Nanoseconds}, &profile.ValueType{Type: schema.Switches, Unit: schema.Count})
	for _, r := range d.records {
		if !r.waker.valid {
			continue
		}
		// Leaf first: waker thread, waker user frames root first... see
		// Offwake's comment for the root-first reading.
		var locs []*profile.Location
		locs = append(locs, ob.marker(names.waker(r.waker, sym.kern)))
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
		wk := trimWaker(r.waker.kernel, sym.kern)
		for i := len(wk) - 1; i >= 0; i-- {
			locs = append(locs, ob.kernelLoc(wk[i]))
		}
		locs = append(locs, ob.marker("--"))
		target := ob.stack(r.tgid, trimKernel(r.kernel, sym.kern), nil, 0, true)
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
			Label:    map[string][]string{schema.LabelThread: {d.threadOf(&r).comm}, schema.LabelWaker: {names.waker(r.waker, sym.kern)}},
			NumLabel: map[string][]int64{schema.LabelTID: {int64(r.tid)}, schema.LabelWakerTID: {int64(r.waker.tid)}},
		}, d.folds(r.tgid, r.waker))
	}
	return ob.p
}

// KeptShare is the share of the recorded threads' off-CPU time that the
// profile kept: all of it but the intervals outside --min-block and
// --max-block.
func (s *Stats) KeptShare() float64 {
	t := s.OffCPU + s.OutOfRangeTime
	if t == 0 {
		return 1
	}
	return float64(s.OffCPU) / float64(t)
}

// CompleteShare is the share of off-CPU time whose user stack reaches a
// thread-start frame, or -1 without user stacks.
func (s *Stats) CompleteShare() float64 {
	t := s.CompleteTime + s.TruncatedTime
	if t == 0 {
		return -1
	}
	return float64(s.CompleteTime) / float64(t)
}

func (d *recording) finishProfile(p *profile.Profile) {
	st := d.stats
	p.TimeNanos = d.start.UnixNano()
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
	if st.Budget != nil {
		p.Comments = append(p.Comments, st.Budget.comment())
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

// threadNames names threads that may lie outside the recorded set.
type threadNames struct {
	d     *recording
	procs *procTable
}

// threadGen names a thread of a known incarnation (gen 0: unknown), so
// that a reused tid names the thread that was sampled or woken.
func (n *threadNames) threadGen(tgid, tid, gen uint32) string {
	if gen != 0 {
		if th, ok := n.d.threads[tid]; ok && th.gen == gen {
			return th.comm
		}
		if th, ok := n.d.exited[[2]uint32{tid, gen}]; ok {
			return th.comm
		}
	}
	return n.thread(tgid, tid)
}

func (n *threadNames) thread(tgid, tid uint32) string {
	if th, ok := n.d.threads[tid]; ok {
		return th.comm
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/comm", tgid, tid)); err == nil {
		c := strings.TrimSpace(string(b))
		n.d.threads[tid] = thread{tgid: tgid, comm: c}
		return c
	}
	if tid == 0 {
		return "swapper"
	}
	return fmt.Sprintf("tid-%d", tid)
}

func (n *threadNames) waker(w waker, k *symtab.Kernel) string {
	if w.irq {
		for _, a := range w.kernel {
			switch name := k.Lookup(a); name {
			case "handle_softirqs", "__do_softirq", "do_softirq", "net_rx_action", "run_timer_softirq":
				return "[softirq]"
			}
		}
		return "[interrupt]"
	}
	return n.thread(w.tgid, w.tid)
}

// classifyWakeup names the kernel path of a wake-up from the waker's
// kernel stack. A wake-up raised by an interrupt, or by a softirq run in
// ksoftirqd, is classed by the interrupt's own frames (those leafward of
// the interrupt entry or the softirq dispatcher), never by the code the
// interrupt happened to stop.
func classifyWakeup(w waker, k *symtab.Kernel) string {
	names := make([]string, len(w.kernel))
	for i, a := range w.kernel {
		names[i] = k.Lookup(a)
	}
	if cut, ok := interruptFrames(names, w.irq); ok {
		return classifyInterrupt(names[:cut])
	}
	return classifyTask(names)
}

// interruptFrames finds, in a waker's kernel stack (leaf first), where the
// interrupt's own frames end: at the softirq dispatcher, or past the
// hard-irq entry (whose name tells the vector). ok is false for a wake-up
// in task context.
func interruptFrames(names []string, irq bool) (cut int, ok bool) {
	softirqThread := slices.Contains(names, "run_ksoftirqd")
	if !irq && !softirqThread {
		return 0, false
	}
	for i, n := range names {
		switch {
		case n == "handle_softirqs" || n == "__do_softirq":
			return i, true
		case strings.HasPrefix(n, "sysvec_") || strings.HasPrefix(n, "__sysvec_") || n == "common_interrupt" || n == "__common_interrupt" ||
			strings.HasPrefix(n, "asm_"):
			return i + 1, true
		}
	}
	return len(names), true
}

// Wake-up classes of interrupt context.
const (
	ClassBlockIO = "block-io" // block I/O completion
	ClassNetRx   = "net-rx"   // network receive
	ClassTimer   = "timer"
	ClassIPI     = "ipi"       // another CPU's request (function call, irq work)
	ClassIRQ     = "irq-other" // any other interrupt
)

func classifyInterrupt(names []string) string {
	has := func(subs ...string) bool { return hasAny(names, subs) }
	switch {
	case has("blk_", "bio_endio", "end_buffer", "scsi_", "nvme_", "virtblk", "end_page_writeback", "folio_end_writeback", "_end_io"):
		return ClassBlockIO
	case has("net_rx_action", "netif_receive", "napi_", "process_backlog", "ip_rcv", "ip6_rcv", "tcp_v4_rcv", "tcp_v6_rcv", "udp_rcv"):
		return ClassNetRx
	case has("hrtimer_", "run_timer", "call_timer_fn", "tick_", "timerfd", "process_timeout", "it_real_fn", "posix_timer", "apic_timer"):
		return ClassTimer
	case has("call_function", "smp_call_function", "irq_work", "reschedule_ipi"):
		return ClassIPI
	}
	return ClassIRQ
}

func hasAny(names, subs []string) bool {
	for _, n := range names {
		for _, s := range subs {
			if strings.Contains(n, s) {
				return true
			}
		}
	}
	return false
}

// classifyTask classes a wake-up made by a thread, from its kernel path.
func classifyTask(names []string) string {
	has := func(subs ...string) bool { return hasAny(names, subs) }
	switch {
	case has("eventfd"):
		return "eventfd"
	case has("futex"):
		return "futex"
	case has("hrtimer_wakeup", "timerfd", "process_timeout", "it_real_fn", "posix_timer"):
		return "timer"
	case has("pipe_", "sock_def", "unix_stream", "unix_dgram", "tcp_", "udp_", "sk_", "sock_"):
		return "pipe/socket"
	}
	return "other"
}

// trimWaker drops the tracing frames above try_to_wake_up.
func trimWaker(st []uint64, k *symtab.Kernel) []uint64 {
	for i, a := range st {
		if n := k.Lookup(a); n == "try_to_wake_up" || n == "wake_up_new_task" || n == "wake_up_q" {
			return st[i:]
		}
	}
	return st
}

func isKernelThread(r record) bool { return len(r.user) == 0 && r.userErr == -1 }

func errnoName(e int64) string {
	if e == 0 {
		return "none"
	}
	return unix.ErrnoName(unix.Errno(-e))
}

func processName(d *recording, tgid uint32, procs *procTable) string {
	if th, ok := d.threads[tgid]; ok && th.tgid == tgid {
		if p := procs.get(tgid); p != nil && p.comm != "" {
			return p.comm
		}
		return th.comm
	}
	if p := procs.get(tgid); p != nil && p.comm != "" {
		return p.comm
	}
	return fmt.Sprintf("pid-%d", tgid)
}

// trimKernel drops the frames above __schedule (tracing and BPF glue).
func trimKernel(st []uint64, k *symtab.Kernel) []uint64 {
	for i, a := range st {
		if n := k.Lookup(a); n == "__schedule" || n == "__schedule_loop" {
			return st[i:]
		}
	}
	return st
}

func (b *profBuilder) function(name, file string) *profile.Function {
	key := [2]string{name, file}
	if f, ok := b.funcs[key]; ok {
		return f
	}
	f := &profile.Function{ID: uint64(len(b.p.Function) + 1), Name: name, SystemName: name, Filename: file}
	b.p.Function = append(b.p.Function, f)
	b.funcs[key] = f
	return f
}

func (b *profBuilder) kernelLoc(addr uint64) *profile.Location {
	key := [2]uint64{0, addr}
	if l, ok := b.locs[key]; ok {
		return l
	}
	l := &profile.Location{ID: uint64(len(b.p.Location) + 1), Mapping: b.kmap, Address: addr,
		Line: []profile.Line{{Function: b.function(b.sym.kern.Lookup(addr), "")}}}
	b.p.Location = append(b.p.Location, l)
	b.locs[key] = l
	return l
}

// marker is a pseudo-frame that says why a stack is missing.
func (b *profBuilder) marker(text string) *profile.Location {
	if l, ok := b.markers[text]; ok {
		return l
	}
	l := &profile.Location{ID: uint64(len(b.p.Location) + 1), Line: []profile.Line{{Function: b.function(text, "")}}}
	b.p.Location = append(b.p.Location, l)
	b.markers[text] = l
	return l
}

// userLoc is the location of a user frame. leaf: addr is where the thread
// stopped (the registers' instruction pointer); otherwise it is a return
// address, and the call instruction before it is looked up.
func (b *profBuilder) userLoc(pid uint32, addr uint64, leaf bool) *profile.Location {
	key := [2]uint64{uint64(pid) + 1, addr}
	look := addr - 1
	if leaf || isJavaMethod(addr) { // a Method*, not a return address
		look = addr
	}
	if leaf {
		key[0] |= 1 << 40
		look = addr
	}
	if l, ok := b.locs[key]; ok {
		return l
	}
	p := b.sym.proc(pid)
	var m *mapping
	if p != nil {
		m = p.find(look)
	}
	if m != nil && m.file != nil {
		// Code from a file: one location per file offset, shared by every
		// process that maps the file (each has its own addresses), so that
		// many short-lived processes do not each add their own.
		l := b.fileLoc(pid, m, addr, look, leaf)
		b.locs[key] = l
		return l
	}
	if b.sym.jvms != nil {
		// Java code: an interpreter frame, or a pc in compiled code with the
		// methods inlined there, innermost first.
		if names, ok := b.sym.jvms.frames(pid, addr); ok {
			l := &profile.Location{ID: uint64(len(b.p.Location) + 1), Address: addr, Mapping: b.mapping(pid, m)}
			for _, f := range names {
				l.Line = append(l.Line, profile.Line{Function: b.function(f.Name, ""), Line: int64(f.Line)})
			}
			b.p.Location = append(b.p.Location, l)
			b.locs[key] = l
			return l
		}
	}
	frames, m := b.sym.userFrames(pid, look)
	l := &profile.Location{ID: uint64(len(b.p.Location) + 1), Address: addr, Mapping: b.mapping(pid, m)}
	b.setLines(l, frames)
	b.p.Location = append(b.p.Location, l)
	b.locs[key] = l
	return l
}

// fileLoc is the location of addr in file mapping m, keyed by file and
// offset. Its address is in the first mapping of that file segment seen,
// so that pprof still finds the file offset from it.
func (b *profBuilder) fileLoc(pid uint32, m *mapping, addr, look uint64, leaf bool) *profile.Location {
	seg := fileSeg{m.file, m.offset}
	pm, ok := b.fileMaps[seg]
	if !ok {
		pm = b.mapping(pid, m)
		b.fileMaps[seg] = pm
	}
	key := fileOff{seg, addr - m.start, leaf}
	if l, ok := b.fileLocs[key]; ok {
		return l
	}
	frames, _ := b.sym.userFrames(pid, look)
	l := &profile.Location{ID: uint64(len(b.p.Location) + 1), Address: pm.Start + (addr - m.start), Mapping: pm}
	b.setLines(l, frames)
	b.p.Location = append(b.p.Location, l)
	b.fileLocs[key] = l
	return l
}

// setLines gives l a line for each frame (innermost first, as pprof has
// inlined calls), leaving out Go's wrappers as its tracebacks do; a
// location of wrappers alone is left out of stacks.
func (b *profBuilder) setLines(l *profile.Location, frames []symtab.Frame) {
	for _, fr := range frames {
		if !fr.Wrapper {
			l.Line = append(l.Line, profile.Line{Function: b.function(fr.Func, fr.File), Line: fr.Line})
		}
	}
	if len(l.Line) == 0 {
		fr := frames[len(frames)-1]
		l.Line = []profile.Line{{Function: b.function(fr.Func, fr.File), Line: fr.Line}}
		b.wrappers[l] = true
	}
}

type fileSeg struct {
	file   *symtab.File
	offset uint64
}

type fileOff struct {
	seg  fileSeg
	off  uint64 // from the segment's start
	leaf bool
}

func (b *profBuilder) mapping(pid uint32, m *mapping) *profile.Mapping {
	if m == nil {
		if pm, ok := b.unknown[pid]; ok {
			return pm
		}
		pm := &profile.Mapping{ID: uint64(len(b.p.Mapping) + 1), File: "[unmapped]", HasFunctions: true}
		b.p.Mapping = append(b.p.Mapping, pm)
		b.unknown[pid] = pm
		return pm
	}
	key := fmt.Sprintf("%d:%x", pid, m.start)
	if pm, ok := b.maps[key]; ok {
		return pm
	}
	pm := &profile.Mapping{ID: uint64(len(b.p.Mapping) + 1), Start: m.start, Limit: m.end, Offset: m.offset,
		File: m.path, HasFunctions: true}
	if pm.File == "" {
		pm.File = "[anon]"
	}
	if m.file != nil {
		m.file.Load()
		pm.BuildID = m.file.BuildID
	}
	b.p.Mapping = append(b.p.Mapping, pm)
	b.maps[key] = pm
	return pm
}

func durationNs(ns uint64) time.Duration {
	if ns > 1<<63-1 {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(ns)
}
