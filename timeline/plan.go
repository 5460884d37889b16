// Package timeline owns the trace files of a schema.Timeline: it writes one
// as a Perfetto trace (the protobuf format ui.perfetto.dev and
// trace_processor read, encoded by hand) and as a Chrome JSON trace (the
// format the Catapult trace viewer and Perfetto read), and reads back,
// losslessly, the Perfetto traces it wrote.
//
// Both files show the same picture, laid out once by buildPlan: per thread
// a track of slices, "running" from a switch-in to the thread's next
// switch-out (only between two of its waits: before its first wait and
// after its last one the recording does not say what it did), blocked
// (Out..Wake, named by the wait's verdict or category, else
// "blocked (<state>)", carrying the wait's stack) and "runnable"
// (Wake..In, waiting for a CPU; for a preempted wait Out..In, carrying the
// stack). A wake-up is an instant "wakes <thread>" on the waker's track at
// Wake (carrying the waker's stack) with a flow to the woken thread's
// runnable slice. Request spans (Labels["span_id"]) are slices on "requests"
// tracks beside the thread's track, from the span's first wait's Out to its
// last wait's In on that thread.
package timeline

import (
	"fmt"
	"sort"
	"strconv"

	"github.com/offcpu/offcpu/schema"
)

// Options are WritePerfetto's settings.
type Options struct {
	// Name: the trace's title, the name of its top track ("offcpu" when
	// empty).
	Name string
}

// Slice categories, also the TrackEvent categories and JSON "cat"s.
const (
	catWindow   = "offcpu"
	catRunning  = "running"
	catBlocked  = "blocked"
	catRunnable = "runnable"
	catWakeup   = "wakeup"
	catRequest  = "request"
)

// Lane kinds: the names of the tracks beside a thread's own.
const (
	laneRequests = "requests"
	// laneOverlap holds waits that overlap an earlier wait of the same
	// thread (a thread is off a CPU once at a time, so only in damaged
	// input), so that every track's slices stay sequential.
	laneOverlap = "overlapping waits"
)

// trackWindow is the track of the recording window slice.
const trackWindow = -1

// arg is one annotation of a slice: val is a string, int64, bool, []arg
// (a dictionary) or [][]arg (an array of dictionaries).
type arg struct {
	key string
	val any
}

// slice is one slice (or instant, when instant) of the picture.
type slice struct {
	// track: trackWindow, a thread's index (its own track), or
	// len(Threads)+i for lane i.
	track      int
	name, cat  string
	start, end int64
	instant    bool
	stack      int32 // index in Stacks; -1: none
	// flowOut starts a flow here, flowIn ends one; 0: none.
	flowOut, flowIn uint64
	wait            int // the wait whose record this slice carries; -1: none
	args            []arg
}

// lane is a track beside a thread's own.
type lane struct {
	thread int32
	kind   string
}

// plan is the picture of a Timeline both writers draw.
type plan struct {
	t       *schema.Timeline
	slices  []slice
	lanes   []lane
	laneEnd []int64
	free    map[lane][]int // the lanes of each thread and kind
}

// buildPlan lays t out; t must be valid.
func buildPlan(t *schema.Timeline) (*plan, error) {
	if err := validate(t); err != nil {
		return nil, err
	}
	p := &plan{t: t, free: map[lane][]int{}}
	p.add(slice{track: trackWindow, name: "recording", cat: catWindow, start: t.Start,
		end: max(t.End, t.Start), stack: -1, wait: -1, args: []arg{{"lost", t.Lost}}})
	by := t.ByThread()
	for th, ws := range by {
		p.threadWaits(int32(th), ws)
	}
	p.wakeups()
	p.spans()
	return p, nil
}

func (p *plan) add(s slice) { p.slices = append(p.slices, s) }

// laneFor is the track of a new slice start..end on a lane of the thread's
// of that kind: the first one free by start, or a new one.
func (p *plan) laneFor(th int32, kind string, start, end int64) int {
	key := lane{th, kind}
	for _, l := range p.free[key] {
		if p.laneEnd[l] <= start {
			p.laneEnd[l] = end
			return len(p.t.Threads) + l
		}
	}
	l := len(p.lanes)
	p.lanes = append(p.lanes, key)
	p.laneEnd = append(p.laneEnd, end)
	p.free[key] = append(p.free[key], l)
	return len(p.t.Threads) + l
}

// waitEnd is where a wait's slices end, even in damaged input.
func waitEnd(w *schema.Wait) int64 { return max(w.Out, w.Wake, w.In) }

// threadWaits lays out one thread's waits (ws, by Out) and the running
// slices between them.
func (p *plan) threadWaits(th int32, ws []int) {
	var cursor int64
	have, ran := false, false
	for _, wi := range ws {
		w := &p.t.Waits[wi]
		track := int(th)
		if have && w.Out < cursor {
			track = p.laneFor(th, laneOverlap, w.Out, waitEnd(w))
		} else {
			if ran && w.Out > cursor {
				p.add(slice{track: track, name: "running", cat: catRunning, start: cursor,
					end: w.Out, stack: -1, wait: -1})
			}
			cursor, have, ran = waitEnd(w), true, !w.Open
		}
		p.waitSlices(track, wi)
	}
}

