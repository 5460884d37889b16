// Package goroutines records the goroutine waits of the Go programs among
// a session's processes: a uprobe per executable on runtime.casgstatus
// (and runtime.preemptPark), the waits aggregated in the kernel by
// goroutine, reason, stack and waker, the pprof label sets moved out
// as they come, and every wait in order when streamed. The session
// builds the profile and the timeline from what it drains.
package goroutines

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/stream"
	"github.com/offcpu/offcpu/runtimes/golang"
)

// Config is what a recorder is loaded with.
type Config struct {
	MaxGoroutines int // go_parked's size (0: the program's)
	// Stream: every wait in order, in a ring of StreamRing bytes, kept
	// StreamKeep (0: all) in at most StreamKeepBytes.
	Stream          bool
	StreamRing      int
	StreamKeep      time.Duration
	StreamKeepBytes int
	// Now is CLOCK_MONOTONIC in ns, the programs' clock.
	Now func() uint64
}

// Recorder records the goroutine waits of the Go programs among the
// targets: one uprobe per executable on runtime.casgstatus, the
// processes it counts for listed in go_procs with their runtime's
// offsets.
type Recorder struct {
	objs bpf.GoroutinesObjects
	now  func() uint64

	mu    sync.Mutex
	links map[uint32][]link.Link // by process
	procs map[uint32]*golang.Runtime
	stats Stats

	// stream: every wait in order (Config.Stream); nil without. open:
	// the waits drain found still open.
	stream *stream.Ring[bpf.GoroutinesGoWaitEvent]
	open   []bpf.GoroutinesGoWaitEvent
	closed bool // stream closed

	// Label sets moved out of go_links (goLinks), and the mover's stop.
	linkMu   sync.Mutex
	labels   map[bpf.GoroutinesGoLinkKey]labelSet
	linkUse  map[bpf.GoroutinesGoLinkKey]int // the last cut that used a set
	cuts     int
	stopMove chan struct{}
	moved    sync.WaitGroup
}

// labelSet is one label set: the pairs, in the order the program keeps
// them (sorted by key from go1.24), and whether some were cut short.
type labelSet struct {
	pairs     [][2]string
	truncated bool
}

