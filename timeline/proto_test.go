package timeline

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/bufbuild/protocompile"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/offcpu/offcpu/schema"
)

// upstreamTrace is perfetto.protos.Trace compiled from upstream's merged
// proto (testdata/perfetto_trace.proto, see testdata/README).
func upstreamTrace(t *testing.T) protoreflect.MessageDescriptor {
	t.Helper()
	c := protocompile.Compiler{Resolver: protocompile.WithStandardImports(
		&protocompile.SourceResolver{ImportPaths: []string{"testdata"}})}
	files, err := c.Compile(context.Background(), "perfetto_trace.proto")
	if err != nil {
		t.Fatal(err)
	}
	d := files[0].FindDescriptorByName("perfetto.protos.Trace")
	md, ok := d.(protoreflect.MessageDescriptor)
	if !ok {
		t.Fatalf("perfetto.protos.Trace is %T", d)
	}
	return md
}

// parseUpstream reads a trace as upstream's Trace message.
func parseUpstream(t *testing.T, md protoreflect.MessageDescriptor, b []byte) protoreflect.Message {
	t.Helper()
	m := dynamicpb.NewMessage(md)
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatalf("upstream's Trace does not parse it: %v", err)
	}
	return m
}

// unknowns lists, anywhere in m's tree, the unknown fields (a field number
// upstream lacks, or a wire type its field cannot take) and enum values
// upstream does not define; n counts the messages walked.
func unknowns(m protoreflect.Message, path string, n *int) []string {
	*n++
	var bad []string
	if u := m.GetUnknown(); len(u) > 0 {
		bad = append(bad, fmt.Sprintf("%s (%s): unknown %s", path, m.Descriptor().FullName(), wireFields(u)))
	}
	value := func(fd protoreflect.FieldDescriptor, v protoreflect.Value, p string) {
		switch fd.Kind() {
		case protoreflect.MessageKind, protoreflect.GroupKind:
			bad = append(bad, unknowns(v.Message(), p, n)...)
		case protoreflect.EnumKind:
			if fd.Enum().Values().ByNumber(v.Enum()) == nil {
				bad = append(bad, fmt.Sprintf("%s: %d is no %s", p, v.Enum(), fd.Enum().FullName()))
			}
		}
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsList():
			for i := range v.List().Len() {
				value(fd, v.List().Get(i), fmt.Sprintf("%s[%d]", p, i))
			}
		case fd.IsMap():
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				value(fd.MapValue(), mv, p+"["+k.String()+"]")
				return true
			})
		default:
			value(fd, v, p)
		}
		return true
	})
	return bad
}

// wireFields names the fields of unknown bytes: number/wire type.
func wireFields(b []byte) string {
	var out []string
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Sprint(out, " and garbage")
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return fmt.Sprint(out, " and garbage")
		}
		out, b = append(out, fmt.Sprintf("%d/%d", num, typ)), b[n+m:]
	}
	return fmt.Sprint(out)
}

// oddTimeline adds to viewerTimeline what else the writer writes: a
// thread whose process name is not its pid's, overlapping waits (an
// "overlapping waits" lane), empty labels, frames of a runtime in the
// kernel, of one named like a kind_str prefix, and with nothing known.
func oddTimeline() *schema.Timeline {
	tl := viewerTimeline()
	tl.Threads = append(tl.Threads, schema.TimelineThread{PID: 100, TID: 102, Process: "server2"})
	tl.Stacks = append(tl.Stacks, []schema.Frame{{Name: "bpf_prog", Kernel: true, Runtime: "ebpf"},
		{Name: "x", Runtime: "kernel/odd"}, {}})
	tl.Waits = append(tl.Waits,
		schema.Wait{Thread: 3, Out: 100, Wake: 200, In: 300, Stack: 4, Waker: 0, WakerStack: 4, Labels: map[string]string{}},
		schema.Wait{Thread: 3, Out: 250, Wake: 260, In: 400, Stack: 0, Waker: -1})
	return tl
}

