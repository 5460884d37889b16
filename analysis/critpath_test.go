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
