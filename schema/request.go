package schema

import (
	"slices"
	"strings"

	"github.com/google/pprof/profile"
)

// MarkInRequest finds, in one profile's stacks, the threads that serve
// another program (another program or the network ended some of their
// waits), and marks their waits away from those input waits.
// The verdict needs no function name: a connection thread's wait for the
// client's next request is its top of loop, woken by the client; any other
// wait it makes (a row lock, a group commit, a latch) is inside a request.
func MarkInRequest(stacks []Stack) {
	x := NewRequestIndex()
	for i := range stacks {
		x.Observe(&stacks[i])
	}
	for i := range stacks {
		x.Mark(&stacks[i])
	}
}

// RequestIndex is MarkInRequest in two passes for readers that keep no
// stacks (SampleReader): Observe every stack of a profile, then Mark each.
type RequestIndex struct {
	threads map[[3]int64]*requestThread
}

// requestThread is a thread's, or a goroutine's (whose network waits are
// its input waits), input waits.
type requestThread struct {
	inputAt map[string]bool // user stacks of input waits
	inputs  [][]string      // the same, root first
	// work: where the thread waits for its own process (a pool's queue),
	// its user frames root first down to the innermost frame a language
	// runtime named (the interpreted code that waits): a wait for the
	// network below one of them is a call made for the work item it
	// took there.
	workAt map[string]bool
	work   [][]string
}

func NewRequestIndex() *RequestIndex { return &RequestIndex{threads: map[[3]int64]*requestThread{}} }

func requestKey(s *Stack) [3]int64 { return [3]int64{s.PID, s.TID, s.Goid} }

// Observe notes s's thread and, if s is an input wait, where it waits.
func (x *RequestIndex) Observe(s *Stack) {
	if s.Kind != KindOffCPU || s.WaitsForCPU() || (s.TID == 0 && s.Goid == 0) {
		return
	}
	t := x.threads[requestKey(s)]
	if t == nil {
		t = &requestThread{inputAt: map[string]bool{}}
		x.threads[requestKey(s)] = t
	}
	if s.WokenByInput() {
		if at := userFolded(s); !t.inputAt[at] {
			t.inputAt[at] = true
			t.inputs = append(t.inputs, userFrames(s.Frames))
		}
	} else if s.WakerRelation() == "same-process" && s.Reason != ReasonGIL && s.Goid == 0 {
		if w := runtimePrefix(s.Frames); len(w) > 0 {
			if t.workAt == nil {
				t.workAt = map[string]bool{}
			}
			if at := strings.Join(w, ";"); !t.workAt[at] {
				t.workAt[at] = true
				t.work = append(t.work, w)
			}
		}
	}
}

// runtimePrefix is a stack's user frames, root first, down to its
// innermost frame a language runtime named; nil without one.
func runtimePrefix(frames []Frame) []string {
	last := -1
	for i, f := range frames {
		if f.Runtime != "" {
			last = i
		}
	}
	if last < 0 {
		return nil
	}
	return userFrames(frames[:last+1])
}

// SamePlace tells whether two stacks wait at the same place: the same
// user frames down to the innermost frame a language runtime named (the
// interpreted code that waits; the runtime's own calls below it may wait
// at more than one spot), or, with no such frame, the same frames.
func SamePlace(a, b []Frame) bool {
	pa, pb := runtimePrefix(a), runtimePrefix(b)
	if len(pa) == 0 && len(pb) == 0 {
		return slices.EqualFunc(a, b, func(x, y Frame) bool { return x.Name == y.Name && x.Kernel == y.Kernel })
	}
	// A folded label (a waker's stack) keeps no runtime marks: the other
	// stack's tell where its interpreted code ends.
	ua, ub := userFrames(a), userFrames(b)
	n := max(len(pa), len(pb))
	return len(ua) >= n && len(ub) >= n && slices.Equal(ua[:n], ub[:n]) && (len(pa) == 0 || len(pb) == 0 || len(pa) == len(pb))
}