// TestUpstreamProto reads WritePerfetto's traces with upstream's
// perfetto_trace.proto: they parse, with no unknown field or enum value
// anywhere (so every field number written exists upstream with a wire type
// it takes), and the values read by field name are the Timeline's.
func TestUpstreamProto(t *testing.T) {
	md := upstreamTrace(t)
	for name, tl := range map[string]*schema.Timeline{"viewer": viewerTimeline(), "odd": oddTimeline()} {
		var buf bytes.Buffer
		if err := WritePerfetto(&buf, tl, Options{Name: "test"}); err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, b := range unknowns(parseUpstream(t, md, buf.Bytes()), "trace", &n) {
			t.Errorf("%s: %s", name, b)
		}
		if n < 3*len(tl.Waits) {
			t.Errorf("%s: walked only %d messages", name, n)
		}
	}
	// The walk does see a wrong wire type, a field upstream lacks and an
	// undefined enum value (which dynamicpb keeps as a known field).
	for _, bogus := range []pb{
		pb(nil).bytes(fPacketTrackEvent, pb(nil).fixed64(fEventType, typeSliceBegin)),
		pb(nil).bytes(fPacketTrackDesc, pb(nil).bytes(fTrackThread, pb(nil).str(7, "x"))),
		pb(nil).bytes(fPacketInternedData, pb(nil).bytes(fInternedFrames, pb(nil).varint(fFrameKind, 99))),
	} {
		n := 0
		if bad := unknowns(parseUpstream(t, md, pb(nil).bytes(fTracePacket, bogus)), "trace", &n); len(bad) != 1 {
			t.Errorf("bogus packet %x: %q; want one finding", bogus, bad)
		}
	}

	var buf bytes.Buffer
	tl := viewerTimeline()
	if err := WritePerfetto(&buf, tl, Options{Name: "test"}); err != nil {
		t.Fatal(err)
	}
	tr := &upstreamReader{t: t, tracks: map[uint64]pmsg{}, in: newInterned()}
	tr.read(pmsg{t, parseUpstream(t, md, buf.Bytes())})
	tr.checkTracks(tl)
	tr.checkInterned(tl)
	tr.checkEvents(tl)
}

// pmsg reads an upstream message by field name; a name upstream lacks
// fails the test.
type pmsg struct {
	t *testing.T
	m protoreflect.Message
}

func (p pmsg) field(name string) protoreflect.FieldDescriptor {
	p.t.Helper()
	fd := p.m.Descriptor().Fields().ByName(protoreflect.Name(name))
	if fd == nil {
		p.t.Fatalf("%s has no field %s upstream", p.m.Descriptor().FullName(), name)
	}
	return fd
}

func (p pmsg) has(name string) bool { return p.m.Has(p.field(name)) }
func (p pmsg) msg(name string) pmsg { return pmsg{p.t, p.m.Get(p.field(name)).Message()} }

// uint is an integer or bool field's value.
func (p pmsg) uint(name string) uint64 {
	fd := p.field(name)
	v := p.m.Get(fd)
	switch fd.Kind() {
	case protoreflect.BoolKind:
		if v.Bool() {
			return 1
		}
		return 0
	case protoreflect.Int32Kind, protoreflect.Int64Kind, protoreflect.Sint32Kind, protoreflect.Sint64Kind,
		protoreflect.Sfixed32Kind, protoreflect.Sfixed64Kind:
		return uint64(v.Int())
	}
	return v.Uint()
}

// str is a string or bytes field's value.
func (p pmsg) str(name string) string {
	fd := p.field(name)
	if fd.Kind() == protoreflect.BytesKind {
		return string(p.m.Get(fd).Bytes())
	}
	return p.m.Get(fd).String()
}

// enum is an enum field's value's name.
func (p pmsg) enum(name string) string {
	fd := p.field(name)
	if v := fd.Enum().Values().ByNumber(p.m.Get(fd).Enum()); v != nil {
		return string(v.Name())
	}
	return fmt.Sprint(p.m.Get(fd).Enum())
}

func (p pmsg) list(name string) []pmsg {
	l := p.m.Get(p.field(name)).List()
	out := make([]pmsg, l.Len())
	for i := range out {
		out[i] = pmsg{p.t, l.Get(i).Message()}
	}
	return out
}

func (p pmsg) uints(name string) []uint64 {
	l := p.m.Get(p.field(name)).List()
	out := make([]uint64, l.Len())
	for i := range out {
		out[i] = l.Get(i).Uint()
	}
	return out
}

// interned is a sequence's InternedData, by iid.
type interned struct {
	names, cats, annNames, annStrs, funcs, paths map[uint64]string
	frames                                       map[uint64]pmsg
	mappings, calls                              map[uint64][]uint64
}

