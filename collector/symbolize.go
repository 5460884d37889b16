package collector

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/offcpu/offcpu/collector/symtab"
)

// symbolizer resolves the addresses of one recording.
type symbolizer struct {
	procs    *procTable
	procCopy map[uint32]*procInfo // procs.get once per process
	kern     *symtab.Kernel
	perfMaps map[uint32]*symtab.PerfMap
	jvms     *jvmTracker // nil: no JVM named through its structures
	// reread: read a live process's mappings again on a miss (continuous
	// cuts, which trust them for a while); done once per process.
	reread   bool
	reReadOf map[uint32]bool
}

func newSymbolizer(procs *procTable) *symbolizer {
	return &symbolizer{procs: procs, perfMaps: map[uint32]*symtab.PerfMap{}, kern: loadKernelSymbols()}
}

func loadKernelSymbols() *symtab.Kernel {
	if f, err := os.Open("/proc/kallsyms"); err == nil {
		defer f.Close()
		if k, err := symtab.LoadKallsyms(f); err == nil && k != nil {
			return k
		}
	}
	return &symtab.Kernel{}
}

// kernelSymbols keeps the kernel's symbols across the cuts of a
// continuous recording; they are read again when the loaded modules
// change.
type kernelSymbols struct {
	modules []byte
	kern    *symtab.Kernel
}

func (k *kernelSymbols) get() *symtab.Kernel {
	mods, _ := os.ReadFile("/proc/modules")
	if k.kern == nil || !bytes.Equal(mods, k.modules) {
		k.kern, k.modules = loadKernelSymbols(), mods
	}
	return k.kern
}

// proc returns pid's entry as it was when first asked for.
func (s *symbolizer) proc(pid uint32) *procInfo {
	if p, ok := s.procCopy[pid]; ok {
		return p
	}
	if s.procCopy == nil {
		s.procCopy = map[uint32]*procInfo{}
	}
	p := s.procs.get(pid)
	s.procCopy[pid] = p
	return p
}

// perfMapFor reads the JIT map now, at the end, since it grows while the
// process runs; a container's map is read through its root.
func (s *symbolizer) perfMapFor(pid uint32, p *procInfo) *symtab.PerfMap {
	if m, ok := s.perfMaps[pid]; ok {
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
	s.perfMaps[pid] = m
	return m
}

// wrapped names the function a Go wrapper at addr of process pid calls
// (symtab.File.WrappedCall); ok is false elsewhere.
func (s *symbolizer) wrapped(pid uint32, addr uint64) (symtab.Frame, bool) {
	p := s.proc(pid)
	if p == nil {
		return symtab.Frame{}, false
	}
	m := p.find(addr)
	if m == nil || m.file == nil {
		return symtab.Frame{}, false
	}
	va, ok := m.file.VAddr(addr - m.start + m.offset)
	if !ok {
		return symtab.Frame{}, false
	}
	return m.file.WrappedCall(va)
}

// user symbolizes a user address of process pid: the function holding
// it. The returned mapping is nil when the address is in no known mapping.
func (s *symbolizer) user(pid uint32, addr uint64) (symtab.Frame, *mapping) {
	frames, m := s.userFrames(pid, addr)
	return frames[len(frames)-1], m
}

// userFrames symbolizes a user address of process pid with the Go calls
// inlined there, innermost first; the function holding it last.
func (s *symbolizer) userFrames(pid uint32, addr uint64) ([]symtab.Frame, *mapping) {
	p := s.proc(pid)
	var m *mapping
	if p != nil {
		m = p.find(addr)
	}
	if m == nil && s.reread && !s.reReadOf[pid] && processExists(int(pid)) {
		if s.reReadOf == nil {
			s.reReadOf = map[uint32]bool{}
		}
		s.reReadOf[pid] = true
		s.procs.snapshot(pid)
		delete(s.procCopy, pid)
		if p = s.proc(pid); p != nil {
			m = p.find(addr)
		}
	}
	if m == nil || m.file == nil {
		if s.jvms != nil {
			if name, ok := s.jvms.name(pid, addr); ok {
				return []symtab.Frame{{Func: name}}, m
			}
		}
		if name, ok := s.perfMapFor(pid, p).Lookup(addr); ok {
			return []symtab.Frame{{Func: name}}, m
		}
		if m != nil {
			label := m.path
			if label == "" {
				label = "[anon]"
			}
			return []symtab.Frame{{Func: fmt.Sprintf("%s+0x%x", label, addr-m.start)}}, m
		}
		return []symtab.Frame{{Func: fmt.Sprintf("[unmapped]+0x%x", addr)}}, nil
	}
	off := addr - m.start + m.offset
	m.file.Load()
	if m.file.Err == nil {
		if va, ok := m.file.VAddr(off); ok {
			if frames, ok := m.file.LookupFrames(va); ok {
				return frames, m
			}
		}
	}
	return []symtab.Frame{{Func: fmt.Sprintf("%s+0x%x", filepath.Base(m.path), off)}}, m
}
