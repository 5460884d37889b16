package analysis

import (
	"testing"

	"github.com/offcpu/offcpu/schema"
)

// A hand-made chain: thread 0 (req) waits on 1 (worker), which waits on
// 2 (backend), which sleeps until a timer; 2 also waited on 1 before
// (a cycle the path must not follow back).
func chainTimeline() *schema.Timeline {
	fr := func(n string) []schema.Frame { return []schema.Frame{{Name: n}, {Name: "schedule", Kernel: true}} }
	return &schema.Timeline{Start: 0, End: 1000,
		Threads: []schema.TimelineThread{{PID: 1, TID: 1, Name: "req"}, {PID: 1, TID: 2, Name: "worker"}, {PID: 3, TID: 3, Name: "backend"}},
		Stacks:  [][]schema.Frame{nil, fr("read_answer"), fr("read_backend"), fr("nanosleep"), fr("read_request")},
		Waits: []schema.Wait{
			{Thread: 0, Out: 100, Wake: 900, In: 910, Stack: 1, Waker: 1},
			{Thread: 1, Out: 200, Wake: 800, In: 820, Stack: 2, Waker: 2},
			{Thread: 2, Out: 50, Wake: 210, In: 230, Stack: 4, Waker: 1},
			{Thread: 2, Out: 300, Wake: 750, In: 760, Stack: 3, Waker: -1, IRQ: true, Class: "timer"},
			{Thread: 2, Out: 850, Wake: 1000, In: 1000, Stack: 4, Waker: -1, Open: true},
		}}
}

