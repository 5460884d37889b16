package timeline

import (
	"bufio"
	"fmt"
	"hash/fnv"
	"io"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/offcpu/offcpu/schema"
)

// Perfetto traces written here are one packet sequence (sequenceID). Its
// first packet clears the incremental state, sets the sequence's default
// clock to CLOCK_MONOTONIC (TracePacketDefaults.timestamp_clock_id, which
// trace_processor's proto_trace_reader.cc honours for every timestamped
// packet; without a ClockSnapshot it takes MONOTONIC as aligned with the
// trace clock, so the times read as recorded) and interns every stack.
//
// Callstacks: each blocked slice (the runnable slice of a preempted wait,
// the waker's wake-up instant) carries TrackEvent.callstack_iid, a
// Callstack interned in InternedData.callstacks whose frames are interned
// Frames (InternedData.frames: function_name_id into function_names,
// mapping_id into mappings, whose path is the frame's Module, and kind:
// KIND_KERNEL, KIND_NATIVE, or kind_str naming the language runtime), the
// same tables perf samples use. Interned rather than
// TrackEvent.callstack (InlineCallstack), because the inline form holds
// only function names and source lines, and a recording's thousands of
// waits share a few hundred stacks. trace_processor (track_event_event_importer.h,
// ParseCallstack) puts both forms into __intrinsic_track_event_callstacks,
// and the Perfetto UI shows that as a "Callstack" section in the slice's
// details (plugins/dev.perfetto.TraceProcessorTrack/callstack_details_section.ts)
// and as a flamegraph of an area selection.
//
// Round trip: what the picture cannot hold exactly, ReadPerfetto reads
// from annotations: each wait's runnable slice carries an "offcpu.wait"
// dictionary (its index, thread, times, stacks, waker and flags beside the
// visible state, class, verdict, category and labels), and the recording
// window's slice an "offcpu.timeline" one (format, window, lost, counts,
// and the threads whose process name differs from their pid's track).

// timelineFormat marks the traces WritePerfetto wrote.
const (
	timelineFormat  = "offcpu-timeline"
	timelineVersion = 1
	keyTimeline     = "offcpu.timeline"
	keyWait         = "offcpu.wait"
)

// WritePerfetto writes t as a Perfetto trace.
func WritePerfetto(w io.Writer, t *schema.Timeline, o Options) error {
	p, err := buildPlan(t)
	if err != nil {
		return err
	}
	e := &pbEncoder{p: p, out: bufio.NewWriterSize(w, 1<<16),
		names: newInterner(fInternedNames), cats: newInterner(fInternedCategories),
		annNames: newInterner(fInternedAnnNames)}
	e.packet(e.firstPacket())
	e.tracks(o)
	for _, ev := range p.events() {
		e.packet(e.eventPacket(ev))
	}
	if e.err != nil {
		return e.err
	}
	return e.out.Flush()
}

// pbEncoder writes a plan's packets.
type pbEncoder struct {
	p                     *plan
	out                   *bufio.Writer
	err                   error
	uuids                 []uint64 // by track+1 (trackWindow first), then lanes
	names, cats, annNames *interner
}

// packet writes one TracePacket.
func (e *pbEncoder) packet(b pb) {
	if e.err != nil {
		return
	}
	var hdr pb
	hdr = protowire.AppendTag(hdr, fTracePacket, protowire.BytesType)
	hdr = protowire.AppendVarint(hdr, uint64(len(b)))
	if _, err := e.out.Write(hdr); err != nil {
		e.err = err
		return
	}
	_, e.err = e.out.Write(b)
}

// interner hands out iids for strings of one InternedData field whose
// messages are {iid = 1, name = 2}, and keeps the entries not yet written.
type interner struct {
	field   protowire.Number
	ids     map[string]uint64
	pending pb
}

func newInterner(f protowire.Number) *interner {
	return &interner{field: f, ids: map[string]uint64{}}
}

