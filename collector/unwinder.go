package collector

import (
	"debug/elf"
	"errors"
	"sort"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/symtab"
	"github.com/offcpu/offcpu/collector/unwind"
	"github.com/offcpu/offcpu/internal/loop"
	"github.com/offcpu/offcpu/runtimes"
)

// unwinder gives the BPF programs the unwind tables of code built without
// frame pointers: each file's rows once in unwind_rows, and per process
// the mappings that use them in unwind_procs. Processes whose code all
// keeps frame pointers stay out and keep the kernel's fast walker.
type unwinder struct {
	rows  *ebpf.Map
	procs *ebpf.Map
	files *ebpf.Map // unwind_files: lets the kernel make a process's entry itself

	wake    loop.Alarm // a process to scan soon
	mu      sync.Mutex
	loadMu  sync.Mutex // one file's table parsed at a time, outside mu
	cap     uint32
	next    uint32                          // first free row
	loaded  map[*symtab.File]*fileRows      // by open file: same identity as the symbolizer's
	entries map[uint32]bpf.OffcpuUnwindProc // tgid -> the entry last written
	scans   map[uint32]*rescan              // live processes and when to look at their mappings again
	stats   UnwindStats
	gens    uint32            // last entry generation handed out
	execs   map[uint32]uint32 // execs seen per process while recording
	// rescan: read a process's mappings again after it is first seen
	// (off when the kernel reports every code mapping as it is made).
	rescan bool

	// Generated code (a JVM's code cache): rows written by jvms into
	// regions of unwind_rows of their own, and the mapping to add to the
	// process's entry.
	rts     []runtimes.Reader // every runtime read (runtimes/registry)
	extra   map[uint32]bpf.OffcpuUnwindMap
	regions map[uint32]*rowRegions
	last    map[uint32][]symbolize.Mapping // the mapping list each entry was made from
}

// rowRegions are two runs of unwind_rows a process's generated code
// alternates between, so that a rewrite does not change the rows a walk
// in flight reads.
type rowRegions struct {
	first [2]uint32
	cap   uint32
	cur   int
}

// MaxUnwindProcs is how many processes can be walked with unwind tables at once.
const MaxUnwindProcs = 4096

// UnwindStats describes the unwind tables loaded for .eh_frame unwinding.
type UnwindStats struct {
	Files         int    `json:"files"`          // files whose tables were loaded
	FramePointers int    `json:"frame_pointers"` // files walked by frame pointers (kept rbp frames, or no .eh_frame)
	Failed        int    `json:"failed"`         // files whose .eh_frame could not be read
	Rows          uint32 `json:"rows"`           // rows used of RowCapacity
	RowCapacity   uint32 `json:"row_capacity"`
	RowsFull      int    `json:"rows_full"`    // files left to frame pointers: no room for their rows
	Processes     int    `json:"processes"`    // processes walked with tables
	MapsDropped   int    `json:"maps_dropped"` // mappings beyond the per-process limit, walked by frame pointers
	ProcsFull     int    `json:"procs_full"`   // processes left to frame pointers: unwind_procs full

	// From the BPF programs.
	Stacks     uint64 `json:"stacks"`      // user stacks walked with tables
	Frames     uint64 `json:"frames"`      // frames found through rows
	Ends       uint64 `json:"ends"`        // walks that reached the thread's start
	DepthLimit uint64 `json:"depth_limit"` // walks cut at 127 frames
}

// fileRows is where a file's rows are in unwind_rows; count 0: none
// (frame pointers suffice, or the file could not be read).
type fileRows struct {
	first, count uint32
}

type rescan struct {
	next  time.Time
	every time.Duration
}

func newUnwinder(coll *ebpf.Collection, capacity uint32) *unwinder {
	return &unwinder{
		wake:    loop.NewAlarm(),
		rows:    coll.Maps[bpf.OffcpuMapUnwindRows],
		procs:   coll.Maps[bpf.OffcpuMapUnwindProcs],
		files:   coll.Maps[bpf.OffcpuMapUnwindFiles],
		cap:     capacity,
		loaded:  map[*symtab.File]*fileRows{},
		execs:   map[uint32]uint32{},
		entries: map[uint32]bpf.OffcpuUnwindProc{},
		scans:   map[uint32]*rescan{},
		stats:   UnwindStats{RowCapacity: capacity},
		rescan:  true,
		extra:   map[uint32]bpf.OffcpuUnwindMap{},
		regions: map[uint32]*rowRegions{},
		last:    map[uint32][]symbolize.Mapping{},
	}
}

