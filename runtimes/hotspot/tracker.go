package hotspot

import (
	"debug/elf"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/symtab"
	"github.com/offcpu/offcpu/collector/unwind"
	"github.com/offcpu/offcpu/internal/loop"
	"github.com/offcpu/offcpu/runtimes"
)

// jvmTracker follows the HotSpot JVMs among the recorded processes: it
// reads each one's code cache while it runs, gives the BPF walker a row
// per blob (compiled frames have fixed sizes, interpreter frames keep
// rbp), and names compiled code and the Method* values the walker found
// in interpreter frames before the process can exit.
type jvmTracker struct {
	h       runtimes.Handle
	methods *ebpf.Map // java_methods
	layouts *ebpf.Map // java_procs

	wake loop.Alarm // a JVM was seen
	mu   sync.Mutex
	jvms map[uint32]*jvm

	stats     JVMStats
	otherArch bool // a JVM seen on a machine whose frame layout is not read
}

// errArch: the interpreter's frames are read from x86-64's layout only.
var errArch = fmt.Errorf("interpreted and compiled Java frames are read on x86-64 only, not %s: its stacks are walked as native code", runtime.GOARCH)

// JVMStats describes the JVMs walked through their own structures.
type JVMStats struct {
	JVMs         int           `json:"jvms"`          // processes whose VMStructs were read
	Failed       int           `json:"failed"`        // JVMs whose structures could not be read
	Refreshes    int           `json:"refreshes"`     // code cache walks
	Blobs        int           `json:"blobs"`         // blobs in each JVM's latest walk, summed
	Compiled     int           `json:"compiled"`      // of them compiled methods
	Methods      int           `json:"methods"`       // Method* named
	Unnamed      int           `json:"unnamed"`       // Method* that could not be read
	PCs          int           `json:"pcs"`           // pcs in compiled code whose frames were read
	Inlined      int           `json:"inlined"`       // of them, pcs inside inlined methods
	InlineFailed int           `json:"inline_failed"` // pcs whose debug information could not be read
	GapWalks     int           `json:"gap_walks"`     // walks brought forward by a stack in code compiled since the last
	ResolveCPU   time.Duration `json:"resolve_cpu"`   // CPU time of the recorder's thread walking code caches and naming
}

// String describes the code caches walked, for the recorder's summary.
func (j JVMStats) String() string {
	return fmt.Sprintf("%d code blobs, %d compiled methods; %d pcs in compiled code named, %d of them in inlined methods, %d unreadable; %d code cache walks, %d brought forward by new code; %v of CPU",
		j.Blobs, j.Compiled, j.PCs, j.Inlined, j.InlineFailed, j.Refreshes, j.GapWalks, j.ResolveCPU.Round(time.Millisecond))
}

type jvm struct {
	pid     uint32
	lib     symbolize.Mapping // libjvm.so's executable mapping
	vm      *VM
	mem     *os.File
	err     error
	seenAt  time.Time // libjvm.so first seen mapped
	next    time.Time
	every   time.Duration
	blobs   map[uint64]Blob    // every blob seen, by start: code that was freed still names old stacks
	sorted  []Blob             // blobs by start, made when symbolizing
	cur     *CodeCache         // the latest walk
	inlined map[uint64][]Frame // pc in compiled code -> its Java frames, innermost first
	last    time.Time          // the latest walk
	walkCPU time.Duration      // CPU time of the latest walk
	dirty   bool
	stopped bool
}

// openGrace is how long a JVM whose tables cannot be read yet is tried
// again before it counts as failed.
const openGrace = 2 * time.Second

// Info: HotSpot's Java frames, tagged bpf.FrameJava.
var Info = runtimes.Info{Kind: bpf.FrameJava, Name: "hotspot", Title: "JVM", Mapping: "[java]",
	FrameType: "jvm", Unread: "Interpreter", Prefix: "java_", Modules: []string{`^libjvm\.so`}}

// New starts reading JVMs through h.
func New(h runtimes.Handle) runtimes.Reader {
	return &jvmTracker{h: h, methods: h.Map(bpf.OffcpuMapJavaMethods), layouts: h.Map(bpf.OffcpuMapJavaProcs), jvms: map[uint32]*jvm{}, wake: loop.NewAlarm()}
}

// Seen: the JVM was looked for before the tables (seenEarly).
func (t *jvmTracker) Seen(uint32, []symbolize.Mapping) {}

