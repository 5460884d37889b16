package collector

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/stream"
	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/symtab"
	"github.com/offcpu/offcpu/runtimes/golang"
	"github.com/offcpu/offcpu/schema"
)

// goRecorder records the goroutine waits of the Go programs among the
// targets: one uprobe per executable on runtime.casgstatus, the
// processes it counts for listed in go_procs with their runtime's
// offsets.
type goRecorder struct {
	objs bpf.GoroutinesObjects

	mu    sync.Mutex
	links map[uint32][]link.Link // by process
	procs map[uint32]*golang.Runtime
	stats GoroutineStats

	// stream: every wait in order (Options.Stream); nil without. open:
	// the waits drain found still open.
	stream *stream.Ring[bpf.GoroutinesGoWaitEvent]
	open   []bpf.GoroutinesGoWaitEvent
	closed bool // stream closed

	// Label sets moved out of go_links (goLinks), and the mover's stop.
	linkMu   sync.Mutex
	labels   map[bpf.GoroutinesGoLinkKey]goLabels
	linkUse  map[bpf.GoroutinesGoLinkKey]int // the last cut that used a set
	cuts     int
	stopMove chan struct{}
	moved    sync.WaitGroup
}

// goLabels is one label set: the pairs, in the order the program keeps
// them (sorted by key from go1.24), and whether some were cut short.
type goLabels struct {
	pairs     [][2]string
	truncated bool
}

// GoroutineStats describes the goroutine waits recorded.
type GoroutineStats struct {
	Processes int    `json:"processes"` // Go processes probed
	Parks     uint64 `json:"parks"`
	Readies   uint64 `json:"readies"`
	// Requeues: running goroutines put back on a run queue (preempted,
	// yielded, back from a system call without a P): waits for a P alone.
	Requeues uint64 `json:"requeues"`
	// Suspends: running goroutines the GC stopped to scan their stacks
	// (wait reason "preempted"), until it made them runnable.
	Suspends  uint64 `json:"suspends"`
	Runs      uint64 `json:"runs"`
	Open      uint64 `json:"open"`       // still parked or runnable at the end, counted up to it
	Unseen    uint64 `json:"unseen"`     // made runnable, parked before the probe: counted from the probe (or the start)
	LostParks uint64 `json:"lost_parks"` // goroutine map full (--goroutines-max)
	LostWaits uint64 `json:"lost_waits"` // aggregation map full
	// Merged: waits counted without their goroutine ids (goid -1), the
	// aggregation map being full of other goroutines'.
	Merged    uint64 `json:"merged_waits"`
	LostStack uint64 `json:"lost_stacks"` // stack map full: counted without a stack
	// ReusedStacks: parks and wake-ups at the place of the goroutine's previous one,
	// whose stack was reused rather than walked again.
	ReusedStacks uint64 `json:"reused_stacks"`
	// Label sets (pprof labels) read, the waits counted without theirs
	// (label map full), and the sets cut short (more than 8 labels, a key
	// over 32 bytes or a value over 64).
	LabelSets      uint64 `json:"label_sets"`
	LostLabelSets  uint64 `json:"lost_label_sets"`
	TruncatedLabel uint64 `json:"truncated_label_sets"`
	ShedLabelSets  uint64 `json:"shed_label_sets"` // past the recording's bound (262,144 sets)
	// StreamLost: waits the goroutine stream's ring had no room for
	// (--timeline).
	StreamLost uint64 `json:"stream_lost,omitempty"`
	// IDsByAddress: processes whose sets are told apart by their addresses
	// alone (runtime.memstats stripped): after a collection a set at a
	// freed one's address can take its id.
	IDsByAddress int      `json:"label_ids_by_address,omitempty"`
	Skipped      []string `json:"skipped,omitempty"`
}

