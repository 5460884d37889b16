package timeline

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/offcpu/offcpu/schema"
)

// Perfetto traces written here are one packet sequence (sequenceID),
// written as the layout hands out slices, so that memory does not grow
// with the waits: each slice's begin (or instant) is written at its start,
// its end kept in a heap until the next start passes it. Packets so come
// in timestamp order, which trace_processor does not need (it sorts a
// file's events: sorter/trace_sorter.h) but does use to break ties (by
// file order), and ties need an order: a flow must start before the slice
// that ends it (FlowTracker::End drops an end it has no start for), and a
// track's slice must end before the next begins.
//
// The first packet clears the incremental state, sets the sequence's
// default clock to clockDeltas and interns every stack. The first event's
// packet is preceded by a ClockSnapshot setting clockDeltas to its time on
// CLOCK_MONOTONIC, the trace's primary clock: each event's timestamp is
// its delta from the last (a byte or two instead of eight).
//
// Names, categories, annotation names and annotation string values are
// interned (InternedData: event_names, event_categories,
// debug_annotation_names, debug_annotation_string_values) when first
// used; tracks have small uuids. Packets leave out sequence_flags
// SEQ_NEEDS_INCREMENTAL_STATE, which only asks a reader to skip them
// while the state is lost, and the state, cleared by the first packet of
// the one sequence, cannot be.
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
// record (see record), and the recording window's slice an
// "offcpu.timeline" dictionary (format, window, lost, counts, and the
// threads whose process name differs from their pid's track).

// timelineFormat marks the traces WritePerfetto wrote.
const (
	timelineFormat  = "offcpu-timeline"
	timelineVersion = 3
	// oldestVersion: the oldest format ReadPerfetto reads (2 had no
	// goroutine tracks).
	oldestVersion = 2
	keyTimeline   = "offcpu.timeline"
	keyWait       = "offcpu.wait"
)

// WritePerfetto writes t as a Perfetto trace.
func WritePerfetto(w io.Writer, t *schema.Timeline, o Options) error {
	l, err := newLayout(t)
	if err != nil {
		return err
	}
	e := &pbEncoder{t: t, l: l, out: bufio.NewWriterSize(w, 1<<16),
		names: newInterner(fInternedNames), cats: newInterner(fInternedCategories),
		annNames: newInterner(fInternedAnnNames), strs: newInterner(fInternedAnnStrings),
		threads: make([]pbThread, len(t.Threads)), blocked: map[string]string{}}
	e.ends.less = endBefore
	for i := range e.threads {
		e.threads[i].lastIndex = -1
	}
	e.packet(e.firstPacket())
	e.tracks(o)
	for s, ok := l.next(); ok && e.err == nil; s, ok = l.next() {
		e.endsUntil(s.start)
		e.slice(&s)
	}
	for len(e.ends.items) > 0 {
		s := e.ends.pop()
		e.end(&s)
	}
	if e.err != nil {
		return e.err
	}
	return e.out.Flush()
}

// pbEncoder writes a layout's packets.
type pbEncoder struct {
	t   *schema.Timeline
	l   *layout
	out *bufio.Writer
	err error
	// uuids: the tracks' by track+1: the window, the threads, then the
	// lanes written so far.
	uuids                       []uint64
	lastUUID                    uint64
	names, cats, annNames, strs *interner
	clocked                     bool  // the ClockSnapshot is written
	lastTS                      int64 // of the last event written
	ends                        heapOf[slice]
	threads                     []pbThread
	blocked                     map[string]string // blockedName's
	// Scratch, reused by every packet.
	hdr, te, in, pkt, rec pb
	keys                  []string
	iids                  []uint64
}

// pbThread is what the encoder keeps per thread.
type pbThread struct {
	label, wakes uint64 // iids of its label (a string value) and "wakes <label>"
	// lastIndex, lastIn: of the last wait record written on it.
	lastIndex, lastIn int64
}

// packet writes one TracePacket.
func (e *pbEncoder) packet(b pb) {
	if e.err != nil {
		return
	}
	e.hdr = protowire.AppendVarint(protowire.AppendTag(e.hdr[:0], fTracePacket, protowire.BytesType), uint64(len(b)))
	if _, err := e.out.Write(e.hdr); err != nil {
		e.err = err
		return
	}
	_, e.err = e.out.Write(b)
}

