package collector

import "github.com/offcpu/offcpu/collector/threadctx"

// part is a piece of a session beside the recording pipeline: the
// runtimes' unwinder, the goroutine recorder, thread context. Each hears
// of the recorded processes through the same four calls, from the event
// reader and from AddPID, and is closed with the session; a session
// holds the ones its options ask for as a list.
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
	close()
}

// parts calls each part in turn.
type parts []part

func (ps parts) processSeen(pid uint32) {
	for _, p := range ps {
		p.processSeen(pid)
	}
}

func (ps parts) processAdded(pid uint32) {
	for _, p := range ps {
		p.processAdded(pid)
	}
}

func (ps parts) processExec(pid uint32) {
	for _, p := range ps {
		p.processExec(pid)
	}
}

func (ps parts) processExit(pid uint32) {
	for _, p := range ps {
		p.processExit(pid)
	}
}

func (ps parts) close() {
	for _, p := range ps {
		p.close()
	}
}

// The unwinder follows a process's mappings through symbolize.Procs; of
// its life it needs the program it runs and its end.
func (u *unwinder) processSeen(uint32)     {}
func (u *unwinder) processAdded(uint32)    {}
func (u *unwinder) processExec(pid uint32) { u.exec(pid) }
func (u *unwinder) processExit(pid uint32) { u.forget(pid) }
func (u *unwinder) close()                 {}

// The goroutine recorder attaches to a recorded process when it is added
// or runs a new program (a Go program, or not).
func (r *goRecorder) processSeen(uint32)      {}
func (r *goRecorder) processAdded(pid uint32) { r.add(pid) }
func (r *goRecorder) processExec(pid uint32)  { r.add(pid) }
func (r *goRecorder) processExit(pid uint32)  { r.exit(pid) }

// Thread context reads a process's published context from its first
// sight; one added by AddPID is read at once.
type tctxPart struct{ *threadctx.Tracker }

func (t tctxPart) processSeen(pid uint32)  { t.Add(pid) }
func (t tctxPart) processAdded(pid uint32) { t.AddNow(pid) }
func (t tctxPart) processExec(pid uint32)  { t.Exec(pid) }
func (t tctxPart) processExit(pid uint32)  { t.Exit(pid) }
func (t tctxPart) close()                  { t.Close() }
