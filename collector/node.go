package collector

import (
	"debug/elf"
	"fmt"
	"os"
	"slices"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/symtab"
	"github.com/offcpu/offcpu/collector/unwind"
	"github.com/offcpu/offcpu/collector/v8"
)

// v8Tracker gives the walker each V8 process's layout (Node.js) and names
// the SharedFunctionInfos its JavaScript frames hold, while the processes
// live.
type v8Tracker struct {
	procs, sfis *ebpf.Map
	active      *ebpf.Variable
	mu          sync.Mutex
	runtimes    map[*symtab.File]*v8Runtime // nil: not V8
	byPID       map[uint32]*v8Proc
	stats       RuntimeStats
	wake        alarm
}

// v8Runtime is a binary holding V8, as read once.
type v8Runtime struct {
	l      *v8.Layout
	interp v8.Interp
	err    error // a V8 whose layout is not read
}

type v8Proc struct {
	r     *v8.Reader
	cap   *v8.Capture // OFFCPU_V8_CAPTURE: the reads kept for a test fixture
	mem   *os.File
	funcs map[uint64]*v8.Function // by SharedFunctionInfo
	dead  bool
}

func newV8Tracker(coll *ebpf.Collection) *v8Tracker {
	return &v8Tracker{procs: coll.Maps[bpf.OffcpuMapV8Procs], sfis: coll.Maps[bpf.OffcpuMapV8Sfis],
		active: coll.Variables[bpf.OffcpuVarV8Active], runtimes: map[*symtab.File]*v8Runtime{},
		byPID: map[uint32]*v8Proc{}, stats: RuntimeStats{Runtime: "v8"}, wake: newAlarm()}
}

func (t *v8Tracker) frameKind() uint64 { return bpf.FrameV8 }

// recognise reads a binary's V8 layout from its v8dbg_* constants. A V8
// process's stacks are walked with every row of its binary, so that its
// JavaScript frames are read even where its code keeps frame pointers.
func (t *v8Tracker) recognise(f *symtab.File, ef *elf.File, rows []unwind.Row) []unwind.Row {
	l, in, err := v8.ReadLayout(ef)
	var r *v8Runtime
	switch {
	case err == v8.ErrNotV8:
	case err != nil:
		r = &v8Runtime{err: err}
	default:
		r = &v8Runtime{l: l, interp: in}
	}
	t.mu.Lock()
	t.runtimes[f] = r
	t.mu.Unlock()
	if r == nil || r.err != nil {
		return nil
	}
	return rows
}

func (t *v8Tracker) seen(pid uint32, ms []symbolize.Mapping) {
	t.mu.Lock()
	_, had := t.byPID[pid]
	t.mu.Unlock()
	if had {
		return
	}
	for _, m := range ms {
		if m.File == nil {
			continue
		}
		t.mu.Lock()
		rt := t.runtimes[m.File]
		t.mu.Unlock()
		if rt == nil {
			continue
		}
		m.File.Load()
		bias, ok := loadBias(m.File.Loads, m)
		if !ok {
			continue
		}
		t.attach(pid, rt, bias)
		return
	}
}

func (t *v8Tracker) attach(pid uint32, rt *v8Runtime, bias uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rt.err != nil {
		t.byPID[pid] = &v8Proc{dead: true}
		t.stats.Unsupported++
		if why := rt.err.Error(); !slices.Contains(t.stats.Skipped, why) {
			t.stats.Skipped = append(t.stats.Skipped, why)
		}
		return
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.byPID[pid] = &v8Proc{dead: true}
		return
	}
	p := &v8Proc{r: &v8.Reader{Mem: mem, L: rt.l}, mem: mem, funcs: map[uint64]*v8.Function{}}
	if keep := os.Getenv("OFFCPU_V8_CAPTURE_SCRIPT"); keep != "" {
		p.cap = &v8.Capture{Mem: mem, Keep: keep}
		p.r.Mem = p.cap
	}
	t.byPID[pid] = p
	v := bpf.OffcpuV8Proc{FunctionShared: uint32(rt.l.JSFunctionShared), SmiShift: uint32(rt.l.SmiShift)}
	if rt.interp.Hi > rt.interp.Lo {
		v.InterpLo, v.InterpHi = rt.interp.Lo+bias, rt.interp.Hi+bias
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

func (t *v8Tracker) forget(pid uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.byPID[pid]; p != nil && !p.dead {
		p.dead = true
		t.procs.Delete(pid)
		p.mem.Close()
	}
}

// run names the functions the walker saw, every 50 ms while a V8 process
// is recorded: a function's objects may move at the next collection of
// its heap.
func (t *v8Tracker) run(stop <-chan struct{}) {
	nameWhileLive(stop, t.wake, func() bool { return anyLive(&t.mu, t.byPID, func(p *v8Proc) bool { return p.dead }) }, t.nameFunctions)
}

// final names what the walker found last; OFFCPU_V8_CAPTURE (a path)
// saves what was read of the functions of OFFCPU_V8_CAPTURE_SCRIPT, for
// collector/v8's tests.
func (t *v8Tracker) final() {
	t.nameFunctions()
	if path := os.Getenv("OFFCPU_V8_CAPTURE"); path != "" {
		t.mu.Lock()
		defer t.mu.Unlock()
		for _, p := range t.byPID {
			if p.cap != nil {
				p.cap.Save(path, p.r.L)
			}
		}
	}
}

func (t *v8Tracker) nameFunctions() {
	drainSeen(t.sfis, func(k bpf.OffcpuV8SfiKey) {
		t.mu.Lock()
		p := t.byPID[k.Tgid]
		t.mu.Unlock()
		if p != nil {
			t.function(p, k.Sfi)
		}
	})
}

// function returns a function of p, read on first use.
func (t *v8Tracker) function(p *v8Proc, sfi uint64) *v8.Function {
	t.mu.Lock()
	defer t.mu.Unlock()
	f, ok := p.funcs[sfi]
	if ok || p.dead {
		return f
	}
	var err error
	if p.cap != nil {
		f, err = p.cap.Function(p.r, sfi)
	} else {
		f, err = p.r.Function(sfi)
	}
	if err != nil {
		f = nil
		t.stats.Unnamed++
	} else {
		t.stats.Named++
	}
	p.funcs[sfi] = f
	return f
}

// Frames names a JavaScript frame: its function, script and line.
func (t *v8Tracker) Frames(pid uint32, addr uint64) ([]symtab.Frame, bool) {
	if FrameKindOf(addr) != bpf.FrameV8 {
		return nil, false
	}
	t.mu.Lock()
	p := t.byPID[pid]
	t.mu.Unlock()
	if p == nil || p.funcs == nil {
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
		fr.Line = int64(f.LineAt(int64(off), p.r.L))
	}
	return []symtab.Frame{fr}, true
}

func (t *v8Tracker) Name(pid uint32, addr uint64) (string, bool) {
	if FrameKindOf(addr) != bpf.FrameV8 {
		return "", false
	}
	return "[javascript unread]", true
}

func (t *v8Tracker) runtimeStats() RuntimeStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.stats
	st.Skipped = slices.Clone(st.Skipped)
	return st
}
