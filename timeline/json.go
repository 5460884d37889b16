package timeline

import (
	"bufio"
	"encoding/json"
	"io"
	"sort"
	"strconv"
	"strings"

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
// otherData.
func WriteJSON(w io.Writer, t *schema.Timeline) error {
	p, err := buildPlan(t)
	if err != nil {
		return err
	}
	j := &jsonWriter{p: p, nodes: map[frameNode]int{}, leaf: map[int32]int{}, frames: map[string]jsonFrame{}}
	evs := append(j.metadata(), j.events()...)
	bw := bufio.NewWriterSize(w, 1<<16)
	bw.WriteString(`{"traceEvents":[`)
	for i := range evs {
		if i > 0 {
			bw.WriteString(",\n")
		}
		b, err := json.Marshal(&evs[i])
		if err != nil {
			return err
		}
		bw.Write(b)
	}
	tail := struct {
		Unit   string               `json:"displayTimeUnit"`
		Frames map[string]jsonFrame `json:"stackFrames"`
		Other  map[string]int64     `json:"otherData"`
	}{"ns", j.frames, map[string]int64{"offcpu.start": t.Start, "offcpu.end": t.End, "offcpu.lost": t.Lost}}
	b, err := json.Marshal(tail)
	if err != nil {
		return err
	}
	bw.WriteString("],")
	bw.Write(b[1:])
	bw.WriteString("\n")
	return bw.Flush()
}

// usec is a time in ns written as µs with three decimals, exactly.
type usec int64

func (u usec) MarshalJSON() ([]byte, error) {
	v, sign := uint64(u), ""
	if u < 0 {
		v, sign = uint64(-(u+1))+1, "-"
	}
	frac := strconv.FormatUint(1000+v%1000, 10)[1:]
	return []byte(sign + strconv.FormatUint(v/1000, 10) + "." + frac), nil
}

type jsonEvent struct {
	Name  string         `json:"name,omitempty"`
	Cat   string         `json:"cat,omitempty"`
	Phase string         `json:"ph"`
	TS    usec           `json:"ts"`
	Dur   *usec          `json:"dur,omitempty"`
	PID   int64          `json:"pid"`
	TID   int64          `json:"tid"`
	ID    any            `json:"id,omitempty"`
	BP    string         `json:"bp,omitempty"`
	SF    int            `json:"sf,omitempty"`
	Args  map[string]any `json:"args,omitempty"`

	rank int // order among the events at TS
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
	p      *plan
	nodes  map[frameNode]int
	leaf   map[int32]int
	frames map[string]jsonFrame
}

// metadata names the processes and threads.
func (j *jsonWriter) metadata() []jsonEvent {
	var evs []jsonEvent
	seen := map[int64]bool{}
	for _, th := range j.p.t.Threads {
		if !seen[th.PID] {
			seen[th.PID] = true
			evs = append(evs, jsonEvent{Name: "process_name", Phase: "M", PID: th.PID,
				Args: map[string]any{"name": th.Process}})
		}
		evs = append(evs, jsonEvent{Name: "thread_name", Phase: "M", PID: th.PID, TID: th.TID,
			Args: map[string]any{"name": th.Name}})
	}
	return evs
}

// events are the slices' events, by time; at one time async ends first,
// then slices and async beginnings, zero-length slices, zero-length async
// ends, flow starts and flow ends.
func (j *jsonWriter) events() []jsonEvent {
	var evs []jsonEvent
	nt := len(j.p.t.Threads)
	for i := range j.p.slices {
		s := &j.p.slices[i]
		if s.track == trackWindow {
			continue
		}
		th := j.p.t.Threads[j.threadOf(s.track)]
		ev := jsonEvent{Name: s.name, Cat: s.cat, TS: usec(s.start), PID: th.PID, TID: th.TID,
			Args: j.args(s)}
		if s.stack >= 0 && int(s.stack) < len(j.p.t.Stacks) {
			ev.SF = j.stackID(s.stack)
		}
		zero := s.end == s.start
		if s.track < nt {
			dur := usec(s.end - s.start)
			ev.Phase, ev.Dur, ev.rank = "X", &dur, rankOf(zero, 2, 1)
			evs = append(evs, ev)
		} else {
			ev.Phase, ev.ID, ev.rank = "b", "s"+strconv.Itoa(i), 1
			end := jsonEvent{Name: s.name, Cat: s.cat, Phase: "e", TS: usec(s.end), PID: th.PID,
				TID: th.TID, ID: ev.ID, rank: rankOf(zero, 3, 0)}
			evs = append(evs, ev, end)
		}
		flow := jsonEvent{Name: "wakeup", Cat: catWakeup, TS: usec(s.start), PID: th.PID, TID: th.TID}
		if s.flowOut != 0 {
			flow.Phase, flow.ID, flow.rank = "s", s.flowOut, 4
			evs = append(evs, flow)
		}
		if s.flowIn != 0 {
			flow.Phase, flow.ID, flow.BP, flow.rank = "f", s.flowIn, "e", 5
			evs = append(evs, flow)
		}
	}
	sort.SliceStable(evs, func(a, b int) bool {
		if evs[a].TS != evs[b].TS {
			return evs[a].TS < evs[b].TS
		}
		return evs[a].rank < evs[b].rank
	})
	return evs
}

func rankOf(zero bool, ifZero, otherwise int) int {
	if zero {
		return ifZero
	}
	return otherwise
}

func (j *jsonWriter) threadOf(track int) int32 {
	if nt := len(j.p.t.Threads); track >= nt {
		return j.p.lanes[track-nt].thread
	}
	return int32(track)
}

// args are a slice's annotations, and its stack's frames leaf first.
func (j *jsonWriter) args(s *slice) map[string]any {
	m := jsonArgs(s.args)
	if s.stack >= 0 && int(s.stack) < len(j.p.t.Stacks) && len(j.p.t.Stacks[s.stack]) > 0 {
		st := j.p.t.Stacks[s.stack]
		names := make([]string, len(st))
		for i, f := range st {
			names[len(st)-1-i] = frameLabel(f)
		}
		if m == nil {
			m = map[string]any{}
		}
		m["stack"] = names
	}
	return m
}

func jsonArgs(args []arg) map[string]any {
	if len(args) == 0 {
		return nil
	}
	m := make(map[string]any, len(args))
	for _, a := range args {
		switch v := a.val.(type) {
		case []arg:
			m[a.key] = jsonArgs(v)
		case [][]arg:
			l := make([]map[string]any, len(v))
			for i, d := range v {
				l[i] = jsonArgs(d)
			}
			m[a.key] = l
		default:
			m[a.key] = v
		}
	}
	return m
}

// stackID is the stackFrames id of a stack's leaf (0 for an empty stack),
// adding its frames to the tree of frames.
func (j *jsonWriter) stackID(s int32) int {
	if id, ok := j.leaf[s]; ok {
		return id
	}
	id := 0
	for _, f := range j.p.t.Stacks[s] {
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
