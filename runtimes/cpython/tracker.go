package cpython

import (
	"debug/elf"
	"os"

	"github.com/cilium/ebpf"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/symtab"
	"github.com/offcpu/offcpu/collector/unwind"
	"github.com/offcpu/offcpu/runtimes"
)

// Info: CPython's frames, tagged bpf.FramePython.
var Info = runtimes.Info{Kind: bpf.FramePython, Name: "cpython", Title: "Python", Mapping: "[python]",
	FrameType: "cpython", Unread: "[python code unread]", Prefix: "py_", Lock: "GIL",
	// CPython itself and its extension modules (_queue, _socket...).
	Modules: []string{`^(lib)?python\d\.\d+`, `\.cpython-\d+[^/]*\.so$`}}

// tracker gives the walker each CPython process's layout and names the
// code objects its frames hold, while the processes live (a code object
// is read from the process's memory).
type tracker struct {
	procs runtimes.Layouts
	codes *ebpf.Map
	ps    *runtimes.Procs[Runtime, proc]
}

// proc is one CPython process: its layout and the code objects named.
type proc struct {
	l     Layout
	codes map[uint64]*Code
}

// New starts reading CPython processes through h.
func New(h runtimes.Handle) runtimes.Reader {
	return &tracker{procs: runtimes.NewLayouts(h, bpf.OffcpuMapPyProcs, bpf.OffcpuVarPyActive),
		codes: h.Map(bpf.OffcpuMapPyCodes), ps: runtimes.NewProcs[Runtime, proc](Info.Name)}
}

// Recognise marks the interpreter loop's rows of a CPython binary: every
// row, so that the loop's are there to mark.
func (t *tracker) Recognise(f *symtab.File, ef *elf.File, rows []unwind.Row) []unwind.Row {
	rt := t.ps.File(f, func() *Runtime {
		r, err := ReadRuntime(ef, f.Path)
		if err != nil {
			return nil
		}
		return r
	})
	if rt != nil && rt.Supported {
		return runtimes.MarkInterpLoop(rows, rt.EvalLo, rt.EvalHi)
	}
	return nil
}

// Seen gives the walker the layout of a process that maps a CPython
// interpreter (its unwind rows mark the interpreter loop: Recognise).
func (t *tracker) Seen(pid uint32, ms []symbolize.Mapping) {
	t.ps.Seen(pid, ms, t.attach)
}

func (t *tracker) attach(pid uint32, rt *Runtime, bias uint64) {
	if !rt.Supported {
		t.ps.Unsupported(pid, rt.UnsupError)
		return
	}
	l := rt.Layout
	t.ps.Attach(pid, proc{l: l, codes: map[uint64]*Code{}}, func(*runtimes.Proc[proc]) error {
		runtime := rt.Runtime + bias
		v := bpf.OffcpuPyProc{
			InterpHead: runtime + l.InterpHead, Gil: runtime + l.Gil, GilSize: uint32(l.GilSize), GilHolder: l.GilHolder,
			ThreadsHead: l.ThreadsHead, TstateNext: l.TstateNext, TstateThreadId: l.ThreadID, TstateNativeId: l.NativeID,
			TstateFrame: l.TstateFrame, CframeFrame: l.CframeFrame,
			FrameCode: l.FrameCode, FrameBack: l.FrameBack, FrameInstr: l.FrameInstr, FrameEntry: l.FrameEntry,
			CodeFirstInstr: l.CodeFirstInstr, EntryVal: l.EntryVal, Flags: l.Flags,
		}
		return t.procs.Put(pid, &v)
	})
}

// Forget stops reading an exited process; its names stay.
func (t *tracker) Forget(pid uint32) {
	t.ps.Forget(pid, t.procs.Delete)
}

// Run names the code objects the walker saw, every 50 ms while a CPython
// process is recorded, so that a short-lived script's are named before it
// exits.
func (t *tracker) Run(stop <-chan struct{}) {
	runtimes.NameWhileLive(stop, t.ps.Wake, t.ps.Live, t.nameCodes)
}

// Final names what the walker found since the last time, once the
// programs are detached.
func (t *tracker) Final() { t.nameCodes() }

// nameCodes reads the code objects the walker found since the last time.
func (t *tracker) nameCodes() {
	runtimes.DrainSeen(t.codes, func(k bpf.OffcpuPyCodeKey) {
		if p := t.ps.Get(k.Tgid); p != nil {
			t.code(p, k.Code)
		}
	})
}

// code returns a code object of p, read on first use.
func (t *tracker) code(p *runtimes.Proc[proc], addr uint64) *Code {
	return runtimes.ReadOnce(t.ps, p, p.S.codes, addr, func(mem *os.File) *Code { return ReadCode(mem, p.S.l, addr) })
}

// Frames names a Python frame: its function, as module.qualname, its
// file and line.
func (t *tracker) Frames(pid uint32, addr uint64) ([]symtab.Frame, bool) {
	if runtimes.KindOf(addr) != bpf.FramePython {
		return nil, false
	}
	p := t.ps.Get(pid)
	if p == nil || p.S.codes == nil {
		return nil, false
	}
	c := t.code(p, addr&bpf.JavaMethodMask)
	if c == nil {
		return nil, false
	}
	f := symtab.Frame{Func: Module(c.File) + "." + c.Name, File: c.File}
	if idx := addr >> 47 & bpf.PyInstrNone; idx != bpf.PyInstrNone {
		if p.S.l.LineFormat == 311 {
			f.Line = Line(c.Lines, c.First, idx)
		} else {
			f.Line = LineOld(c.Lines, c.First, idx, p.S.l.LineFormat)
		}
	}
	return []symtab.Frame{f}, true
}

func (t *tracker) Stats() runtimes.Stats { return t.ps.Stats() }
