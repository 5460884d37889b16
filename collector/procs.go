package collector

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/procfs"
)

// procTable keeps what is needed to symbolize a process after it exits:
// its executable mappings (taken when it is first seen and again at exec
// and at the end), the mapped files held open, and its root directory.
type procTable struct {
	mu    sync.Mutex
	procs map[uint32]*procInfo
	files *fileCache
	// onChange, when set, sees each new mapping list of a process.
	onChange func(pid uint32, ms []mapping)
}

type procInfo struct {
	pid   uint32
	comm  string
	nspid int      // pid inside its own pid namespace, for perf-PID.map
	root  *os.File // /proc/PID/root, kept open: valid after exit
	// snaps holds mapping snapshots, newest first.
	snaps [][]mapping
}

type mapping struct {
	start, end, offset uint64
	path               string
	file               *symFile // nil for anonymous or unreadable mappings
}

func newProcTable() *procTable {
	return &procTable{procs: map[uint32]*procInfo{}, files: newFileCache()}
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
			key := fmt.Sprintf("%d:%d", m.Dev, m.Inode)
			mm.file = t.files.open(key, m.Pathname, mapFile, fmt.Sprintf("/proc/%d/root%s", pid, m.Pathname), m.Pathname)
		}
		ms = append(ms, mm)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].start < ms[j].start })

	t.mu.Lock()
	info := t.procs[pid]
	if info == nil {
		info = &procInfo{pid: pid}
		if f, err := os.Open(fmt.Sprintf("/proc/%d/root", pid)); err == nil {
			info.root = f
		}
		info.nspid = nsPid(p)
		t.procs[pid] = info
	}
	if c, err := p.Comm(); err == nil {
		info.comm = c
	}
	if len(info.snaps) > 0 && sameMappings(info.snaps[0], ms) {
		t.mu.Unlock()
		return
	}
	info.snaps = append([][]mapping{ms}, info.snaps...)
	onChange := t.onChange
	t.mu.Unlock()
	if onChange != nil {
		onChange(pid, ms)
	}
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

func (t *procTable) get(pid uint32) *procInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.procs[pid]
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

func (t *procTable) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.procs {
		if p.root != nil {
			p.root.Close()
		}
	}
	t.files.close()
}