func newInterned() *interned {
	return &interned{names: map[uint64]string{}, cats: map[uint64]string{}, annNames: map[uint64]string{},
		annStrs: map[uint64]string{}, funcs: map[uint64]string{}, paths: map[uint64]string{}, frames: map[uint64]pmsg{},
		mappings: map[uint64][]uint64{}, calls: map[uint64][]uint64{}}
}

// add takes an InternedData's entries; an iid given twice fails.
func (in *interned) add(t *testing.T, d pmsg) {
	t.Helper()
	strs := func(field, value string, into map[uint64]string) {
		for _, e := range d.list(field) {
			if _, dup := into[e.uint("iid")]; dup {
				t.Errorf("interned_data.%s: iid %d twice", field, e.uint("iid"))
			}
			into[e.uint("iid")] = e.str(value)
		}
	}
	strs("event_names", "name", in.names)
	strs("event_categories", "name", in.cats)
	strs("debug_annotation_names", "name", in.annNames)
	strs("debug_annotation_string_values", "str", in.annStrs)
	strs("function_names", "str", in.funcs)
	strs("mapping_paths", "str", in.paths)
	for _, f := range d.list("frames") {
		in.frames[f.uint("iid")] = f
	}
	for _, m := range d.list("mappings") {
		in.mappings[m.uint("iid")] = m.uints("path_string_ids")
	}
	for _, c := range d.list("callstacks") {
		in.calls[c.uint("iid")] = c.uints("frame_ids")
	}
}

// upstreamReader holds a trace read through upstream's descriptors.
type upstreamReader struct {
	t      *testing.T
	first  pmsg            // the first packet
	clocks pmsg            // the ClockSnapshot
	tracks map[uint64]pmsg // TrackDescriptors by uuid
	in     *interned
	events []upstreamEvent
	ts     uint64 // the last event's time: timestamps are deltas from it
}

type upstreamEvent struct {
	ts uint64
	ev pmsg // TrackEvent
}

func (r *upstreamReader) read(trace pmsg) {
	for i, p := range trace.list("packet") {
		if p.uint("trusted_packet_sequence_id") != sequenceID {
			r.t.Errorf("packet %d: sequence %d", i, p.uint("trusted_packet_sequence_id"))
		}
		if i == 0 {
			r.first = p
		}
		if p.has("interned_data") {
			r.in.add(r.t, p.msg("interned_data"))
		}
		if p.has("track_descriptor") {
			d := p.msg("track_descriptor")
			r.tracks[d.uint("uuid")] = d
		}
		if p.has("clock_snapshot") {
			r.clocks = p.msg("clock_snapshot")
			r.ts = r.clocks.list("clocks")[0].uint("timestamp")
		}
		if p.has("track_event") {
			if r.clocks.m == nil || p.has("timestamp_clock_id") || int64(p.uint("timestamp")) < 0 {
				r.t.Errorf("packet %d: an event before the clock snapshot, on its own clock, or back in time", i)
			}
			r.ts += p.uint("timestamp")
			r.events = append(r.events, upstreamEvent{r.ts, p.msg("track_event")})
		}
	}
}

// enumNumber is a value of an enum upstream declares in msg (or, for
// msg nil, at the top of the file).
func enumNumber(t *testing.T, file protoreflect.FileDescriptor, msg, enum, value string) uint64 {
	t.Helper()
	enums := file.Enums()
	if msg != "" {
		enums = file.Messages().ByName(protoreflect.Name(msg)).Enums()
	}
	v := enums.ByName(protoreflect.Name(enum)).Values().ByName(protoreflect.Name(value))
	if v == nil {
		t.Fatalf("no %s.%s upstream", enum, value)
	}
	return uint64(v.Number())
}

