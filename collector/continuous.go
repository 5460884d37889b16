package collector

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/symtab"
)

// Interval is one period of a continuous recording: the off-CPU
// intervals, wake-ups and on-CPU time that ended in it. An off-CPU
// interval counts whole in the period it ended in (as other off-CPU
// profilers report them); at Stop, the threads still blocked are counted
// up to the end, label interval=open.
type Interval struct {
	Seq      int // 1, 2, ...
	Start    time.Time
	Duration time.Duration
	Profile  *profile.Profile // off-CPU, with on-CPU samples
	Wakeups  *profile.Profile // nil with NoWakeups
	// Goroutines: the goroutine waits that ended in it (Options.Goroutines).
	Goroutines *profile.Profile
	Stats      Stats // this period's counts and losses
	Final      bool  // the last one, cut by Stop
}

// ErrStopped is returned by Snapshot once Stop has been called.
var ErrStopped = errors.New("the recording has stopped")

// continuous is a Session's state between snapshots: the maps hold
// running totals per key, and a snapshot reports the difference from the
// totals read the last time.
type continuous struct {
	mu    sync.Mutex // one snapshot at a time
	mapMu sync.Mutex // the maps' entries and the totals read from them
	// aggMu: the aggregation maps' swap and what was moved out of them
	// (agg, folded, aggRemoved, aggMoved). Apart from mapMu, so that the
	// map is moved to memory while a slow cut reads the others.
	aggMu sync.Mutex
	// recs: the running totals of the keys read as totals (prestart).
	recs map[any]aggVals
	// aggUses: what the last cut's aggregation records held (their
	// stacks), so that a stack no record used since is deleted.
	aggUses map[aggUse]struct{}
	wakes   map[bpf.OffcpuWakeKey]uint64
	cpu     map[bpf.OffcpuCpuKey]uint64
	oncpu   map[[2]uint32]cpuTotal
	// budget: the deferred walks' running counters at the last cut.
	budget *BudgetStats
	// counters: the kernel's running loss counters at the last snapshot.
	counters Stats
	lastMono uint64
	lastTime time.Time
	seq      int
	total    Stats
	// graveyard: addresses of the stacks deleted at the last cuts.
	graveyard map[int64]grave
	namesKept map[[2]uint32]thread // exited threads named until the next cut
	// idle: keys that did not change over the last interval, deleted like
	// those of exited threads, so that the maps hold what is active
	// rather than everything seen since the start.
	idle    map[any]bool
	kern    symbolize.KernelSymbols
	stopped bool
	// The two aggregation maps (fold.go), the entries moved out of them
	// since the last cut, the entries removed from them in all (for their
	// fill) and those moved between cuts.
	agg        *aggMaps
	folded     []foldedEntry
	aggRemoved uint64
	aggMoved   uint64
	folds      int    // swaps between cuts since the last
	movedAtCut uint64 // aggMoved as the cut took the entries
}

type grave struct {
	ips  []uint64
	cuts int // cuts since it was deleted
}

type aggVals struct{ ns, count, runq, chain uint64 }

// aggUse is what an aggregation key holds of the maps: its stacks, and
// the threads whose exit releases them. A record keeps no key of its own
// (boxed, it was ~150 bytes a record at every cut).
type aggUse struct {
	tid, gen uint32
	wakerTid uint32 // 0: none, or an interrupt
	stacks   [7]int64
}

func aggUseOf(k *bpf.OffcpuOffcpuKey) aggUse {
	u := aggUse{tid: k.Tid, gen: k.Gen, stacks: [7]int64{k.Ustack, k.Kstack, k.GilHolderStack,
		k.Waker.Ustack, k.Waker.Kstack, k.Waker.WaitUstack, k.Waker.WaitKstack}}
	if k.Waker.Valid != 0 && k.Waker.Irq == 0 {
		u.wakerTid = k.Waker.Tid
	}
	return u
}

// prestartKey identifies a blocked-since-before-the-start record.
type prestartKey struct {
	tid, gen uint32
	ustack   int64
}

func newContinuous() *continuous {
	return &continuous{recs: map[any]aggVals{}, aggUses: map[aggUse]struct{}{}, wakes: map[bpf.OffcpuWakeKey]uint64{}, cpu: map[bpf.OffcpuCpuKey]uint64{},
		oncpu: map[[2]uint32]cpuTotal{}, graveyard: map[int64]grave{}}
}