// interner hands out iids for strings of one InternedData field whose
// messages are {iid = 1, name or str = 2}, and keeps the entries not yet
// written.
type interner struct {
	field   protowire.Number
	ids     map[string]uint64
	pending pb
}

func newInterner(f protowire.Number) *interner {
	return &interner{field: f, ids: map[string]uint64{}}
}

// idOf is id(string(b)), without making the string when b is interned.
func (in *interner) idOf(b []byte) uint64 {
	if id, ok := in.ids[string(b)]; ok {
		return id
	}
	return in.id(string(b))
}

func (in *interner) id(s string) uint64 {
	if id, ok := in.ids[s]; ok {
		return id
	}
	id := uint64(len(in.ids) + 1)
	in.ids[s] = id
	n := protowire.SizeTag(fInternIID) + protowire.SizeVarint(id) + protowire.SizeTag(fInternName) + protowire.SizeBytes(len(s))
	in.pending = protowire.AppendTag(in.pending, in.field, protowire.BytesType)
	in.pending = protowire.AppendVarint(in.pending, uint64(n))
	in.pending = in.pending.varint(fInternIID, id).str(fInternName, s)
	return id
}

// firstPacket clears the sequence's state, sets its clock and interns
// every stack.
func (e *pbEncoder) firstPacket() pb {
	var b pb
	b = b.varint(fPacketSequenceID, sequenceID).
		varint(fPacketSequenceFlags, seqIncrementalCleared).
		varint(fPacketFirstOnSeq, 1).
		bytes(fPacketDefaults, pb(nil).varint(fDefaultsClockID, clockDeltas))
	return b.bytes(fPacketInternedData, internStacks(e.t.Stacks))
}

