package runtimes

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/symtab"
	"github.com/offcpu/offcpu/internal/loop"
)

// Procs is the bookkeeping a runtime's Reader shares with every other:
// what it recognised in each file (F: nil for a file without the runtime),
// its processes (P) with their memory open while they live, its figures,
// and an alarm rung when a process is attached.
type Procs[F any, P any] struct {
	Mu    sync.Mutex
	files map[*symtab.File]*F
	byPID map[uint32]*Proc[P]
	stats Stats
	Wake  loop.Alarm
}

// Proc is one process of the runtime.
type Proc[P any] struct {
	PID  uint32
	Mem  *os.File // /proc/PID/mem, open while it lives
	Dead bool     // exited, or not read (a build whose layout is not known)
	S    P
}

// NewProcs starts the bookkeeping of the runtime called name.
func NewProcs[F, P any](name string) *Procs[F, P] {
	return &Procs[F, P]{files: map[*symtab.File]*F{}, byPID: map[uint32]*Proc[P]{},
		stats: Stats{Runtime: name}, Wake: loop.NewAlarm()}
}

// File returns what was recognised in f, reading it with read on first
// use (nil: not the runtime's).
func (ps *Procs[F, P]) File(f *symtab.File, read func() *F) *F {
	ps.Mu.Lock()
	r, ok := ps.files[f]
	ps.Mu.Unlock()
	if ok {
		return r
	}
	r = read()
	ps.Mu.Lock()
	ps.files[f] = r
	ps.Mu.Unlock()
	return r
}

// Seen calls attach for the first mapping of a recognised file in a new
// process, with the file's load bias there.
func (ps *Procs[F, P]) Seen(pid uint32, ms []symbolize.Mapping, attach func(pid uint32, f *F, bias uint64)) {
	ps.Mu.Lock()
	_, had := ps.byPID[pid]
	ps.Mu.Unlock()
	if had {
		return
	}
	for _, m := range ms {
		if m.File == nil {
			continue
		}
		ps.Mu.Lock()
		f := ps.files[m.File]
		ps.Mu.Unlock()
		if f == nil {
			continue
		}
		if runtime.GOARCH != "amd64" {
			// The layouts and the walker's code are x86-64's.
			ps.Unsupported(pid, fmt.Sprintf("%s frames are read on x86-64 only, not %s", ps.stats.Runtime, runtime.GOARCH))
			return
		}
		m.File.Load() // its PT_LOAD segments
		bias, ok := LoadBias(m.File.Loads, m)
		if !ok {
			continue
		}
		attach(pid, f, bias)
		return
	}
}

// Unsupported notes a process of a build whose layout is not read, and
// why (once per reason).
func (ps *Procs[F, P]) Unsupported(pid uint32, why string) {
	ps.Mu.Lock()
	defer ps.Mu.Unlock()
	ps.byPID[pid] = &Proc[P]{PID: pid, Dead: true}
	ps.stats.Unsupported++
	if !slices.Contains(ps.stats.Skipped, why) {
		ps.stats.Skipped = append(ps.stats.Skipped, why)
	}
}

// Attach opens a process's memory and keeps it with s; publish gives the
// walker its layout (an error leaves the process unread).
func (ps *Procs[F, P]) Attach(pid uint32, s P, publish func(p *Proc[P]) error) *Proc[P] {
	p := &Proc[P]{PID: pid, S: s}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err == nil {
		p.Mem = mem
		err = publish(p)
	}
	ps.Mu.Lock()
	defer ps.Mu.Unlock()
	ps.byPID[pid] = p
	if err != nil {
		p.Dead = true
		if mem != nil {
			mem.Close()
		}
		return p
	}
	ps.stats.Processes++
	ps.Wake.Wake()
	return p
}

// Forget marks an exited process dead, closes its memory and calls drop
// (to remove it from the walker's maps); its names stay.
func (ps *Procs[F, P]) Forget(pid uint32, drop func(pid uint32)) {
	ps.Mu.Lock()
	defer ps.Mu.Unlock()
	if p := ps.byPID[pid]; p != nil && !p.Dead {
		p.Dead = true
		drop(pid)
		if p.Mem != nil {
			p.Mem.Close()
		}
	}
}

// Get returns a process, nil when not seen.
func (ps *Procs[F, P]) Get(pid uint32) *Proc[P] {
	ps.Mu.Lock()
	defer ps.Mu.Unlock()
	return ps.byPID[pid]
}

// Live says whether some process is still read.
func (ps *Procs[F, P]) Live() bool {
	ps.Mu.Lock()
	defer ps.Mu.Unlock()
	for _, p := range ps.byPID {
		if !p.Dead {
			return true
		}
	}
	return false
}

// Each calls f for every process, under the lock.
func (ps *Procs[F, P]) Each(f func(p *Proc[P])) {
	ps.Mu.Lock()
	defer ps.Mu.Unlock()
	for _, p := range ps.byPID {
		f(p)
	}
}

// Named counts a function read (ok) or one that could not be.
func (ps *Procs[F, P]) Named(ok bool) {
	ps.Mu.Lock()
	defer ps.Mu.Unlock()
	if ok {
		ps.stats.Named++
	} else {
		ps.stats.Unnamed++
	}
}

// Stats returns the figures so far.
func (ps *Procs[F, P]) Stats() Stats {
	ps.Mu.Lock()
	defer ps.Mu.Unlock()
	st := ps.stats
	st.Skipped = slices.Clone(st.Skipped)
	return st
}

// Layouts is a runtime's map of processes for the walker (by tgid) and
// the variable that tells the BPF side it holds any.
type Layouts struct {
	m      *ebpf.Map
	active *ebpf.Variable
}

// NewLayouts reaches the map and the variable named through h.
func NewLayouts(h Handle, mapName, activeVar string) Layouts {
	return Layouts{m: h.Map(mapName), active: h.Variable(activeVar)}
}

// Put gives the walker pid's layout and marks the runtime active.
func (l Layouts) Put(pid uint32, v any) error {
	if err := l.m.Put(pid, v); err != nil {
		return err
	}
	if l.active != nil {
		_ = l.active.Set(uint32(1))
	}
	return nil
}

// Delete forgets pid.
func (l Layouts) Delete(pid uint32) { _ = l.m.Delete(pid) }

// ReadOnce is what m holds at addr for p, read by read on first use
// (outside the lock: a read takes system calls) and counted as named or
// not; nil when unreadable or once p is gone.
func ReadOnce[F, P, V any](ps *Procs[F, P], p *Proc[P], m map[uint64]*V, addr uint64, read func(mem *os.File) *V) *V {
	ps.Mu.Lock()
	v, ok := m[addr]
	mem, dead := p.Mem, p.Dead
	ps.Mu.Unlock()
	if ok || mem == nil || dead || m == nil {
		return v
	}
	v = read(mem)
	ps.Mu.Lock()
	m[addr] = v
	ps.Mu.Unlock()
	ps.Named(v != nil)
	return v
}
