package collector

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/collector/symtab"
)

// procTable keeps what is needed to symbolize a process after it exits:
// its executable mappings (reported by the kernel as they are made, at
// fork, exec and mmap, and read from /proc when it is first seen and at
// the end), the mapped files held open, and a container's root directory.
type procTable struct {
	mu    sync.Mutex
	procs map[uint32]*procInfo
	files *symtab.Cache
	// onChange, when set, sees each new mapping list of a process.
	onChange func(pid uint32, ms []mapping)
}

type procInfo struct {
	pid   uint32
	comm  string
	nspid int      // pid inside its own pid namespace, for perf-PID.map
	root  *os.File // /proc/PID/root of a process in another root, kept open: valid after exit
	// snaps holds mapping snapshots, newest first. Snapshots are never
	// changed in place: a forked child shares its parent's.
	snaps [][]mapping
	// fromKernel: snaps[0] is being built from the kernel's map events.
	fromKernel bool
	snapped    time.Time // when /proc last gave its mappings
}

type mapping struct {
	start, end, offset uint64
	path               string
	file               *symtab.File // nil for anonymous or unreadable mappings
}

func newProcTable() *procTable {
	return &procTable{procs: map[uint32]*procInfo{}, files: symtab.NewCache()}
}

// snapshot reads /proc/PID/maps now and opens the mapped executables.
func (t *procTable) snapshot(pid uint32) {
	p, err := procfs.NewProc(int(pid))
	if err != nil {
		return
	}
	maps, err := p.ProcMaps()
	if err != nil {
		return
	}
	var ms []mapping
	for _, m := range maps {
		if !m.Perms.Execute {
			continue
		}
		mm := mapping{start: uint64(m.StartAddr), end: uint64(m.EndAddr), offset: uint64(m.Offset), path: m.Pathname}
		if m.Inode != 0 && strings.HasPrefix(m.Pathname, "/") {
			mapFile := fmt.Sprintf("/proc/%d/map_files/%x-%x", pid, m.StartAddr, m.EndAddr)
			mm.file = t.files.Open(m.Dev, m.Inode, m.Pathname, mapFile, fmt.Sprintf("/proc/%d/root%s", pid, m.Pathname), m.Pathname)
		}
		ms = append(ms, mm)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].start < ms[j].start })

	t.mu.Lock()
	info := t.info(pid)
	info.snapped = time.Now()
	if info.nspid == 0 {
		info.root = foreignRoot(pid)
		info.nspid = nsPid(p)
	}
	if c, err := p.Comm(); err == nil {
		info.comm = c
	}
	if len(info.snaps) > 0 && sameMappings(info.snaps[0], ms) {
		t.mu.Unlock()
		return
	}
	info.snaps = append([][]mapping{ms}, info.snaps...)
	info.fromKernel = false
	t.changed(pid, ms)
}

// info returns pid's entry, creating it. Called with t.mu held.
func (t *procTable) info(pid uint32) *procInfo {
	info := t.procs[pid]
	if info == nil {
		info = &procInfo{pid: pid}
		t.procs[pid] = info
	}
	return info
}

// changed unlocks t.mu and reports pid's new mappings.
func (t *procTable) changed(pid uint32, ms []mapping) {
	onChange := t.onChange
	t.mu.Unlock()
	if onChange != nil {
		onChange(pid, ms)
	}
}

// known says whether pid's mappings are known.
func (t *procTable) known(pid uint32) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	info := t.procs[pid]
	return info != nil && len(info.snaps) > 0
}

// foreignRoot opens /proc/PID/root when it is not this process's root (a
// container), so files in it stay readable after the process exits;
// otherwise it keeps nothing open.
func foreignRoot(pid uint32) *os.File {
	f, err := os.Open(fmt.Sprintf("/proc/%d/root", pid))
	if err != nil {
		return nil
	}
	var theirs, ours unix.Stat_t
	if unix.Fstat(int(f.Fd()), &theirs) == nil && unix.Stat("/", &ours) == nil &&
		theirs.Dev == ours.Dev && theirs.Ino == ours.Ino {
		f.Close()
		return nil
	}
	return f
}

// exec starts a new, empty mapping list for pid: the kernel's map events
// for the new program follow.
func (t *procTable) exec(pid uint32) {
	t.mu.Lock()
	info := t.info(pid)
	info.snaps = append([][]mapping{nil}, info.snaps...)
	info.fromKernel = true
	t.mu.Unlock()
}

