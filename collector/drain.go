package collector

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/goroutines"
	"github.com/offcpu/offcpu/collector/stream"
	"github.com/offcpu/offcpu/collector/threadctx"
)

// record is one aggregation-map entry with its stacks resolved to
// addresses (leaf first).
type record struct {
	tgid, tid uint32
	gen       uint32 // the thread's incarnation (tids are reused)
	state     State
	ns, count uint64
	runq      uint64 // of ns, waiting for a CPU
	chain     uint64 // of ns, the waker itself off a CPU in waker.wait*
	user      []uint64
	kernel    []uint64
	userErr   int64 // negative errno when no user stack was captured
	kernelErr int64
	waker     waker
	open      bool // still off-CPU when recording stopped
	prestart  bool // blocked since before the start: stacks walked at the start
	kthread   bool // known to be a kernel thread (prestart records)
	sampled   bool // below the walk threshold, drawn: values estimated (calibrate)
	// A CPython GIL wait: the thread that held the GIL (0: not known) and
	// its Python stack.
	gil            bool
	gilHolder      uint32
	gilHolderStack []uint64
	link           uint64 // its request's thread context (tctx_links), 0: none
	id             any    // the map key it was read under (continuous mode only)
}

// waker is who ended an interval or made a wake-up.
type waker struct {
	valid     bool
	irq       bool
	tgid, tid uint32
	user      []uint64
	kernel    []uint64
	userID    int64 // stack ids, to group identical wakers
	kernelID  int64
	// Its own last wait, where it overlapped the interval it ended.
	waitUser, waitKernel     []uint64
	waitUserID, waitKernelID int64
}

// cpuRecord is one on-CPU sample aggregation entry.
type cpuRecord struct {
	tgid, tid    uint32
	gen          uint32
	count        uint64
	user, kernel []uint64
	id           bpf.OffcpuCpuKey
}

// wakeRecord is one wake-up aggregation entry.
type wakeRecord struct {
	tgid, tid uint32 // woken thread
	gen       uint32 // its incarnation (0: unknown)
	count     uint64
	waker     waker
	id        bpf.OffcpuWakeKey
}

// recording is what a session drained from the kernel: plain data that
// profiles are built from (build) without root or BPF.
type recording struct {
	records []record
	wakes   []wakeRecord
	cpu     []cpuRecord
	// oncpu: each thread's exact time on a CPU in the window, by tid and
	// incarnation (tp_btf only).
	oncpu   map[[2]uint32]cpuTotal
	threads map[uint32]thread
	stacks  map[int64][]uint64 // every stack read, by id
	// goroutines: the goroutine stream's (Options.Stream with Goroutines).
	goroutines *goroutines.Timeline
	// waits: the stream's waits (Options.Stream), in the order they ended.
	waits    stream.WaitView
	streamed bool
	// aggUses: what the aggregation records hold (continuous mode).
	aggUses map[aggUse]struct{}
	// exited: threads that exited while recording, by tid and incarnation.
	exited map[[2]uint32]thread

	// o: how it is being built (set by build).
	o buildOptions
	// fold: the exited processes it merges (Options.ExitedDetail).
	fold        map[uint32]bool
	exitedNames map[uint32]string // by exitedProcs
}

// buildOptions say how a recording is built into profiles.
type buildOptions struct {
	// stats: the recording's so far (read for the profiles' comments);
	// build returns them with completeness and classes added.
	stats   Stats
	start   time.Time
	cpuHz   int  // on-CPU sampling rate: a sample's weight without exact times
	wakeups bool // build the wake-up and offwake profiles
	// noOffwake: not the offwake one (an agent's intervals carry the
	// off-CPU and wake-up profiles only).
	noOffwake    bool
	exitedDetail int // Options.ExitedDetail
	// window: its bounds, CLOCK_MONOTONIC ns (the timeline's).
	window [2]uint64
	// links: the thread-context records the waits' links name (nil: none).
	links *threadctx.Labels
}

type cpuTotal struct {
	tgid uint32
	ns   uint64
	// Deferred walks: its intervals below the threshold, exact, by state.
	belowNs, belowN [4]uint64
}

type thread struct {
	tgid    uint32
	gen     uint32
	comm    string
	exited  bool // its last switch-out was seen
	guessed bool // not in the threads map: named from /proc or its tid
}

// threadOf is the thread that made record r: when its tid was used by
// several threads while recording, the one of r's incarnation.
func (d *recording) threadOf(r *record) thread {
	if th, ok := d.threads[r.tid]; ok && th.gen == r.gen {
		return th
	}
	if th, ok := d.exited[[2]uint32{r.tid, r.gen}]; ok {
		return th
	}
	return d.threads[r.tid]
}