// checkTracks: the first packet's flags and clock, a thread track per
// thread with its tid, pid and name, a process track per pid, and lanes
// whose parents are thread tracks.
func (r *upstreamReader) checkTracks(tl *schema.Timeline) {
	t, f := r.t, r.first
	file := f.m.Descriptor().ParentFile()
	cleared := enumNumber(t, file, "TracePacket", "SequenceFlags", "SEQ_INCREMENTAL_STATE_CLEARED")
	if f.uint("sequence_flags") != cleared || f.uint("first_packet_on_sequence") != 1 ||
		f.msg("trace_packet_defaults").uint("timestamp_clock_id") != clockDeltas {
		t.Errorf("first packet: flags %d, first %d, clock %d; want %d, 1, %d", f.uint("sequence_flags"),
			f.uint("first_packet_on_sequence"), f.msg("trace_packet_defaults").uint("timestamp_clock_id"), cleared, clockDeltas)
	}
	r.checkClocks()
	threads, procs := map[int64]pmsg{}, map[int64]string{}
	for _, d := range r.tracks {
		switch {
		case d.has("thread"):
			threads[int64(d.msg("thread").uint("tid"))] = d.msg("thread")
		case d.has("process"):
			procs[int64(d.msg("process").uint("pid"))] = d.msg("process").str("process_name")
		case d.has("parent_uuid"):
			if p, ok := r.tracks[d.uint("parent_uuid")]; !ok || !p.has("thread") || d.str("name") != laneRequests {
				t.Errorf("lane %q: parent %d is no thread track", d.str("name"), d.uint("parent_uuid"))
			}
		case d.str("name") != "test":
			t.Errorf("track %d named %q: neither thread, process, lane nor the window", d.uint("uuid"), d.str("name"))
		}
	}
	for _, th := range tl.Threads {
		d, ok := threads[th.TID]
		if !ok || int64(d.uint("pid")) != th.PID || d.str("thread_name") != th.Name {
			t.Errorf("thread %d: no track with its pid %d and name %q", th.TID, th.PID, th.Name)
		}
		if procs[th.PID] != th.Process {
			t.Errorf("process %d: track named %q, want %q", th.PID, procs[th.PID], th.Process)
		}
	}
	if len(threads) != len(tl.Threads) || len(procs) != 2 {
		t.Errorf("%d thread tracks, %d process tracks", len(threads), len(procs))
	}
}

// checkClocks: the ClockSnapshot makes MONOTONIC the trace's clock and
// sets the sequence's own clock (64..127, sequence-scoped upstream), whose
// timestamps are deltas, to the same time.
func (r *upstreamReader) checkClocks() {
	t, c := r.t, r.clocks
	if c.m == nil {
		t.Fatal("no clock snapshot")
	}
	file := c.m.Descriptor().ParentFile()
	monotonic := enumNumber(t, file, "", "BuiltinClock", "BUILTIN_CLOCK_MONOTONIC")
	cl := c.list("clocks")
	if c.enum("primary_trace_clock") != "BUILTIN_CLOCK_MONOTONIC" || len(cl) != 2 ||
		cl[0].uint("clock_id") != monotonic || cl[0].uint("is_incremental") != 0 ||
		cl[1].uint("clock_id") != clockDeltas || cl[1].uint("is_incremental") != 1 ||
		cl[0].uint("timestamp") != cl[1].uint("timestamp") || clockDeltas < 64 || clockDeltas > 127 {
		t.Errorf("clock snapshot: primary %s, clocks %v", c.enum("primary_trace_clock"), c.m)
	}
}

// checkInterned: each stack is callstack index+1, whose frame_ids are
// interned frames naming interned function names and mappings (whose
// paths are interned) with the frame's kind.
func (r *upstreamReader) checkInterned(tl *schema.Timeline) {
	t, in := r.t, r.in
	if len(in.calls) != len(tl.Stacks) {
		t.Errorf("%d callstacks interned, want %d", len(in.calls), len(tl.Stacks))
	}
	for i, st := range tl.Stacks {
		ids, ok := in.calls[uint64(i)+1]
		if !ok || len(ids) != len(st) {
			t.Errorf("stack %d: callstack %d has frames %v (interned %v); want %d", i, i+1, ids, ok, len(st))
			continue
		}
		for j, id := range ids {
			f, ok := in.frames[id]
			if !ok {
				t.Errorf("stack %d: frame_id %d not interned", i, id)
				continue
			}
			if got, ok := in.funcs[f.uint("function_name_id")]; !ok || got != st[j].Name {
				t.Errorf("stack %d frame %d: function %q (interned %v), want %q", i, j, got, ok, st[j].Name)
			}
			var path string
			for _, p := range in.mappings[f.uint("mapping_id")] {
				path += in.paths[p]
			}
			if path != st[j].Module || !f.has("rel_pc") {
				t.Errorf("stack %d frame %d: mapping %q, rel_pc set %v; want %q", i, j, path, f.has("rel_pc"), st[j].Module)
			}
			if got, want := frameKind(f), wantKind(st[j]); got != want {
				t.Errorf("stack %d frame %d: kind %q, want %q", i, j, got, want)
			}
		}
	}
}