func (in *interner) id(s string) uint64 {
	if id, ok := in.ids[s]; ok {
		return id
	}
	id := uint64(len(in.ids) + 1)
	in.ids[s] = id
	in.pending = in.pending.bytes(in.field, pb(nil).varint(fInternIID, id).str(fInternName, s))
	return id
}

// firstPacket clears the sequence's state, sets its clock and interns
// every stack.
func (e *pbEncoder) firstPacket() pb {
	var b pb
	b = b.varint(fPacketSequenceID, sequenceID).
		varint(fPacketSequenceFlags, seqIncrementalCleared).
		varint(fPacketFirstOnSeq, 1).
		bytes(fPacketDefaults, pb(nil).varint(fDefaultsClockID, clockMonotonic))
	return b.bytes(fPacketInternedData, internStacks(e.p.t.Stacks))
}

// internStacks is the InternedData of every stack: callstack i+1 is stack i.
func internStacks(stacks [][]schema.Frame) pb {
	var fn, paths, maps, frames, calls pb
	fnIDs, mapIDs, frameIDs := map[string]uint64{}, map[string]uint64{}, map[schema.Frame]uint64{}
	frameID := func(f schema.Frame) uint64 {
		if id, ok := frameIDs[f]; ok {
			return id
		}
		id := uint64(len(frameIDs) + 1)
		frameIDs[f] = id
		m := pb(nil).varint(fFrameIID, id)
		if f.Name != "" {
			nid, ok := fnIDs[f.Name]
			if !ok {
				nid = uint64(len(fnIDs) + 1)
				fnIDs[f.Name] = nid
				fn = fn.bytes(fInternedFunctions, pb(nil).varint(fInternIID, nid).str(fInternName, f.Name))
			}
			m = m.varint(fFrameFunction, nid)
		}
		if f.Module != "" {
			mid, ok := mapIDs[f.Module]
			if !ok {
				mid = uint64(len(mapIDs) + 1)
				mapIDs[f.Module] = mid
				paths = paths.bytes(fInternedPaths, pb(nil).varint(fInternIID, mid).str(fInternName, f.Module))
				maps = maps.bytes(fInternedMappings, pb(nil).varint(fMappingIID, mid).varint(fMappingPathIDs, mid))
			}
			m = m.varint(fFrameMapping, mid).varint(fFrameRelPC, 0)
		}
		frames = frames.bytes(fInternedFrames, appendKind(m, f))
		return id
	}
	for i, st := range stacks {
		c := pb(nil).varint(fCallstackIID, uint64(i)+1)
		for _, f := range st {
			c = c.varint(fCallstackFrames, frameID(f))
		}
		calls = calls.bytes(fInternedCallstacks, c)
	}
	return append(append(append(append(fn, paths...), maps...), frames...), calls...)
}

// appendKind sets a Frame's kind: KIND_KERNEL or KIND_NATIVE, or, for a
// language runtime's frame, kind_str naming the runtime (prefixed
// "kernel/" for a kernel frame, and "user/" where the name would
// otherwise read as one of those prefixes).
func appendKind(m pb, f schema.Frame) pb {
	switch {
	case f.Runtime == "" && f.Kernel:
		return m.varint(fFrameKind, kindKernel)
	case f.Runtime == "":
		return m.varint(fFrameKind, kindNative)
	case f.Kernel:
		return m.str(fFrameKindStr, "kernel/"+f.Runtime)
	case strings.HasPrefix(f.Runtime, "kernel/") || strings.HasPrefix(f.Runtime, "user/"):
		return m.str(fFrameKindStr, "user/"+f.Runtime)
	}
	return m.str(fFrameKindStr, f.Runtime)
}