// drainer reads the programs' maps into a recording, counting into its
// own stats (drain returns them).
type drainer struct {
	p      *probes
	opts   Options
	stats  Stats
	cont   *continuous // nil: one recording
	spill  *stackSpill
	events *eventReader
	parts  parts // their figures
	stream *streamReader
	// stopMono: the window's end, for the classic mode's open intervals.
	stopMono uint64
}

// drain reads every map into a recording, with what it counted. final:
// the window is closed (Stop), the open intervals of the classic
// tracepoint mode are accounted up to its end.
func (s *drainer) drain(final bool) (*recording, Stats, error) {
	d := &recording{threads: map[uint32]thread{}, exited: map[[2]uint32]thread{}, oncpu: map[[2]uint32]cpuTotal{}}
	cache := map[int64][]uint64{}
	getStack := s.stackReader(cache)

	take := func(key *bpf.OffcpuOffcpuKey, val *bpf.OffcpuOffcpuVal) {
		r := aggRecord(*key, *val, getStack)
		if d.aggUses != nil {
			d.aggUses[aggUseOf(key)] = struct{}{}
		}
		if r.open {
			s.stats.OpenIntervals += val.Count
			s.stats.OpenTime += durationNs(val.Ns)
		}
		d.records = append(d.records, r)
		s.stats.Intervals += val.Count
		s.stats.OffCPU += durationNs(val.Ns)
		s.stats.RunQueue += durationNs(r.runq)
	}
	var err error
	if s.cont != nil {
		d.aggUses = map[aggUse]struct{}{}
		err = s.cont.takeAgg(func(n int) { d.records = make([]record, 0, n+n/16+64) }, take)
	} else {
		// Sized once: keys are only added while recording, and the
		// records are most of what a recording holds at the end.
		if n, err := statSum(s.p.coll.Maps[bpf.OffcpuMapStats], bpf.OffcpuOffcpuStatSTAT_AGG_STORED); err == nil && n < 1<<24 {
			d.records = make([]record, 0, n+n/16+64)
		}
		err = eachEntry(s.p.coll.Maps[bpf.OffcpuMapOffcpu], take)
	}
	if err != nil {
		return nil, Stats{}, fmt.Errorf("reading the aggregation map: %w", err)
	}
	if !s.p.flushIter {
		if final {
			s.drainOpenStarts(d, getStack)
		}
	} else if err := s.drainPrestart(d, getStack); err != nil {
		return nil, Stats{}, err
	}
	if err := s.drainWakeupsAndSamples(d, getStack); err != nil {
		return nil, Stats{}, err
	}
	if err := s.drainOnCPU(d); err != nil {
		return nil, Stats{}, err
	}
	if s.stream != nil && s.cont == nil { // continuous: a flight recorder's, taken by FlightTimeline
		d.waits = s.stream.Take()
		d.waits.Each(func(w *bpf.OffcpuWaitEvent) {
			getStack(w.Ustack)
			getStack(w.Kstack)
			decodeWaker(w.Waker, getStack)
		})
		d.streamed = true
	}
	if s.opts.deferred() && s.cont == nil {
		dn, dns, drunq := d.calibrate()
		s.stats.Intervals = uint64(int64(s.stats.Intervals) + dn)
		s.stats.OffCPU += dns
		s.stats.RunQueue += drunq
	}
	s.stats.Keys = len(d.records)
	s.stats.Stacks = len(cache)
	d.stacks = cache

	if err := s.drainThreads(d); err != nil {
		return nil, Stats{}, err
	}

	if err := s.readStats(); err != nil {
		return nil, Stats{}, err
	}
	return d, s.stats, nil
}

// stackReader returns a function reading a stack by id, once each (into
// cache): from the map, or where it was moved or deleted to.
func (s *drainer) stackReader(cache map[int64][]uint64) func(int64) []uint64 {
	stacks := s.p.coll.Maps[bpf.OffcpuMapStacks]
	return func(id int64) []uint64 {
		if id <= 0 {
			return nil
		}
		if st, ok := cache[id]; ok {
			return st
		}
		var raw bpf.OffcpuStackBuf
		var st []uint64
		if err := stacks.Lookup(id, &raw); err == nil {
			st = trimStack(raw.Ips[:])
		} else if s.spill != nil {
			var ok bool
			if st, ok = s.spill.get(id); !ok {
				if g, dead := s.cont.grave(id); dead {
					st = g
				} else {
					s.stats.StacksMissing++
				}
			}
		}
		cache[id] = st
		return st
	}
}