// SeenEarly looks for libjvm.so among a process's mappings.
func (t *jvmTracker) SeenEarly(pid uint32, ms []symbolize.Mapping) {
	for _, m := range ms {
		if m.File == nil || !strings.HasSuffix(m.Path, "/libjvm.so") {
			continue
		}
		t.mu.Lock()
		if _, ok := t.jvms[pid]; !ok && runtime.GOARCH != "amd64" {
			t.jvms[pid] = &jvm{pid: pid, lib: m, err: errArch, stopped: true}
			t.stats.Failed++
			t.otherArch = true
		} else if !ok {
			t.jvms[pid] = &jvm{pid: pid, lib: m, seenAt: time.Now(), next: time.Now().Add(20 * time.Millisecond),
				every: 50 * time.Millisecond, blobs: map[uint64]Blob{}, inlined: map[uint64][]Frame{}}
			t.wake.Wake()
		}
		t.mu.Unlock()
		return
	}
}

// Run ticks every 10 ms until stop is closed, on a thread of its own (a
// large file's unwind table parsed by the unwinder does not delay it, and
// its CPU time is what resolving costs).
func (t *jvmTracker) Run(stop <-chan struct{}) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	loop.EveryWhileBusy(10*time.Millisecond, time.Second, t.wake, stop, func() bool {
		t.mu.Lock()
		defer t.mu.Unlock()
		for _, j := range t.jvms {
			if !j.stopped && j.err == nil {
				return true
			}
		}
		return false
	}, t.tick)
}

// Forget stops reading an exited process; its names stay.
func (t *jvmTracker) Forget(pid uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if j := t.jvms[pid]; j != nil && !j.stopped {
		j.stopped = true
		if t.layouts != nil {
			t.layouts.Delete(pid)
		}
		if j.mem != nil {
			j.mem.Close()
		}
	}
}

// tick refreshes the JVMs that are due (after 20, 50, 100 ... ms, then
// every second or more, since a JVM compiles most of its code early) and names
// what the walker found since the last tick.
func (t *jvmTracker) tick(now time.Time) {
	t.mu.Lock()
	var due []*jvm
	for _, j := range t.jvms {
		if j.stopped || j.err != nil {
			continue
		}
		if j.cur == nil {
			// Every tick until the first walk: a thread blocking before it
			// is walked without rows, its Java frames unnamed for the whole
			// wait (a JVM not ready at 170 ms was read again only at 370).
			j.next = now.Add(j.every)
			due = append(due, j)
			continue
		}
		if !now.Before(j.next) {
			j.next = now.Add(j.every)
			// Doubling to a second, or more for a large code cache: periodic
			// walks cost at most 1% of a CPU (5,500 compiled methods: ~12 ms).
			j.every = min(2*j.every, max(time.Second, min(100*j.walkCPU, 5*time.Second)))
			due = append(due, j)
		}
	}
	n := len(t.jvms)
	t.mu.Unlock()
	if n == 0 {
		return
	}
	start := ownThreadCPU()
	for _, j := range due {
		t.refresh(j)
	}
	// Every tick, not only at walks: a process may exit within the
	// second, its Method* values unread.
	t.nameMethods()
	t.mu.Lock()
	t.stats.ResolveCPU += ownThreadCPU() - start
	t.mu.Unlock()
}

// refresh walks j's code cache and rewrites its rows.
func (t *jvmTracker) refresh(j *jvm) {
	if j.vm == nil {
		if err := t.open(j); err != nil {
			// Mapped is not yet loaded: until the dynamic loader has
			// relocated libjvm.so its tables point nowhere.
			if !IsNotReady(err) && time.Since(j.seenAt) > openGrace {
				t.fail(j, err)
			}
			return
		}
	}
	start := ownThreadCPU()
	cc, err := j.vm.CodeCache()
	j.walkCPU = ownThreadCPU() - start
	if err != nil {
		if !IsNotReady(err) && !symbolize.ProcessExists(int(j.pid)) {
			t.Forget(j.pid)
		}
		return
	}
	if cc.High-cc.Low > 0xffffffff {
		t.fail(j, fmt.Errorf("code cache of %d MiB: beyond what a row addresses", (cc.High-cc.Low)>>20))
		return
	}
	t.mu.Lock()
	for _, b := range cc.Blobs {
		j.blobs[b.Start] = b
	}
	j.dirty, j.cur, j.last = true, cc, time.Now()
	t.stats.Refreshes++
	t.mu.Unlock()
	t.h.SetGenerated(j.pid, cc.Low, cc.High, codeCacheRows(cc))
	// Named now, after the rows: a method may be unloaded later.
	for _, b := range cc.Blobs {
		if b.Kind == KindCompiled && b.Method != 0 {
			j.vm.MethodName(b.Method)
		}
	}
}

