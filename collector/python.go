package collector

import (
	"debug/elf"
	"fmt"
	"os"
	"slices"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/cpython"
	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/symtab"
	"github.com/offcpu/offcpu/collector/unwind"
)

// PythonStats describes the CPython processes recorded.
type PythonStats struct {
	Processes   int `json:"processes"`   // CPython processes whose frames were walked
	Unsupported int `json:"unsupported"` // CPython processes of a version whose layout is not known
	Codes       int `json:"codes"`       // code objects named
	Unnamed     int `json:"unnamed"`     // code objects seen in stacks that could not be read
	// Skipped: why processes were walked as native code only (a version
	// whose layout is not known), once each.
	Skipped []string `json:"skipped,omitempty"`
}

// pyTracker gives the walker each CPython process's layout and names the
// code objects its frames hold, while the processes live (a code object
// is read from the process's memory).
type pyTracker struct {
	procs, codes *ebpf.Map
	active       *ebpf.Variable
	mu           sync.Mutex
	runtimes     map[*symtab.File]*cpython.Runtime // nil: not an interpreter
	byPID        map[uint32]*pyProc
	stats        PythonStats
	wake         alarm
}

// pyProc is one CPython process: its runtime and the code objects named.
type pyProc struct {
	rt    *cpython.Runtime
	l     cpython.Layout
	mem   *os.File // /proc/PID/mem, open while it lives
	codes map[uint64]*cpython.Code
	dead  bool
}

func newPyTracker(coll *ebpf.Collection) *pyTracker {
	return &pyTracker{procs: coll.Maps[bpf.OffcpuMapPyProcs], codes: coll.Maps[bpf.OffcpuMapPyCodes],
		active: coll.Variables[bpf.OffcpuVarPyActive], runtimes: map[*symtab.File]*cpython.Runtime{}, byPID: map[uint32]*pyProc{}, wake: newAlarm()}
}

// runtimeOf recognises a CPython interpreter binary, once per file.
func (t *pyTracker) runtimeOf(f *symtab.File, ef *elf.File) *cpython.Runtime {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r, ok := t.runtimes[f]; ok {
		return r
	}
	r, err := cpython.ReadRuntime(ef, f.Path)
	if err != nil {
		r = nil
	}
	t.runtimes[f] = r
	return r
}

// seen gives the walker the layout of a process that maps a CPython
// interpreter (its unwind tables mark the interpreter loop: unwinder.table).
func (t *pyTracker) seen(pid uint32, ms []symbolize.Mapping) {
	for _, m := range ms {
		if m.File == nil {
			continue
		}
		t.mu.Lock()
		rt, known := t.runtimes[m.File]
		_, had := t.byPID[pid]
		t.mu.Unlock()
		if !known || rt == nil || had {
			continue
		}
		m.File.Load() // its PT_LOAD segments
		bias, ok := loadBias(m.File.Loads, m)
		if !ok {
			continue
		}
		t.attach(pid, rt, bias)
		return
	}
}

func (t *pyTracker) attach(pid uint32, rt *cpython.Runtime, bias uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !rt.Supported {
		t.byPID[pid] = &pyProc{rt: rt, dead: true}
		t.stats.Unsupported++
		if !slices.Contains(t.stats.Skipped, rt.UnsupError) {
			t.stats.Skipped = append(t.stats.Skipped, rt.UnsupError)
		}
		return
	}
	l := rt.Layout
	p := &pyProc{rt: rt, l: l, codes: map[uint64]*cpython.Code{}}
	p.mem, _ = os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	t.byPID[pid] = p
	runtime := rt.Runtime + bias
	v := bpf.OffcpuPyProc{
		InterpHead: runtime + l.InterpHead, Gil: runtime + l.Gil, GilSize: uint32(l.GilSize), GilHolder: l.GilHolder,
		ThreadsHead: l.ThreadsHead, TstateNext: l.TstateNext, TstateThreadId: l.ThreadID, TstateNativeId: l.NativeID,
		TstateFrame: l.TstateFrame, CframeFrame: l.CframeFrame,
		FrameCode: l.FrameCode, FrameBack: l.FrameBack, FrameInstr: l.FrameInstr, FrameEntry: l.FrameEntry,
		CodeFirstInstr: l.CodeFirstInstr, EntryVal: l.EntryVal, Flags: l.Flags,
	}
	if err := t.procs.Put(pid, &v); err != nil {
		p.dead = true
		return
	}
	t.stats.Processes++
	if t.active != nil {
		_ = t.active.Set(uint32(1))
	}
	t.wake.wake()
}

