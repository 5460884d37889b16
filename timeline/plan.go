// Package timeline owns the trace files of a schema.Timeline: it writes one
// as a Perfetto trace (the protobuf format ui.perfetto.dev and
// trace_processor read, encoded by hand) and as a Chrome JSON trace (the
// format the Catapult trace viewer and Perfetto read), and reads back,
// losslessly, the Perfetto traces it wrote.
//
// Both files show the same picture, laid out by a layout, which hands out
// its slices in time order while walking the waits, so that neither writer
// holds more than a few slices per thread: per thread a track of slices,
// "running" from a switch-in to the thread's next switch-out (only between
// two of its waits: before its first wait and after its last one the
// recording does not say what it did), blocked (Out..Wake, named by the
// wait's verdict or category, else "blocked (<state>)", carrying the
// wait's stack) and "runnable" (Wake..In, waiting for a CPU; for a
// preempted wait Out..In, carrying the stack). A wake-up is an instant
// "wakes <thread>" on the waker's track at Wake (carrying the waker's
// stack) with a flow to the woken thread's runnable slice. Request spans
// (Labels["span_id"]) are slices on "requests" tracks beside the thread's
// track, from the span's first wait's Out to its last wait's In on that
// thread.
package timeline

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

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

// kind is what a slice shows.
type kind uint8

const (
	kindWindow   kind = iota // the recording window
	kindRunning              // between two waits of a thread
	kindBlocked              // a wait's Out..Wake
	kindRunnable             // a wait's Wake..In
	kindWakeup               // an instant on the waker's track
	kindSpan                 // a request span on a requests lane
)

// slice is one slice (or, of kindWakeup, instant) of the picture.
type slice struct {
	// track: trackWindow, a thread's index (its own track), or
	// len(Threads)+i for lane i.
	track      int
	kind       kind
	start, end int64
	// of: the wait a blocked, runnable or wake-up slice shows, the span
	// (index in layout.spans) a span slice shows; -1: none.
	of int
	// full: a runnable slice that carries the wait's stack and
	// annotations, the wait having no blocked slice (it was preempted).
	full bool
	// rank orders slices starting together: instants (1) before
	// zero-length slices (2) before the others (3), so that a flow starts
	// before the slice that ends it and each track's slices stay
	// sequential; then seq, the order laid out.
	rank uint8
	seq  uint64
}

// sliceBefore is the order slices are handed out in.
func sliceBefore(a, b *slice) bool {
	if a.start != b.start {
		return a.start < b.start
	}
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.seq < b.seq
}

// endBefore is the order of slice ends: by time, then laid out.
func endBefore(a, b *slice) bool {
	if a.end != b.end {
		return a.end < b.end
	}
	return a.seq < b.seq
}

// lane is a track beside a thread's own.
type lane struct {
	thread int32
	kind   string
}

// span is one request span's waits on one thread.
type span struct {
	id, name, trace string
	thread          int32
	start, end      int64
	waits           int64
}

// layout lays out a Timeline's picture and hands out its slices by start.
// It merges sources whose slices come in order of a lower bound: each
// thread's waits (by Out), the wake-ups (by Wake) and the spans (by
// start); a slice is handed out once no source can lay out an earlier one.
type layout struct {
	t       *schema.Timeline
	threads []threadCursor
	order   []int32 // wait indices by thread, each thread's by Out
	wakeups []int32 // the waits a known thread woke, by Wake
	spans   []span  // by start
	nw, ns  int     // the next wake-up and span
	lanes   []lane
	laneEnd []int64
	free    map[lane][]int // the lanes of each thread and kind
	pending heapOf[slice]
	sources heapOf[source]
	seq     uint64
}

// threadCursor is where a thread's waits are laid out to.
type threadCursor struct {
	next, end int32 // positions in layout.order
	cursor    int64 // where its track is free from
	have, ran bool  // a wait laid out on its track; and that wait not open
}

// source is a thread (src < len(Threads)), the wake-ups or the spans, and
// the earliest start of a slice still to come from it.
type source struct {
	lb  int64
	src int
}

func sourceBefore(a, b *source) bool { return a.lb < b.lb || a.lb == b.lb && a.src < b.src }

// newLayout lays t out; an invalid t is an error.
func newLayout(t *schema.Timeline) (*layout, error) {
	if err := validate(t); err != nil {
		return nil, err
	}
	l := &layout{t: t, free: map[lane][]int{}, spans: spanList(t)}
	l.pending.less, l.sources.less = sliceBefore, sourceBefore
	l.index()
	l.add(slice{track: trackWindow, kind: kindWindow, start: t.Start, end: max(t.End, t.Start), of: -1})
	for th, c := range l.threads {
		if c.next < c.end {
			l.sources.push(source{t.Waits[l.order[c.next]].Out, th})
		}
	}
	nt := len(t.Threads)
	if len(l.wakeups) > 0 {
		l.sources.push(source{t.Waits[l.wakeups[0]].Wake, nt})
	}
	if len(l.spans) > 0 {
		l.sources.push(source{l.spans[0].start, nt + 1})
	}
	return l, nil
}

