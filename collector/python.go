package collector

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"

	"github.com/cilium/ebpf"

	"github.com/offcpu/offcpu/bpf"
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
	runtimes     map[*symtab.File]*pyRuntime // nil: not an interpreter
	byPID        map[uint32]*pyProc
	stats        PythonStats
	wake         alarm
}

// pyProc is one CPython process: its runtime and the code objects named.
type pyProc struct {
	rt    *pyRuntime
	l     pyLayout
	mem   *os.File // /proc/PID/mem, open while it lives
	codes map[uint64]*pyCode
	dead  bool
}

// pyCode is a code object as read: its function, file and line table.
type pyCode struct {
	name, file string
	first      int64
	lines      []byte
}

func newPyTracker(coll *ebpf.Collection) *pyTracker {
	return &pyTracker{procs: coll.Maps[bpf.OffcpuMapPyProcs], codes: coll.Maps[bpf.OffcpuMapPyCodes],
		active: coll.Variables[bpf.OffcpuVarPyActive], runtimes: map[*symtab.File]*pyRuntime{}, byPID: map[uint32]*pyProc{}, wake: newAlarm()}
}

// runtimeOf recognises a CPython interpreter binary, once per file.
func (t *pyTracker) runtimeOf(f *symtab.File, ef *elf.File) *pyRuntime {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r, ok := t.runtimes[f]; ok {
		return r
	}
	r, err := readPyRuntime(ef, f.Path)
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

func (t *pyTracker) attach(pid uint32, rt *pyRuntime, bias uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !rt.supported {
		t.byPID[pid] = &pyProc{rt: rt, dead: true}
		t.stats.Unsupported++
		if !slices.Contains(t.stats.Skipped, rt.unsupError) {
			t.stats.Skipped = append(t.stats.Skipped, rt.unsupError)
		}
		return
	}
	l := rt.layout
	p := &pyProc{rt: rt, l: l, codes: map[uint64]*pyCode{}}
	p.mem, _ = os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	t.byPID[pid] = p
	runtime := rt.runtime + bias
	v := bpf.OffcpuPyProc{
		InterpHead: runtime + l.interpHead, Gil: runtime + l.gil, GilSize: uint32(l.gilSize), GilHolder: l.gilHolder,
		ThreadsHead: l.threadsHead, TstateNext: l.tstateNext, TstateThreadId: l.threadID, TstateNativeId: l.nativeID,
		TstateFrame: l.tstateFrame, CframeFrame: l.cframeFrame,
		FrameCode: l.frameCode, FrameBack: l.frameBack, FrameInstr: l.frameInstr, FrameEntry: l.frameEntry,
		CodeFirstInstr: l.codeFirstInstr, EntryVal: l.entryVal, Flags: l.flags,
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
func (t *pyTracker) code(p *pyProc, addr uint64) *pyCode {
	t.mu.Lock()
	c, ok := p.codes[addr]
	mem, dead := p.mem, p.dead
	t.mu.Unlock()
	if ok || mem == nil || dead {
		return c
	}
	c = readPyCode(mem, p.l, addr)
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

// readPyCode reads a code object's names and line table.
func readPyCode(mem io.ReaderAt, l pyLayout, addr uint64) *pyCode {
	b := make([]byte, max(l.codeFile, l.codeName, l.codeQualname, l.codeFirstLine, l.codeLines)+8)
	if _, err := mem.ReadAt(b, int64(addr)); err != nil {
		return nil
	}
	ptr := func(off uint64) uint64 { return binary.LittleEndian.Uint64(b[off:]) }
	var name string
	if l.codeQualname != 0 {
		name = readPyString(mem, l, ptr(l.codeQualname))
	}
	if name == "" {
		name = readPyString(mem, l, ptr(l.codeName))
	}
	file := readPyString(mem, l, ptr(l.codeFile))
	if name == "" {
		return nil
	}
	c := &pyCode{name: name, file: file, first: int64(int32(binary.LittleEndian.Uint32(b[l.codeFirstLine:])))}
	if tbl := ptr(l.codeLines); tbl != 0 {
		var hdr [8]byte
		if _, err := mem.ReadAt(hdr[:], int64(tbl+l.bytesSize)); err == nil {
			if n := binary.LittleEndian.Uint64(hdr[:]); n < 1<<16 {
				c.lines = make([]byte, n)
				if _, err := mem.ReadAt(c.lines, int64(tbl+l.bytesData)); err != nil {
					c.lines = nil
				}
			}
		}
	}
	return c
}

// readPyString reads a str object: compact, of 1, 2 or 4 bytes a
// character (PEP 393); "" if it is not one.
func readPyString(mem io.ReaderAt, l pyLayout, addr uint64) string {
	if addr == 0 {
		return ""
	}
	var hdr [40]byte
	if _, err := mem.ReadAt(hdr[:], int64(addr)); err != nil {
		return ""
	}
	n := binary.LittleEndian.Uint64(hdr[16:])
	state := binary.LittleEndian.Uint32(hdr[32:])
	kind, compact, ascii := state>>2&7, state>>5&1, state>>6&1
	if compact == 0 || n > 4096 || kind == 0 || kind == 3 || kind > 4 {
		return ""
	}
	data := l.compactData
	if ascii == 1 {
		data = l.asciiData
	}
	raw := make([]byte, n*uint64(kind))
	if _, err := mem.ReadAt(raw, int64(addr+data)); err != nil {
		return ""
	}
	if kind == 1 {
		if ascii == 1 {
			return string(raw)
		}
		rs := make([]rune, n)
		for i, c := range raw {
			rs[i] = rune(c)
		}
		return string(rs)
	}
	rs := make([]rune, n)
	for i := range rs {
		if kind == 2 {
			rs[i] = rune(binary.LittleEndian.Uint16(raw[2*i:]))
		} else {
			rs[i] = rune(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	}
	return string(rs)
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
	f := symtab.Frame{Func: pyModule(c.file) + "." + c.name, File: c.file}
	if idx := addr >> 47 & bpf.PyInstrNone; idx != bpf.PyInstrNone {
		if p.l.lineFormat == 311 {
			f.Line = pyLine(c.lines, c.first, idx)
		} else {
			f.Line = pyLineOld(c.lines, c.first, idx, p.l.lineFormat)
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
	if rt := t.runtimeOf(f, ef); rt != nil && rt.supported {
		return markPyEval(rows, rt.evalLo, rt.evalHi)
	}
	return nil
}

func (t *pyTracker) runtimeStats() RuntimeStats {
	st := t.snapshotStats()
	return RuntimeStats{Runtime: "cpython", Processes: st.Processes, Unsupported: st.Unsupported,
		Named: st.Codes, Unnamed: st.Unnamed, Skipped: st.Skipped}
}