// clockSnapshot sets clockDeltas to ts on CLOCK_MONOTONIC, the trace's
// primary clock (without it, trace_processor takes proto traces to be on
// BOOTTIME, and nothing relates MONOTONIC to that).
func (e *pbEncoder) clockSnapshot(ts int64) {
	mono := pb(nil).varint(fClockID, clockMonotonic).varint(fClockTimestamp, uint64(ts))
	deltas := pb(nil).varint(fClockID, clockDeltas).varint(fClockTimestamp, uint64(ts)).varint(fClockIsIncremental, 1)
	snap := pb(nil).bytes(fSnapshotClocks, mono).bytes(fSnapshotClocks, deltas).varint(fSnapshotPrimary, clockMonotonic)
	e.packet(pb(nil).varint(fPacketSequenceID, sequenceID).bytes(fPacketClockSnapshot, snap))
	e.clocked, e.lastTS = true, ts
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
// its own. Lanes are written as the layout makes them (laneTracks).
func (e *pbEncoder) tracks(o Options) {
	name := o.Name
	if name == "" {
		name = "offcpu"
	}
	e.uuids = append(e.uuids, e.newUUID())
	e.trackPacket(pb(nil).varint(fTrackUUID, e.uuids[0]).str(fTrackName, name))
	procs := map[int64]uint64{}
	for _, th := range e.t.Threads {
		pu, ok := procs[th.PID]
		if !ok {
			pu = e.newUUID()
			procs[th.PID] = pu
			d := pb(nil).varint(fProcessPID, uint64(th.PID))
			if th.Process != "" {
				d = d.str(fProcessName, th.Process)
			}
			e.trackPacket(pb(nil).varint(fTrackUUID, pu).bytes(fTrackProcess, d))
		}
		u := e.newUUID()
		e.uuids = append(e.uuids, u)
		if th.GoID != 0 { // a goroutine: a named track of its process
			e.trackPacket(pb(nil).varint(fTrackUUID, u).varint(fTrackParent, pu).str(fTrackName, goroutineTrackName(&th)))
			continue
		}
		d := pb(nil).varint(fThreadPID, uint64(th.PID)).varint(fThreadTID, uint64(th.TID))
		if th.Name != "" {
			d = d.str(fThreadName, th.Name)
		}
		e.trackPacket(pb(nil).varint(fTrackUUID, u).bytes(fTrackThread, d))
	}
}

// newUUID is the next track's uuid: small, so a byte or two in each event.
func (e *pbEncoder) newUUID() uint64 {
	e.lastUUID++
	return e.lastUUID
}

// laneTracks writes the descriptors of the lanes laid out since the last
// call, children of their thread's track.
func (e *pbEncoder) laneTracks() {
	for i := len(e.uuids) - 1 - len(e.t.Threads); i < len(e.l.lanes); i++ {
		ln := e.l.lanes[i]
		u := e.newUUID()
		e.uuids = append(e.uuids, u)
		e.trackPacket(pb(nil).varint(fTrackUUID, u).varint(fTrackParent, e.uuids[ln.thread+1]).str(fTrackName, ln.kind))
	}
}

func (e *pbEncoder) trackPacket(d pb) {
	e.packet(pb(nil).varint(fPacketSequenceID, sequenceID).bytes(fPacketTrackDesc, d))
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

// endsUntil writes the ends due by ts: at one time, ends come first.
func (e *pbEncoder) endsUntil(ts int64) {
	for len(e.ends.items) > 0 && e.ends.items[0].end <= ts {
		s := e.ends.pop()
		e.end(&s)
	}
}

// slice writes a slice's begin (or instant), and its end when it has no
// length; a longer slice's end waits in e.ends.
func (e *pbEncoder) slice(s *slice) {
	if s.track >= len(e.uuids)-1 {
		e.laneTracks()
	}
	typ := uint64(typeSliceBegin)
	if s.kind == kindWakeup {
		typ = typeInstant
	}
	te := e.te[:0].varint(fEventType, typ).varint(fEventTrackUUID, e.uuids[s.track+1])
	e.te = e.body(te, s)
	e.event(s.start, e.te)
	switch {
	case s.kind == kindWakeup:
	case s.end == s.start:
		e.end(s)
	default:
		e.ends.push(*s)
	}
}

func (e *pbEncoder) end(s *slice) {
	e.te = e.te[:0].varint(fEventType, typeSliceEnd).varint(fEventTrackUUID, e.uuids[s.track+1])
	e.event(s.end, e.te)
}

// event writes a TrackEvent's packet at ts, with the interned data it is
// the first to use.
func (e *pbEncoder) event(ts int64, te pb) {
	ts = max(ts, 0)
	if !e.clocked {
		e.clockSnapshot(ts)
	}
	b := e.pkt[:0].varint(fPacketTimestamp, uint64(ts-e.lastTS)).varint(fPacketSequenceID, sequenceID)
	e.lastTS = ts
	in := e.in[:0]
	for _, i := range [...]*interner{e.cats, e.names, e.annNames, e.strs} {
		in, i.pending = append(in, i.pending...), i.pending[:0]
	}
	if len(in) > 0 {
		b = b.bytes(fPacketInternedData, in)
	}
	e.in, e.pkt = in, b.bytes(fPacketTrackEvent, te)
	e.packet(e.pkt)
}

// body adds a beginning's or instant's name, category, callstack, flows
// and annotations.
func (e *pbEncoder) body(te pb, s *slice) pb {
	var w *schema.Wait
	if s.of >= 0 && s.kind != kindSpan {
		w = &e.t.Waits[s.of]
	}
	switch s.kind {
	case kindWindow:
		te = e.named(te, "recording", catWindow, -1)
		te = te.ann(fEventAnnotations, e.annNames.id("lost"), fAnnotationInt, uint64(e.t.Lost))
		return e.annotation(te, fEventAnnotations, timelineRecord(e.t))
	case kindRunning:
		return e.named(te, "running", catRunning, -1)
	case kindBlocked:
		te = e.named(te, blockedName(w, e.blocked), catBlocked, w.Stack)
		return e.waitAnns(te, w)
	case kindRunnable:
		stack := int32(-1)
		if s.full {
			stack = w.Stack
		}
		te = e.named(te, "runnable", catRunnable, stack)
		if w.Waker >= 0 {
			te = te.fixed64(fEventTermFlowIDs, uint64(s.of)+1)
		}
		if s.full {
			te = e.waitAnns(te, w)
		}
		return e.record(te, s.of)
	case kindWakeup:
		te = te.varint(fEventNameIID, e.wakesName(w.Thread)).varint(fEventCategoryIIDs, e.cats.id(catWakeup))
		te = e.callstack(te, w.WakerStack).fixed64(fEventFlowIDs, uint64(s.of)+1)
		if w.Class != "" {
			te = e.annStr(te, "class", w.Class)
		}
		return te
	}
	sp := &e.l.spans[s.of]
	te = e.named(te, spanName(sp), catRequest, -1)
	te = e.annStr(te, "span_id", sp.id)
	if sp.trace != "" {
		te = e.annStr(te, "trace_id", sp.trace)
	}
	return te.ann(fEventAnnotations, e.annNames.id("waits"), fAnnotationInt, uint64(sp.waits))
}

// named adds a name, a category and a stack (-1: none).
func (e *pbEncoder) named(te pb, name, cat string, stack int32) pb {
	te = te.varint(fEventNameIID, e.names.id(name)).varint(fEventCategoryIIDs, e.cats.id(cat))
	return e.callstack(te, stack)
}

func (e *pbEncoder) callstack(te pb, st int32) pb {
	if st >= 0 && int(st) < len(e.t.Stacks) && len(e.t.Stacks[st]) > 0 {
		te = te.varint(fEventCallstackIID, uint64(st)+1)
	}
	return te
}

// wakesName is the iid of "wakes <thread>".
func (e *pbEncoder) wakesName(th int32) uint64 {
	p := &e.threads[th]
	if p.wakes == 0 {
		p.wakes = e.names.id("wakes " + threadLabel(e.t, th))
	}
	return p.wakes
}

// labelIID is the iid of a thread's label as a string value.
func (e *pbEncoder) labelIID(th int32) uint64 {
	p := &e.threads[th]
	if p.label == 0 {
		p.label = e.strs.id(threadLabel(e.t, th))
	}
	return p.label
}

// strIID is the iid of a string value, 0 for "".
func (e *pbEncoder) strIID(s string) uint64 {
	if s == "" {
		return 0
	}
	return e.strs.id(s)
}

// annStr adds an annotation of an interned string value.
func (e *pbEncoder) annStr(te pb, key, v string) pb {
	return te.ann(fEventAnnotations, e.annNames.id(key), fAnnotationStrIID, e.strs.id(v))
}

// waitAnns adds the annotations a reader of the trace sees on a wait.
func (e *pbEncoder) waitAnns(te pb, w *schema.Wait) pb {
	for _, kv := range [...]struct{ k, v string }{{"state", w.State}, {"class", w.Class},
		{"verdict", w.Verdict}, {"category", w.Category}} {
		if kv.v != "" {
			te = e.annStr(te, kv.k, kv.v)
		}
	}
	if w.Waker >= 0 {
		te = te.ann(fEventAnnotations, e.annNames.id("waker"), fAnnotationStrIID, e.labelIID(w.Waker))
	}
	if w.IRQ {
		te = te.ann(fEventAnnotations, e.annNames.id("irq"), fAnnotationBool, 1)
	}
	if w.Open {
		te = te.ann(fEventAnnotations, e.annNames.id("open"), fAnnotationBool, 1)
	}
	if len(w.Labels) == 0 {
		return te
	}
	e.labelIIDs(w.Labels)
	n := protowire.SizeTag(fAnnotationNameIID) + protowire.SizeVarint(e.annNames.id("labels"))
	for i := 0; i < len(e.iids); i += 2 {
		n += protowire.SizeTag(fAnnotationDict) + protowire.SizeBytes(annSize(e.iids[i], fAnnotationStrIID, e.iids[i+1]))
	}
	te = protowire.AppendVarint(protowire.AppendTag(te, fEventAnnotations, protowire.BytesType), uint64(n))
	te = te.varint(fAnnotationNameIID, e.annNames.id("labels"))
	for i := 0; i < len(e.iids); i += 2 {
		te = te.ann(fAnnotationDict, e.iids[i], fAnnotationStrIID, e.iids[i+1])
	}
	return te
}

// sortKeys sets e.keys to the labels' keys in order.
func (e *pbEncoder) sortKeys(labels map[string]string) {
	e.keys = e.keys[:0]
	for k := range labels {
		e.keys = append(e.keys, k)
	}
	slices.Sort(e.keys)
}

// labelIIDs sets e.iids to the labels' key and value iids by key.
func (e *pbEncoder) labelIIDs(labels map[string]string) {
	e.sortKeys(labels)
	e.iids = e.iids[:0]
	for _, k := range e.keys {
		e.iids = append(e.iids, e.annNames.id(k), e.strs.id(labels[k]))
	}
}

// record adds the "offcpu.wait" annotation ReadPerfetto reads a wait
// from: a string of decimal integers, so that a wait costs some 30 bytes:
//
//	index - the index of the last record on the thread (-1 at first)
//	Out - the In of that record (0 at first)
//	Wake - Out
//	In - Wake
//	Stack, Waker, WakerStack
//	flags: 1 open, 2 irq, 4 labels (nil and empty alike)
//	State, Class, Verdict, Category: string value iids (0: "")
//	the labels: a string value iid (0: none) of labelSet's
//	OutThread+1, InThread+1: a goroutine's (0 for a thread's wait)
//
// less the zeros at its end. Its thread is its track's (or lane's).
func (e *pbEncoder) record(te pb, wi int) pb {
	w := &e.t.Waits[wi]
	p := &e.threads[w.Thread]
	var flags int64
	if w.Open {
		flags |= 1
	}
	if w.IRQ {
		flags |= 2
	}
	if w.Labels != nil {
		flags |= 4
	}
	var set uint64
	if len(w.Labels) > 0 {
		e.sortKeys(w.Labels)
		e.rec = labelSet(e.rec[:0], e.keys, w.Labels)
		set = e.strs.idOf(e.rec)
	}
	var outTh, inTh int64 // a goroutine's threads, +1 (0: a thread's wait)
	if e.t.Threads[w.Thread].GoID != 0 {
		outTh, inTh = int64(w.OutThread)+1, int64(w.InThread)+1
	}
	v := [...]int64{int64(wi) - p.lastIndex, w.Out - p.lastIn, w.Wake - w.Out, w.In - w.Wake,
		int64(w.Stack), int64(w.Waker), int64(w.WakerStack), flags, int64(e.strIID(w.State)),
		int64(e.strIID(w.Class)), int64(e.strIID(w.Verdict)), int64(e.strIID(w.Category)), int64(set), outTh, inTh}
	p.lastIndex, p.lastIn = int64(wi), w.In
	n := len(v)
	for n > 0 && v[n-1] == 0 {
		n--
	}
	r := e.rec[:0]
	for i, x := range v[:n] {
		if i > 0 {
			r = append(r, ' ')
		}
		r = strconv.AppendInt(r, x, 10)
	}
	e.rec = r
	name := e.annNames.id(keyWait)
	size := protowire.SizeTag(fAnnotationNameIID) + protowire.SizeVarint(name) + protowire.SizeTag(fAnnotationString) + protowire.SizeBytes(len(r))
	te = protowire.AppendVarint(protowire.AppendTag(te, fEventAnnotations, protowire.BytesType), uint64(size))
	return te.varint(fAnnotationNameIID, name).bytes(fAnnotationString, r)
}

// labelSet appends labels, keys in order, as Go-quoted key=value pairs
// separated by spaces: byte for byte (where JSON would not keep invalid
// UTF-8), and one string per set, which a span's waits share.
func labelSet(b []byte, keys []string, labels map[string]string) []byte {
	for i, k := range keys {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(strconv.AppendQuote(b, k), '=')
		b = strconv.AppendQuote(b, labels[k])
	}
	return b
}

// annSize is the size of a DebugAnnotation {name_iid, field vf = v}.
func annSize(name uint64, vf protowire.Number, v uint64) int {
	return protowire.SizeTag(fAnnotationNameIID) + protowire.SizeVarint(name) + protowire.SizeTag(vf) + protowire.SizeVarint(v)
}

// ann appends a DebugAnnotation {name_iid, field vf = v} as field f.
func (b pb) ann(f protowire.Number, name uint64, vf protowire.Number, v uint64) pb {
	b = protowire.AppendTag(b, f, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(annSize(name, vf, v)))
	return b.varint(fAnnotationNameIID, name).varint(vf, v)
}

// arg is one annotation of the window's slice: val is a string, int64,
// []arg (a dictionary) or [][]arg (an array of dictionaries).
type arg struct {
	key string
	val any
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
