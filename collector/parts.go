package collector

import (
	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/threadctx"
)

// part is a piece of a session beside the recording pipeline: the
// runtimes' unwinder, the goroutine recorder, thread context. Each hears
// of the recorded processes through the same four calls, from the event
// reader and from AddPID, gives its figures when the maps are drained,
// and is closed with the session; a session holds the ones its options
// ask for as a list.
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
	// addStats puts the part's figures in st (get: the programs'
	// counters), at each drain.
	addStats(st *Stats, get statReader)
	close()
}

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

func (ps parts) close() { ps.each(part.close) }

// The unwinder follows a process's mappings through symbolize.Procs; of
// its life it needs the program it runs and its end.
func (u *unwinder) processSeen(uint32)     {}
func (u *unwinder) processAdded(uint32)    {}
func (u *unwinder) processExec(pid uint32) { u.exec(pid) }
func (u *unwinder) processExit(pid uint32) { u.forget(pid) }
func (u *unwinder) close()                 {}

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
type tctxPart struct{ *threadctx.Tracker }

func (t tctxPart) processSeen(pid uint32)  { t.Add(pid) }
func (t tctxPart) processAdded(pid uint32) { t.AddNow(pid) }
func (t tctxPart) processExec(pid uint32)  { t.Exec(pid) }
func (t tctxPart) processExit(pid uint32)  { t.Exit(pid) }
func (t tctxPart) close()                  { t.Close() }

func (t tctxPart) addStats(st *Stats, get statReader) {
	st.ThreadContext = t.Stats(get(bpf.OffcpuOffcpuStatSTAT_TCTX_LINKS), get(bpf.OffcpuOffcpuStatSTAT_TCTX_LOST),
		get(bpf.OffcpuOffcpuStatSTAT_TCTX_GO_SETS), get(bpf.OffcpuOffcpuStatSTAT_TCTX_GO_LOST))
}
