package ruby

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

// Info: CRuby's frames, tagged bpf.RubyFrameTag.
var Info = runtimes.Info{Kind: bpf.RubyFrameTag >> bpf.FrameKindShift, Name: "ruby", Title: "Ruby", Mapping: "[ruby]",
	FrameType: "ruby", Unread: "[ruby code unread]", Prefix: "ruby_", Lock: "GVL",
	// libruby and the interpreter (ruby3.1).
	Modules: []string{`^libruby`, `^ruby\d`}}

// tracker gives the walker each CRuby process's layout and names the
// iseqs and method entries its frames hold while the processes live.
type tracker struct {
	procs  runtimes.Layouts
	frames *ebpf.Map
	ps     *runtimes.Procs[Lib, proc]
}

type proc struct {
	l     *Layout
	iseqs map[uint64]*Iseq // by iseq (nil: unreadable)
}

// New starts reading CRuby processes through h.
func New(h runtimes.Handle) runtimes.Reader {
	return &tracker{procs: runtimes.NewLayouts(h, bpf.OffcpuMapRubyProcs, bpf.OffcpuVarRubyActive),
		frames: h.Map(bpf.OffcpuMapRubyFrames), ps: runtimes.NewProcs[Lib, proc](Info.Name)}
}

// Recognise marks rb_vm_exec's rows in a libruby: each activation of it
// runs Ruby frames, recorded in its place.
func (t *tracker) Recognise(f *symtab.File, ef *elf.File, rows []unwind.Row) []unwind.Row {
	lib := t.ps.File(f, func() *Lib {
		l, err := ReadLib(ef)
		if err != nil {
			return nil
		}
		return l
	})
	if lib == nil || lib.Unsupported != "" {
		return nil
	}
	return runtimes.MarkInterpLoop(rows, lib.ExecLo, lib.ExecHi)
}

func (t *tracker) Seen(pid uint32, ms []symbolize.Mapping) { t.ps.Seen(pid, ms, t.attach) }

func (t *tracker) attach(pid uint32, lib *Lib, bias uint64) {
	if lib.Unsupported != "" {
		t.ps.Unsupported(pid, lib.Unsupported)
		return
	}
	l := lib.Layout
	t.ps.Attach(pid, proc{l: &lib.Layout, iseqs: map[uint64]*Iseq{}}, func(*runtimes.Proc[proc]) error {
		v := bpf.OffcpuRubyProc{TlsGot: lib.TLSGot + bias, TlsOffset: lib.TLSOffset,
			EcVmStack: l.ECVMStack, EcVmStackSize: l.ECVMStackSize, EcCfp: l.ECCfp, EcThread: l.ECThread,
			CfpSize: l.CfpSize, CfpPc: l.CfpPC, CfpIseq: l.CfpIseq, CfpEp: l.CfpEP,
			IseqBody: l.IseqBody, BodyEncoded: l.BodyEncoded,
			ThRactor: l.ThRactor, ThEc: l.ThEC, ThTid: l.ThTID, ThGvlNode: l.ThGVLNode, ThGvlCond: l.ThGVLCond,
			RactorGvl: l.RactorGVL, GvlLock: l.GVLLock, GvlSwitch: l.GVLSwitch}
		return t.procs.Put(pid, &v)
	})
}

func (t *tracker) Forget(pid uint32) {
	t.ps.Forget(pid, t.procs.Delete)
}

// Run names the frames the walker saw, every 50 ms while a Ruby process
// is recorded: an iseq may be collected once its code is gone.
func (t *tracker) Run(stop <-chan struct{}) {
	runtimes.NameWhileLive(stop, t.ps.Wake, t.ps.Live, t.nameFrames)
}

func (t *tracker) Final() { t.nameFrames() }

func (t *tracker) nameFrames() {
	runtimes.DrainSeen(t.frames, func(k bpf.OffcpuRubyFrameKey) {
		if p := t.ps.Get(k.Tgid); p != nil && k.Entry&bpf.RubyCfuncBit == 0 {
			t.iseq(p, k.Entry&bpf.RubyPtrMask)
		}
	})
}

// iseq returns an iseq of p, read on first use.
func (t *tracker) iseq(p *runtimes.Proc[proc], addr uint64) *Iseq {
	return runtimes.ReadOnce(t.ps, p, p.S.iseqs, addr, func(mem *os.File) *Iseq {
		is, err := ReadIseq(mem, p.S.l, addr)
		if err != nil {
			return nil
		}
		return is
	})
}

// Frames names a Ruby frame: its label (method, or block in it), file and
// line; a C method's frame as such (the native frames under it name it).
func (t *tracker) Frames(pid uint32, addr uint64) ([]symtab.Frame, bool) {
	if runtimes.KindOf(addr) != Info.Kind {
		return nil, false
	}
	if addr&bpf.RubyCfuncBit != 0 {
		return []symtab.Frame{{Func: "[ruby C method]"}}, true
	}
	p := t.ps.Get(pid)
	if p == nil || p.S.iseqs == nil {
		return nil, false
	}
	is := t.iseq(p, addr&bpf.RubyPtrMask)
	if is == nil {
		return nil, false
	}
	f := symtab.Frame{Func: is.Label, File: is.Path, Line: is.FirstLine}
	if pos := addr >> 47 & bpf.RubyPosNone; pos != bpf.RubyPosNone {
		f.Line = is.Line(pos)
	}
	return []symtab.Frame{f}, true
}

func (t *tracker) Stats() runtimes.Stats { return t.ps.Stats() }