func newGoRecorder(o Options) (*goRecorder, error) {
	spec, err := bpf.LoadGoroutines()
	if err != nil {
		return nil, err
	}
	if o.MaxGoroutines > 0 {
		spec.Maps[bpf.GoroutinesMapGoParked].MaxEntries = uint32(o.MaxGoroutines)
	}
	ring := os.Getpagesize() // off: the send is pruned
	if o.Stream {
		ring = o.StreamRing
	}
	spec.Maps[bpf.GoroutinesMapGoStream].MaxEntries = uint32(ring)
	if err := spec.Variables[bpf.GoroutinesVarGoWantStream].Set(o.Stream); err != nil {
		return nil, fmt.Errorf("setting %s: %w", bpf.GoroutinesVarGoWantStream, err)
	}
	r := &goRecorder{links: map[uint32][]link.Link{}, procs: map[uint32]*golang.Runtime{},
		labels: map[bpf.GoroutinesGoLinkKey]goLabels{}, linkUse: map[bpf.GoroutinesGoLinkKey]int{}, stopMove: make(chan struct{})}
	if err := spec.LoadAndAssign(&r.objs, nil); err != nil {
		return nil, fmt.Errorf("loading the goroutine probe: %w", err)
	}
	if o.Stream {
		r.stream, err = stream.New(r.objs.GoStream, o.StreamKeep, o.StreamKeepBytes,
			func(w *bpf.GoroutinesGoWaitEvent) uint64 { return w.RunNs }, nil)
		if err != nil {
			r.objs.Close()
			return nil, err
		}
	}
	r.moved.Add(1)
	go r.moveLinks()
	return r, nil
}

// linkEvery: how often label sets are moved out of the kernel's map, which
// holds 4,096: a server starting more labelled requests than that in the
// time loses the labels of the rest (counted).
const linkEvery = 250 * time.Millisecond

// maxLabelSets bounds the label sets a recording keeps (about 50 MiB at
// most): past it a wait keeps its time, not its labels (counted).
const maxLabelSets = 1 << 18

func (r *goRecorder) moveLinks() {
	defer r.moved.Done()
	t := time.NewTicker(linkEvery)
	defer t.Stop()
	for {
		select {
		case <-r.stopMove:
			return
		case <-t.C:
			r.takeLinks()
		}
	}
}

// takeLinks moves the label sets the probe read into r.labels: the probe
// reads a set again if its goroutine parks with it after.
func (r *goRecorder) takeLinks() {
	r.linkMu.Lock()
	defer r.linkMu.Unlock()
	bpf.MoveOut(r.objs.GoLinks, func(k bpf.GoroutinesGoLinkKey, v *bpf.GoroutinesGoLinkVal) {
		if _, ok := r.labels[k]; ok {
			return
		}
		if len(r.labels) >= maxLabelSets {
			r.stats.ShedLabelSets++
			return
		}
		r.labels[k] = decodeLabels(v)
	})
}

// decodeLabels reads one label set of the probe's.
func decodeLabels(v *bpf.GoroutinesGoLinkVal) goLabels {
	pairs, truncated := v.Pairs()
	return goLabels{pairs: pairs, truncated: truncated}
}

// add probes process pid if it runs a Go executable; other processes are
// left alone, and a Go one that cannot be read is named in the stats.
func (r *goRecorder) add(pid uint32) {
	exe := fmt.Sprintf("/proc/%d/exe", pid)
	rt, err := golang.ReadRuntime(exe)
	if errors.Is(err, golang.ErrNotGo) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.procs[pid]; ok {
		return
	}
	if err == nil {
		err = r.attach(pid, exe, rt)
	}
	if err != nil {
		r.stats.Skipped = append(r.stats.Skipped, fmt.Sprintf("process %d: %v", pid, err))
		return
	}
	off := rt.Offsets
	off.Preempted = 0xff
	if i := slices.Index(rt.Reasons, "preempted"); i >= 0 {
		off.Preempted = uint32(i) // a goroutine the GC suspended (preemptPark)
	}
	if off.GcCycles = rt.GCCyclesIn(pid); off.GcCycles == 0 && off.Labels != 0 {
		r.stats.IDsByAddress++
	}
	off.ProbedNs = monotonicNow() // the probe traps from here on
	if err := r.objs.GoProcs.Put(pid, off); err != nil {
		r.stats.Skipped = append(r.stats.Skipped, fmt.Sprintf("process %d: %v", pid, err))
		return
	}
	r.procs[pid] = rt
	r.stats.Processes++
}

