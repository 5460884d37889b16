package v8

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

// Info: V8's JavaScript frames (Node.js), tagged bpf.FrameV8.
var Info = runtimes.Info{Kind: bpf.FrameV8, Name: "v8", Title: "JavaScript", Mapping: "[javascript]",
	FrameType: "v8js", Unread: "[javascript unread]", Prefix: "v8_"}

// tracker gives the walker each V8 process's layout and names the
// SharedFunctionInfos its JavaScript frames hold, while the processes
// live.
type tracker struct {
	procs runtimes.Layouts
	sfis  *ebpf.Map
	ps    *runtimes.Procs[v8File, proc]
}

// v8File is a file holding V8, as read once.
type v8File struct {
	l      *Layout
	interp Interp
	err    error // a V8 whose layout is not read
}

type proc struct {
	r     *Reader
	funcs map[uint64]*Function // by SharedFunctionInfo
}

// New starts reading V8 processes through h.
func New(h runtimes.Handle) runtimes.Reader {
	return &tracker{procs: runtimes.NewLayouts(h, bpf.OffcpuMapV8Procs, bpf.OffcpuVarV8Active),
		sfis: h.Map(bpf.OffcpuMapV8Sfis), ps: runtimes.NewProcs[v8File, proc](Info.Name)}
}

// Recognise reads a v8File's V8 layout from its v8dbg_* constants. A V8
// process's stacks are walked with every row of its v8File, so that its
// JavaScript frames are read even where its code keeps frame pointers.
func (t *tracker) Recognise(f *symtab.File, ef *elf.File, rows []unwind.Row) []unwind.Row {
	b := t.ps.File(f, func() *v8File {
		l, in, err := ReadLayout(ef)
		switch {
		case err == ErrNotV8:
			return nil
		case err != nil:
			return &v8File{err: err}
		}
		return &v8File{l: l, interp: in}
	})
	if b == nil || b.err != nil {
		return nil
	}
	return rows
}

func (t *tracker) Seen(pid uint32, ms []symbolize.Mapping) { t.ps.Seen(pid, ms, t.attach) }

func (t *tracker) attach(pid uint32, b *v8File, bias uint64) {
	if b.err != nil {
		t.ps.Unsupported(pid, b.err.Error())
		return
	}
	t.ps.Attach(pid, proc{funcs: map[uint64]*Function{}}, func(p *runtimes.Proc[proc]) error {
		p.S.r = &Reader{Mem: p.Mem, L: b.l}
		v := bpf.OffcpuV8Proc{FunctionShared: uint32(b.l.JSFunctionShared), SmiShift: uint32(b.l.SmiShift)}
		if b.interp.Hi > b.interp.Lo {
			v.InterpLo, v.InterpHi = b.interp.Lo+bias, b.interp.Hi+bias
		}
		return t.procs.Put(pid, &v)
	})
}

func (t *tracker) Forget(pid uint32) {
	t.ps.Forget(pid, t.procs.Delete)
}

// Run names the functions the walker saw, every 50 ms while a V8 process
// is recorded: a function's objects may move at the next collection of
// its heap.
func (t *tracker) Run(stop <-chan struct{}) {
	runtimes.NameWhileLive(stop, t.ps.Wake, t.ps.Live, t.nameFunctions)
}

// Final names what the walker found last.
func (t *tracker) Final() { t.nameFunctions() }

func (t *tracker) nameFunctions() {
	runtimes.DrainSeen(t.sfis, func(k bpf.OffcpuV8SfiKey) {
		if p := t.ps.Get(k.Tgid); p != nil {
			t.function(p, k.Sfi)
		}
	})
}

// function returns a function of p, read on first use.
func (t *tracker) function(p *runtimes.Proc[proc], sfi uint64) *Function {
	return runtimes.ReadOnce(t.ps, p, p.S.funcs, sfi, func(*os.File) *Function {
		if p.S.r == nil {
			return nil
		}
		f, err := p.S.r.Function(sfi)
		if err != nil {
			return nil
		}
		return f
	})
}

// Frames names a JavaScript frame: its function, script and line.
func (t *tracker) Frames(pid uint32, addr uint64) ([]symtab.Frame, bool) {
	if runtimes.KindOf(addr) != bpf.FrameV8 {
		return nil, false
	}
	p := t.ps.Get(pid)
	if p == nil || p.S.funcs == nil {
		return nil, false
	}
	f := t.function(p, addr&bpf.V8SfiMask)
	if f == nil {
		return nil, false
	}
	name := f.Name
	if name == "" {
		name = "(anonymous)"
	}
	fr := symtab.Frame{Func: name, File: f.Script, Line: int64(f.Line)}
	if off := addr >> 47 & bpf.V8OffsetNone; off != bpf.V8OffsetNone {
		fr.Line = int64(f.LineAt(int64(off), p.S.r.L))
	}
	return []symtab.Frame{fr}, true
}

func (t *tracker) Stats() runtimes.Stats { return t.ps.Stats() }
