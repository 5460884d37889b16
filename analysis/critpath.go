package analysis

import (
	"fmt"
	"sort"
	"strings"

	"github.com/offcpu/offcpu/schema"
)

// Kinds of critical-path segments.
const (
	SegRunning  = "running"  // on a CPU (or off it unseen: a lost wait)
	SegRunnable = "runnable" // woken, waiting for a CPU
	SegBlocked  = "blocked"  // blocked, and its waker not followed (a leaf)
	SegFollowed = "followed" // blocked; its waker's activity meanwhile follows
)

// maxPathDepth bounds how many wake-ups a path follows back.
const maxPathDepth = 32

// Segment is one piece of a critical path: a thread's time from Start to
// End, at Depth wake-ups from the request's own thread (0).
type Segment struct {
	Depth      int
	Thread     int32 // index in Timeline.Threads
	Kind       string
	Start, End int64
	Wait       int // index in Timeline.Waits; -1 for a running segment
	// Why: for a blocked leaf, why its waker was not followed (an
	// interrupt or a timer, no waker known, a cycle, the depth bound).
	Why string
}

// Duration is the segment's length in ns.
func (s *Segment) Duration() int64 { return s.End - s.Start }

// CriticalPath is a thread's wall time from Start to End as segments:
// its own time on a CPU, waiting for one and blocked, each blocked part
// followed into its waker's activity during it, back to CPU work or a
// wait with no waker to follow. The segments that are not followed tile
// [Start, End] exactly.
type CriticalPath struct {
	Thread     int32
	Start, End int64
	Segments   []Segment // in time order, a followed one before what it holds
}

// Leaves are the segments the path's time is made of.
func (p *CriticalPath) Leaves() []Segment {
	var out []Segment
	for _, s := range p.Segments {
		if s.Kind != SegFollowed {
			out = append(out, s)
		}
	}
	return out
}

// FollowCriticalPath follows thread's time from start to end through the
// timeline's waits and wake-ups.
func FollowCriticalPath(t *schema.Timeline, thread int32, start, end int64) (*CriticalPath, error) {
	if thread < 0 || int(thread) >= len(t.Threads) {
		return nil, fmt.Errorf("no thread %d in the timeline", thread)
	}
	if end <= start {
		return nil, fmt.Errorf("empty range: %d to %d", start, end)
	}
	f := &pathFollower{t: t, by: t.ByThread()}
	p := &CriticalPath{Thread: thread, Start: start, End: end}
	p.Segments = f.follow(nil, thread, start, end, 0, map[int32]bool{thread: true})
	return p, nil
}

type pathFollower struct {
	t  *schema.Timeline
	by [][]int
}

// follow appends thread's segments from a to b (depth hops away; on: the
// threads the path is inside, whose waits are not followed again).
func (f *pathFollower) follow(out []Segment, thread int32, a, b int64, depth int, on map[int32]bool) []Segment {
	ws := f.by[thread]
	// The first wait that ends after a.
	i := sort.Search(len(ws), func(i int) bool { return f.t.Waits[ws[i]].In > a })
	cur := a
	for ; i < len(ws) && cur < b; i++ {
		w := &f.t.Waits[ws[i]]
		if w.Out >= b {
			break
		}
		if w.Out > cur {
			out = f.running(out, thread, w.OutThread, cur, w.Out, depth, on)
			cur = w.Out
		}
		if wake := min(w.Wake, b); wake > cur {
			out = f.blocked(out, thread, ws[i], cur, wake, depth, on)
			cur = wake
		}
		if in := min(w.In, b); in > cur {
			out = append(out, Segment{Depth: depth, Thread: thread, Kind: SegRunnable, Start: cur, End: in, Wait: ws[i]})
			cur = in
		}
	}
	if cur < b {
		// A goroutine ran there on the thread it next parked on, or the
		// one it last ran on.
		ran := int32(-1)
		if i < len(ws) {
			ran = f.t.Waits[ws[i]].OutThread
		} else if i > 0 {
			ran = f.t.Waits[ws[i-1]].InThread
		}
		out = f.running(out, thread, ran, cur, b, depth, on)
	}
	return out
}