// Snapshot returns what ended since the previous snapshot (or the start)
// and evicts what belongs to threads and processes that have exited. It
// needs Options.Continuous; Stop cuts the last interval (FinalInterval).
func (s *Session) Snapshot() (*Interval, error) {
	if s.cont == nil {
		return nil, errors.New("Snapshot needs a session started with Options.Continuous")
	}
	return s.cut(false)
}

// FinalInterval is, after Stop of a continuous session, its last interval.
func (s *Session) FinalInterval() *Interval { return s.final }

// cut drains the maps and turns the change since the last cut into an
// interval. final: Stop has closed the window and detached the programs.
func (s *Session) cut(final bool) (*Interval, error) {
	c := s.cont
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil, ErrStopped
	}
	c.stopped = final
	now, wall := monotonicNow(), time.Now()
	if final {
		now = s.stopMono
	}
	if c.lastMono == 0 {
		c.lastMono, c.lastTime = s.startMono, s.start
	}
	// The maps are read and their entries deleted under mapMu; the
	// aggregation map may be moved to memory in between (fold.go), while
	// the profiles are built, the slowest part of a cut.
	d, iv, dead, err := s.readCut(final, now)
	if err != nil {
		return nil, err
	}
	s.snapshotLive(d)
	sym := s.withJIT(&symbolize.Symbolizer{Procs: s.procs, PerfMaps: map[uint32]*symtab.PerfMap{}, Kern: c.kern.Get(), Reread: true})
	ps, st, err := build(d, sym, s.buildOptions(iv.Stats, iv.Start, true))
	iv.Stats = st
	if err != nil {
		return nil, err
	}
	iv.Profile, iv.Wakeups = ps.OffCPU, ps.Wakeups
	if s.tctx != nil {
		s.tctx.Labels().Cut()
	}
	if s.gor != nil {
		waits, stacks := s.gor.Cut(final, s.startMono, now)
		if iv.Goroutines, err = goProfile(s.gor, symbolize.NewSymbolizer(s.procs), waits, stacks, iv.Start, iv.Duration); err != nil {
			return nil, err
		}
		iv.Stats.Goroutines = s.gor.Stats()
	}
	if !final {
		c.mapMu.Lock()
		s.evict(dead.threads, dead.procs, d.stacks)
		c.mapMu.Unlock()
	}
	c.seq++
	c.lastMono, c.lastTime = now, wall
	c.total.add(&iv.Stats)
	return iv, nil
}

// exits are the threads and processes known to have exited before a cut
// read the maps: their entries are deleted after it.
type exits struct {
	threads map[[2]uint32]thread
	procs   map[uint32]bool
}

// readCut reads the maps and turns their totals into the change since the
// last cut.
func (s *Session) readCut(final bool, now uint64) (*recording, *Interval, exits, error) {
	c := s.cont
	c.mapMu.Lock()
	defer c.mapMu.Unlock()
	// Exit events queued in the ring buffer first: a thread whose exit is
	// not known yet is not evicted.
	if !final {
		s.events.settle()
	}
	dead := s.events.exits()

	var warnings []string
	if !final {
		if err := s.p.runIter(bpf.OffcpuProgOffcpuSnapOncpu); err != nil {
			warnings = append(warnings, fmt.Sprintf("on-CPU times of running threads not read: %v", err))
		}
	}
	dr := s.drainer()
	d, read, err := dr.drain(final)
	read.Attach, read.SwitchMissed = s.p.attach, s.p.switchMisses()
	if err != nil {
		return nil, nil, dead, err
	}
	if !final {
		// Processes that came and went while the maps were read: their
		// mappings and names arrive as events.
		s.events.settle()
		dr.nameExited(d)
	}
	iv := &Interval{Seq: c.seq + 1, Start: c.lastTime, Duration: time.Duration(now - c.lastMono), Final: final}
	iv.Stats = c.delta(d, read)
	iv.Stats.Duration = iv.Duration
	iv.Stats.Warnings = append(read.Warnings, warnings...)
	if final {
		iv.Stats.Warnings = append(iv.Stats.Warnings, s.stats.Warnings...)
	}
	return d, iv, dead, nil
}