func (t *jvmTracker) open(j *jvm) error {
	f := j.lib.File
	if f.Handle == nil {
		return fmt.Errorf("libjvm.so of process %d could not be opened", j.pid)
	}
	// Its headers only: f.load() reads every symbol, for names, later.
	ef, err := elf.NewFile(f.Handle)
	if err != nil {
		return err
	}
	var loads []elf.ProgHeader
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD {
			loads = append(loads, p.ProgHeader)
		}
	}
	bias, ok := runtimes.LoadBias(loads, j.lib)
	if !ok {
		return fmt.Errorf("libjvm.so of process %d: no executable segment", j.pid)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", j.pid))
	if err != nil {
		return err
	}
	// process_vm_readv where it works: the code-cache walks cost a third
	// less than through /proc/PID/mem (BenchmarkCodeCacheWalk).
	var r io.ReaderAt = mem
	if remote := (Remote{PID: int(j.pid)}); remote.Usable(bias + loads[0].Vaddr) {
		r = remote
	}
	vm, err := Open(r, ef, bias)
	if err != nil {
		mem.Close()
		return err
	}
	j.vm, j.mem = vm, mem
	if t.layouts != nil {
		off, size := vm.BCILayout()
		t.layouts.Update(j.pid, bpf.OffcpuJavaProc{ConstMethodOff: off, ConstMethodSize: size}, ebpf.UpdateAny) // full: no bcis
	}
	t.mu.Lock()
	t.stats.JVMs++
	t.mu.Unlock()
	return nil
}

func (t *jvmTracker) fail(j *jvm, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	j.err = err
	t.stats.Failed++
}

// Start reads every JVM seen so far at once: threads blocked since before
// the recording started are walked right after.
func (t *jvmTracker) Start() {
	runtime.LockOSThread() // walks measure this thread's CPU time
	defer runtime.UnlockOSThread()
	t.mu.Lock()
	var all []*jvm
	for _, j := range t.jvms {
		if !j.stopped && j.err == nil {
			all = append(all, j)
		}
	}
	t.mu.Unlock()
	for _, j := range all {
		t.refresh(j)
	}
}

// Final names what the walker found since the last tick, once the
// programs are detached.
func (t *jvmTracker) Final() {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := ownThreadCPU()
	t.nameMethods()
	t.mu.Lock()
	t.stats.ResolveCPU += ownThreadCPU() - start
	t.mu.Unlock()
}

// nameMethods names the Method* values the walker found since the last
// tick and removes them from the map (a walk adds them again, cheaply).
func (t *jvmTracker) nameMethods() {
	if t.methods == nil {
		return
	}
	var k bpf.OffcpuJavaMethodKey
	var v uint8
	var done []bpf.OffcpuJavaMethodKey
	it := t.methods.Iterate()
	for it.Next(&k, &v) {
		t.mu.Lock()
		j := t.jvms[k.Tgid]
		t.mu.Unlock()
		if j != nil && j.vm == nil && j.err == nil && !j.stopped {
			continue // named once the JVM's structures are read
		}
		done = append(done, k)
		if j == nil || j.vm == nil {
			continue
		}
		switch k.Kind {
		case 1:
			t.nameCompiled(j, k.Method)
			continue
		case 2: // new code: read the code cache again soon
			t.mu.Lock()
			// 50 ms after the last walk, or more for a large code cache:
			// walks on new code cost at most 2% of a CPU.
			if soon := j.last.Add(max(50*time.Millisecond, 50*j.walkCPU)); soon.Before(j.next) {
				j.next = soon
				t.stats.GapWalks++
			}
			t.mu.Unlock()
			continue
		}
		if _, ok := j.vm.Method(k.Method); ok {
			continue
		}
		_, err := j.vm.MethodName(k.Method)
		j.vm.Line(k.Method, 0) // its line table, read now
		t.mu.Lock()
		if err != nil {
			t.stats.Unnamed++
		} else {
			t.stats.Methods++
		}
		t.mu.Unlock()
	}
	for _, k := range done {
		t.methods.Delete(k)
	}
}

// nameCompiled reads the Java frames at pc, a pc in compiled code, from
// the compiled method there now.
func (t *jvmTracker) nameCompiled(j *jvm, pc uint64) {
	t.mu.Lock()
	_, done := j.inlined[pc]
	cc := j.cur
	t.mu.Unlock()
	if done || cc == nil {
		return
	}
	i := sort.Search(len(cc.Blobs), func(i int) bool { return cc.Blobs[i].Start > pc }) - 1
	if i < 0 || pc >= cc.Blobs[i].End || cc.Blobs[i].Kind != KindCompiled {
		return
	}
	names, err := j.vm.Frames(cc.Blobs[i], pc)
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.stats.InlineFailed++
		return
	}
	j.inlined[pc] = names
	t.stats.PCs++
	if len(names) > 1 {
		t.stats.Inlined++
	}
}