// waitSlices adds a wait's blocked slice (when it was blocked at all) and
// its runnable slice, which carries the wait's record and the end of its
// wake-up's flow.
func (p *plan) waitSlices(track, wi int) {
	w := &p.t.Waits[wi]
	args := p.waitArgs(w)
	stack := w.Stack
	if w.Wake > w.Out {
		p.add(slice{track: track, name: blockedName(w), cat: catBlocked, start: w.Out,
			end: w.Wake, stack: w.Stack, wait: -1, args: args})
		stack = -1
	}
	var flow uint64
	if w.Waker >= 0 {
		flow = uint64(wi) + 1
	}
	rs := max(w.Wake, w.Out)
	p.add(slice{track: track, name: "runnable", cat: catRunnable, start: rs,
		end: max(w.In, rs), stack: stack, flowIn: flow, wait: wi, args: args})
}

// blockedName names a blocked slice by the wait's verdict or category,
// else by its state.
func blockedName(w *schema.Wait) string {
	switch {
	case w.Verdict != "":
		return w.Verdict
	case w.Category != "":
		return w.Category
	case w.State != "":
		return "blocked (" + w.State + ")"
	}
	return "blocked"
}

// waitArgs are the annotations a reader of the trace sees on a wait's
// slices; ReadPerfetto reads the strings back from them.
func (p *plan) waitArgs(w *schema.Wait) []arg {
	var a []arg
	for _, kv := range [...]struct{ k, v string }{{"state", w.State}, {"class", w.Class},
		{"verdict", w.Verdict}, {"category", w.Category}} {
		if kv.v != "" {
			a = append(a, arg{kv.k, kv.v})
		}
	}
	if w.Waker >= 0 {
		a = append(a, arg{"waker", p.threadLabel(w.Waker)})
	}
	if w.IRQ {
		a = append(a, arg{"irq", true})
	}
	if w.Open {
		a = append(a, arg{"open", true})
	}
	if len(w.Labels) > 0 {
		keys := make([]string, 0, len(w.Labels))
		for k := range w.Labels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		d := make([]arg, len(keys))
		for i, k := range keys {
			d[i] = arg{k, w.Labels[k]}
		}
		a = append(a, arg{"labels", d})
	}
	return a
}

// threadLabel names a thread in slice names and annotations.
func (p *plan) threadLabel(th int32) string {
	t := &p.t.Threads[th]
	id := "[" + strconv.FormatInt(t.TID, 10) + "]"
	if t.Name == "" {
		return id
	}
	return t.Name + " " + id
}

// wakeups adds an instant on the waker's track per wake-up by a known
// thread, starting the flow the woken thread's runnable slice ends.
func (p *plan) wakeups() {
	for wi := range p.t.Waits {
		w := &p.t.Waits[wi]
		if w.Waker < 0 {
			continue
		}
		args := []arg{{"woken", p.threadLabel(w.Thread)}}
		if w.Class != "" {
			args = append(args, arg{"class", w.Class})
		}
		p.add(slice{track: int(w.Waker), name: "wakes " + p.threadLabel(w.Thread), cat: catWakeup,
			start: w.Wake, end: w.Wake, instant: true, stack: w.WakerStack,
			flowOut: uint64(wi) + 1, wait: -1, args: args})
	}
}

// span is one request span's waits on one thread.
type span struct {
	id, name, trace string
	thread          int32
	start, end      int64
	waits           int64
}

// spans adds a slice per span and thread on the thread's requests lanes.
func (p *plan) spans() {
	type key struct {
		id string
		th int32
	}
	at := map[key]int{}
	var all []span
	for i := range p.t.Waits {
		w := &p.t.Waits[i]
		id := w.Labels["span_id"]
		if id == "" {
			continue
		}
		k := key{id, w.Thread}
		j, ok := at[k]
		if !ok {
			j, at[k] = len(all), len(all)
			all = append(all, span{id: id, thread: w.Thread, start: w.Out, end: waitEnd(w)})
		}
		s := &all[j]
		s.start, s.end, s.waits = min(s.start, w.Out), max(s.end, waitEnd(w)), s.waits+1
		if s.name == "" {
			s.name = w.Labels["span_name"]
		}
		if s.trace == "" {
			s.trace = w.Labels["trace_id"]
		}
	}
	sort.SliceStable(all, func(i, j int) bool {
		if all[i].thread != all[j].thread {
			return all[i].thread < all[j].thread
		}
		return all[i].start < all[j].start
	})
	for _, s := range all {
		p.addSpan(s)
	}
}

func (p *plan) addSpan(s span) {
	name := s.name
	if name == "" {
		name = "span " + s.id
	}
	args := []arg{{"span_id", s.id}}
	if s.trace != "" {
		args = append(args, arg{"trace_id", s.trace})
	}
	args = append(args, arg{"waits", s.waits})
	p.add(slice{track: p.laneFor(s.thread, laneRequests, s.start, s.end), name: name,
		cat: catRequest, start: s.start, end: s.end, stack: -1, wait: -1, args: args})
}

// validate checks that every index in t is in range (stack 0, the empty
// stack, always is).
func validate(t *schema.Timeline) error {
	nt, ns := int32(len(t.Threads)), int32(len(t.Stacks))
	okStack := func(s int32) bool { return s == 0 || (s > 0 && s < ns) }
	for i := range t.Waits {
		w := &t.Waits[i]
		switch {
		case w.Thread < 0 || w.Thread >= nt:
			return fmt.Errorf("timeline: wait %d: thread %d of %d", i, w.Thread, nt)
		case w.Waker < -1 || w.Waker >= nt:
			return fmt.Errorf("timeline: wait %d: waker %d of %d threads", i, w.Waker, nt)
		case !okStack(w.Stack):
			return fmt.Errorf("timeline: wait %d: stack %d of %d", i, w.Stack, ns)
		case !okStack(w.WakerStack):
			return fmt.Errorf("timeline: wait %d: waker stack %d of %d", i, w.WakerStack, ns)
		}
	}
	return nil
}
