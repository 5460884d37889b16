package timeline

import (
	"bufio"
	"encoding/json"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/offcpu/offcpu/schema"
)

// WriteJSON writes t as a Chrome JSON trace (the trace-event format of
// Catapult's trace viewer, $GOROOT/src/internal/trace/traceviewer, which
// Perfetto reads too): {"traceEvents":[...],"displayTimeUnit":"ns",
// "stackFrames":{...},"otherData":{...}}, times in µs with the ns as
// decimals. Each thread's slices are "X" complete events on its pid/tid
// ("M" process_name and thread_name events name them), request spans (and
// waits overlapping an earlier one of their thread) nestable async "b"/"e"
// pairs, a wake-up a zero-length "X" on the waker's thread and a flow "s"
// there, ending in an "f" (binding point "e": the woken thread's slice at
// the wake-up) on the woken thread. Stacks are "sf" references into
// stackFrames and, for viewers that ignore those (Perfetto), a "stack"
// argument of frames, leaf first. The window and the lost count are in
// otherData. Events are written by start as the layout hands out slices
// (an async end when the next start passes it), encoded by hand, so that
// memory does not grow with the waits.
func WriteJSON(w io.Writer, t *schema.Timeline) error {
	l, err := newLayout(t)
	if err != nil {
		return err
	}
	j := &jsonWriter{t: t, l: l, out: bufio.NewWriterSize(w, 1<<16), nodes: map[frameNode]int{},
		leaf: map[int32]int{}, frames: map[string]jsonFrame{}, blocked: map[string]string{},
		stacks: make([][]byte, len(t.Stacks)), names: make([]string, len(t.Threads)),
		wakes: make([]string, len(t.Threads))}
	j.ends.less = endBefore
	j.out.WriteString(`{"traceEvents":[`)
	j.metadata()
	for s, ok := l.next(); ok; s, ok = l.next() {
		j.endsUntil(s.start)
		j.slice(&s)
	}
	j.endsUntil(math.MaxInt64)
	tail := struct {
		Unit   string               `json:"displayTimeUnit"`
		Frames map[string]jsonFrame `json:"stackFrames"`
		Other  map[string]int64     `json:"otherData"`
	}{"ns", j.frames, map[string]int64{"offcpu.start": t.Start, "offcpu.end": t.End, "offcpu.lost": t.Lost}}
	b, err := json.Marshal(tail)
	if err != nil {
		return err
	}
	j.out.WriteString("],")
	j.out.Write(b[1:])
	j.out.WriteString("\n")
	return j.out.Flush()
}

// appendUsec appends a time in ns as µs with three decimals, exactly.
func appendUsec(b []byte, ns int64) []byte {
	v := uint64(ns)
	if ns < 0 {
		v, b = uint64(-(ns+1))+1, append(b, '-')
	}
	b = strconv.AppendUint(b, v/1000, 10)
	return append(b, '.', byte('0'+v%1000/100), byte('0'+v%100/10), byte('0'+v%10))
}

// jsonShort are the control characters JSON escapes by a letter.
var jsonShort = [0x20]byte{'\b': 'b', '\f': 'f', '\n': 'n', '\r': 'r', '\t': 't'}

// appendString appends s as a JSON string, invalid UTF-8 as U+FFFD.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 && jsonShort[c] != 0:
			b = append(b, '\\', jsonShort[c])
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		case c < utf8.RuneSelf:
			b = append(b, c)
		default:
			r, n := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && n == 1 {
				b = append(b, `\ufffd`...)
			} else {
				b = append(b, s[i:i+n]...)
			}
			i += n
			continue
		}
		i++
	}
	return append(b, '"')
}

type jsonFrame struct {
	Name     string `json:"name"`
	Category string `json:"category,omitempty"`
	Parent   int    `json:"parent,omitempty"`
}

type frameNode struct {
	parent int
	f      schema.Frame
}

type jsonWriter struct {
	t      *schema.Timeline
	l      *layout
	out    *bufio.Writer
	n      int    // events written
	b      []byte // the event being written
	ends   heapOf[slice]
	nodes  map[frameNode]int
	leaf   map[int32]int
	frames map[string]jsonFrame
	// Made once, on first use: by stack, its "stack" argument; by thread,
	// its label and its wake-ups' name; by state, its blocked slices' name.
	stacks  [][]byte
	names   []string
	wakes   []string
	blocked map[string]string
	keys    []string
}