// Frames returns the Java Frames at pc, a pc in compiled code of process
// pid whose debug information was read (innermost first), or a tagged
// interpreter frame whose method was named.
func (t *jvmTracker) Frames(pid uint32, pc uint64) ([]symtab.Frame, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	j := t.jvms[pid]
	if j == nil || j.vm == nil {
		return nil, false
	}
	if isJavaMethod(pc) { // an interpreter frame: its Method* and bci
		m, bci := bpf.JavaFrame(pc)
		name, ok := j.vm.Method(m)
		if !ok {
			return nil, false
		}
		f := symtab.Frame{Func: name}
		if bci != bpf.JavaBciNone {
			f.Line = int64(j.vm.Line(m, bci))
		}
		return []symtab.Frame{f}, true
	}
	fs, ok := j.inlined[pc]
	out := make([]symtab.Frame, len(fs))
	for i, f := range fs {
		out[i] = symtab.Frame{Func: f.Name, Line: int64(f.Line)}
	}
	return out, ok
}

// codeCacheRows are the walker's rows for a code cache, relative to its
// low bound: interpreter frames by rbp with their Method*, frames of a
// known size (compiled methods, runtime stubs) by rsp with the caller's
// rbp saved below the return address, the rest by frame pointers; where
// no blob was, the walker asks for the code cache to be read again.
func codeCacheRows(cc *CodeCache) []bpf.OffcpuUnwindRow {
	gap := bpf.OffcpuUnwindRow{Kind: uint8(unwind.KindJavaGap)}
	rows := []bpf.OffcpuUnwindRow{gap}
	add := func(pc uint64, r bpf.OffcpuUnwindRow) {
		r.Pc = uint32(pc - cc.Low)
		if last := &rows[len(rows)-1]; last.Pc == r.Pc {
			*last = r
			return
		}
		rows = append(rows, r)
	}
	for _, b := range cc.Blobs {
		r := bpf.OffcpuUnwindRow{Kind: uint8(unwind.KindNone)}
		switch {
		case b.Kind == KindInterpreter:
			r.Kind = uint8(unwind.KindJavaInterp)
		case b.FrameSize > 0 && b.FrameSize < 1<<15:
			r.Kind, r.CfaOff, r.RbpOff = uint8(unwind.KindRSP), int16(b.FrameSize), -2
			if b.Kind == KindCompiled {
				r.Kind = uint8(unwind.KindJavaCompiled)
			}
		}
		add(b.Start, r)
		add(b.End, gap)
	}
	return rows
}

// Name names code in the code cache of process pid by its blob, and an
// interpreter frame whose method could not be named.
func (t *jvmTracker) Name(pid uint32, addr uint64) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	j := t.jvms[pid]
	if isJavaMethod(addr) {
		return "Interpreter", true // frames names it when its Method* was read
	}
	if j == nil || j.cur == nil || addr < j.cur.Low || addr >= j.cur.High {
		return "", false
	}
	if j.dirty {
		j.sorted = j.sorted[:0]
		for _, b := range j.blobs {
			j.sorted = append(j.sorted, b)
		}
		sort.Slice(j.sorted, func(a, b int) bool { return j.sorted[a].Start < j.sorted[b].Start })
		j.dirty = false
	}
	i := sort.Search(len(j.sorted), func(i int) bool { return j.sorted[i].Start > addr }) - 1
	if i < 0 || addr >= j.sorted[i].End {
		return "", false
	}
	b := j.sorted[i]
	if b.Kind == KindCompiled {
		if n, ok := j.vm.Method(b.Method); ok {
			return n, true
		}
	}
	return b.Name, true
}

// ownThreadCPU is the calling thread's CPU time (user and system); callers
// keep their goroutine on one thread.
func ownThreadCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_THREAD, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func isJavaMethod(addr uint64) bool { return addr>>60 == bpf.JavaMethodTag>>60 }

func (t *jvmTracker) snapshotStats() JVMStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.stats
	for _, j := range t.jvms {
		if j.cur == nil {
			continue
		}
		st.Blobs += len(j.cur.Blobs)
		for _, b := range j.cur.Blobs {
			if b.Kind == KindCompiled {
				st.Compiled++
			}
		}
	}
	return st
}

// Recognise: a JVM is found by its process's mappings (SeenEarly), not a file.
func (t *jvmTracker) Recognise(*symtab.File, *elf.File, []unwind.Row) []unwind.Row { return nil }

func (t *jvmTracker) Stats() runtimes.Stats {
	st := t.snapshotStats()
	out := runtimes.Stats{Runtime: Info.Name, Processes: st.JVMs, Unsupported: st.Failed, Named: st.Methods + st.PCs,
		Unnamed: st.Unnamed, Detail: st}
	t.mu.Lock()
	if t.otherArch {
		out.Skipped = []string{errArch.Error()}
	}
	t.mu.Unlock()
	return out
}