// running appends thread's time on a CPU from a to b; a goroutine's is
// its thread's (onThread; -1: not known), followed there: the thread may
// have been blocked in a system call or waiting for a CPU meanwhile.
func (f *pathFollower) running(out []Segment, thread, onThread int32, a, b int64, depth int, on map[int32]bool) []Segment {
	seg := Segment{Depth: depth, Thread: thread, Kind: SegRunning, Start: a, End: b, Wait: -1}
	if f.t.Threads[thread].GoID == 0 || onThread < 0 || int(onThread) >= len(f.by) || on[onThread] || len(f.by[onThread]) == 0 {
		return append(out, seg)
	}
	seg.Kind, seg.Why = SegFollowed, "running on "+ThreadLabel(f.t, onThread)
	out = append(out, seg)
	on[onThread] = true
	out = f.follow(out, onThread, a, b, depth+1, on)
	delete(on, onThread)
	return out
}

// blocked appends the blocked part a..b of wait wi: followed into its
// waker where there is one to follow, a leaf otherwise.
func (f *pathFollower) blocked(out []Segment, thread int32, wi int, a, b int64, depth int, on map[int32]bool) []Segment {
	w := &f.t.Waits[wi]
	seg := Segment{Depth: depth, Thread: thread, Kind: SegBlocked, Start: a, End: b, Wait: wi}
	switch {
	case w.Waker < 0 && w.IRQ:
		seg.Why = "woken by an interrupt (" + w.Class + ")"
	case w.Waker < 0 && w.Open:
		seg.Why = "still blocked when recording stopped"
	case w.Waker < 0:
		seg.Why = "no waker recorded"
	case len(f.by[w.Waker]) == 0:
		// A waker the recording did not follow (-p leaves others out):
		// its time is unknown, not on a CPU.
		seg.Why = "its waker " + ThreadLabel(f.t, w.Waker) + " was not recorded"
	case on[w.Waker]:
		seg.Why = "its waker is already on this path"
	case depth+1 >= maxPathDepth:
		seg.Why = fmt.Sprintf("%d wake-ups deep", maxPathDepth)
	default:
		seg.Kind = SegFollowed
		out = append(out, seg)
		on[w.Waker] = true
		out = f.follow(out, w.Waker, a, b, depth+1, on)
		delete(on, w.Waker)
		return out
	}
	return append(out, seg)
}

// PathCause is the time of a critical path spent in one place: a thread
// doing one kind of thing at one stack.
type PathCause struct {
	Thread   int32
	Kind     string
	Stack    int32 // the blocked stack (0: none, running)
	Verdict  string
	Ns       int64
	Segments int
}

// Causes sums the path's leaves by thread, kind and stack, largest first.
func (p *CriticalPath) Causes(t *schema.Timeline) []PathCause {
	type key struct {
		thread int32
		kind   string
		stack  int32
	}
	sums := map[key]*PathCause{}
	var order []key
	for _, s := range p.Leaves() {
		k := key{s.Thread, s.Kind, 0}
		verdict := ""
		if s.Wait >= 0 && s.Kind == SegBlocked {
			k.stack = t.Waits[s.Wait].Stack
			verdict = t.Waits[s.Wait].Verdict
		}
		c, ok := sums[k]
		if !ok {
			c = &PathCause{Thread: k.thread, Kind: k.kind, Stack: k.stack, Verdict: verdict}
			sums[k] = c
			order = append(order, k)
		}
		c.Ns += s.Duration()
		c.Segments++
	}
	out := make([]PathCause, 0, len(order))
	for _, k := range order {
		out = append(out, *sums[k])
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Ns > out[j].Ns })
	return out
}

// ThreadLabel names a timeline thread: process/thread (tid).
func ThreadLabel(t *schema.Timeline, i int32) string {
	th := t.Threads[i]
	if th.GoID != 0 {
		return fmt.Sprintf("%s/goroutine %d %s", th.Process, th.GoID, th.Name)
	}
	if th.Process != "" && th.Process != th.Name {
		return fmt.Sprintf("%s/%s (%d)", th.Process, th.Name, th.TID)
	}
	return fmt.Sprintf("%s (%d)", th.Name, th.TID)
}

// StackLeaf names a stack by its innermost frame outside the kernel and
// the kernel's innermost one before the scheduler.
func StackLeaf(t *schema.Timeline, i int32) string {
	fr := t.Stacks[i]
	var user, kern string
	for j := len(fr) - 1; j >= 0; j-- {
		switch {
		case !fr[j].Kernel && user == "":
			user = fr[j].Name
		case fr[j].Kernel && kern == "" && !strings.Contains(fr[j].Name, "schedule"):
			kern = fr[j].Name
		}
	}
	return strings.Trim(user+" → "+kern, " →")
}