// head starts an event (dur < 0: none); the caller adds members and ends
// it with done.
func (j *jsonWriter) head(name, cat, ph string, ts, dur, pid, tid int64) {
	b := j.b[:0]
	if j.n > 0 {
		b = append(b, ",\n"...)
	}
	j.n++
	b = append(b, '{')
	if name != "" {
		b = append(appendString(append(b, `"name":`...), name), ',')
	}
	if cat != "" {
		b = append(appendString(append(b, `"cat":`...), cat), ',')
	}
	b = append(append(append(b, `"ph":"`...), ph...), `","ts":`...)
	b = appendUsec(b, ts)
	if dur >= 0 {
		b = appendUsec(append(b, `,"dur":`...), dur)
	}
	b = strconv.AppendInt(append(b, `,"pid":`...), pid, 10)
	j.b = strconv.AppendInt(append(b, `,"tid":`...), tid, 10)
}

func (j *jsonWriter) done() {
	j.b = append(j.b, '}')
	j.out.Write(j.b)
}

// metadata names the processes and threads.
func (j *jsonWriter) metadata() {
	seen := map[int64]bool{}
	for _, th := range j.t.Threads {
		if !seen[th.PID] {
			seen[th.PID] = true
			j.head("process_name", "", "M", 0, -1, th.PID, 0)
			j.b = append(appendString(append(j.b, `,"args":{"name":`...), th.Process), '}')
			j.done()
		}
		name := th.Name
		if th.GoID != 0 {
			name = goroutineTrackName(&th)
		}
		j.head("thread_name", "", "M", 0, -1, th.PID, jsonTID(&th))
		j.b = append(appendString(append(j.b, `,"args":{"name":`...), name), '}')
		j.done()
	}
}

// endsUntil writes the async ends due by ts.
func (j *jsonWriter) endsUntil(ts int64) {
	for len(j.ends.items) > 0 && j.ends.items[0].end <= ts {
		s := j.ends.pop()
		j.asyncEnd(&s)
	}
}

// slice writes a slice's events: an "X" on its thread's track, a "b" (and
// later an "e") on a lane; the flow a wake-up starts or a runnable slice
// ends.
func (j *jsonWriter) slice(s *slice) {
	if s.kind == kindWindow {
		return
	}
	th := &j.t.Threads[j.l.threadOf(s.track)]
	name, cat, stack := j.describe(s)
	if s.track < len(j.t.Threads) {
		j.head(name, cat, "X", s.start, s.end-s.start, th.PID, jsonTID(th))
	} else {
		j.head(name, cat, "b", s.start, -1, th.PID, jsonTID(th))
		j.b = append(strconv.AppendUint(append(j.b, `,"id":"s`...), s.seq, 10), '"')
	}
	if stack >= 0 && int(stack) < len(j.t.Stacks) {
		if sf := j.stackID(stack); sf != 0 {
			j.b = strconv.AppendInt(append(j.b, `,"sf":`...), int64(sf), 10)
		}
	}
	j.args(s, stack)
	j.done()
	switch {
	case s.track < len(j.t.Threads):
	case s.end == s.start:
		j.asyncEnd(s)
	default:
		j.ends.push(*s)
	}
	if s.kind == kindWakeup {
		j.head("wakeup", catWakeup, "s", s.start, -1, th.PID, jsonTID(th))
		j.b = strconv.AppendInt(append(j.b, `,"id":`...), int64(s.of)+1, 10)
		j.done()
	}
	if s.kind == kindRunnable && j.t.Waits[s.of].Waker >= 0 {
		j.head("wakeup", catWakeup, "f", s.start, -1, th.PID, jsonTID(th))
		j.b = append(strconv.AppendInt(append(j.b, `,"id":`...), int64(s.of)+1, 10), `,"bp":"e"`...)
		j.done()
	}
}

func (j *jsonWriter) asyncEnd(s *slice) {
	th := &j.t.Threads[j.l.threadOf(s.track)]
	name, cat, _ := j.describe(s)
	j.head(name, cat, "e", s.end, -1, th.PID, jsonTID(th))
	j.b = append(strconv.AppendUint(append(j.b, `,"id":"s`...), s.seq, 10), '"')
	j.done()
}

// describe is a slice's name, category and stack (-1: none).
func (j *jsonWriter) describe(s *slice) (string, string, int32) {
	switch s.kind {
	case kindRunning:
		return "running", catRunning, -1
	case kindSpan:
		return spanName(&j.l.spans[s.of]), catRequest, -1
	}
	w := &j.t.Waits[s.of]
	switch {
	case s.kind == kindBlocked:
		return blockedName(w, j.blocked), catBlocked, w.Stack
	case s.kind == kindRunnable && s.full:
		return "runnable", catRunnable, w.Stack
	case s.kind == kindRunnable:
		return "runnable", catRunnable, -1
	}
	if j.wakes[w.Thread] == "" {
		j.wakes[w.Thread] = "wakes " + j.label(w.Thread)
	}
	return j.wakes[w.Thread], catWakeup, w.WakerStack
}