// eachEntry calls fn for every entry of a hash map, read in batches of
// 512 (a system call per batch rather than two per entry) where the
// kernel can.
func eachEntry[K, V any](m *ebpf.Map, fn func(*K, *V)) error {
	keys, vals := make([]K, 512), make([]V, 512)
	var cursor ebpf.MapBatchCursor
	for first := true; ; first = false {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			fn(&keys[i], &vals[i])
		}
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist):
			return nil
		case first && n == 0 && errors.Is(err, ebpf.ErrNotSupported):
			var k K
			var v V
			it := m.Iterate()
			for it.Next(&k, &v) {
				fn(&k, &v)
			}
			return it.Err()
		case err != nil:
			return err
		}
	}
}

// takeAll deletes every entry of a hash map and calls fn with each,
// in batches of 1024 where the kernel can; it returns how many it took.
func takeAll[K, V any](m *ebpf.Map, fn func(*K, *V)) int {
	keys, vals := make([]K, 1024), make([]V, 1024)
	var cursor ebpf.MapBatchCursor
	taken := 0
	for {
		n, err := m.BatchLookupAndDelete(&cursor, keys, vals, nil)
		for i := range n {
			fn(&keys[i], &vals[i])
		}
		taken += n
		if err == nil {
			continue
		}
		if !errors.Is(err, ebpf.ErrKeyNotExist) {
			taken += takeOneByOne(m, fn)
		}
		return taken
	}
}

// takeOneByOne is takeAll for kernels without batch operations.
func takeOneByOne[K, V any](m *ebpf.Map, fn func(*K, *V)) int {
	var k K
	var v V
	var ks []K
	it := m.Iterate()
	for it.Next(&k, &v) {
		ks = append(ks, k)
	}
	taken := 0
	for i := range ks {
		if m.LookupAndDelete(ks[i], &v) == nil {
			fn(&ks[i], &v)
			taken++
		}
	}
	return taken
}

// aggRecord is an aggregation map entry as a record.
func aggRecord(key bpf.OffcpuOffcpuKey, val bpf.OffcpuOffcpuVal, getStack func(int64) []uint64) record {
	r := record{tgid: key.Tgid, tid: key.Tid, gen: key.Gen, state: State(key.State), ns: val.Ns, count: val.Count,
		runq: min(val.RunqNs, val.Ns), chain: val.ChainNs, userErr: min(key.Ustack, 0), kernelErr: min(key.Kstack, 0)}
	r.user = getStack(key.Ustack)
	r.kernel = getStack(key.Kstack)
	r.waker = decodeWaker(key.Waker, getStack)
	r.open = key.Open != 0
	r.sampled = key.Sampled != 0
	r.gil = key.Gil != 0
	r.gilHolder = key.GilHolder
	r.gilHolderStack = getStack(key.GilHolderStack)
	r.link = key.Link
	return r
}

// drainWakeupsAndSamples reads the wake-up and on-CPU sample maps.
func (s *drainer) drainWakeupsAndSamples(d *recording, getStack func(int64) []uint64) error {
	err := eachEntry(s.p.coll.Maps[bpf.OffcpuMapWakeups], func(wk *bpf.OffcpuWakeKey, n *uint64) {
		d.wakes = append(d.wakes, wakeRecord{tgid: wk.TargetTgid, tid: wk.TargetTid, gen: wk.TargetGen, count: *n, waker: decodeWaker(wk.Waker, getStack), id: *wk})
		s.stats.Wakeups += *n
	})
	if err != nil {
		return fmt.Errorf("reading the wake-up map: %w", err)
	}
	err = eachEntry(s.p.coll.Maps[bpf.OffcpuMapCpuSamples], func(ck *bpf.OffcpuCpuKey, n *uint64) {
		d.cpu = append(d.cpu, cpuRecord{tgid: ck.Tgid, tid: ck.Tid, gen: ck.Gen, count: *n, user: getStack(ck.Ustack), kernel: getStack(ck.Kstack), id: *ck})
		s.stats.CPUSamples += *n
	})
	if err != nil {
		return fmt.Errorf("reading the on-CPU sample map: %w", err)
	}
	return nil
}

// drainThreads names the threads: from the threads map (renamed since
// when still alive), those that exited while recording, and, for a tid
// no name was kept for, /proc or "tid-N".
func (s *drainer) drainThreads(d *recording) error {
	err := eachEntry(s.p.coll.Maps[bpf.OffcpuMapThreads], func(tid *uint32, ti *bpf.OffcpuThreadInfo) {
		d.threads[*tid] = thread{tgid: ti.Tgid, gen: ti.Gen, comm: cString(ti.Comm[:])}
	})
	if err != nil {
		return fmt.Errorf("reading the thread map: %w", err)
	}
	// Live threads may have been renamed after they were first seen.
	for tid, th := range d.threads {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/comm", th.tgid, tid)); err == nil {
			th.comm = strings.TrimSpace(string(b))
			d.threads[tid] = th
		}
	}
	s.nameExited(d)
	return nil
}