// New loads the goroutine probe; it attaches to processes as they are
// added.
func New(o Config) (*Recorder, error) {
	if o.Now == nil {
		return nil, errors.New("goroutines: no clock")
	}
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
	r := &Recorder{now: o.Now, links: map[uint32][]link.Link{}, procs: map[uint32]*golang.Runtime{},
		labels: map[bpf.GoroutinesGoLinkKey]labelSet{}, linkUse: map[bpf.GoroutinesGoLinkKey]int{}, stopMove: make(chan struct{})}
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

func (r *Recorder) moveLinks() {
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
func (r *Recorder) takeLinks() {
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
func decodeLabels(v *bpf.GoroutinesGoLinkVal) labelSet {
	pairs, truncated := v.Pairs()
	return labelSet{pairs: pairs, truncated: truncated}
}

// Add probes process pid if it runs a Go executable; other processes are
// left alone, and a Go one that cannot be read is named in the stats.
func (r *Recorder) Add(pid uint32) {
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
	off.ProbedNs = r.now() // the probe traps from here on
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
func (r *Recorder) attach(pid uint32, exe string, rt *golang.Runtime) error {
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

// Exit removes an ended process's probe; its waits stay for drain.
func (r *Recorder) Exit(pid uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ls, ok := r.links[pid]; ok {
		closeLinks(ls)
		delete(r.links, pid)
	}
}

// SetWindow tells the probe where the recorded window starts or stops
// (CLOCK_MONOTONIC ns): it counts nothing outside it.
func (r *Recorder) SetWindow(start bool, ns uint64) error {
	v := r.objs.GoStopNs
	if start {
		v = r.objs.GoStartNs
	}
	return v.Set(ns)
}

// Detach stops the probes; the maps stay for drain.
func (r *Recorder) Detach() {
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

func (r *Recorder) Close() {
	r.Detach()
	r.stopLinks()
	r.closeStream()
	r.objs.Close()
}

// stopLinks stops the mover (once); drain takes what is left.
func (r *Recorder) stopLinks() {
	r.linkMu.Lock()
	select {
	case <-r.stopMove:
	default:
		close(r.stopMove)
	}
	r.linkMu.Unlock()
	r.moved.Wait()
}

// Wait is one aggregated row: a goroutine's waits with the same reason,
// stack, waker and waker stack.
// BeforeStart: the wait began before the window.
const BeforeStart = bpf.GoBeforeStart

type Wait struct {
	Key  bpf.GoroutinesGoKey
	Val  bpf.GoroutinesGoVal
	Open bool // still parked or runnable at the end of the window
}

// Drain reads the waits, and counts the goroutines still parked (or
// runnable) at end (CLOCK_MONOTONIC ns) up to it, from start at the
// earliest.
func (r *Recorder) Drain(start, end uint64) (waits []Wait, stacks map[uint64][]uint64) {
	var k bpf.GoroutinesGoKey
	var v bpf.GoroutinesGoVal
	for _, m := range []*ebpf.Map{r.objs.GoWaits, r.objs.GoWaitsMerged} {
		it := m.Iterate()
		for it.Next(&k, &v) {
			waits = append(waits, Wait{Key: k, Val: v})
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
		w := Wait{Key: bpf.GoroutinesGoKey{Tgid: gk.Tgid, Reason: uint16(p.Reason), Goid: p.Goid, Stack: p.Stack,
			WakerStack: p.WakerStack, WakerGoid: p.WakerGoid, WakerWaitStack: p.WakerWaitStack, Gopc: p.Gopc, Startpc: p.Startpc, Link: p.Link}, Open: true}
		if p.ParkNs < start || p.Flags&BeforeStart != 0 {
			w.Key.Flags |= BeforeStart
		}
		w.Val.Count = 1
		if r.stream != nil {
			r.open = append(r.open, openWait(gk.Tgid, &p, park, end))
		}
		if p.ReadyNs != 0 && p.ReadyNs <= end {
			ready := max(p.ReadyNs, park)
			w.Val.BlockedNs, w.Val.RunqNs = ready-park, end-ready
			w.Val.WakerWaitNs = min(p.WakerWaitNs, w.Val.BlockedNs)
		} else {
			w.Val.BlockedNs = end - park
			w.Key.WakerStack, w.Key.WakerGoid, w.Key.WakerWaitStack = 0, 0, 0
		}
		waits = append(waits, w)
		r.stats.Open++
	}
	r.stopLinks() // the window is closed: one last move, no more races
	r.takeLinks()
	return waits, r.ReadStacks()
}

// ReadStacks reads the stacks the waits refer to, and the counters.
func (r *Recorder) ReadStacks() map[uint64][]uint64 {
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

// Cut is a continuous recording's goroutine waits of one interval: those
// that ended in it, taken out of the maps (a wait counts whole in the
// interval it ended in); at the final cut, those still open too, up to
// end. Label sets no wait used for linkCuts cuts are forgotten.
func (r *Recorder) Cut(final bool, start, end uint64) ([]Wait, map[uint64][]uint64) {
	var waits []Wait
	var stacks map[uint64][]uint64
	if final {
		waits, stacks = r.Drain(start, end)
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
					waits = append(waits, Wait{Key: k, Val: v})
				}
			}
		}
		r.takeLinks()
		stacks = r.ReadStacks()
	}
	// The waits' own sets are marked used at this cut: none is forgotten
	// before the profile reads it.
	r.linkMu.Lock()
	defer r.linkMu.Unlock()
	r.cuts++
	for _, w := range waits {
		if w.Key.Link != 0 {
			r.linkUse[bpf.GoroutinesGoLinkKey{Tgid: w.Key.Tgid, Id: w.Key.Link}] = r.cuts
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
	return waits, stacks
}

// Stats is the counters so far.
func (r *Recorder) Stats() *Stats {
	truncated := r.countTruncated()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats.TruncatedLabel = truncated
	st := r.stats
	st.Skipped = append([]string(nil), r.stats.Skipped...)
	return &st
}

// Programs are the recorder's programs, by name, for their figures.
func (r *Recorder) Programs() map[string]*ebpf.Program {
	return map[string]*ebpf.Program{bpf.GoroutinesProgGoCasgstatus: r.objs.GoCasgstatus, bpf.GoroutinesProgGoPreemptPark: r.objs.GoPreemptPark}
}

// linkCuts: a label set unused this many cuts is forgotten (a wait still
// open that long ends without its labels; counted as not read).
const linkCuts = 4

// countTruncated counts the label sets kept that were cut short.
func (r *Recorder) countTruncated() (n uint64) {
	r.linkMu.Lock()
	defer r.linkMu.Unlock()
	for _, l := range r.labels {
		if l.truncated {
			n++
		}
	}
	return n
}

// Labels is label set link of process pid, in the program's order;
// false: the set was not read.
func (r *Recorder) Labels(pid uint32, link uint64) ([][2]string, bool) {
	r.linkMu.Lock()
	defer r.linkMu.Unlock()
	l, ok := r.labels[bpf.GoroutinesGoLinkKey{Tgid: pid, Id: link}]
	return l.pairs, ok
}