func TestFollowCriticalPath(t *testing.T) {
	tl := chainTimeline()
	p, err := FollowCriticalPath(tl, 0, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var sum, last int64
	for _, s := range p.Leaves() {
		if s.Start != last && last != 0 {
			t.Errorf("leaves do not tile: %+v starts at %d, the last ended at %d", s, s.Start, last)
		}
		sum += s.Duration()
		last = s.End
	}
	if sum != 1000 {
		t.Errorf("leaves sum to %d, want the range's 1000", sum)
	}
	c := p.Causes(tl)[0]
	if c.Thread != 2 || c.Stack != 3 || c.Ns != 450 || c.Kind != SegBlocked {
		t.Errorf("first cause %+v, want the backend's 450ns nanosleep", c)
	}
	for _, s := range p.Segments {
		if s.Wait == 2 && s.Kind == SegBlocked && s.Why != "its waker is already on this path" {
			t.Errorf("the backend's wait on the worker, woken by a thread on the path: %+v", s)
		}
		if s.Wait == 3 && s.Depth != 2 {
			t.Errorf("the sleep at depth %d, want 2", s.Depth)
		}
	}
	// A range that cuts waits: the leaves still tile it.
	p, _ = FollowCriticalPath(tl, 0, 150, 500)
	sum = 0
	for _, s := range p.Leaves() {
		sum += s.Duration()
	}
	if sum != 350 {
		t.Errorf("leaves of 150..500 sum to %d", sum)
	}
	// A waker outside the recording (no wait of its own): not followed.
	tl.Threads = append(tl.Threads, schema.TimelineThread{PID: 9, TID: 9, Name: "client"})
	tl.Waits[0].Waker = 3
	p, _ = FollowCriticalPath(tl, 0, 0, 1000)
	if c := p.Causes(tl)[0]; c.Thread != 0 || c.Kind != SegBlocked || c.Ns != 800 {
		t.Errorf("first cause %+v, want req's own wait on a waker not recorded", c)
	}
	if _, err := FollowCriticalPath(tl, 7, 0, 1); err == nil {
		t.Error("no error for a thread not in the timeline")
	}
	if _, err := FollowCriticalPath(tl, 0, 5, 5); err == nil {
		t.Error("no error for an empty range")
	}
}

func TestPathFor(t *testing.T) {
	tl := chainTimeline()
	tl.Waits[0].Labels = map[string]string{schema.LabelSpanID: "s1", schema.LabelTraceID: "t1"}
	th, start, end, err := PathFor(tl, "s1", "")
	if err != nil || th != 0 || start != 100 || end != 910 {
		t.Errorf("PathFor(s1) = %d %d..%d %v", th, start, end, err)
	}
	if _, _, _, err := PathFor(tl, "", "t2"); err == nil {
		t.Error("no error for a trace no wait carries")
	}
}

// Goroutines: G1 (a request) waits on a channel G2 sends on; G2 waits for
// the network, made ready by thread 0 (netpoll), itself woken by the
// backend thread 2 out of its sleep. G2 runs on thread 1 between, which is
// blocked in a system call (a file read) for part of that: the goroutine
// "runs" but its thread does not.
func TestFollowCriticalPathGoroutines(t *testing.T) {
	fr := func(n string) []schema.Frame { return []schema.Frame{{Name: n}} }
	tl := &schema.Timeline{Start: 0, End: 1000,
		Threads: []schema.TimelineThread{{PID: 1, TID: 10, Name: "poller"}, {PID: 1, TID: 11, Name: "m1"},
			{PID: 3, TID: 3, Name: "backend"}, {PID: 1, GoID: 5, Name: "main.handle"}, {PID: 1, GoID: 6, Name: "main.worker"}},
		Stacks: [][]schema.Frame{nil, fr("chanrecv"), fr("netpoll"), fr("epoll_wait"), fr("nanosleep"), fr("pread")},
		Waits: []schema.Wait{
			{Thread: 3, Out: 100, Wake: 900, In: 910, Stack: 1, Waker: 4, OutThread: 1, InThread: 1},
			{Thread: 4, Out: 300, Wake: 700, In: 720, Stack: 2, Waker: 0, OutThread: 1, InThread: 1},
			{Thread: 0, Out: 200, Wake: 650, In: 660, Stack: 3, Waker: 2},
			{Thread: 2, Out: 250, Wake: 640, In: 645, Stack: 4, Waker: -1, IRQ: true, Class: "timer"},
			{Thread: 1, Out: 750, Wake: 850, In: 860, Stack: 5, Waker: -1, IRQ: true, Class: "disk"},
			{Thread: 4, Out: 902, Wake: 1000, In: 1000, Stack: 1, Waker: -1, Open: true, OutThread: 1, InThread: -1},
		}}
	p, err := FollowCriticalPath(tl, 3, 100, 910)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	got := map[[2]int64]int64{} // by thread's tid or goid, and wait
	for _, s := range p.Leaves() {
		sum += s.Duration()
		if s.Kind == SegBlocked {
			id := tl.Threads[s.Thread].TID + tl.Threads[s.Thread].GoID
			got[[2]int64{id, int64(s.Wait)}] += s.Duration()
		}
	}
	if sum != 810 {
		t.Errorf("leaves sum to %d, want 810", sum)
	}
	// The backend's sleep from G2's park (300) to its wake-up (640); the
	// pread G2's thread was blocked in, 750 to 850 (G2 ran on it then).
	if got[[2]int64{3, 3}] != 340 || got[[2]int64{11, 4}] != 100 {
		t.Errorf("sleep %d ns, pread %d ns; want 340, 100: %v", got[[2]int64{3, 3}], got[[2]int64{11, 4}], p.Segments)
	}
	if c := p.Causes(tl)[0]; c.Thread != 2 || c.Stack != 4 {
		t.Errorf("first cause %+v, want the backend's sleep", c)
	}
}

// A span a goroutine carries is followed from the goroutine, though the
// thread that ran it carries it at more waits (its thread context).
func TestPathForGoroutine(t *testing.T) {
	span := map[string]string{schema.LabelSpanID: "s"}
	tl := &schema.Timeline{Start: 0, End: 100,
		Threads: []schema.TimelineThread{{PID: 1, TID: 2}, {PID: 1, GoID: 7}},
		Stacks:  [][]schema.Frame{nil},
		Waits: []schema.Wait{
			{Thread: 0, Out: 10, Wake: 12, In: 13, Waker: -1, Labels: span},
			{Thread: 0, Out: 20, Wake: 22, In: 23, Waker: -1, Labels: span},
			{Thread: 1, Out: 15, Wake: 60, In: 61, Waker: -1, Labels: span},
		}}
	th, start, end, err := PathFor(tl, "s", "")
	if err != nil || th != 1 || start != 15 || end != 61 {
		t.Errorf("PathFor: thread %d, %d..%d, %v; want the goroutine (1), 15..61", th, start, end, err)
	}
}