// JudgeTimeline gives each wait of t the category and verdict its
// aggregated stack has in d (the same recording's profile): a verdict
// reads the whole recording (its loops, its chains), so it is reached on
// the aggregate and carried to each wait of that stack.
func JudgeTimeline(t *schema.Timeline, d *Data, r *Rules) {
	Judge(d.Stacks, r)
	type judged struct{ cat, verdict string }
	byKey := map[string]judged{}
	for i := range d.Stacks {
		s := &d.Stacks[i]
		if s.Kind != KindOffCPU || s.WaitsForCPU() {
			continue
		}
		k := timelineKey(s.TID, s.Frames, s.WakerFrames)
		if _, ok := byKey[k]; ok {
			continue
		}
		cat := r.Categorize(s)[0]
		v := "blocked"
		if r.IsIdle(cat) {
			v = "idle"
		}
		byKey[k] = judged{cat, v}
	}
	// Each thread, stack and waker stack of the timeline looked up once
	// (a flight recorder's dump holds a million waits, a few thousand of
	// those).
	seen := map[[3]int32]judged{}
	for i := range t.Waits {
		w := &t.Waits[i]
		if w.State == "preempted" {
			continue
		}
		k := [3]int32{w.Thread, w.Stack, w.WakerStack}
		j, ok := seen[k]
		if !ok {
			var wf []schema.Frame
			if w.WakerStack > 0 {
				wf = t.Stacks[w.WakerStack]
			}
			j = byKey[timelineKey(t.Threads[w.Thread].TID, t.Stacks[w.Stack], wf)]
			seen[k] = j
		}
		if j.cat != "" {
			w.Category, w.Verdict = j.cat, j.verdict
		}
	}
}

func timelineKey(tid int64, frames, waker []schema.Frame) string {
	return fmt.Sprintf("%d|%s|%s", tid, schema.FoldFrames(frames), schema.FoldFrames(waker))
}

// PathFor picks a request in t: the waits that carry span (or, without
// one, trace); its thread is the one that has most of them (a goroutine
// if any has), its range from the first one's switch-out to the last
// one's switch-in there.
func PathFor(t *schema.Timeline, span, trace string) (thread int32, start, end int64, err error) {
	key, val := schema.LabelSpanID, span
	if span == "" {
		key, val = schema.LabelTraceID, trace
	}
	n := map[int32]int{}
	for i := range t.Waits {
		if t.Waits[i].Labels[key] == val {
			n[t.Waits[i].Thread]++
		}
	}
	if len(n) == 0 {
		return 0, 0, 0, fmt.Errorf("no wait in the timeline carries %s %s: record the program with its thread context or --goroutines labels", key, val)
	}
	// A goroutine that carries it is the request's own; the thread that
	// ran it carries the same labels (its thread context) at more waits.
	goroutines := false
	for th := range n {
		goroutines = goroutines || t.Threads[th].GoID != 0
	}
	thread = -1
	for th, c := range n {
		if goroutines && t.Threads[th].GoID == 0 {
			continue
		}
		if thread < 0 || c > n[thread] || (c == n[thread] && th < thread) {
			thread = th
		}
	}
	start, end = -1, 0
	for i := range t.Waits {
		if w := &t.Waits[i]; w.Thread == thread && w.Labels[key] == val {
			if start < 0 || w.Out < start {
				start = w.Out
			}
			end = max(end, w.In)
		}
	}
	return thread, start, end, nil
}

// ThreadByTID is the index of the thread with this tid (-1: none).
func ThreadByTID(t *schema.Timeline, tid int64) int32 {
	for i, th := range t.Threads {
		if th.TID == tid {
			return int32(i)
		}
	}
	return -1
}

// GoroutineByID is the index of the goroutine with this id: an error if
// none, or if goroutines of several processes have it.
func GoroutineByID(t *schema.Timeline, goid int64) (int32, error) {
	found := int32(-1)
	for i, th := range t.Threads {
		if th.GoID != goid {
			continue
		}
		if found >= 0 {
			return -1, fmt.Errorf("goroutine %d of processes %d and %d: follow one of its waits' span (--span) instead", goid, t.Threads[found].PID, th.PID)
		}
		found = int32(i)
	}
	if found < 0 {
		return -1, fmt.Errorf("goroutine %d has no wait in the timeline (record with --goroutines --timeline)", goid)
	}
	return found, nil
}