// index sorts the waits by thread and Out, and the wake-ups by Wake: two
// ints per wait, all the layout keeps that grows with the waits.
func (l *layout) index() {
	t := l.t
	nt := len(t.Threads)
	off := make([]int32, nt+1)
	nwake := 0
	for i := range t.Waits {
		off[t.Waits[i].Thread+1]++
		if t.Waits[i].Waker >= 0 {
			nwake++
		}
	}
	l.threads = make([]threadCursor, nt)
	for th := range nt {
		off[th+1] += off[th]
		l.threads[th] = threadCursor{next: off[th], end: off[th]}
	}
	l.order, l.wakeups = make([]int32, len(t.Waits)), make([]int32, 0, nwake)
	for i := range t.Waits {
		c := &l.threads[t.Waits[i].Thread]
		l.order[c.end], c.end = int32(i), c.end+1
		if t.Waits[i].Waker >= 0 {
			l.wakeups = append(l.wakeups, int32(i))
		}
	}
	byOut := func(a, b int32) int { return cmp.Or(cmp.Compare(t.Waits[a].Out, t.Waits[b].Out), cmp.Compare(a, b)) }
	for th := range nt {
		slices.SortFunc(l.order[off[th]:off[th+1]], byOut)
	}
	slices.SortFunc(l.wakeups, func(a, b int32) int {
		return cmp.Or(cmp.Compare(t.Waits[a].Wake, t.Waits[b].Wake), cmp.Compare(a, b))
	})
}

func (l *layout) add(s slice) {
	switch {
	case s.kind == kindWakeup:
		s.rank = 1
	case s.end == s.start:
		s.rank = 2
	default:
		s.rank = 3
	}
	l.seq++
	s.seq = l.seq
	l.pending.push(s)
}

// next is the next slice by start; false when there are no more.
func (l *layout) next() (slice, bool) {
	for len(l.sources.items) > 0 && (len(l.pending.items) == 0 || l.sources.items[0].lb <= l.pending.items[0].start) {
		s := &l.sources.items[0]
		var more bool
		switch nt := len(l.t.Threads); {
		case s.src < nt:
			s.lb, more = l.threadNext(int32(s.src))
		case s.src == nt:
			s.lb, more = l.wakeupNext()
		default:
			s.lb, more = l.spanNext()
		}
		if more {
			l.sources.down(0)
		} else {
			l.sources.pop()
		}
	}
	if len(l.pending.items) == 0 {
		return slice{}, false
	}
	return l.pending.pop(), true
}

// threadNext lays out the thread's next wait, then the running slice to
// the wait after it when that one follows on the thread's track (so that
// no slice starts before the Out it returns, the next wait's).
func (l *layout) threadNext(th int32) (int64, bool) {
	c := &l.threads[th]
	wi := int(l.order[c.next])
	c.next++
	w := &l.t.Waits[wi]
	track := int(th)
	if c.have && w.Out < c.cursor {
		track = l.laneFor(th, laneOverlap, w.Out, waitEnd(w))
	} else {
		c.cursor, c.have, c.ran = waitEnd(w), true, !w.Open
	}
	if w.Wake > w.Out {
		l.add(slice{track: track, kind: kindBlocked, start: w.Out, end: w.Wake, of: wi})
	}
	rs := max(w.Wake, w.Out)
	l.add(slice{track: track, kind: kindRunnable, start: rs, end: max(w.In, rs), of: wi, full: w.Wake <= w.Out})
	if c.next == c.end {
		return 0, false
	}
	next := l.t.Waits[l.order[c.next]].Out
	if c.ran && next > c.cursor {
		l.add(slice{track: int(th), kind: kindRunning, start: c.cursor, end: next, of: -1})
	}
	return next, true
}

func (l *layout) wakeupNext() (int64, bool) {
	wi := int(l.wakeups[l.nw])
	l.nw++
	w := &l.t.Waits[wi]
	l.add(slice{track: int(w.Waker), kind: kindWakeup, start: w.Wake, end: w.Wake, of: wi})
	if l.nw == len(l.wakeups) {
		return 0, false
	}
	return l.t.Waits[l.wakeups[l.nw]].Wake, true
}

func (l *layout) spanNext() (int64, bool) {
	i := l.ns
	l.ns++
	s := &l.spans[i]
	l.add(slice{track: l.laneFor(s.thread, laneRequests, s.start, s.end), kind: kindSpan,
		start: s.start, end: s.end, of: i})
	if l.ns == len(l.spans) {
		return 0, false
	}
	return l.spans[l.ns].start, true
}