// setGenerated writes rows for pid's generated code [start, end) (row pcs
// relative to start) and adds the code to the process's entry.
func (u *unwinder) setGenerated(pid uint32, start, end uint64, rows []bpf.OffcpuUnwindRow) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := uint32(len(rows))
	rr := u.regions[pid]
	if rr == nil || rr.cap < n {
		c := max(2*n, 4096)
		if uint64(u.next)+2*uint64(c) > uint64(u.cap) {
			u.stats.RowsFull++
			return errors.New("unwind rows full")
		}
		rr = &rowRegions{first: [2]uint32{u.next, u.next + c}, cap: c, cur: 1}
		u.next += 2 * c
		u.stats.Rows = u.next
		u.regions[pid] = rr
	}
	rr.cur ^= 1
	first := rr.first[rr.cur]
	keys := make([]uint32, n)
	for i := range keys {
		keys[i] = first + uint32(i)
	}
	if err := u.writeRows(keys, rows); err != nil {
		return err
	}
	u.extra[pid] = bpf.OffcpuUnwindMap{Start: start, End: end, Bias: start, First: first, Count: n}
	u.updateLocked(pid, u.last[pid])
	return nil
}

// table returns f's rows, loading them on first use. It parses files
// one at a time under loadMu and takes mu only to look up and to reserve
// rows, so that a large file (libjvm: 20 MB of .eh_frame) does not hold
// up what else needs the entries (the JVM tracker's code-cache rows).
func (u *unwinder) table(f *symtab.File) *fileRows {
	u.loadMu.Lock()
	defer u.loadMu.Unlock()
	u.mu.Lock()
	fr, ok := u.loaded[f]
	u.mu.Unlock()
	if ok {
		return fr
	}
	fr = &fileRows{}
	count := func(c *int) {
		u.mu.Lock()
		*c++
		u.loaded[f] = fr
		u.mu.Unlock()
	}
	if f.Handle == nil {
		count(&u.stats.Failed)
		return fr
	}
	ef, err := elf.NewFile(f.Handle)
	if err != nil {
		count(&u.stats.Failed)
		return fr
	}
	t, err := unwind.FromELF(ef)
	if err != nil {
		count(&u.stats.Failed)
		return fr
	}
	rows := t.Needed()
	for _, rt := range u.rts {
		if marked := rt.Recognise(f, ef, t.Rows); marked != nil {
			rows = marked
		}
	}
	if len(rows) == 0 {
		count(&u.stats.FramePointers)
		return fr
	}
	var vals []bpf.OffcpuUnwindRow
	for _, r := range rows {
		if r.PC > 0xffffffff {
			break // beyond what a row holds: the rest falls back to frame pointers
		}
		vals = append(vals, bpf.OffcpuUnwindRow{Pc: uint32(r.PC), CfaOff: r.CFAOffset, Kind: uint8(r.Kind), RbpOff: r.RBPOffset})
	}
	n := uint32(len(vals))
	u.mu.Lock()
	if uint64(u.next)+uint64(n) > uint64(u.cap) {
		u.stats.RowsFull++
		u.loaded[f] = fr
		u.mu.Unlock()
		return fr
	}
	first := u.next
	u.next += n
	u.stats.Rows = u.next
	u.mu.Unlock()
	keys := make([]uint32, n)
	for i := range keys {
		keys[i] = first + uint32(i)
	}
	if err := u.writeRows(keys, vals); err != nil {
		count(&u.stats.Failed)
		return fr
	}
	fr.first, fr.count = first, n
	u.mu.Lock()
	u.stats.Files++
	u.loaded[f] = fr
	u.mu.Unlock()
	u.publish(f, ef, fr)
	return fr
}