// attach puts the probes on the process's executable for that process
// alone: other processes that run it (the recorder itself, when it
// records its own workload) do not trap. Without preemptPark (not found),
// the GC's suspensions are not followed.
func (r *goRecorder) attach(pid uint32, exe string, rt *golang.Runtime) error {
	ex, err := link.OpenExecutable(exe)
	if err != nil {
		return err
	}
	l, err := ex.Uprobe("runtime.casgstatus", r.objs.GoCasgstatus, &link.UprobeOptions{Address: rt.Casgstatus, PID: int(pid)})
	if err != nil {
		return fmt.Errorf("uprobe on runtime.casgstatus: %w", err)
	}
	links := []link.Link{l}
	if rt.PreemptPark != 0 {
		l, err := ex.Uprobe("runtime.preemptPark", r.objs.GoPreemptPark, &link.UprobeOptions{Address: rt.PreemptPark, PID: int(pid)})
		if err != nil {
			closeLinks(links)
			return fmt.Errorf("uprobe on runtime.preemptPark: %w", err)
		}
		links = append(links, l)
	}
	r.links[pid] = links
	return nil
}

// exit removes an ended process's probe; its waits stay for drain.
func (r *goRecorder) exit(pid uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ls, ok := r.links[pid]; ok {
		closeLinks(ls)
		delete(r.links, pid)
	}
}

// setWindow tells the probe where the recorded window starts or stops
// (CLOCK_MONOTONIC ns): it counts nothing outside it.
func (r *goRecorder) setWindow(start bool, ns uint64) error {
	v := r.objs.GoStopNs
	if start {
		v = r.objs.GoStartNs
	}
	return v.Set(ns)
}

// detach stops the probes; the maps stay for drain.
func (r *goRecorder) detach() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, ls := range r.links {
		closeLinks(ls)
		delete(r.links, k)
	}
}

func closeLinks(ls []link.Link) {
	for _, l := range ls {
		l.Close()
	}
}

func (r *goRecorder) close() {
	r.detach()
	r.stopLinks()
	r.closeStream()
	r.objs.Close()
}

// stopLinks stops the mover (once); drain takes what is left.
func (r *goRecorder) stopLinks() {
	r.linkMu.Lock()
	select {
	case <-r.stopMove:
	default:
		close(r.stopMove)
	}
	r.linkMu.Unlock()
	r.moved.Wait()
}

// goWait is one aggregated row: a goroutine's waits with the same reason,
// stack, waker and waker stack.
// goBeforeStart: the wait began before the window.
const goBeforeStart = bpf.GoBeforeStart

type goWait struct {
	key  bpf.GoroutinesGoKey
	val  bpf.GoroutinesGoVal
	open bool // still parked or runnable at the end of the window
}

// drain reads the waits, and counts the goroutines still parked (or
// runnable) at end (CLOCK_MONOTONIC ns) up to it, from start at the
// earliest.
func (r *goRecorder) drain(start, end uint64) (waits []goWait, stacks map[uint64][]uint64) {
	var k bpf.GoroutinesGoKey
	var v bpf.GoroutinesGoVal
	for _, m := range []*ebpf.Map{r.objs.GoWaits, r.objs.GoWaitsMerged} {
		it := m.Iterate()
		for it.Next(&k, &v) {
			waits = append(waits, goWait{key: k, val: v})
		}
	}
	var gk bpf.GoroutinesGoGkey
	var p bpf.GoroutinesGoPark
	pit := r.objs.GoParked.Iterate()
	for pit.Next(&gk, &p) {
		if p.ParkNs == 0 || p.ParkNs > end || p.RunNs != 0 {
			continue // ran since: counted already, kept as its last wait
		}
		park := max(p.ParkNs, start)
		w := goWait{key: bpf.GoroutinesGoKey{Tgid: gk.Tgid, Reason: uint16(p.Reason), Goid: p.Goid, Stack: p.Stack,
			WakerStack: p.WakerStack, WakerGoid: p.WakerGoid, WakerWaitStack: p.WakerWaitStack, Gopc: p.Gopc, Startpc: p.Startpc, Link: p.Link}, open: true}
		if p.ParkNs < start || p.Flags&goBeforeStart != 0 {
			w.key.Flags |= goBeforeStart
		}
		w.val.Count = 1
		if r.stream != nil {
			r.open = append(r.open, openGoWait(gk.Tgid, &p, park, end))
		}
		if p.ReadyNs != 0 && p.ReadyNs <= end {
			ready := max(p.ReadyNs, park)
			w.val.BlockedNs, w.val.RunqNs = ready-park, end-ready
			w.val.WakerWaitNs = min(p.WakerWaitNs, w.val.BlockedNs)
		} else {
			w.val.BlockedNs = end - park
			w.key.WakerStack, w.key.WakerGoid, w.key.WakerWaitStack = 0, 0, 0
		}
		waits = append(waits, w)
		r.stats.Open++
	}
	r.stopLinks() // the window is closed: one last move, no more races
	r.takeLinks()
	return waits, r.readStacks()
}