func (j *jsonWriter) label(th int32) string {
	if j.names[th] == "" {
		j.names[th] = threadLabel(j.t, th)
	}
	return j.names[th]
}

// jsonObj appends a JSON object's members.
type jsonObj struct {
	b []byte
	n int
}

func (o *jsonObj) key(k string) {
	if o.n > 0 {
		o.b = append(o.b, ',')
	}
	o.n++
	o.b = append(appendString(o.b, k), ':')
}

func (o *jsonObj) str(k, v string) {
	if v != "" {
		o.key(k)
		o.b = appendString(o.b, v)
	}
}

func (o *jsonObj) yes(k string, v bool) {
	if v {
		o.key(k)
		o.b = append(o.b, "true"...)
	}
}

// args adds a slice's annotations, their keys sorted, and its stack's
// frames leaf first.
func (j *jsonWriter) args(s *slice, stack int32) {
	mark := len(j.b)
	o := jsonObj{b: append(j.b, `,"args":{`...)}
	stackArg := func() {
		if stack >= 0 && int(stack) < len(j.t.Stacks) && len(j.t.Stacks[stack]) > 0 {
			o.key("stack")
			o.b = append(o.b, j.stackArg(stack)...)
		}
	}
	switch s.kind {
	case kindBlocked, kindRunnable:
		w := &j.t.Waits[s.of]
		o.str("category", w.Category)
		o.str("class", w.Class)
		o.yes("irq", w.IRQ)
		if len(w.Labels) > 0 {
			o.key("labels")
			o.b = j.labels(o.b, w.Labels)
		}
		o.yes("open", w.Open)
		stackArg()
		o.str("state", w.State)
		o.str("verdict", w.Verdict)
		if w.Waker >= 0 {
			o.str("waker", j.label(w.Waker))
		}
	case kindWakeup:
		o.str("class", j.t.Waits[s.of].Class)
		stackArg()
	case kindSpan:
		sp := &j.l.spans[s.of]
		o.str("span_id", sp.id)
		o.str("trace_id", sp.trace)
		o.key("waits")
		o.b = strconv.AppendInt(o.b, sp.waits, 10)
	}
	if j.b = o.b; o.n == 0 {
		j.b = j.b[:mark]
	} else {
		j.b = append(j.b, '}')
	}
}

// labels appends a wait's labels as an object, keys sorted.
func (j *jsonWriter) labels(b []byte, l map[string]string) []byte {
	j.keys = j.keys[:0]
	for k := range l {
		j.keys = append(j.keys, k)
	}
	slices.Sort(j.keys)
	o := jsonObj{b: append(b, '{')}
	for _, k := range j.keys {
		o.key(k)
		o.b = appendString(o.b, l[k])
	}
	return append(o.b, '}')
}

// stackArg is a stack's "stack" argument: its frames' labels leaf first.
func (j *jsonWriter) stackArg(s int32) []byte {
	if j.stacks[s] == nil {
		st := j.t.Stacks[s]
		b := []byte{'['}
		for i := len(st) - 1; i >= 0; i-- {
			if i < len(st)-1 {
				b = append(b, ',')
			}
			b = appendString(b, frameLabel(st[i]))
		}
		j.stacks[s] = append(b, ']')
	}
	return j.stacks[s]
}

// stackID is the stackFrames id of a stack's leaf (0 for an empty stack),
// adding its frames to the tree of frames.
func (j *jsonWriter) stackID(s int32) int {
	if id, ok := j.leaf[s]; ok {
		return id
	}
	id := 0
	for _, f := range j.t.Stacks[s] {
		k := frameNode{id, f}
		n, ok := j.nodes[k]
		if !ok {
			n = len(j.nodes) + 1
			j.nodes[k] = n
			j.frames[strconv.Itoa(n)] = jsonFrame{Name: f.Name, Category: frameCategory(f), Parent: id}
		}
		id = n
	}
	j.leaf[s] = id
	return id
}

// frameCategory says where a frame is: its module, "kernel", its runtime.
func frameCategory(f schema.Frame) string {
	var parts []string
	if f.Module != "" {
		parts = append(parts, f.Module)
	}
	if f.Kernel {
		parts = append(parts, "kernel")
	}
	if f.Runtime != "" {
		parts = append(parts, f.Runtime)
	}
	return strings.Join(parts, " ")
}

func frameLabel(f schema.Frame) string {
	if c := frameCategory(f); c != "" {
		return f.Name + " (" + c + ")"
	}
	return f.Name
}

// jsonTID is a thread's tid; a goroutine's, its id past any tid's range
// (a tid is below 2^22).
func jsonTID(th *schema.TimelineThread) int64 {
	if th.GoID != 0 {
		return 1<<32 + th.GoID
	}
	return th.TID
}
