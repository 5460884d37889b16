package schema

import "sort"

// Timeline is every wait of a recording in order: plain data that a
// Perfetto trace is written from and read back into, and that a
// request's critical path is followed through. Times are CLOCK_MONOTONIC
// nanoseconds (the BPF programs' bpf_ktime_get_ns).
type Timeline struct {
	Start, End int64 // the window
	Threads    []TimelineThread
	// Stacks: every stack the waits name, root first, interned; index 0
	// is the empty stack.
	Stacks [][]Frame
	Waits  []Wait // by Out, then thread
	// Lost: waits the stream could not keep (its ring was full); their
	// threads' time around them reads as on a CPU.
	Lost int64
}

// TimelineThread is a thread a wait names (the waiter or its waker), or
// a goroutine (GoID not 0, TID 0, Name its function).
type TimelineThread struct {
	PID, TID      int64
	GoID          int64
	Process, Name string
}

// Wait is one off-CPU interval: switch-out (Out), wake-up (Wake) and
// switch-in (In). From Out to Wake the thread was blocked, from Wake to
// In it waited for a CPU; a preempted thread waited for a CPU throughout
// (Wake == Out). An interval still open when recording stopped has Open
// set and In at the window's end.
type Wait struct {
	Thread        int32 // index in Threads
	Out, Wake, In int64
	State         string // sleeping, uninterruptible, preempted, other
	Stack         int32  // index in Stacks
	Open          bool
	// Waker: the thread that woke it (index in Threads; -1: none known or
	// an interrupt, then IRQ says which), its stack then, and the wake-up
	// class (futex, pipe/socket, timer, ...).
	Waker      int32
	WakerStack int32
	IRQ        bool
	Class      string
	// Labels: the request it waited in (trace_id, span_id, the program's
	// own labels); nil where none.
	Labels map[string]string
	// Category and Verdict: analysis's judgement, where it was judged.
	Category, Verdict string
	// A goroutine's wait only: the threads it parked on (OutThread) and
	// ran on after (InThread), whose own waits are the goroutine's while
	// it ran there (-1: not known).
	OutThread, InThread int32
}

// Blocked is the wait's time blocked, before its wake-up.
func (w *Wait) Blocked() int64 { return w.Wake - w.Out }

// Runnable is the wait's time waiting for a CPU, after its wake-up.
func (w *Wait) Runnable() int64 { return w.In - w.Wake }

// Sort orders the waits by switch-out, then thread.
func (t *Timeline) Sort() {
	sort.SliceStable(t.Waits, func(i, j int) bool {
		a, b := &t.Waits[i], &t.Waits[j]
		if a.Out != b.Out {
			return a.Out < b.Out
		}
		return a.Thread < b.Thread
	})
}

// ByThread is each thread's waits in order, by index in Threads.
func (t *Timeline) ByThread() [][]int {
	by := make([][]int, len(t.Threads))
	for i := range t.Waits {
		w := &t.Waits[i]
		by[w.Thread] = append(by[w.Thread], i)
	}
	for _, ws := range by {
		sort.SliceStable(ws, func(i, j int) bool { return t.Waits[ws[i]].Out < t.Waits[ws[j]].Out })
	}
	return by
}