// readStacks reads the stacks the waits refer to, and the counters.
func (r *goRecorder) readStacks() map[uint64][]uint64 {
	stacks := map[uint64][]uint64{}
	var h uint64
	var st bpf.GoroutinesGoStack
	sit := r.objs.GoStacks.Iterate()
	for sit.Next(&h, &st) {
		var ips []uint64
		for _, a := range st.Ips {
			if a == 0 {
				break
			}
			ips = append(ips, a)
		}
		stacks[h] = ips
	}
	var per []uint64
	for i, dst := range map[bpf.GoroutinesGoStat]*uint64{
		bpf.GoroutinesGoStatGO_STAT_PARKS: &r.stats.Parks, bpf.GoroutinesGoStatGO_STAT_READIES: &r.stats.Readies,
		bpf.GoroutinesGoStatGO_STAT_RUNS: &r.stats.Runs, bpf.GoroutinesGoStatGO_STAT_LOST_PARKS: &r.stats.LostParks,
		bpf.GoroutinesGoStatGO_STAT_LOST_WAITS: &r.stats.LostWaits, bpf.GoroutinesGoStatGO_STAT_LOST_STACKS: &r.stats.LostStack,
		bpf.GoroutinesGoStatGO_STAT_UNSEEN: &r.stats.Unseen, bpf.GoroutinesGoStatGO_STAT_MERGED: &r.stats.Merged,
		bpf.GoroutinesGoStatGO_STAT_REUSED: &r.stats.ReusedStacks, bpf.GoroutinesGoStatGO_STAT_LINKS: &r.stats.LabelSets,
		bpf.GoroutinesGoStatGO_STAT_LOST_LINKS: &r.stats.LostLabelSets, bpf.GoroutinesGoStatGO_STAT_REQUEUES: &r.stats.Requeues,
		bpf.GoroutinesGoStatGO_STAT_SUSPENDS: &r.stats.Suspends, bpf.GoroutinesGoStatGO_STAT_STREAM_LOST: &r.stats.StreamLost} {
		if err := r.objs.GoStats.Lookup(uint32(i), &per); err == nil {
			*dst = 0
			for _, n := range per {
				*dst += n
			}
		}
	}
	return stacks
}

// cut is a continuous recording's goroutine profile of one interval: the
// waits that ended in it, taken out of the maps (a wait counts whole in
// the interval it ended in); at the final cut, those still open too, up
// to end. Label sets no wait used for linkCuts cuts are forgotten.
func (r *goRecorder) cut(sym *symbolize.Symbolizer, final bool, start, end uint64, t0 time.Time, dur time.Duration) (*profile.Profile, error) {
	var waits []goWait
	var stacks map[uint64][]uint64
	if final {
		waits, stacks = r.drain(start, end)
	} else {
		for _, m := range []*ebpf.Map{r.objs.GoWaits, r.objs.GoWaitsMerged} {
			var k bpf.GoroutinesGoKey
			var v bpf.GoroutinesGoVal
			var keys []bpf.GoroutinesGoKey
			it := m.Iterate()
			for it.Next(&k, &v) {
				keys = append(keys, k)
			}
			for _, k := range keys {
				if err := m.LookupAndDelete(&k, &v); err == nil {
					waits = append(waits, goWait{key: k, val: v})
				}
			}
		}
		r.takeLinks()
		stacks = r.readStacks()
	}
	p, err := r.profile(sym, waits, stacks, t0, dur)
	r.linkMu.Lock()
	defer r.linkMu.Unlock()
	r.cuts++
	for _, w := range waits {
		if w.key.Link != 0 {
			r.linkUse[bpf.GoroutinesGoLinkKey{Tgid: w.key.Tgid, Id: w.key.Link}] = r.cuts
		}
	}
	for k := range r.labels {
		if u, ok := r.linkUse[k]; !ok {
			r.linkUse[k] = r.cuts
		} else if r.cuts-u > linkCuts {
			delete(r.labels, k)
			delete(r.linkUse, k)
		}
	}
	return p, err
}

