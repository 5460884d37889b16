package collector

import (
	"debug/elf"
	"sync"
	"time"

	"github.com/cilium/ebpf"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/symtab"
	"github.com/offcpu/offcpu/collector/unwind"
)

// A runtimeReader reads one language runtime's frames from its own
// structures: it recognises the files and processes that run it, gives
// the walker each process's layout (through its BPF header's maps), and
// names the stack entries of its frame kind (bpf.Frame*) while the
// processes live. Adding a runtime: a type implementing this, a line in
// newRuntimes, a BPF header with its hook in the walker, and its value
// of enum frame_kind.
type runtimeReader interface {
	// frameKind: the bpf.Frame* value of the stack entries it names.
	frameKind() uint64
	// recognise looks at a file once, as its unwind table is read; rows
	// are its unwind rows, which it may mark (the rows to load, or nil
	// to keep the file's defaults).
	recognise(f *symtab.File, ef *elf.File, rows []unwind.Row) []unwind.Row
	// seen: a process's code mappings, after its files' tables are read.
	seen(pid uint32, ms []symbolize.Mapping)
	// forget: the process exited (names already read stay).
	forget(pid uint32)
	// run names what the walker found until stop; final once detached.
	run(stop <-chan struct{})
	final()
	// Frames names a stack entry of its kind (symtab.JIT); Name is the
	// placeholder for one that could not be read.
	Frames(pid uint32, addr uint64) ([]symtab.Frame, bool)
	Name(pid uint32, addr uint64) (string, bool)
	runtimeStats() RuntimeStats
}

// earlyRuntime is a runtime that finds its processes by their mappings,
// not by a file's contents: it is told of them before their files' unwind
// tables are read.
type earlyRuntime interface {
	seenEarly(pid uint32, ms []symbolize.Mapping)
}

// RuntimeStats describes one runtime's processes, the same for each.
type RuntimeStats struct {
	Runtime     string   `json:"runtime"`           // hotspot, cpython, v8
	Processes   int      `json:"processes"`         // processes whose frames were read
	Unsupported int      `json:"unsupported"`       // processes of a build whose layout is not read
	Named       int      `json:"named"`             // functions (methods, code objects) named
	Unnamed     int      `json:"unnamed"`           // seen in stacks but not readable
	Skipped     []string `json:"skipped,omitempty"` // why processes were walked as native code only
}

// newRuntimes: every runtime read, in the order their files are
// recognised.
func newRuntimes(u *unwinder, coll *ebpf.Collection) []runtimeReader {
	return []runtimeReader{
		newJVMTracker(u, coll.Maps[bpf.OffcpuMapJavaMethods], coll.Maps[bpf.OffcpuMapJavaProcs]),
		newPyTracker(coll),
		newV8Tracker(coll),
	}
}

// FrameKindOf is the kind of a user stack entry (bpf.Frame*).
func FrameKindOf(addr uint64) uint64 {
	if k := addr >> bpf.FrameKindShift; k >= bpf.FrameV8 && k <= bpf.FramePython {
		return k
	}
	return bpf.FrameNative
}

// runtimeNames names the frames of every runtime read (symtab.JIT).
type runtimeNames []runtimeReader

// Frames: a tagged entry by the runtime of its kind; a native pc by each
// runtime that generates code (a JVM's code cache).
func (r runtimeNames) Frames(pid uint32, addr uint64) ([]symtab.Frame, bool) {
	k := FrameKindOf(addr)
	for _, rt := range r {
		if k == bpf.FrameNative || rt.frameKind() == k {
			if fr, ok := rt.Frames(pid, addr); ok || k != bpf.FrameNative {
				return fr, ok
			}
		}
	}
	return nil, false
}

func (r runtimeNames) Name(pid uint32, addr uint64) (string, bool) {
	k := FrameKindOf(addr)
	for _, rt := range r {
		if k == bpf.FrameNative || rt.frameKind() == k {
			if n, ok := rt.Name(pid, addr); ok || k != bpf.FrameNative {
				return n, ok
			}
		}
	}
	return "", false
}

// runtimeFiles: the pprof mapping of each frame kind's frames.
var runtimeFiles = map[uint64]string{bpf.FrameV8: "[javascript]", bpf.FrameJava: "[java]", bpf.FramePython: "[python]"}

// MappingOf is the pprof mapping file of a frame a runtime named: its
// kind's, or a JVM's for a pc in compiled code.
func (r runtimeNames) MappingOf(addr uint64) string {
	if f, ok := runtimeFiles[FrameKindOf(addr)]; ok {
		return f
	}
	return runtimeFiles[bpf.FrameJava]
}

// nameWhileLive calls name every 50 ms while live says a process of the
// runtime is recorded (a short-lived one's frames are named before it
// exits, a moving collector's objects before they move), and on wake.
func nameWhileLive(stop <-chan struct{}, wake alarm, live func() bool, name func()) {
	everyWhileBusy(50*time.Millisecond, time.Second, wake, stop, live, func(time.Time) { name() })
}

// anyLive: some process of procs is not dead.
func anyLive[P any](mu *sync.Mutex, procs map[uint32]P, dead func(P) bool) bool {
	mu.Lock()
	defer mu.Unlock()
	for _, p := range procs {
		if !dead(p) {
			return true
		}
	}
	return false
}

// drainSeen calls each for every key the walker put in m since the last
// time and removes them (a walk adds them again, cheaply).
func drainSeen[K any](m *ebpf.Map, each func(K)) {
	var k K
	var v uint8
	var done []K
	for it := m.Iterate(); it.Next(&k, &v); {
		done = append(done, k)
		each(k)
	}
	deleteKeys(m, done)
}