// delta turns d's running totals into the change since the last cut (in
// place) and returns that change's counts; read holds the counters the
// drain read. Keys that did not change are marked idle.
func (c *continuous) delta(d *recording, read Stats) Stats {
	var st Stats
	st.Attach, st.ExactOnCPU = read.Attach, read.ExactOnCPU
	c.idle = map[any]bool{}
	c.deltaRecords(d, &st)
	d.wakes, c.wakes, st.Wakeups = deltaCounts(d.wakes, c.wakes, c.idle,
		func(w *wakeRecord) bpf.OffcpuWakeKey { return w.id }, func(w *wakeRecord) *uint64 { return &w.count })
	d.cpu, c.cpu, st.CPUSamples = deltaCounts(d.cpu, c.cpu, c.idle,
		func(r *cpuRecord) bpf.OffcpuCpuKey { return r.id }, func(r *cpuRecord) *uint64 { return &r.count })
	st.OnCPU = c.deltaOnCPU(d)
	// Deferred walks: each thread's sampled keys scaled to its exact time.
	dn, dns, drunq := d.calibrate()
	st.Intervals = uint64(int64(st.Intervals) + dn)
	st.OffCPU += dns
	st.RunQueue += drunq
	for k, v := range d.oncpu {
		if v.ns == 0 { // kept for calibrate only
			delete(d.oncpu, k)
		}
	}

	st.Keys, st.Stacks, st.StacksMoved, st.Unwind, st.Programs = read.Keys, read.Stacks, read.StacksMoved, read.Unwind, read.Programs
	st.StacksMissing = read.StacksMissing
	st.Runtimes = read.Runtimes
	st.ThreadContext = read.ThreadContext // running totals
	st.AggMoved, c.movedAtCut = c.movedAtCut, 0
	st.Budget, c.budget = read.Budget.Since(c.budget), read.Budget
	st.addCounters(&read, 1)
	st.addCounters(&c.counters, -1)
	c.counters = read
	return st
}

// deltaRecords turns the records' totals into their change since the
// last cut and counts them in st. The aggregation map's records (no id)
// are moved out of it at each swap, so they are that change already;
// what the last cut's held and this one's does not is idle.
func (c *continuous) deltaRecords(d *recording, st *Stats) {
	recs := make(map[any]aggVals)
	out := d.records[:0]
	for _, r := range d.records {
		if r.id == nil {
			out = append(out, r)
			continue
		}
		cur := aggVals{r.ns, r.count, r.runq, r.chain}
		recs[r.id] = cur
		p := c.recs[r.id]
		if cur.count < p.count || cur.ns < p.ns {
			p = aggVals{} // evicted and made again
		}
		r.ns, r.count, r.runq, r.chain = cur.ns-p.ns, cur.count-p.count, cur.runq-min(p.runq, cur.runq), cur.chain-min(p.chain, cur.chain)
		if r.count == 0 && r.ns == 0 {
			c.idle[r.id] = true
			continue
		}
		out = append(out, r)
	}
	for u := range c.aggUses {
		if _, seen := d.aggUses[u]; !seen {
			d.aggUses[u] = struct{}{}
			c.idle[u] = true
		}
	}
	for _, r := range out {
		st.Intervals += r.count
		st.OffCPU += durationNs(r.ns)
		st.RunQueue += durationNs(r.runq)
		if r.open {
			st.OpenIntervals += r.count
			st.OpenTime += durationNs(r.ns)
		}
	}
	d.records, c.recs, c.aggUses = out, recs, d.aggUses
	d.aggUses = nil
}

// deltaCounts turns running counts into their change since prev, keeping
// the records that changed; it returns them, the new totals and their sum.
func deltaCounts[R any, K comparable](rs []R, prev map[K]uint64, idle map[any]bool, key func(*R) K, count func(*R) *uint64) ([]R, map[K]uint64, uint64) {
	totals := make(map[K]uint64, len(rs))
	out := rs[:0]
	var sum uint64
	for _, r := range rs {
		k, n := key(&r), count(&r)
		totals[k] = *n
		if p := prev[k]; p <= *n {
			*n -= p
		}
		if *n == 0 {
			idle[k] = true
			continue
		}
		out = append(out, r)
		sum += *n
	}
	return out, totals, sum
}

// deltaOnCPU turns each thread's on-CPU total into its change.
func (c *continuous) deltaOnCPU(d *recording) time.Duration {
	var sum time.Duration
	oncpu := make(map[[2]uint32]cpuTotal, len(d.oncpu))
	for k, v := range d.oncpu {
		p := c.oncpu[k]
		cur := v
		cur.ns = max(p.ns, v.ns)
		oncpu[k] = cur
		// A run stored by the clock at the end can exceed what the
		// scheduler's count adds later: never count back.
		v.ns -= min(p.ns, v.ns)
		below := false
		for i := range v.belowNs {
			if v.belowN[i] >= p.belowN[i] && v.belowNs[i] >= p.belowNs[i] {
				v.belowNs[i] -= p.belowNs[i]
				v.belowN[i] -= p.belowN[i]
			}
			below = below || v.belowN[i] > 0
		}
		if v.ns == 0 && !below {
			delete(d.oncpu, k)
			continue
		}
		d.oncpu[k] = v
		sum += durationNs(v.ns)
	}
	c.oncpu = oncpu
	return sum
}