// nameExited names the threads that exited, and the others no name was
// kept for from /proc or as "tid-N". It may run again once more exits are
// known.
func (s *drainer) nameExited(d *recording) {
	for k, th := range s.events.exits().threads {
		d.exited[k] = th
	}
	// A tid no live thread holds is named by the last thread that had it.
	for k, th := range d.exited {
		if old, ok := d.threads[k[0]]; !ok || old.guessed || (old.exited && old.gen < th.gen) {
			d.threads[k[0]] = th
		}
	}
	for _, r := range d.records {
		if _, ok := d.threads[r.tid]; !ok {
			th := thread{tgid: r.tgid, comm: fmt.Sprintf("tid-%d", r.tid), guessed: true}
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/comm", r.tgid, r.tid)); err == nil {
				th.comm = strings.TrimSpace(string(b))
			}
			d.threads[r.tid] = th
		}
	}
}

// statReader reads one of the programs' counters, summed over CPUs.
type statReader func(bpf.OffcpuOffcpuStat) uint64

func (s *drainer) readStats() error {
	m := s.p.coll.Maps[bpf.OffcpuMapStats]
	get := func(idx bpf.OffcpuOffcpuStat) uint64 {
		v, _ := statSum(m, idx)
		return v
	}
	s.stats.UserStackLost = get(bpf.OffcpuOffcpuStatSTAT_USTACK_LOST)
	s.stats.KernelStackLost = get(bpf.OffcpuOffcpuStatSTAT_KSTACK_LOST)
	s.stats.UserStackFault = get(bpf.OffcpuOffcpuStatSTAT_USTACK_FAULT)
	s.stats.AggFull = get(bpf.OffcpuOffcpuStatSTAT_AGG_FULL)
	s.stats.AggFullTime = durationNs(get(bpf.OffcpuOffcpuStatSTAT_AGG_FULL_NS))
	s.stats.StartFull = get(bpf.OffcpuOffcpuStatSTAT_START_FULL)
	s.stats.NoStart = get(bpf.OffcpuOffcpuStatSTAT_NO_START)
	s.stats.MissedSwitchIn = get(bpf.OffcpuOffcpuStatSTAT_MISSED_IN)
	s.stats.OutOfRange = get(bpf.OffcpuOffcpuStatSTAT_OUT_OF_RANGE)
	s.stats.OutOfRangeTime = durationNs(get(bpf.OffcpuOffcpuStatSTAT_OUT_OF_RANGE_NS))
	s.stats.EventsLost = get(bpf.OffcpuOffcpuStatSTAT_EVENTS_LOST)
	s.stats.StacksReused = get(bpf.OffcpuOffcpuStatSTAT_STACKS_REUSED)
	s.stats.WakeFull = get(bpf.OffcpuOffcpuStatSTAT_WAKE_FULL)
	s.stats.WakerStackLost = get(bpf.OffcpuOffcpuStatSTAT_WAKER_STACK_LOST)
	s.stats.WakesReused = get(bpf.OffcpuOffcpuStatSTAT_WAKES_REUSED)
	s.stats.IRQWakesReused = get(bpf.OffcpuOffcpuStatSTAT_IRQ_WAKES_REUSED)
	s.stats.CPUFull = get(bpf.OffcpuOffcpuStatSTAT_CPU_FULL)
	s.stats.ThreadCPUFull = get(bpf.OffcpuOffcpuStatSTAT_THREAD_CPU_FULL)
	s.stats.ForkUnwindFull = get(bpf.OffcpuOffcpuStatSTAT_FORK_UNWIND_FULL)
	s.stats.StreamLost = get(bpf.OffcpuOffcpuStatSTAT_STREAM_LOST)
	s.parts.addStats(&s.stats, get)
	return nil
}

func decodeWaker(w bpf.OffcpuWakerRec, getStack func(int64) []uint64) waker {
	if w.Valid == 0 {
		return waker{}
	}
	return waker{valid: true, irq: w.Irq != 0, tgid: w.Tgid, tid: w.Tid,
		user: getStack(w.Ustack), kernel: getStack(w.Kstack), userID: w.Ustack, kernelID: w.Kstack,
		waitUser: getStack(w.WaitUstack), waitKernel: getStack(w.WaitKstack), waitUserID: w.WaitUstack, waitKernelID: w.WaitKstack}
}

