package collector

import (
	"errors"
	"maps"

	"github.com/cilium/ebpf"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/threadctx"
)

// part is a piece of a session beside the recording pipeline: the
// runtimes' unwinder, the goroutine recorder, thread context. Each hears
// of the recorded processes through the same four calls, from the event
// reader and from AddPID, of the recorded window's ends and of the
// programs' detaching, gives its figures when the maps are drained, and
// is closed with the session; a session holds the ones its options ask
// for as a list. quietPart gives the calls a part does not need.
type part interface {
	// processSeen: a process found running, or to be read again.
	processSeen(pid uint32)
	// processAdded: a process added to the recorded set (Options.PIDs,
	// AddPID).
	processAdded(pid uint32)
	// processExec: the process runs a new program.
	processExec(pid uint32)
	// processExit: the process ended.
	processExit(pid uint32)
	// window: the recorded window opens (open) or closes at ns
	// (CLOCK_MONOTONIC): nothing outside it counts.
	window(open bool, ns uint64) error
	// halt: the session's programs are detached; the part stops its own
	// and keeps its maps for the drain.
	halt()
	// programs are the part's own programs, by name (Options.Stats).
	programs() map[string]*ebpf.Program
	// addStats puts the part's figures in st (get: the programs'
	// counters), at each drain.
	addStats(st *Stats, get statReader)
	close()
}

// quietPart: no-op calls, for a part to embed.
type quietPart struct{}

func (quietPart) processSeen(uint32)                 {}
func (quietPart) processAdded(uint32)                {}
func (quietPart) processExec(uint32)                 {}
func (quietPart) processExit(uint32)                 {}
func (quietPart) window(bool, uint64) error          { return nil }
func (quietPart) halt()                              {}
func (quietPart) programs() map[string]*ebpf.Program { return nil }
func (quietPart) addStats(*Stats, statReader)        {}
func (quietPart) close()                             {}

// parts calls each part in turn.
type parts []part

func (ps parts) each(f func(part)) {
	for _, p := range ps {
		f(p)
	}
}

func (ps parts) processSeen(pid uint32)  { ps.each(func(p part) { p.processSeen(pid) }) }
func (ps parts) processAdded(pid uint32) { ps.each(func(p part) { p.processAdded(pid) }) }
func (ps parts) processExec(pid uint32)  { ps.each(func(p part) { p.processExec(pid) }) }
func (ps parts) processExit(pid uint32)  { ps.each(func(p part) { p.processExit(pid) }) }
func (ps parts) addStats(st *Stats, get statReader) {
	ps.each(func(p part) { p.addStats(st, get) })
}
func (ps parts) halt()  { ps.each(part.halt) }
func (ps parts) close() { ps.each(part.close) }

// window tells each part; the errors joined.
func (ps parts) window(open bool, ns uint64) error {
	var errs []error
	ps.each(func(p part) { errs = append(errs, p.window(open, ns)) })
	return errors.Join(errs...)
}

// programs are every part's programs, by name.
func (ps parts) programs() map[string]*ebpf.Program {
	out := map[string]*ebpf.Program{}
	ps.each(func(p part) { maps.Copy(out, p.programs()) })
	return out
}

// The unwinder follows a process's mappings through symbolize.Procs; of
// its life it needs the program it runs and its end. At the halt each
// runtime names what the walker found last.
func (u *unwinder) processSeen(uint32)                 {}
func (u *unwinder) processAdded(uint32)                {}
func (u *unwinder) processExec(pid uint32)             { u.exec(pid) }
func (u *unwinder) processExit(pid uint32)             { u.forget(pid) }
func (u *unwinder) window(bool, uint64) error          { return nil }
func (u *unwinder) programs() map[string]*ebpf.Program { return nil }
func (u *unwinder) close()                             {}

func (u *unwinder) halt() {
	for _, rt := range u.rts {
		rt.Final()
	}
}

// addStats: the tables and walks, and each runtime met.
func (u *unwinder) addStats(st *Stats, get statReader) {
	us := u.snapshotStats()
	us.Stacks = get(bpf.OffcpuOffcpuStatSTAT_DWARF_STACKS)
	us.Frames = get(bpf.OffcpuOffcpuStatSTAT_DWARF_FRAMES)
	us.Ends = get(bpf.OffcpuOffcpuStatSTAT_DWARF_END)
	us.DepthLimit = get(bpf.OffcpuOffcpuStatSTAT_DWARF_DEPTH)
	st.Unwind = &us
	st.Runtimes = runtimeFigures(u.rts)
}

// Thread context reads a process's published context from its first
// sight; one added by AddPID is read at once.
type tctxPart struct {
	quietPart
	*threadctx.Tracker
}

func (t tctxPart) processSeen(pid uint32)  { t.Add(pid) }
func (t tctxPart) processAdded(pid uint32) { t.AddNow(pid) }
func (t tctxPart) processExec(pid uint32)  { t.Exec(pid) }
func (t tctxPart) processExit(pid uint32)  { t.Exit(pid) }
func (t tctxPart) close()                  { t.Close() }

func (t tctxPart) addStats(st *Stats, get statReader) {
	st.ThreadContext = t.Stats(get(bpf.OffcpuOffcpuStatSTAT_TCTX_LINKS), get(bpf.OffcpuOffcpuStatSTAT_TCTX_LOST),
		get(bpf.OffcpuOffcpuStatSTAT_TCTX_GO_SETS), get(bpf.OffcpuOffcpuStatSTAT_TCTX_GO_LOST))
}