// publish tells the kernel where f's rows are, so that a process mapping
// f later gets its entry made at once, as the mapping is made.
func (u *unwinder) publish(f *symtab.File, ef *elf.File, fr *fileRows) {
	if u.files == nil || f.Ino == 0 {
		return
	}
	for _, p := range ef.Progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_X == 0 {
			continue
		}
		key := bpf.OffcpuFileKey{Ino: f.Ino, Dev: kernelDev(f.Dev)}
		val := bpf.OffcpuFileUnwind{SegOff: p.Off &^ 0xfff, SegEnd: p.Off + p.Filesz,
			OffVaddr: int64(p.Off) - int64(p.Vaddr), First: fr.first, Count: fr.count}
		u.files.Update(key, val, ebpf.UpdateAny) // full: those processes wait for user space
		return
	}
}

// kernelDev turns a userspace dev_t into the kernel's (major << 20 | minor).
func kernelDev(dev uint64) uint32 {
	return unix.Major(dev)<<20 | unix.Minor(dev)
}

func (u *unwinder) writeRows(keys []uint32, vals []bpf.OffcpuUnwindRow) error {
	for len(keys) > 0 {
		n := min(len(keys), 65536)
		if _, err := u.rows.BatchUpdate(keys[:n], vals[:n], nil); err != nil {
			if !errors.Is(err, ebpf.ErrNotSupported) {
				return err
			}
			for i := range n {
				if err := u.rows.Update(keys[i], vals[i], ebpf.UpdateAny); err != nil {
					return err
				}
			}
		}
		keys, vals = keys[n:], vals[n:]
	}
	return nil
}

// update writes the process's entry from its executable mappings: the
// ones whose code needs tables. A process needing none is removed.
func (u *unwinder) update(pid uint32, ms []symbolize.Mapping) {
	// A runtime found by its process's mappings rather than its files
	// (a JVM) starts reading the process before the tables are parsed
	// (libjvm's takes a while; a short-lived JVM's methods are named
	// while it lives).
	for _, rt := range u.rts {
		if e, ok := rt.(runtimes.Early); ok {
			e.SeenEarly(pid, ms)
		}
	}
	for _, m := range ms {
		if m.File != nil {
			u.table(m.File)
		}
	}
	for _, rt := range u.rts {
		rt.Seen(pid, ms) // after table: it recognises the runtime's files
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	u.updateLocked(pid, ms)
}

func (u *unwinder) updateLocked(pid uint32, ms []symbolize.Mapping) {
	u.last[pid] = ms
	if _, ok := u.scans[pid]; !ok && u.rescan {
		u.scans[pid] = &rescan{next: time.Now().Add(10 * time.Millisecond), every: 10 * time.Millisecond}
		u.wake.Wake()
	}
	var entry bpf.OffcpuUnwindProc
	for _, m := range ms {
		if m.File == nil {
			continue
		}
		fr, ok := u.loaded[m.File] // loaded by update before it locked
		if !ok || fr.count == 0 {
			continue
		}
		m.File.Load() // its PT_LOAD segments, shared with the symbolizer
		bias, ok := runtimes.LoadBias(m.File.Loads, m)
		if !ok {
			continue
		}
		if int(entry.N) == len(entry.Maps) {
			u.stats.MapsDropped++
			break
		}
		entry.Maps[entry.N] = bpf.OffcpuUnwindMap{Start: m.Start, End: m.End, Bias: bias, First: fr.first, Count: fr.count}
		entry.N++
	}
	if x, ok := u.extra[pid]; ok {
		if int(entry.N) < len(entry.Maps) {
			entry.Maps[entry.N] = x
			entry.N++
			ms := entry.Maps[:entry.N]
			sort.Slice(ms, func(i, j int) bool { return ms[i].Start < ms[j].Start })
		} else {
			u.stats.MapsDropped++
		}
	}
	old, had := u.entries[pid]
	// The kernel makes and grows entries too, as mappings are made. This
	// list may be behind it: write only over an entry of the program
	// (exec) this list is of, and keep the mappings the kernel added.
	var cur bpf.OffcpuUnwindProc
	if u.procs.Lookup(pid, &cur) == nil {
		if cur.Execs != u.execs[pid] {
			return // an exec this list has not seen yet
		}
		entry = mergeUnwindMaps(entry, cur)
	} else if u.execs[pid] > 0 || !symbolize.ProcessExists(int(pid)) {
		return // the kernel has no entry and the process has exited
	}
	entry.Execs = u.execs[pid]
	if entry.N == 0 {
		if had {
			u.procs.Delete(pid)
			delete(u.entries, pid)
		}
		return
	}
	if entry.Gen = old.Gen; had && old == entry {
		return
	}
	// A new generation: the process's threads walk their stacks again
	// instead of reusing ones cached before this change.
	u.gens++
	entry.Gen = u.gens
	if err := u.procs.Update(pid, &entry, ebpf.UpdateAny); err != nil {
		u.stats.ProcsFull++
		return // map full: this process keeps frame pointers
	}
	u.entries[pid] = entry
}

// mergeUnwindMaps adds to e the mappings of k that start where none of
// e's does, keeping the result sorted by start.
func mergeUnwindMaps(e, k bpf.OffcpuUnwindProc) bpf.OffcpuUnwindProc {
	have := map[uint64]bool{}
	for _, m := range e.Maps[:e.N] {
		have[m.Start] = true
	}
	out := e
	for _, m := range k.Maps[:min(int(k.N), len(k.Maps))] {
		if !have[m.Start] && int(out.N) < len(out.Maps) {
			out.Maps[out.N] = m
			out.N++
		}
	}
	ms := out.Maps[:out.N]
	sort.Slice(ms, func(i, j int) bool { return ms[i].Start < ms[j].Start })
	return out
}

// due returns the processes whose mappings should be read again now: the
// dynamic loader and dlopen map code after a process is first seen, so
// each is looked at after 10, 20, 40 ... ms, then every 10 s.
func (u *unwinder) due(now time.Time) []uint32 {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []uint32
	for pid, r := range u.scans {
		if now.Before(r.next) {
			continue
		}
		r.every = min(2*r.every, 10*time.Second)
		r.next = now.Add(r.every)
		out = append(out, pid)
	}
	return out
}

// exec counts an exec of pid, in the order of the kernel's events.
func (u *unwinder) exec(pid uint32) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.execs[pid]++
	delete(u.entries, pid) // the kernel replaced it
}