// statsCopy is the counters so far.
func (r *goRecorder) statsCopy() *GoroutineStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.stats
	st.Skipped = append([]string(nil), r.stats.Skipped...)
	return &st
}

// linkCuts: a label set unused this many cuts is forgotten (a wait still
// open that long ends without its labels; counted as not read).
const linkCuts = 4

// profile builds the goroutine profile: a sample per row, at the park's
// stack, with the goroutine, its reason, the waker goroutine and its
// stack as labels.
func (r *goRecorder) profile(sym *symbolize.Symbolizer, waits []goWait, stacks map[uint64][]uint64, start time.Time, dur time.Duration) (*profile.Profile, error) {
	b := newProfBuilder(sym, &profile.ValueType{Type: schema.GoroutineBlocked, Unit: schema.Nanoseconds},
		&profile.ValueType{Type: schema.GoroutineRunQueue, Unit: schema.Nanoseconds},
		&profile.ValueType{Type: schema.GoroutineWaits, Unit: schema.Count},
		&profile.ValueType{Type: schema.WakerWaiting, Unit: schema.Nanoseconds})
	sort.Slice(waits, func(i, j int) bool { return waits[i].val.BlockedNs > waits[j].val.BlockedNs })
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
			funcs[k] = goFunc(sym, pid, pc)
		}
		return funcs[k]
	}
	creators := map[[2]uint64]string{}
	creatorAt := func(pid uint32, pc uint64) string {
		k := [2]uint64{uint64(pid), pc}
		if _, ok := creators[k]; !ok {
			creators[k] = goCreator(sym, pid, pc)
		}
		return creators[k]
	}
	unnamed := 0
	for _, w := range waits {
		pid := w.key.Tgid
		locs := b.stack(pid, nil, stacks[w.key.Stack], 0, true)
		if len(locs) == 0 {
			locs = append(locs, b.marker("[goroutine stack: not walked]"))
		}
		s := &profile.Sample{Location: locs, Value: []int64{int64(w.val.BlockedNs), int64(w.val.RunqNs), int64(w.val.Count), int64(w.val.WakerWaitNs)},
			Label: map[string][]string{
				schema.LabelReason:  {r.procs[pid].Reason(w.key.Reason)},
				schema.LabelProcess: {processName(&recording{}, pid, sym.Procs)},
			},
			NumLabel: map[string][]int64{schema.LabelGoid: {int64(w.key.Goid)}, schema.LabelPID: {int64(pid)},
				schema.LabelWakerGoid: {int64(w.key.WakerGoid)}},
		}
		if w.key.WakerStack != 0 {
			s.Label[schema.LabelWakerStack] = []string{fold(pid, w.key.WakerStack)}
		}
		if w.key.WakerWaitStack != 0 && w.val.WakerWaitNs > 0 {
			s.Label[schema.LabelWakerWaitStack] = []string{fold(pid, w.key.WakerWaitStack)}
		}
		if w.key.Gopc != 0 { // a return address: the go statement is before it
			s.Label[schema.LabelGoCreator] = []string{creatorAt(pid, w.key.Gopc-1)}
		}
		if fr := funcAt(pid, w.key.Startpc); w.key.Startpc != 0 && !fr.Wrapper {
			s.Label[schema.LabelGoStart] = []string{fr.Func}
		}
		if iv := goInterval(w); iv != "" {
			s.Label[schema.LabelInterval] = []string{iv}
		}
		if w.key.Link != 0 && !r.putLabels(s, pid, w.key.Link) {
			unnamed++
		}
		b.p.Sample = append(b.p.Sample, s)
	}
	p := b.p
	p.Mapping = p.Mapping[1:] // no kernel frames: the executable's mapping comes first, as pprof's main file
	p.TimeNanos, p.DurationNanos = start.UnixNano(), int64(dur)
	r.countTruncated()
	p.Comments = append(p.Comments, r.stats.comments()...)
	if unnamed > 0 {
		p.Comments = append(p.Comments, fmt.Sprintf("offcpu goroutines: %d rows whose label set was not read", unnamed))
	}
	if err := p.CheckValid(); err != nil {
		return nil, fmt.Errorf("building the goroutine profile: %w", err)
	}
	return p, nil
}