// underWork: a stack passes through one of the thread's waits for work
// down to its innermost runtime frame, and goes on in more runtime frames
// (a handler's code, a client library's): a call the work item made.
func underWork(frames []Frame, work [][]string) bool {
	mine := runtimePrefix(frames)
	for _, w := range work {
		if len(mine) > len(w)+1 && slices.Equal(mine[:len(w)], w) {
			return true
		}
	}
	return false
}

// RequestIndex observes every stack of samples, read by r: the first of
// the two passes.
func (r *SampleReader) RequestIndex(samples []*profile.Sample) *RequestIndex {
	x := NewRequestIndex()
	var buf []Stack
	for _, s := range samples {
		buf = r.Stacks(buf[:0], s)
		for i := range buf {
			x.Observe(&buf[i])
		}
	}
	return x
}

// Mark sets s.InRequest and s.WakerDispatching from what was observed.
func (x *RequestIndex) Mark(s *Stack) {
	t := x.threads[requestKey(s)]
	if s.Kind != KindOffCPU || s.WaitsForCPU() || t == nil || len(t.inputAt) == 0 {
		return
	}
	s.InRequest = !t.inputAt[userFolded(s)] || nestedIn(userFrames(s.Frames), t.inputs) || underWork(s.Frames, t.work)
	// A goroutine that reads the network gets its work from there, never
	// from a reader passing it on: Go hands a connection over by starting
	// a goroutine, so another reader that wakes it delivers what its
	// request waits for (a response), not new work.
	if w := x.threads[[3]int64{s.WakerPID, s.WakerTID, s.WakerGoid}]; s.InRequest && w != nil && s.Goid == 0 {
		s.WakerDispatching = nearInput(userFrames(s.WakerFrames), w.inputs)
	}
}

// goNetworkWait is the Go runtime's wait reason for a goroutine parked in
// the network poller.
const goNetworkWait = "IO wait"

// WokenByInput tells whether another program or the network ended the
// wait (a goroutine's network poll included): a wait for input.
func (s *Stack) WokenByInput() bool {
	return s.WakerRelation() == "other-program" || s.Class == "net-rx" || s.Reason == goNetworkWait
}

// Woken tells whether a recorded waker ended the wait (a goroutine's
// network poll counts: the poller readied it).
func (s *Stack) Woken() bool {
	rel := s.WakerRelation()
	return rel != "none" && rel != "unknown" || s.Reason == goNetworkWait
}

// dispatchDepth: a wake-up this many frames or fewer past where the
// waker's stack leaves one of its input waits' is made from its top of
// loop (the wake call and a library wrapper or two).
const dispatchDepth = 3

// nearInput tells whether stack (root first) leaves one of inputs at most
// dispatchDepth frames before its leaf.
func nearInput(stack []string, inputs [][]string) bool {
	for _, in := range inputs {
		c := 0
		for c < len(stack) && c < len(in) && stack[c] == in[c] {
			c++
		}
		if c > 0 && len(stack)-c <= dispatchDepth {
			return true
		}
	}
	return false
}

// nestedIn: stack passes through one of the thread's input waits at its
// wait (a loop's poll, within dispatchDepth frames of it) and goes on
// deeper: a wait made while handling what that loop dispatched (a
// handler's synchronous read, a child it runs), inside a request though
// another program ends it.
func nestedIn(stack []string, inputs [][]string) bool {
	for _, in := range inputs {
		c := 0
		for c < len(stack) && c < len(in) && stack[c] == in[c] {
			c++
		}
		if c > 0 && len(in)-c <= dispatchDepth && len(stack)-c > dispatchDepth {
			return true
		}
	}
	return false
}

func userFrames(frames []Frame) []string {
	var out []string
	for _, f := range frames {
		if !f.Kernel {
			out = append(out, f.Name)
		}
	}
	return out
}

// userFolded is a stack's user frames, root first.
func userFolded(s *Stack) string {
	var b strings.Builder
	for _, f := range s.Frames {
		if !f.Kernel {
			b.WriteString(f.Name)
			b.WriteByte(';')
		}
	}
	return b.String()
}