// tracks writes the track descriptors: the window's track, then per
// thread in order its process's track (the first time its pid comes) and
// its own, then the lanes as children of their thread's track.
func (e *pbEncoder) tracks(o Options) {
	p := e.p
	used := map[uint64]bool{}
	uuid := func(key string) uint64 {
		for n := 0; ; n++ {
			h := fnv.New64a()
			fmt.Fprintf(h, "offcpu/%s/%d", key, n)
			if u := h.Sum64(); u != 0 && !used[u] {
				used[u] = true
				return u
			}
		}
	}
	name := o.Name
	if name == "" {
		name = "offcpu"
	}
	e.uuids = append(e.uuids, uuid("window"))
	e.trackPacket(pb(nil).varint(fTrackUUID, e.uuids[0]).str(fTrackName, name))
	procs := map[int64]bool{}
	for _, th := range p.t.Threads {
		if !procs[th.PID] {
			procs[th.PID] = true
			d := pb(nil).varint(fProcessPID, uint64(th.PID))
			if th.Process != "" {
				d = d.str(fProcessName, th.Process)
			}
			e.trackPacket(pb(nil).varint(fTrackUUID, uuid("process/"+itoa(th.PID))).bytes(fTrackProcess, d))
		}
		u := uuid("thread/" + itoa(th.PID) + "/" + itoa(th.TID))
		e.uuids = append(e.uuids, u)
		d := pb(nil).varint(fThreadPID, uint64(th.PID)).varint(fThreadTID, uint64(th.TID))
		if th.Name != "" {
			d = d.str(fThreadName, th.Name)
		}
		e.trackPacket(pb(nil).varint(fTrackUUID, u).bytes(fTrackThread, d))
	}
	for i, l := range p.lanes {
		parent := e.uuids[l.thread+1]
		u := uuid("lane/" + strconv.FormatUint(parent, 16) + "/" + itoa(int64(i)))
		e.uuids = append(e.uuids, u)
		e.trackPacket(pb(nil).varint(fTrackUUID, u).varint(fTrackParent, parent).str(fTrackName, l.kind))
	}
}