// forget drops an exited process.
func (u *unwinder) forget(pid uint32) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.scans, pid)
	delete(u.execs, pid)
	delete(u.entries, pid)
	delete(u.extra, pid)
	delete(u.last, pid)
	delete(u.regions, pid) // its rows are not reused
	for _, rt := range u.rts {
		rt.Forget(pid)
	}
	u.procs.Delete(pid) // the kernel's too: it may not have seen the exit
}

// run rescans mappings until stop is closed.
// It sleeps until the next rescan is due or a new process wakes it: with
// many processes, one is nearly always due within a second, and polling
// for it cost a hundred wake-ups a second on an idle machine.
func (u *unwinder) run(procs *symbolize.Procs, stop <-chan struct{}) {
	loop.SleepLoop(10*time.Millisecond, u.wake, stop, func(now time.Time) time.Duration {
		for _, pid := range u.due(now) {
			if !symbolize.ProcessExists(int(pid)) {
				u.forget(pid)
				continue
			}
			procs.Snapshot(pid) // kept only if the mappings changed
		}
		return u.untilDue(now)
	})
}

// untilDue is the time to the next rescan (at least 10 ms, at most a
// minute: a new process wakes the loop).
func (u *unwinder) untilDue(now time.Time) time.Duration {
	u.mu.Lock()
	defer u.mu.Unlock()
	d := time.Minute
	for _, r := range u.scans {
		d = min(d, r.next.Sub(now))
	}
	return max(d, 10*time.Millisecond)
}

func (u *unwinder) snapshotStats() UnwindStats {
	u.mu.Lock()
	defer u.mu.Unlock()
	st := u.stats
	st.Processes = len(u.entries)
	return st
}
