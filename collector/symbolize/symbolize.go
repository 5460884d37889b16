// Package symbolize names the addresses of a recording: the processes'
// code mappings as they were while recording (kept after the processes
// exit), the files behind them, the kernel's symbols, perf maps and a
// runtime's compiled code.
package symbolize

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/offcpu/offcpu/collector/symtab"
)

// JIT names code a runtime made or runs (HotSpot's compiled and
// interpreted Java, CPython's Python frames), read from the runtime's own
// structures, where no file or perf map names it.
type JIT interface {
	Name(pid uint32, addr uint64) (string, bool)
	Frames(pid uint32, pc uint64) ([]symtab.Frame, bool) // inlined, innermost first
}

// Symbolizer resolves the addresses of one recording.
type Symbolizer struct {
	Procs    *Procs
	procCopy map[uint32]*Proc // procs.get once per process
	Kern     *symtab.Kernel
	PerfMaps map[uint32]*symtab.PerfMap
	JIT      JIT // nil: no JVM named through its structures
	// Reread: read a live process's mappings again on a miss (continuous
	// cuts, which trust them for a while); done once per process.
	Reread   bool
	reReadOf map[uint32]bool
}

func NewSymbolizer(procs *Procs) *Symbolizer {
	return &Symbolizer{Procs: procs, PerfMaps: map[uint32]*symtab.PerfMap{}, Kern: LoadKernelSymbols()}
}

func LoadKernelSymbols() *symtab.Kernel {
	if f, err := os.Open("/proc/kallsyms"); err == nil {
		defer f.Close()
		if k, err := symtab.LoadKallsyms(f); err == nil && k != nil {
			return k
		}
	}
	return &symtab.Kernel{}
}

// KernelSymbols keeps the kernel's symbols across the cuts of a
// continuous recording; they are read again when the loaded modules
// change.
type KernelSymbols struct {
	modules []byte
	kern    *symtab.Kernel
}

func (k *KernelSymbols) Get() *symtab.Kernel {
	mods, _ := os.ReadFile("/proc/modules")
	if k.kern == nil || !bytes.Equal(mods, k.modules) {
		k.kern, k.modules = LoadKernelSymbols(), mods
	}
	return k.kern
}

// Proc returns pid's entry as it was when first asked for.
func (s *Symbolizer) Proc(pid uint32) *Proc {
	if p, ok := s.procCopy[pid]; ok {
		return p
	}
	if s.procCopy == nil {
		s.procCopy = map[uint32]*Proc{}
	}
	p := s.Procs.Get(pid)
	s.procCopy[pid] = p
	return p
}

// perfMapFor reads the JIT map now, at the end, since it grows while the
// process runs; a container's map is read through its root.
func (s *Symbolizer) perfMapFor(pid uint32, p *Proc) *symtab.PerfMap {
	if m, ok := s.PerfMaps[pid]; ok {
		return m
	}
	var m *symtab.PerfMap
	var paths []string
	if p != nil && p.root != nil {
		paths = append(paths, fmt.Sprintf("/proc/self/fd/%d/tmp/perf-%d.map", p.root.Fd(), p.nspid))
	}
	paths = append(paths, fmt.Sprintf("/tmp/perf-%d.map", pid))
	for _, path := range paths {
		if b, err := os.ReadFile(path); err == nil {
			m = symtab.ParsePerfMap(bytes.NewReader(b))
			break
		}
	}
	s.PerfMaps[pid] = m
	return m
}

// Wrapped names the function a Go wrapper at addr of process pid calls
// (symtab.File.WrappedCall); ok is false elsewhere.
func (s *Symbolizer) Wrapped(pid uint32, addr uint64) (symtab.Frame, bool) {
	p := s.Proc(pid)
	if p == nil {
		return symtab.Frame{}, false
	}
	m := p.Find(addr)
	if m == nil || m.File == nil {
		return symtab.Frame{}, false
	}
	va, ok := m.File.VAddr(addr - m.Start + m.Offset)
	if !ok {
		return symtab.Frame{}, false
	}
	return m.File.WrappedCall(va)
}

// User symbolizes a User address of process pid: the function holding
// it. The returned mapping is nil when the address is in no known mapping.
func (s *Symbolizer) User(pid uint32, addr uint64) (symtab.Frame, *Mapping) {
	frames, m := s.UserFrames(pid, addr)
	return frames[len(frames)-1], m
}

// UserFrames symbolizes a user address of process pid with the Go calls
// inlined there, innermost first; the function holding it last.
func (s *Symbolizer) UserFrames(pid uint32, addr uint64) ([]symtab.Frame, *Mapping) {
	p := s.Proc(pid)
	var m *Mapping
	if p != nil {
		m = p.Find(addr)
	}
	if m == nil && s.Reread && !s.reReadOf[pid] && ProcessExists(int(pid)) {
		if s.reReadOf == nil {
			s.reReadOf = map[uint32]bool{}
		}
		s.reReadOf[pid] = true
		s.Procs.Snapshot(pid)
		delete(s.procCopy, pid)
		if p = s.Proc(pid); p != nil {
			m = p.Find(addr)
		}
	}
	if m == nil || m.File == nil {
		if s.JIT != nil {
			if name, ok := s.JIT.Name(pid, addr); ok {
				return []symtab.Frame{{Func: name}}, m
			}
		}
		if name, ok := s.perfMapFor(pid, p).Lookup(addr); ok {
			return []symtab.Frame{{Func: name}}, m
		}
		if m != nil {
			label := m.Path
			if label == "" {
				label = "[anon]"
			}
			return []symtab.Frame{{Func: fmt.Sprintf("%s+0x%x", label, addr-m.Start)}}, m
		}
		return []symtab.Frame{{Func: fmt.Sprintf("[unmapped]+0x%x", addr)}}, nil
	}
	off := addr - m.Start + m.Offset
	m.File.Load()
	if m.File.Err == nil {
		if va, ok := m.File.VAddr(off); ok {
			if frames, ok := m.File.LookupFrames(va); ok {
				return frames, m
			}
		}
	}
	return []symtab.Frame{{Func: fmt.Sprintf("%s+0x%x", filepath.Base(m.Path), off)}}, m
}