// evict deletes the map entries of threads that had exited before the
// last drain (their totals are final and reported) and of idle keys, the
// stacks only they used, and what is kept to symbolize processes that had
// exited.
func (s *Session) evict(deadThreads map[[2]uint32]thread, deadProcs map[uint32]bool, stacks map[int64][]uint64) {
	c := s.cont
	ev := c.selectEvicted(deadThreads)
	held, err := s.p.heldStacks()
	if err != nil {
		held = nil
	}
	var stackIDs []int64
	if held != nil {
		stackIDs = c.buryStacks(ev.live, ev.gone, held, stacks, s.spill)
	}
	bpf.DeleteKeys(s.p.coll.Maps[bpf.OffcpuMapPrestart], ev.pre)
	bpf.DeleteKeys(s.p.coll.Maps[bpf.OffcpuMapWakeups], ev.wakes)
	bpf.DeleteKeys(s.p.coll.Maps[bpf.OffcpuMapCpuSamples], ev.cpu)
	bpf.DeleteKeys(s.p.coll.Maps[bpf.OffcpuMapThreadCpus], ev.cpuTotals)
	bpf.DeleteKeys(s.p.coll.Maps[bpf.OffcpuMapStacks], stackIDs)
	if s.spill != nil {
		s.spill.forget(stackIDs)
	}
	for pid := range deadProcs {
		s.procs.Forget(pid)
	}
	// Names of exited threads are kept one cut more: an interval that
	// ended just before the exit may be read at the next cut.
	s.events.forget(c.namesKept, deadProcs)
	c.namesKept = deadThreads
}

// evicted is what a cut takes out of the maps, and the stack ids the
// remaining keys use (live) or the removed ones used (gone).
type evicted struct {
	pre        []uint32
	wakes      []bpf.OffcpuWakeKey
	cpu        []bpf.OffcpuCpuKey
	cpuTotals  []bpf.OffcpuThreadKey
	live, gone map[int64]bool
}

// mark adds the stack ids to the live set, or to the gone one.
func (ev *evicted) mark(gone bool, ids ...int64) {
	set := ev.live
	if gone {
		set = ev.gone
	}
	for _, id := range ids {
		if id > 0 {
			set[id] = true
		}
	}
}

func wakerIDs(w bpf.OffcpuWakerRec) []int64 {
	return []int64{w.Ustack, w.Kstack, w.WaitUstack, w.WaitKstack}
}

// selectEvicted picks the keys of exited threads, of waits an exited
// thread ended (those would pile up under a server that forks a child per
// request) and of idle keys, and forgets their totals.
func (c *continuous) selectEvicted(deadThreads map[[2]uint32]thread) *evicted {
	dead := func(tid, gen uint32) bool { _, ok := deadThreads[[2]uint32{tid, gen}]; return ok }
	deadTIDs := map[uint32]bool{}
	for k := range deadThreads {
		deadTIDs[k[0]] = true
	}
	deadWaker := func(w bpf.OffcpuWakerRec) bool { return w.Valid != 0 && w.Irq == 0 && deadTIDs[w.Tid] }
	ev := &evicted{live: map[int64]bool{}, gone: map[int64]bool{}}
	// The aggregation map's records are moved out of it already: only
	// their stacks may go.
	for u := range c.aggUses {
		out := dead(u.tid, u.gen) || deadTIDs[u.wakerTid] || c.idle[u]
		if out {
			delete(c.aggUses, u)
		}
		ev.mark(out, u.stacks[:]...)
	}
	for k := range c.recs {
		switch k := k.(type) {
		case prestartKey:
			out := dead(k.tid, k.gen) || c.idle[k]
			if out {
				ev.pre = append(ev.pre, k.tid)
				delete(c.recs, k)
			}
			ev.mark(out, k.ustack)
		}
	}
	for k := range c.wakes {
		out := dead(k.TargetTid, k.TargetGen) || deadWaker(k.Waker) || c.idle[k]
		if out {
			ev.wakes = append(ev.wakes, k)
			delete(c.wakes, k)
		}
		ev.mark(out, wakerIDs(k.Waker)...)
	}
	for k := range c.cpu {
		out := dead(k.Tid, k.Gen) || c.idle[k]
		if out {
			ev.cpu = append(ev.cpu, k)
			delete(c.cpu, k)
		}
		ev.mark(out, k.Ustack, k.Kstack)
	}
	for k := range c.oncpu {
		if dead(k[0], k[1]) {
			ev.cpuTotals = append(ev.cpuTotals, bpf.OffcpuThreadKey{Tid: k[0], Gen: k[1]})
			delete(c.oncpu, k)
		}
	}
	return ev
}