// frameKind is a Frame's kind enum name, or its kind_str.
func frameKind(f pmsg) string {
	if f.has("kind_str") {
		return "kind_str " + f.str("kind_str")
	}
	return f.enum("kind")
}

func wantKind(f schema.Frame) string {
	switch {
	case f.Runtime != "" && f.Kernel:
		return "kind_str kernel/" + f.Runtime
	case f.Runtime != "":
		return "kind_str " + f.Runtime
	case f.Kernel:
		return "KIND_KERNEL"
	}
	return "KIND_NATIVE"
}

// upSlice is a slice (or instant) of the trace, read back.
type upSlice struct {
	tid       int64 // of its thread's track; -1: another track
	name, cat string
	ts, dur   uint64
	instant   bool
	ev        pmsg // its begin or instant TrackEvent
}

// slices pairs the begins and ends on each track, checking that every
// event's track, name, categories, callstack and annotation names are
// declared or interned.
func (r *upstreamReader) slices() []upSlice {
	t := r.t
	open := map[uint64][]upSlice{}
	var out []upSlice
	for _, e := range r.events {
		track := e.ev.uint("track_uuid")
		d, ok := r.tracks[track]
		if !ok {
			t.Errorf("event at %d on undeclared track %d", e.ts, track)
		}
		tid := int64(-1)
		if d.m != nil && d.has("thread") {
			tid = int64(d.msg("thread").uint("tid"))
		}
		switch typ := e.ev.enum("type"); typ {
		case "TYPE_SLICE_BEGIN", "TYPE_INSTANT":
			s := upSlice{tid: tid, name: r.in.names[e.ev.uint("name_iid")], ts: e.ts,
				instant: typ == "TYPE_INSTANT", ev: e.ev}
			r.checkRefs(s)
			for _, c := range e.ev.uints("category_iids") {
				s.cat += r.in.cats[c]
			}
			switch {
			case s.instant:
				out = append(out, s)
			case len(open[track]) > 0:
				t.Errorf("slice %q begins at %d inside another on track %d", s.name, e.ts, track)
			default:
				open[track] = append(open[track], s)
			}
		case "TYPE_SLICE_END":
			st := open[track]
			if len(st) == 0 {
				t.Errorf("slice end at %d on track %d with none open", e.ts, track)
				continue
			}
			s := st[len(st)-1]
			open[track], s.dur = st[:len(st)-1], e.ts-s.ts
			out = append(out, s)
		default:
			t.Errorf("event at %d of type %s", e.ts, typ)
		}
	}
	for track, st := range open {
		if len(st) > 0 {
			t.Errorf("track %d: %d slices not ended", track, len(st))
		}
	}
	return out
}

// checkRefs: a beginning's name, categories, callstack and annotation
// names are interned.
func (r *upstreamReader) checkRefs(s upSlice) {
	in, ev := r.in, s.ev
	_, name := in.names[ev.uint("name_iid")]
	_, stack := in.calls[ev.uint("callstack_iid")]
	if !name || (ev.has("callstack_iid") && !stack) {
		r.t.Errorf("event at %d: name_iid %d or callstack_iid %d not interned", s.ts, ev.uint("name_iid"), ev.uint("callstack_iid"))
	}
	for _, c := range ev.uints("category_iids") {
		if _, ok := in.cats[c]; !ok {
			r.t.Errorf("event at %d: category_iid %d not interned", s.ts, c)
		}
	}
	var walk func(as []pmsg)
	walk = func(as []pmsg) {
		for _, a := range as {
			if _, ok := in.annNames[a.uint("name_iid")]; a.has("name_iid") && !ok {
				r.t.Errorf("event at %d: annotation name_iid %d not interned", s.ts, a.uint("name_iid"))
			}
			if _, ok := in.annStrs[a.uint("string_value_iid")]; a.has("string_value_iid") && !ok {
				r.t.Errorf("event at %d: annotation string_value_iid %d not interned", s.ts, a.uint("string_value_iid"))
			}
			walk(a.list("dict_entries"))
			walk(a.list("array_values"))
		}
	}
	walk(ev.list("debug_annotations"))
}

