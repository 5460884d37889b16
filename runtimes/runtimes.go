// Package runtimes is the seam between the recorder and the language
// runtimes whose frames it reads from their own structures (HotSpot,
// CPython, V8, CRuby): what a runtime is (Info), what the recorder asks of
// it (Reader), the narrow handle it gets on its own BPF maps (Handle), and
// the bookkeeping every runtime shares (Procs). Each runtime lives in a
// package below this one; runtimes/registry lists them.
package runtimes

import (
	"debug/elf"
	"sort"
	"time"

	"github.com/cilium/ebpf"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/symtab"
	"github.com/offcpu/offcpu/collector/unwind"
	"github.com/offcpu/offcpu/internal/loop"
)

// Info describes a runtime; every table that names runtimes is derived
// from the registry's Infos.
type Info struct {
	Kind      uint64 // bpf.Frame*: the tag of its stack entries
	Name      string // in figures and flags: hotspot, cpython, v8, ruby
	Title     string // in messages: JVM, Python, JavaScript, Ruby
	Mapping   string // the pprof mapping file of its frames: [java]
	FrameType string // the OpenTelemetry profiles frame type: jvm
	Unread    string // the name of a frame whose function could not be read
	Prefix    string // its BPF maps' and variables' names start with it
	Lock      string // its interpreter lock, whose waits are gil-wait: GIL
	// Modules: its own files (regular expressions on their base names),
	// whose frames are never the application's (analysis).
	Modules []string
}

// Runtime is a registry entry: what the runtime is and how to start
// reading it for a recording.
type Runtime struct {
	Info
	New func(h Handle) Reader
}

// Reader reads one runtime's frames while a recording runs: it
// recognises the files that hold the runtime, gives the walker each
// process's layout through its maps, and names the stack entries of its
// kind while the processes live.
type Reader interface {
	// Recognise looks at a file once, as its unwind table is read; rows
	// are its unwind rows, which it may mark (the rows to load, or nil
	// to keep the file's defaults).
	Recognise(f *symtab.File, ef *elf.File, rows []unwind.Row) []unwind.Row
	// Seen: a process's code mappings, after its files' tables are read.
	Seen(pid uint32, ms []symbolize.Mapping)
	// Forget: the process exited (names already read stay).
	Forget(pid uint32)
	// Run names what the walker found until stop; Final once detached.
	Run(stop <-chan struct{})
	Final()
	// Frames names a stack entry of its kind, or a native pc in code it
	// generated (symtab.JIT).
	Frames(pid uint32, addr uint64) ([]symtab.Frame, bool)
	Stats() Stats
}

// Early is a Reader that finds its processes by their mappings, not by a
// file's contents: it is told of them before their files' tables are read.
type Early interface {
	SeenEarly(pid uint32, ms []symbolize.Mapping)
}

// Starter is a Reader with work to do once the programs are attached and
// before threads already blocked are walked.
type Starter interface {
	Start()
}

// Namer is a Reader that names entries its Frames cannot (code it
// generated, by the blob that holds it).
type Namer interface {
	Name(pid uint32, addr uint64) (string, bool)
}

// Handle is what a runtime gets of the recorder: its own BPF maps and
// variables (by name, those with its Prefix), and rows for code it
// generates.
type Handle interface {
	Map(name string) *ebpf.Map
	Variable(name string) *ebpf.Variable
	// SetGenerated gives the walker rows for pid's generated code
	// [start, end), their pcs relative to start.
	SetGenerated(pid uint32, start, end uint64, rows []bpf.OffcpuUnwindRow) error
}

// Stats describes one runtime's processes, the same for each.
type Stats struct {
	Runtime     string   `json:"runtime"`           // hotspot, cpython, v8, ruby
	Processes   int      `json:"processes"`         // processes whose frames were read
	Unsupported int      `json:"unsupported"`       // processes of a build whose layout is not read
	Named       int      `json:"named"`             // functions (methods, code objects) named
	Unnamed     int      `json:"unnamed"`           // seen in stacks but not readable
	Skipped     []string `json:"skipped,omitempty"` // why processes were walked as native code only
	Detail      any      `json:"detail,omitempty"`  // the runtime's own figures
}

// KindOf is the kind of a user stack entry (bpf.Frame*): its top bits
// when they are a runtime's tag (kernel addresses have all three set),
// else native.
func KindOf(addr uint64) uint64 {
	if k := addr >> bpf.FrameKindShift; k != bpf.FrameNative && k < 7 {
		return k
	}
	return bpf.FrameNative
}

// LoadBias is pc - (ELF virtual address) for mapping m of a file with the
// given PT_LOAD segments.
func LoadBias(loads []elf.ProgHeader, m symbolize.Mapping) (uint64, bool) {
	for _, p := range loads {
		// The kernel maps from the page holding the segment's start.
		if p.Flags&elf.PF_X != 0 && m.Offset >= p.Off&^0xfff && m.Offset < p.Off+p.Filesz {
			return m.Start - m.Offset + p.Off - p.Vaddr, true
		}
	}
	return 0, false
}

// NameWhileLive calls name every 50 ms while live says a process of the
// runtime is recorded (a short-lived one's frames are named before it
// exits, a moving collector's objects before they move), and on wake.
func NameWhileLive(stop <-chan struct{}, wake loop.Alarm, live func() bool, name func()) {
	loop.EveryWhileBusy(50*time.Millisecond, time.Second, wake, stop, live, func(time.Time) { name() })
}

// DrainSeen calls each for every key the walker put in m since the last
// time and removes them (a walk adds them again, cheaply).
func DrainSeen[K any](m *ebpf.Map, each func(K)) {
	var k K
	var v uint8
	var done []K
	for it := m.Iterate(); it.Next(&k, &v); {
		done = append(done, k)
		each(k)
	}
	bpf.DeleteKeys(m, done)
}

// MarkInterpLoop marks the rows of an interpreter loop's code [lo, hi):
// the walker records the interpreted frames an activation of it runs in
// its place. Rows are split at lo and hi, so that the mark covers the
// loop alone.
func MarkInterpLoop(rows []unwind.Row, lo, hi uint64) []unwind.Row {
	at := func(pc uint64) (unwind.Row, bool) {
		i := sort.Search(len(rows), func(i int) bool { return rows[i].PC > pc })
		if i == 0 {
			return unwind.Row{}, false
		}
		r := rows[i-1]
		r.PC = pc
		return r, true
	}
	out := make([]unwind.Row, 0, len(rows)+2)
	loRow, okLo := at(lo)
	hiRow, okHi := at(hi)
	for _, r := range rows {
		if okLo && r.PC >= lo {
			if r.PC > lo {
				out = append(out, loRow)
			}
			okLo = false
		}
		if okHi && r.PC >= hi {
			if r.PC > hi {
				out = append(out, hiRow)
			}
			okHi = false
		}
		out = append(out, r)
	}
	if okLo {
		out = append(out, loRow)
	}
	if okHi {
		out = append(out, hiRow)
	}
	for i := range out {
		if out[i].PC >= lo && out[i].PC < hi {
			out[i].Kind |= unwind.KindInterpLoop
		}
	}
	return out
}