// countTruncated counts the label sets kept that were cut short.
func (r *goRecorder) countTruncated() {
	r.linkMu.Lock()
	defer r.linkMu.Unlock()
	r.stats.TruncatedLabel = 0
	for _, l := range r.labels {
		if l.truncated {
			r.stats.TruncatedLabel++
		}
	}
}

// putLabels puts label set link of process pid on s; false: the set
// was not read.
func (r *goRecorder) putLabels(s *profile.Sample, pid uint32, link uint64) bool {
	r.linkMu.Lock()
	l, ok := r.labels[bpf.GoroutinesGoLinkKey{Tgid: pid, Id: link}]
	r.linkMu.Unlock()
	for _, kv := range l.pairs {
		s.Label[schema.ProgramLabelKey(kv[0])] = []string{kv[1]}
	}
	return ok
}

// goFunc is the function at pc: for a go statement's wrapper, the
// function it calls, as Go shows it.
func goFunc(sym *symbolize.Symbolizer, pid uint32, pc uint64) symtab.Frame {
	fr, _ := sym.User(pid, pc)
	if fr.Wrapper {
		if to, ok := sym.Wrapped(pid, pc); ok {
			return to
		}
	}
	return fr
}

// goCreator names a goroutine's creator as Go's "created by" does: the
// innermost function at the go statement, inlined or not.
func goCreator(sym *symbolize.Symbolizer, pid uint32, pc uint64) string {
	frames, _ := sym.UserFrames(pid, pc)
	for _, fr := range frames {
		if !fr.Wrapper {
			return fr.Func
		}
	}
	return frames[len(frames)-1].Func
}

// comments are the profile's comments on what was recorded and lost.
func (st *GoroutineStats) comments() []string {
	out := []string{fmt.Sprintf("offcpu goroutines: processes=%d parks=%d readies=%d requeues=%d suspends=%d runs=%d open=%d unseen=%d lost_parks=%d lost_waits=%d lost_stacks=%d merged_waits=%d reused_stacks=%d label_sets=%d lost_label_sets=%d truncated_label_sets=%d shed_label_sets=%d",
		st.Processes, st.Parks, st.Readies, st.Requeues, st.Suspends, st.Runs, st.Open, st.Unseen, st.LostParks, st.LostWaits, st.LostStack, st.Merged, st.ReusedStacks,
		st.LabelSets, st.LostLabelSets, st.TruncatedLabel, st.ShedLabelSets)}
	if st.IDsByAddress > 0 {
		out = append(out, fmt.Sprintf("label_ids_by_address=%d (runtime.memstats not found: a label set freed can lend its id to one allocated at its address)", st.IDsByAddress))
	}
	for _, s := range st.Skipped {
		out = append(out, "skipped: "+s)
	}
	return out
}

// goInterval labels a wait as the thread profile does: open at the end,
// begun before the start, or both (whole).
func goInterval(w goWait) string {
	before := w.key.Flags&goBeforeStart != 0
	switch {
	case before && w.open:
		return "whole"
	case before:
		return "before-start"
	case w.open:
		return "open"
	}
	return ""
}

// GoReasonClass groups the Go runtime's wait reasons (as it names them in
// g.waitreason, every release since 1.11) into the kinds a developer
// acts on: chan, select, sync (mutexes, conditions, wait groups,
// semaphores), network, sleep, gc (the runtime's "preempted": suspended
// by the GC), runnable (waiting for a P), other.
func GoReasonClass(reason string) string {
	switch {
	case strings.HasPrefix(reason, "chan "):
		return "chan"
	case strings.HasPrefix(reason, "select"):
		return "select"
	case strings.HasPrefix(reason, "sync."), reason == "semacquire":
		return "sync"
	case reason == "IO wait":
		return "network"
	case reason == "sleep":
		return "sleep"
	case reason == golang.ReasonRunnable:
		return "runnable"
	case strings.Contains(strings.ToLower(reason), "gc") || strings.HasPrefix(reason, "garbage collection") ||
		reason == "wait for GC cycle" || reason == "finalizer wait" || reason == "preempted":
		return "gc"
	}
	return "other"
}