// fork gives a new process its parent's mappings: it runs the parent's
// code until it execs.
func (t *procTable) fork(child, parent uint32) {
	t.mu.Lock()
	pi := t.procs[parent]
	if pi == nil || len(pi.snaps) == 0 {
		t.mu.Unlock()
		t.snapshot(parent)
		t.mu.Lock()
		pi = t.procs[parent]
	}
	if pi == nil || len(pi.snaps) == 0 {
		t.mu.Unlock()
		return
	}
	info := t.info(child)
	info.snaps = append(info.snaps, pi.snaps[0]) // the oldest: anything seen later is newer
	// Not reported as a change: the child is walked by frame pointers
	// until it execs (usually within microseconds).
	t.mu.Unlock()
}

// addMapping adds a code mapping the kernel reported as it was made. It
// replaces the part of any other it overlaps (MAP_FIXED over a
// reservation, a library mapped where another was).
func (t *procTable) addMapping(pid uint32, m mapping) {
	t.mu.Lock()
	info := t.info(pid)
	var base []mapping
	if len(info.snaps) > 0 {
		base = info.snaps[0] // after a /proc snapshot or a fork: start from it
	}
	ms := make([]mapping, 0, len(base)+2)
	for _, o := range base {
		if o.end <= m.start || o.start >= m.end {
			ms = append(ms, o)
			continue
		}
		// Split as the kernel splits a mapping partly mapped over.
		if o.start < m.start {
			head := o
			head.end = m.start
			ms = append(ms, head)
		}
		if o.end > m.end {
			tail := o
			tail.offset += m.end - o.start
			tail.start = m.end
			ms = append(ms, tail)
		}
	}
	ms = append(ms, m)
	sort.Slice(ms, func(i, j int) bool { return ms[i].start < ms[j].start })
	if info.fromKernel && len(info.snaps) > 0 {
		info.snaps[0] = ms
	} else {
		info.snaps = append([][]mapping{ms}, info.snaps...)
		info.fromKernel = true
	}
	t.changed(pid, ms)
}

// kernelFile opens the file of a mapping the kernel reported: by device
// and inode if it is already open, else by its path, checked to be the
// same file (not one replaced on disk since).
func (t *procTable) kernelFile(pid uint32, dev, ino uint64, path string) *symtab.File {
	return t.files.Open(dev, ino, path, path, fmt.Sprintf("/proc/%d/root%s", pid, path))
}

func sameMappings(a, b []mapping) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].start != b[i].start || a[i].end != b[i].end || a[i].offset != b[i].offset || a[i].path != b[i].path {
			return false
		}
	}
	return true
}

func nsPid(p procfs.Proc) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.PID))
	if err != nil {
		return p.PID
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "NSpid:") {
			f := strings.Fields(line)
			if n, err := strconv.Atoi(f[len(f)-1]); err == nil {
				return n
			}
		}
	}
	return p.PID
}

// get returns a copy of pid's entry: events and rescans change the entry
// while a continuous recording's cut reads it. The mapping lists in it
// are never changed in place.
func (t *procTable) get(pid uint32) *procInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.procs[pid]
	if p == nil {
		return nil
	}
	cp := *p
	cp.snaps = slices.Clone(p.snaps)
	return &cp
}

// fresh reports whether pid's mappings were read from /proc within age.
func (t *procTable) fresh(pid uint32, age time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.procs[pid]
	return p != nil && time.Since(p.snapped) < age
}

// len is how many processes are kept.
func (t *procTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.procs)
}

// find returns the mapping holding addr, newest snapshot first.
func (p *procInfo) find(addr uint64) *mapping {
	for _, ms := range p.snaps {
		i := sort.Search(len(ms), func(i int) bool { return ms[i].end > addr })
		if i < len(ms) && ms[i].start <= addr {
			return &ms[i]
		}
	}
	return nil
}

// forget drops an exited process's mappings once nothing is left to name.
func (t *procTable) forget(pid uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.procs[pid]; p != nil {
		if p.root != nil {
			p.root.Close()
		}
		delete(t.procs, pid)
	}
}

func (t *procTable) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.procs {
		if p.root != nil {
			p.root.Close()
		}
	}
	t.files.Close()
}