// annotation is a top-level debug annotation's string value, inline or
// interned, by name.
func (r *upstreamReader) annotation(ev pmsg, name string) (string, bool) {
	for _, a := range ev.list("debug_annotations") {
		if r.in.annNames[a.uint("name_iid")] != name {
			continue
		}
		if a.has("string_value_iid") {
			return r.in.annStrs[a.uint("string_value_iid")], true
		}
		return a.str("string_value"), true
	}
	return "", false
}

// checkEvents: each wait's blocked and runnable slices on its thread's
// track, with names, categories, durations and callstacks; a wake-up's
// flow_ids on an instant on the waker's track and its terminating_flow_ids
// on the woken thread's runnable slice, each exactly once.
func (r *upstreamReader) checkEvents(tl *schema.Timeline) {
	t, sl := r.t, r.slices()
	find := func(tid int64, cat string, ts int64) (upSlice, bool) {
		for _, s := range sl {
			if s.tid == tid && s.cat == cat && s.ts == uint64(ts) {
				return s, true
			}
		}
		return upSlice{}, false
	}
	for i, w := range tl.Waits {
		tid := tl.Threads[w.Thread].TID
		if viewerBlocked[i] != "" {
			s, ok := find(tid, catBlocked, w.Out)
			if !ok || s.name != viewerBlocked[i] || s.dur != uint64(w.Wake-w.Out) || s.ev.uint("callstack_iid") != uint64(w.Stack)+1 {
				t.Errorf("wait %d: blocked slice %q, %d ns, callstack %d (found %v); want %q, %d ns, %d",
					i, s.name, s.dur, s.ev.uint("callstack_iid"), ok, viewerBlocked[i], w.Wake-w.Out, w.Stack+1)
			} else if v, _ := r.annotation(s.ev, "class"); v != w.Class {
				t.Errorf("wait %d: blocked slice's class %q, want %q", i, v, w.Class)
			}
		}
		if s, ok := find(tid, catRunnable, w.Wake); !ok || s.name != "runnable" || s.dur != uint64(w.In-w.Wake) {
			t.Errorf("wait %d: runnable slice %q, %d ns (found %v); want %d ns", i, s.name, s.dur, ok, w.In-w.Wake)
		}
	}
	r.checkFlows(tl, sl)
}

// checkFlows: flow i+1 from wait i's waker's instant to its woken
// thread's runnable slice, once each, begun before it is ended in the
// file (trace_processor parses ties in file order, and drops the end of a
// flow not yet begun), and no other flows.
func (r *upstreamReader) checkFlows(tl *schema.Timeline, sl []upSlice) {
	t := r.t
	begun := map[uint64]bool{}
	for _, e := range r.events {
		for _, id := range e.ev.uints("flow_ids") {
			begun[id] = true
		}
		for _, id := range e.ev.uints("terminating_flow_ids") {
			if !begun[id] {
				t.Errorf("flow %d ends at %d before it begins in the file", id, e.ts)
			}
		}
	}
	out, in := map[uint64][]upSlice{}, map[uint64][]upSlice{}
	for _, s := range sl {
		for _, id := range s.ev.uints("flow_ids") {
			out[id] = append(out[id], s)
		}
		for _, id := range s.ev.uints("terminating_flow_ids") {
			in[id] = append(in[id], s)
		}
	}
	n := 0
	for i, w := range tl.Waits {
		if w.Waker < 0 {
			continue
		}
		n++
		id, wake := uint64(i)+1, uint64(w.Wake)
		o, e := out[id], in[id]
		if len(o) != 1 || len(e) != 1 {
			t.Errorf("wait %d: flow %d begun %d times, ended %d times; want once each", i, id, len(o), len(e))
			continue
		}
		if o[0].tid != tl.Threads[w.Waker].TID || !o[0].instant || o[0].ts != wake || o[0].cat != catWakeup {
			t.Errorf("wait %d: flow %d begins on %+v; want the waker's instant at %d", i, id, o[0], wake)
		}
		if e[0].tid != tl.Threads[w.Thread].TID || e[0].name != "runnable" || e[0].ts != wake {
			t.Errorf("wait %d: flow %d ends on %+v; want the woken thread's runnable slice at %d", i, id, e[0], wake)
		}
	}
	if len(out) != n || len(in) != n {
		t.Errorf("flow ids begun %d, ended %d; want %d", len(out), len(in), n)
	}
}