func (e *pbEncoder) trackPacket(d pb) {
	e.packet(pb(nil).varint(fPacketSequenceID, sequenceID).
		varint(fPacketSequenceFlags, seqNeedsIncremental).bytes(fPacketTrackDesc, d))
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// event is one TrackEvent: a slice's begin, end or instant.
type event struct {
	ts    int64
	rank  int
	slice int
	typ   uint64
}

// events are the plan's events in the order to write them: by time, and
// at one time the ends of slices first, then instants (so that a flow
// starts before the slice that ends it), then zero-length slices (each
// begun and ended in turn), then the beginnings, so that every track's
// slices stay sequential (trace_processor breaks ties by file order).
func (p *plan) events() []event {
	evs := make([]event, 0, 2*len(p.slices))
	zero := map[[2]int64]int{}
	for i := range p.slices {
		s := &p.slices[i]
		switch {
		case s.instant:
			evs = append(evs, event{s.start, 1, i, typeInstant})
		case s.end == s.start:
			k := [2]int64{int64(s.track), s.start}
			n := zero[k]
			zero[k] = n + 1
			evs = append(evs, event{s.start, 2 + 2*n, i, typeSliceBegin}, event{s.end, 3 + 2*n, i, typeSliceEnd})
		default:
			evs = append(evs, event{s.start, 1 << 30, i, typeSliceBegin}, event{s.end, 0, i, typeSliceEnd})
		}
	}
	sort.SliceStable(evs, func(i, j int) bool {
		if evs[i].ts != evs[j].ts {
			return evs[i].ts < evs[j].ts
		}
		return evs[i].rank < evs[j].rank
	})
	return evs
}

// eventPacket is the packet of one event, with the interned names it is
// the first to use.
func (e *pbEncoder) eventPacket(ev event) pb {
	s := &e.p.slices[ev.slice]
	te := pb(nil).varint(fEventType, ev.typ).varint(fEventTrackUUID, e.uuids[s.track+1])
	if ev.typ != typeSliceEnd {
		te = e.eventBody(te, s)
	}
	b := pb(nil).varint(fPacketTimestamp, uint64(max(ev.ts, 0))).
		varint(fPacketSequenceID, sequenceID).
		varint(fPacketSequenceFlags, seqNeedsIncremental).
		bytes(fPacketTrackEvent, te)
	var in pb
	for _, i := range [...]*interner{e.cats, e.names, e.annNames} {
		in, i.pending = append(in, i.pending...), i.pending[:0]
	}
	if len(in) > 0 {
		b = b.bytes(fPacketInternedData, in)
	}
	return b
}

// eventBody adds a beginning's or instant's name, category, callstack,
// flows and annotations.
func (e *pbEncoder) eventBody(te pb, s *slice) pb {
	te = te.varint(fEventNameIID, e.names.id(s.name)).varint(fEventCategoryIIDs, e.cats.id(s.cat))
	if st := s.stack; st >= 0 && int(st) < len(e.p.t.Stacks) && len(e.p.t.Stacks[st]) > 0 {
		te = te.varint(fEventCallstackIID, uint64(st)+1)
	}
	if s.flowOut != 0 {
		te = te.fixed64(fEventFlowIDs, s.flowOut)
	}
	if s.flowIn != 0 {
		te = te.fixed64(fEventTermFlowIDs, s.flowIn)
	}
	for _, a := range s.args {
		te = e.annotation(te, fEventAnnotations, a)
	}
	if s.wait >= 0 {
		te = e.annotation(te, fEventAnnotations, waitRecord(e.p.t, s.wait))
	}
	if s.track == trackWindow {
		te = e.annotation(te, fEventAnnotations, timelineRecord(e.p.t))
	}
	return te
}

// annotation appends a DebugAnnotation as field n.
func (e *pbEncoder) annotation(b pb, n protowire.Number, a arg) pb {
	var m pb
	if a.key != "" {
		m = m.varint(fAnnotationNameIID, e.annNames.id(a.key))
	}
	switch v := a.val.(type) {
	case string:
		m = m.str(fAnnotationString, v)
	case int64:
		m = m.varint(fAnnotationInt, uint64(v))
	case bool:
		var u uint64
		if v {
			u = 1
		}
		m = m.varint(fAnnotationBool, u)
	case []arg:
		for _, c := range v {
			m = e.annotation(m, fAnnotationDict, c)
		}
	case [][]arg:
		for _, d := range v {
			m = e.annotation(m, fAnnotationArray, arg{val: d})
		}
	default:
		panic(fmt.Sprintf("timeline: annotation %s of type %T", a.key, a.val))
	}
	return b.bytes(n, m)
}

// waitRecord is what ReadPerfetto needs of a wait beside its visible
// annotations.
func waitRecord(t *schema.Timeline, i int) arg {
	w := &t.Waits[i]
	return arg{keyWait, []arg{{"index", int64(i)}, {"thread", int64(w.Thread)},
		{"out", w.Out}, {"wake", w.Wake}, {"in", w.In}, {"stack", int64(w.Stack)},
		{"waker", int64(w.Waker)}, {"waker_stack", int64(w.WakerStack)},
		{"open", w.Open}, {"irq", w.IRQ}, {"has_labels", w.Labels != nil}}}
}

// timelineRecord is what ReadPerfetto needs of the whole timeline: the
// format, the window, the counts, and the threads whose process name is
// not their pid's track's.
func timelineRecord(t *schema.Timeline) arg {
	d := []arg{{"format", timelineFormat}, {"version", int64(timelineVersion)},
		{"start", t.Start}, {"end", t.End}, {"lost", t.Lost},
		{"threads", int64(len(t.Threads))}, {"stacks", int64(len(t.Stacks))},
		{"waits", int64(len(t.Waits))}}
	procs := map[int64]string{}
	var other [][]arg
	for i, th := range t.Threads {
		name, ok := procs[th.PID]
		if !ok {
			procs[th.PID] = th.Process
		} else if name != th.Process {
			other = append(other, []arg{{"thread", int64(i)}, {"process", th.Process}})
		}
	}
	if other != nil {
		d = append(d, arg{"processes", other})
	}
	return arg{keyTimeline, d}
}