func cString(b []int8) string {
	buf := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		buf = append(buf, byte(c))
	}
	return string(buf)
}

func threadExists(tid int) bool {
	_, err := os.Stat(fmt.Sprintf("/proc/%d/status", tid))
	return err == nil
}

// cgroupIDOf returns the cgroup v2 id of a directory: its inode number.
func cgroupIDOf(path string) (uint64, error) {
	if !filepath.IsAbs(path) {
		path = filepath.Join("/sys/fs/cgroup", path)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("cgroup %s: %w (give a cgroup v2 directory such as /sys/fs/cgroup/system.slice/NAME.service)", path, err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(path, &fs); err == nil && fs.Type != unix.CGROUP2_SUPER_MAGIC {
		return 0, fmt.Errorf("%s is not on a cgroup v2 file system: give a directory under /sys/fs/cgroup", path)
	}
	return st.Ino, nil
}

// drainOnCPU reads each thread's exact on-CPU time (tp_btf mode).
func (s *drainer) drainOnCPU(d *recording) error {
	m, ok := s.p.coll.Maps[bpf.OffcpuMapThreadCpus]
	if !ok {
		return nil
	}
	var k bpf.OffcpuThreadKey
	var v bpf.OffcpuThreadCpu
	it := m.Iterate()
	for it.Next(&k, &v) {
		d.oncpu[[2]uint32{k.Tid, k.Gen}] = cpuTotal{tgid: v.Tgid, ns: v.OncpuNs, belowNs: v.BelowNs, belowN: v.BelowN}
		s.stats.OnCPU += durationNs(v.OncpuNs)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading the on-CPU time map: %w", err)
	}
	s.stats.ExactOnCPU = true
	return nil
}

// drainOpenStarts accounts the intervals still open in the classic
// tracepoint mode's starts map, up to the moment recording stopped.
func (s *drainer) drainOpenStarts(d *recording, getStack func(int64) []uint64) {
	m, ok := s.p.coll.Maps[bpf.OffcpuMapStarts]
	if !ok {
		return
	}
	now := s.stopMono
	var tid uint32
	var st bpf.OffcpuStartRec
	it := m.Iterate()
	for it.Next(&tid, &st) {
		if st.Pending == 0 || st.Ts > now {
			continue
		}
		ns := now - st.Ts
		if ns < uint64(s.opts.MinBlock) || (s.opts.MaxBlock > 0 && ns > uint64(s.opts.MaxBlock)) {
			continue
		}
		var runq uint64
		if State(st.State) == StatePreempted {
			runq = ns
		}
		d.records = append(d.records, record{tgid: st.Tgid, tid: tid, gen: st.Tgen, state: State(st.State), ns: ns, count: 1, runq: runq,
			user: getStack(st.Ustack), kernel: getStack(st.Kstack), userErr: min(st.Ustack, 0), kernelErr: min(st.Kstack, 0), open: true})
		s.stats.Intervals++
		s.stats.OffCPU += durationNs(ns)
		s.stats.OpenIntervals++
		s.stats.OpenTime += durationNs(ns)
	}
}

// drainPrestart reads the threads blocked since before the start.
func (s *drainer) drainPrestart(d *recording, getStack func(int64) []uint64) error {
	m, ok := s.p.coll.Maps[bpf.OffcpuMapPrestart]
	if !ok {
		return nil
	}
	var tid uint32
	var v bpf.OffcpuPrestartVal
	it := m.Iterate()
	for it.Next(&tid, &v) {
		var kernel []uint64
		for _, ip := range v.Kstack {
			if ip == 0 {
				break
			}
			kernel = append(kernel, ip)
		}
		d.records = append(d.records, record{tgid: v.Tgid, tid: tid, gen: v.Gen, state: State(v.State), ns: v.Ns, count: 1, runq: min(v.RunqNs, v.Ns),
			kernel: kernel, user: getStack(v.Ustack), userErr: min(v.Ustack, -1), open: v.Whole != 0, prestart: true, kthread: v.Kthread != 0,
			id: prestartKey{tid: tid, gen: v.Gen, ustack: v.Ustack}})
		s.stats.Intervals++
		s.stats.OffCPU += durationNs(v.Ns)
		s.stats.RunQueue += durationNs(min(v.RunqNs, v.Ns))
		if v.Whole != 0 {
			s.stats.OpenIntervals++
			s.stats.OpenTime += durationNs(v.Ns)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading the blocked-before-start map: %w", err)
	}
	return nil
}
