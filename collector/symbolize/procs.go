package symbolize

import (
	"errors"
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

// Procs keeps what is needed to symbolize a process after it exits:
// its executable mappings (reported by the kernel as they are made, at
// fork, exec and mmap, and read from /proc when it is first seen and at
// the end), the mapped files held open, and a container's root directory.
type Procs struct {
	mu    sync.Mutex
	procs map[uint32]*Proc
	Files *symtab.Cache
	// OnChange, when set, sees each new mapping list of a process.
	OnChange func(pid uint32, ms []Mapping)
}

type Proc struct {
	pid   uint32
	Comm  string
	nspid int      // pid inside its own pid namespace, for perf-PID.map
	root  *os.File // /proc/PID/root of a process in another root, kept open: valid after exit
	// snaps holds mapping snapshots, newest first. Snapshots are never
	// changed in place: a forked child shares its parent's.
	snaps [][]Mapping
	// fromKernel: snaps[0] is being built from the kernel's map events.
	fromKernel bool
	snapped    time.Time // when /proc last gave its mappings
}

type Mapping struct {
	Start, End, Offset uint64
	Path               string
	File               *symtab.File // nil for anonymous or unreadable mappings
}

func NewProcs() *Procs {
	return &Procs{procs: map[uint32]*Proc{}, Files: symtab.NewCache()}
}

// Snapshot reads /proc/PID/maps now and opens the mapped executables.
func (t *Procs) Snapshot(pid uint32) {
	p, err := procfs.NewProc(int(pid))
	if err != nil {
		return
	}
	maps, err := p.ProcMaps()
	if err != nil {
		return
	}
	var ms []Mapping
	for _, m := range maps {
		if !m.Perms.Execute {
			continue
		}
		mm := Mapping{Start: uint64(m.StartAddr), End: uint64(m.EndAddr), Offset: uint64(m.Offset), Path: m.Pathname}
		if m.Inode != 0 && strings.HasPrefix(m.Pathname, "/") {
			mapFile := fmt.Sprintf("/proc/%d/map_files/%x-%x", pid, m.StartAddr, m.EndAddr)
			mm.File = t.Files.Open(m.Dev, m.Inode, m.Pathname, mapFile, fmt.Sprintf("/proc/%d/root%s", pid, m.Pathname), m.Pathname)
		}
		ms = append(ms, mm)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].Start < ms[j].Start })

	t.mu.Lock()
	info := t.info(pid)
	info.snapped = time.Now()
	if info.nspid == 0 {
		info.root = foreignRoot(pid)
		info.nspid = nsPid(p)
	}
	if c, err := p.Comm(); err == nil {
		info.Comm = c
	}
	if len(info.snaps) > 0 && sameMappings(info.snaps[0], ms) {
		t.mu.Unlock()
		return
	}
	info.snaps = append([][]Mapping{ms}, info.snaps...)
	info.fromKernel = false
	t.changed(pid, ms)
}

// info returns pid's entry, creating it. Called with t.mu held.
func (t *Procs) info(pid uint32) *Proc {
	info := t.procs[pid]
	if info == nil {
		info = &Proc{pid: pid}
		t.procs[pid] = info
	}
	return info
}

// changed unlocks t.mu and reports pid's new mappings.
func (t *Procs) changed(pid uint32, ms []Mapping) {
	onChange := t.OnChange
	t.mu.Unlock()
	if onChange != nil {
		onChange(pid, ms)
	}
}

// Known says whether pid's mappings are Known.
func (t *Procs) Known(pid uint32) bool {
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

// Exec starts a new, empty mapping list for pid: the kernel's map events
// for the new program follow.
func (t *Procs) Exec(pid uint32) {
	t.mu.Lock()
	info := t.info(pid)
	info.snaps = append([][]Mapping{nil}, info.snaps...)
	info.fromKernel = true
	t.mu.Unlock()
}

// Fork gives a new process its parent's mappings: it runs the parent's
// code until it execs.
func (t *Procs) Fork(child, parent uint32) {
	t.mu.Lock()
	pi := t.procs[parent]
	if pi == nil || len(pi.snaps) == 0 {
		t.mu.Unlock()
		t.Snapshot(parent)
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

// AddMapping adds a code mapping the kernel reported as it was made. It
// replaces the part of any other it overlaps (MAP_FIXED over a
// reservation, a library mapped where another was).
func (t *Procs) AddMapping(pid uint32, m Mapping) {
	t.mu.Lock()
	info := t.info(pid)
	var base []Mapping
	if len(info.snaps) > 0 {
		base = info.snaps[0] // after a /proc snapshot or a fork: start from it
	}
	ms := make([]Mapping, 0, len(base)+2)
	for _, o := range base {
		if o.End <= m.Start || o.Start >= m.End {
			ms = append(ms, o)
			continue
		}
		// Split as the kernel splits a mapping partly mapped over.
		if o.Start < m.Start {
			head := o
			head.End = m.Start
			ms = append(ms, head)
		}
		if o.End > m.End {
			tail := o
			tail.Offset += m.End - o.Start
			tail.Start = m.End
			ms = append(ms, tail)
		}
	}
	ms = append(ms, m)
	sort.Slice(ms, func(i, j int) bool { return ms[i].Start < ms[j].Start })
	if info.fromKernel && len(info.snaps) > 0 {
		info.snaps[0] = ms
	} else {
		info.snaps = append([][]Mapping{ms}, info.snaps...)
		info.fromKernel = true
	}
	t.changed(pid, ms)
}

// KernelFile opens the file of a mapping the kernel reported: by device
// and inode if it is already open, else by its path, checked to be the
// same file (not one replaced on disk since).
func (t *Procs) KernelFile(pid uint32, dev, ino uint64, path string) *symtab.File {
	return t.Files.Open(dev, ino, path, path, fmt.Sprintf("/proc/%d/root%s", pid, path))
}

func sameMappings(a, b []Mapping) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Start != b[i].Start || a[i].End != b[i].End || a[i].Offset != b[i].Offset || a[i].Path != b[i].Path {
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

// Get returns a copy of pid's entry: events and rescans change the entry
// while a continuous recording's cut reads it. The mapping lists in it
// are never changed in place.
func (t *Procs) Get(pid uint32) *Proc {
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

// Fresh reports whether pid's mappings were read from /proc within age.
func (t *Procs) Fresh(pid uint32, age time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.procs[pid]
	return p != nil && time.Since(p.snapped) < age
}

// Len is how many processes are kept.
func (t *Procs) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.procs)
}

// Find returns the mapping holding addr, newest snapshot first.
func (p *Proc) Find(addr uint64) *Mapping {
	for _, ms := range p.snaps {
		i := sort.Search(len(ms), func(i int) bool { return ms[i].End > addr })
		if i < len(ms) && ms[i].Start <= addr {
			return &ms[i]
		}
	}
	return nil
}

// Forget drops an exited process's mappings once nothing is left to name.
func (t *Procs) Forget(pid uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.procs[pid]; p != nil {
		if p.root != nil {
			p.root.Close()
		}
		delete(t.procs, pid)
	}
}

func (t *Procs) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.procs {
		if p.root != nil {
			p.root.Close()
		}
	}
	t.Files.Close()
}

func ProcessExists(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}