// buryStacks returns the stacks to delete: those only removed keys used
// and no live thread holds. Their addresses stay in the graveyard for two
// more cuts: kernel stacks are shared across processes, and a thread may
// take one from the map just before it is deleted. One in use by then
// comes back to memory.
func (c *continuous) buryStacks(live, gone, held map[int64]bool, stacks map[int64][]uint64, spill *stackSpill) []int64 {
	for id, g := range c.graveyard {
		switch {
		case live[id] || held[id]:
			if spill != nil {
				spill.put(id, g.ips)
			}
			delete(c.graveyard, id)
		case g.cuts >= 2:
			delete(c.graveyard, id)
		default:
			c.graveyard[id] = grave{g.ips, g.cuts + 1}
		}
	}
	var ids []int64
	for id := range gone {
		if !live[id] && !held[id] {
			ids = append(ids, id)
			c.graveyard[id] = grave{ips: stacks[id]}
		}
	}
	return ids
}

// String describes an interval in one line.
func (iv *Interval) String() string {
	st := &iv.Stats
	return fmt.Sprintf("interval %d: %v from %s: %d off-CPU intervals, %v off-CPU (%v waiting for a CPU), %d wake-ups, %v on-CPU, %d lost",
		iv.Seq, iv.Duration.Round(time.Millisecond), iv.Start.Format(time.RFC3339), st.Intervals, st.OffCPU.Round(time.Microsecond),
		st.RunQueue.Round(time.Microsecond), st.Wakeups, st.OnCPU.Round(time.Microsecond), st.Lost())
}

// heldStacks returns the stack ids live threads hold outside the
// aggregation maps: their pending interval's, the ones they may reuse,
// their waker's, their past waits', those walked at the start, and the
// interrupt wakers' stacks the CPUs may reuse.
func (p *probes) heldStacks() (map[int64]bool, error) {
	held := map[int64]bool{}
	add := func(ids ...int64) {
		for _, id := range ids {
			if id > 0 {
				held[id] = true
			}
		}
	}
	if _, ok := p.coll.Programs[bpf.OffcpuProgOffcpuLiveStacks]; ok {
		var buf bytes.Buffer
		if err := p.readIter(bpf.OffcpuProgOffcpuLiveStacks, &buf); err != nil {
			return nil, err
		}
		b := buf.Bytes()
		for i := 0; i+8 <= len(b); i += 8 {
			add(int64(binary.NativeEndian.Uint64(b[i:])))
		}
	} else if m := p.coll.Maps[bpf.OffcpuMapStarts]; m != nil {
		var tid uint32
		var st bpf.OffcpuStartRec
		it := m.Iterate()
		for it.Next(&tid, &st) {
			add(st.Ustack, st.Kstack, st.Waker.Ustack, st.Waker.Kstack, st.Waker.WaitUstack, st.Waker.WaitKstack)
			add(st.SleepCache.Ustack[:]...)
			add(st.SleepCache.Kstack[:]...)
			add(st.WakeCache.Ustack[:]...)
			add(st.WakeCache.Kstack[:]...)
		}
		if err := it.Err(); err != nil {
			return nil, err
		}
	}
	if m := p.coll.Maps[bpf.OffcpuMapBlockedUstacks]; m != nil {
		var tid uint32
		var id int64
		it := m.Iterate()
		for it.Next(&tid, &id) {
			add(id)
		}
		if err := it.Err(); err != nil {
			return nil, err
		}
	}
	// The interrupt wakers' kernel stacks each CPU may reuse.
	if m := p.coll.Maps[bpf.OffcpuMapIrqWakers]; m != nil {
		var slot uint32
		var per []bpf.OffcpuIrqWaker
		it := m.Iterate()
		for it.Next(&slot, &per) {
			for _, w := range per {
				add(w.Kstack)
			}
		}
		if err := it.Err(); err != nil {
			return nil, err
		}
	}
	return held, nil
}

// grave returns a stack deleted at one of the last cuts.
func (c *continuous) grave(id int64) ([]uint64, bool) {
	if c == nil {
		return nil, false
	}
	g, ok := c.graveyard[id]
	return g.ips, ok
}