// laneFor is the track of a new slice start..end on a lane of the thread's
// of that kind: the first one free by start, or a new one.
func (l *layout) laneFor(th int32, kind string, start, end int64) int {
	key := lane{th, kind}
	for _, i := range l.free[key] {
		if l.laneEnd[i] <= start {
			l.laneEnd[i] = end
			return len(l.t.Threads) + i
		}
	}
	i := len(l.lanes)
	l.lanes = append(l.lanes, key)
	l.laneEnd = append(l.laneEnd, end)
	l.free[key] = append(l.free[key], i)
	return len(l.t.Threads) + i
}

// threadOf is the thread whose track or lane a track is.
func (l *layout) threadOf(track int) int32 {
	if nt := len(l.t.Threads); track >= nt {
		return l.lanes[track-nt].thread
	}
	return int32(track)
}

// waitEnd is where a wait's slices end, even in damaged input.
func waitEnd(w *schema.Wait) int64 { return max(w.Out, w.Wake, w.In) }

// blockedName names a blocked slice by the wait's verdict or category,
// else by its state (names, "blocked (<state>)" by state, saves building
// one per wait).
func blockedName(w *schema.Wait, names map[string]string) string {
	switch {
	case w.Verdict != "":
		return w.Verdict
	case w.Category != "":
		return w.Category
	case w.State == "":
		return "blocked"
	}
	n, ok := names[w.State]
	if !ok {
		n = "blocked (" + w.State + ")"
		names[w.State] = n
	}
	return n
}

// threadLabel names a thread in slice names and annotations.
func threadLabel(t *schema.Timeline, th int32) string {
	tt := &t.Threads[th]
	id := "[" + strconv.FormatInt(tt.TID, 10) + "]"
	if tt.GoID != 0 {
		id = "[g" + strconv.FormatInt(tt.GoID, 10) + "]"
	}
	if tt.Name == "" {
		return id
	}
	return tt.Name + " " + id
}

// spanList is the request spans, a span per id and thread, by start (and
// first wait).
func spanList(t *schema.Timeline) []span {
	type key struct {
		id string
		th int32
	}
	at := map[key]int{}
	var all []span
	for i := range t.Waits {
		w := &t.Waits[i]
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
	slices.SortStableFunc(all, func(a, b span) int { return cmp.Compare(a.start, b.start) })
	return all
}

// spanName is a span slice's name: the span's, else its id's.
func spanName(s *span) string {
	if s.name != "" {
		return s.name
	}
	return "span " + s.id
}

// validate checks that every index in t is in range (stack 0, the empty
// stack, always is).
func validate(t *schema.Timeline) error {
	if len(t.Waits) > math.MaxInt32 {
		return fmt.Errorf("timeline: %d waits", len(t.Waits))
	}
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

// heapOf is a binary min-heap by less (container/heap would box each
// item pushed).
type heapOf[T any] struct {
	items []T
	less  func(a, b *T) bool
}

func (h *heapOf[T]) push(x T) {
	h.items = append(h.items, x)
	for i := len(h.items) - 1; i > 0; {
		p := (i - 1) / 2
		if !h.less(&h.items[i], &h.items[p]) {
			break
		}
		h.items[i], h.items[p] = h.items[p], h.items[i]
		i = p
	}
}

func (h *heapOf[T]) pop() T {
	n := len(h.items) - 1
	h.items[0], h.items[n] = h.items[n], h.items[0]
	x := h.items[n]
	h.items = h.items[:n]
	h.down(0)
	return x
}

// down restores the order below i after items[i] grew.
func (h *heapOf[T]) down(i int) {
	for {
		c := 2*i + 1
		if c >= len(h.items) {
			return
		}
		if c+1 < len(h.items) && h.less(&h.items[c+1], &h.items[c]) {
			c++
		}
		if !h.less(&h.items[c], &h.items[i]) {
			return
		}
		h.items[i], h.items[c] = h.items[c], h.items[i]
		i = c
	}
}

// goroutineTrackName names a goroutine's track, which ReadPerfetto knows
// it by: "goroutine ID", then its function if known.
func goroutineTrackName(th *schema.TimelineThread) string {
	n := "goroutine " + strconv.FormatInt(th.GoID, 10)
	if th.Name != "" {
		n += " " + th.Name
	}
	return n
}

// parseGoroutineTrack reads goroutineTrackName's name.
func parseGoroutineTrack(s string) (goid int64, name string, ok bool) {
	rest, found := strings.CutPrefix(s, "goroutine ")
	if !found {
		return 0, "", false
	}
	id, name, _ := strings.Cut(rest, " ")
	goid, err := strconv.ParseInt(id, 10, 64)
	return goid, name, err == nil && goid != 0
}