// forget stops reading an exited process; its names stay.
func (t *pyTracker) forget(pid uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.byPID[pid]; p != nil && !p.dead {
		p.dead = true
		t.procs.Delete(pid)
		if p.mem != nil {
			p.mem.Close()
		}
	}
}

// run names the code objects the walker saw, every 50 ms while a CPython
// process is recorded, so that a short-lived script's are named before it
// exits.
func (t *pyTracker) run(stop <-chan struct{}) {
	nameWhileLive(stop, t.wake, func() bool { return anyLive(&t.mu, t.byPID, func(p *pyProc) bool { return p.dead }) }, t.nameCodes)
}

// nameCodes reads the code objects the walker found since the last time.
func (t *pyTracker) nameCodes() {
	drainSeen(t.codes, func(k bpf.OffcpuPyCodeKey) {
		t.mu.Lock()
		p := t.byPID[k.Tgid]
		t.mu.Unlock()
		if p != nil && p.codes != nil {
			t.code(p, k.Code)
		}
	})
}

// code returns a code object of p, read on first use.
func (t *pyTracker) code(p *pyProc, addr uint64) *cpython.Code {
	t.mu.Lock()
	c, ok := p.codes[addr]
	mem, dead := p.mem, p.dead
	t.mu.Unlock()
	if ok || mem == nil || dead {
		return c
	}
	c = cpython.ReadCode(mem, p.l, addr)
	t.mu.Lock()
	p.codes[addr] = c
	if c == nil {
		t.stats.Unnamed++
	} else {
		t.stats.Codes++
	}
	t.mu.Unlock()
	return c
}

// final names what the walker found since the last time, once the
// programs are detached.
func (t *pyTracker) final() { t.nameCodes() }

// isPythonFrame says whether a stack entry is a Python frame's.
func isPythonFrame(addr uint64) bool { return addr>>61 == bpf.PyFrameTag>>61 }

// Frames names a Python frame: its function, as module.qualname, its
// file and line.
func (t *pyTracker) Frames(pid uint32, addr uint64) ([]symtab.Frame, bool) {
	if !isPythonFrame(addr) {
		return nil, false
	}
	t.mu.Lock()
	p := t.byPID[pid]
	t.mu.Unlock()
	if p == nil || p.codes == nil {
		return nil, false
	}
	c := t.code(p, addr&bpf.JavaMethodMask)
	if c == nil {
		return nil, false
	}
	f := symtab.Frame{Func: cpython.Module(c.File) + "." + c.Name, File: c.File}
	if idx := addr >> 47 & bpf.PyInstrNone; idx != bpf.PyInstrNone {
		if p.l.LineFormat == 311 {
			f.Line = cpython.Line(c.Lines, c.First, idx)
		} else {
			f.Line = cpython.LineOld(c.Lines, c.First, idx, p.l.LineFormat)
		}
	}
	return []symtab.Frame{f}, true
}

// Name names a Python frame whose code object could not be read.
func (t *pyTracker) Name(pid uint32, addr uint64) (string, bool) {
	if !isPythonFrame(addr) {
		return "", false
	}
	return "[python code unread]", true
}

func (t *pyTracker) snapshotStats() PythonStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.stats
	st.Skipped = slices.Clone(st.Skipped)
	return st
}

func (t *pyTracker) frameKind() uint64 { return bpf.FramePython }

// recognise marks the interpreter loop's rows of a CPython binary: every
// row, so that the loop's are there to mark.
func (t *pyTracker) recognise(f *symtab.File, ef *elf.File, rows []unwind.Row) []unwind.Row {
	if rt := t.runtimeOf(f, ef); rt != nil && rt.Supported {
		return markPyEval(rows, rt.EvalLo, rt.EvalHi)
	}
	return nil
}

func (t *pyTracker) runtimeStats() RuntimeStats {
	st := t.snapshotStats()
	return RuntimeStats{Runtime: "cpython", Processes: st.Processes, Unsupported: st.Unsupported,
		Named: st.Codes, Unnamed: st.Unnamed, Skipped: st.Skipped}
}
