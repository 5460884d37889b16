package timeline

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/offcpu/offcpu/schema"
)

// ReadPerfetto reads back a trace WritePerfetto wrote. Empty stacks read
// back as nil, and so do empty Threads, Stacks and Waits; everything else
// is as written. Any other input is an error saying "not an offcpu
// timeline".
func ReadPerfetto(r io.Reader) (*schema.Timeline, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	t, err := readTrace(data)
	if err != nil {
		return nil, fmt.Errorf("not an offcpu timeline: %w", err)
	}
	return t, nil
}

func readTrace(data []byte) (*schema.Timeline, error) {
	switch {
	case len(data) == 0:
		return nil, errors.New("empty input")
	case len(data) >= 2 && data[0] == 0x1f && data[1] == 0x8b:
		return nil, errors.New("gzip-compressed input (a pprof profile?)")
	}
	rd := &reader{seqs: map[uint32]*seqState{}, tracks: map[uint64]*trackDesc{}, procs: map[int64]string{}}
	n := 0
	err := fields(data, func(f field) error {
		if f.num != fTracePacket || f.typ != protowire.BytesType {
			return fmt.Errorf("not a Perfetto trace: top-level field %d of wire type %d", f.num, f.typ)
		}
		n++
		if err := rd.packet(f.b); err != nil {
			return fmt.Errorf("packet %d: %w", n, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return rd.timeline()
}

// reader is what a trace's packets said.
type reader struct {
	seqs      map[uint32]*seqState
	tracks    map[uint64]*trackDesc
	threads   []*trackDesc // the thread tracks, in order
	procs     map[int64]string
	header    dictv     // the offcpu.timeline record
	headerSeq *seqState // its sequence, which interned the stacks
	waits     []waitRec
}

// seqState is a packet sequence's interned data.
type seqState struct {
	funcs, paths, annNames map[uint64]string
	mappings, calls        map[uint64][]uint64
	frames                 map[uint64]frameRec
}

func newSeqState() *seqState {
	return &seqState{funcs: map[uint64]string{}, paths: map[uint64]string{},
		annNames: map[uint64]string{}, mappings: map[uint64][]uint64{},
		calls: map[uint64][]uint64{}, frames: map[uint64]frameRec{}}
}

type frameRec struct {
	name, mapping, kind uint64
	kindStr             string
	hasKindStr          bool
}

type trackDesc struct {
	uuid, parent uint64
	pid, tid     int64
	name         string
}

type waitRec struct {
	index int64
	track uint64
	w     schema.Wait
}

// packet reads one TracePacket.
func (rd *reader) packet(b []byte) error {
	var seq, flags uint64
	var te, in, td []byte
	err := fields(b, func(f field) error {
		switch f.num {
		case fPacketSequenceID:
			seq = f.u
			return f.want(protowire.VarintType)
		case fPacketSequenceFlags:
			flags = f.u
			return f.want(protowire.VarintType)
		case fPacketTrackEvent:
			te = f.b
		case fPacketInternedData:
			in = f.b
		case fPacketTrackDesc:
			td = f.b
		default:
			return nil
		}
		return f.want(protowire.BytesType)
	})
	if err != nil {
		return err
	}
	st := rd.seqs[uint32(seq)]
	if st == nil || flags&seqIncrementalCleared != 0 {
		st = newSeqState()
		rd.seqs[uint32(seq)] = st
	}
	if in != nil {
		if err := st.intern(in); err != nil {
			return fmt.Errorf("interned data: %w", err)
		}
	}
	if td != nil {
		if err := rd.track(td); err != nil {
			return fmt.Errorf("track descriptor: %w", err)
		}
	}
	if te != nil {
		if err := rd.event(st, te); err != nil {
			return fmt.Errorf("track event: %w", err)
		}
	}
	return nil
}

// intern reads an InternedData.
func (st *seqState) intern(b []byte) error {
	return fields(b, func(f field) error {
		var strs map[uint64]string
		switch f.num {
		case fInternedAnnNames:
			strs = st.annNames
		case fInternedFunctions:
			strs = st.funcs
		case fInternedPaths:
			strs = st.paths
		case fInternedMappings:
			return internList(f, fMappingIID, fMappingPathIDs, st.mappings)
		case fInternedCallstacks:
			return internList(f, fCallstackIID, fCallstackFrames, st.calls)
		case fInternedFrames:
			return st.internFrame(f)
		default:
			return nil
		}
		if err := f.want(protowire.BytesType); err != nil {
			return err
		}
		var iid uint64
		var s string
		err := fields(f.b, func(g field) error {
			switch g.num {
			case fInternIID:
				iid = g.u
				return g.want(protowire.VarintType)
			case fInternName:
				s = string(g.b)
				return g.want(protowire.BytesType)
			}
			return nil
		})
		strs[iid] = s
		return err
	})
}

// internList reads a message of an iid and a repeated id (a Mapping's
// paths, a Callstack's frames).
func internList(f field, iidField, listField protowire.Number, into map[uint64][]uint64) error {
	if err := f.want(protowire.BytesType); err != nil {
		return err
	}
	var iid uint64
	var ids []uint64
	err := fields(f.b, func(g field) error {
		switch g.num {
		case iidField:
			iid = g.u
			return g.want(protowire.VarintType)
		case listField:
			v, err := g.uints()
			ids = append(ids, v...)
			return err
		}
		return nil
	})
	into[iid] = ids
	return err
}

func (st *seqState) internFrame(f field) error {
	if err := f.want(protowire.BytesType); err != nil {
		return err
	}
	var iid uint64
	var r frameRec
	err := fields(f.b, func(g field) error {
		switch g.num {
		case fFrameIID:
			iid = g.u
		case fFrameFunction:
			r.name = g.u
		case fFrameMapping:
			r.mapping = g.u
		case fFrameKind:
			r.kind = g.u
		case fFrameKindStr:
			r.kindStr, r.hasKindStr = string(g.b), true
			return g.want(protowire.BytesType)
		default:
			return nil
		}
		return g.want(protowire.VarintType)
	})
	st.frames[iid] = r
	return err
}

// track reads a TrackDescriptor; a repeated one changes nothing.
func (rd *reader) track(b []byte) error {
	d := &trackDesc{}
	var thread, proc []byte
	err := fields(b, func(f field) error {
		switch f.num {
		case fTrackUUID:
			d.uuid = f.u
		case fTrackParent:
			d.parent = f.u
		case fTrackThread:
			thread = f.b
			return f.want(protowire.BytesType)
		case fTrackProcess:
			proc = f.b
			return f.want(protowire.BytesType)
		default:
			return nil
		}
		return f.want(protowire.VarintType)
	})
	if err != nil || rd.tracks[d.uuid] != nil {
		return err
	}
	rd.tracks[d.uuid] = d
	if proc != nil {
		pid, _, name, err := descriptor(proc, fProcessPID, 0, fProcessName)
		if err != nil {
			return err
		}
		if _, ok := rd.procs[pid]; !ok {
			rd.procs[pid] = name
		}
	}
	if thread != nil {
		if d.pid, d.tid, d.name, err = descriptor(thread, fThreadPID, fThreadTID, fThreadName); err != nil {
			return err
		}
		rd.threads = append(rd.threads, d)
	}
	return nil
}

// descriptor reads a Process- or ThreadDescriptor's pid, tid (tidField 0:
// none) and name.
func descriptor(b []byte, pidField, tidField, nameField protowire.Number) (pid, tid int64, name string, err error) {
	err = fields(b, func(f field) error {
		switch f.num {
		case pidField:
			pid = int64(f.u)
		case tidField:
			tid = int64(f.u)
		case nameField:
			name = string(f.b)
			return f.want(protowire.BytesType)
		default:
			return nil
		}
		return f.want(protowire.VarintType)
	})
	return pid, tid, name, err
}

// event reads a TrackEvent, keeping the records offcpu wrote.
func (rd *reader) event(st *seqState, b []byte) error {
	var track uint64
	var anns []annot
	err := fields(b, func(f field) error {
		switch f.num {
		case fEventTrackUUID:
			track = f.u
			return f.want(protowire.VarintType)
		case fEventAnnotations:
			if err := f.want(protowire.BytesType); err != nil {
				return err
			}
			a, err := st.annotation(f.b, 0)
			anns = append(anns, a)
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, a := range anns {
		switch {
		case a.name == keyTimeline && rd.header != nil:
			return errors.New("a second " + keyTimeline + " record")
		case a.name == keyTimeline:
			rd.header, rd.headerSeq = a.dict(), st
		case a.name == keyWait:
			if err := rd.wait(track, a, anns); err != nil {
				return err
			}
		}
	}
	return nil
}

// annot is a decoded DebugAnnotation: kind 'b', 'i', 'u' (u holds the
// value), 's', 'd' (sub: the dictionary's entries), 'a' (sub: the array's
// values), or 0 for a value this reader does not read.
type annot struct {
	name string
	kind byte
	u    uint64
	s    string
	sub  []annot
}

// annotationKinds are the kinds of the DebugAnnotation value fields read.
var annotationKinds = map[protowire.Number]byte{fAnnotationBool: 'b', fAnnotationInt: 'i',
	fAnnotationUint: 'u', fAnnotationString: 's', fAnnotationDict: 'd', fAnnotationArray: 'a'}

// maxNesting bounds how deep annotations nest (offcpu writes 3 levels).
const maxNesting = 8

func (st *seqState) annotation(b []byte, depth int) (annot, error) {
	var a annot
	if depth > maxNesting {
		return a, errors.New("debug annotations nested too deep")
	}
	err := fields(b, func(f field) error {
		switch k := annotationKinds[f.num]; {
		case f.num == fAnnotationNameIID:
			name, ok := st.annNames[f.u]
			if !ok {
				return fmt.Errorf("debug annotation name %d not interned", f.u)
			}
			a.name = name
			return f.want(protowire.VarintType)
		case f.num == fAnnotationName:
			a.name = string(f.b)
		case k == 's':
			a.kind, a.s = k, string(f.b)
		case k == 'd' || k == 'a':
			if err := f.want(protowire.BytesType); err != nil {
				return err
			}
			sub, err := st.annotation(f.b, depth+1)
			a.kind, a.sub = k, append(a.sub, sub)
			return err
		case k != 0:
			a.kind, a.u = k, f.u
			return f.want(protowire.VarintType)
		default:
			return nil
		}
		return f.want(protowire.BytesType)
	})
	return a, err
}

// dictv is a dictionary annotation's entries by name.
type dictv map[string]annot

func (a annot) dict() dictv {
	d := dictv{}
	for _, e := range a.sub {
		d[e.name] = e
	}
	return d
}

// dec reads a record's values, keeping the first error.
type dec struct {
	d   dictv
	err error
}

func (x *dec) get(k string, kinds string) annot {
	a, ok := x.d[k]
	if x.err == nil && !ok {
		x.err = fmt.Errorf("%q missing", k)
	} else if x.err == nil && !strings.ContainsRune(kinds, rune(a.kind)) {
		x.err = fmt.Errorf("%q is not of kind %q", k, kinds)
	}
	return a
}

func (x *dec) int(k string) int64 { return int64(x.get(k, "iu").u) }
func (x *dec) bool(k string) bool { return x.get(k, "b").u != 0 }
func (x *dec) str(k string) string {
	return x.get(k, "s").s
}

func (x *dec) int32(k string) int32 {
	v := x.int(k)
	if x.err == nil && v != int64(int32(v)) {
		x.err = fmt.Errorf("%q out of range: %d", k, v)
	}
	return int32(v)
}

// optStr is an optional string's value, "" when absent.
func (x *dec) optStr(k string) string {
	if _, ok := x.d[k]; !ok {
		return ""
	}
	return x.str(k)
}

// wait reads a wait's record and the visible annotations beside it.
func (rd *reader) wait(track uint64, rec annot, anns []annot) error {
	if rec.kind != 'd' {
		return errors.New(keyWait + " is not a dictionary")
	}
	x := &dec{d: rec.dict()}
	r := waitRec{index: x.int("index"), track: track}
	r.w = schema.Wait{Thread: x.int32("thread"), Out: x.int("out"), Wake: x.int("wake"),
		In: x.int("in"), Stack: x.int32("stack"), Waker: x.int32("waker"),
		WakerStack: x.int32("waker_stack"), Open: x.bool("open"), IRQ: x.bool("irq")}
	labels := x.bool("has_labels")
	v := &dec{d: annot{sub: anns}.dict()}
	r.w.State, r.w.Class = v.optStr("state"), v.optStr("class")
	r.w.Verdict, r.w.Category = v.optStr("verdict"), v.optStr("category")
	if labels {
		r.w.Labels = map[string]string{}
		if _, ok := v.d["labels"]; ok {
			for _, e := range v.get("labels", "d").sub {
				if e.kind != 's' {
					return fmt.Errorf("label %q is not a string", e.name)
				}
				r.w.Labels[e.name] = e.s
			}
		}
	}
	if err := errors.Join(x.err, v.err); err != nil {
		return fmt.Errorf("%s: %w", keyWait, err)
	}
	rd.waits = append(rd.waits, r)
	return nil
}

// timeline assembles what the packets said.
func (rd *reader) timeline() (*schema.Timeline, error) {
	if rd.header == nil {
		return nil, errors.New("no " + keyTimeline + " record: the trace was not written by offcpu")
	}
	x := &dec{d: rd.header}
	format, version := x.str("format"), x.int("version")
	t := &schema.Timeline{Start: x.int("start"), End: x.int("end"), Lost: x.int("lost")}
	nth, nst, nw := x.int("threads"), x.int("stacks"), x.int("waits")
	switch {
	case x.err != nil:
		return nil, fmt.Errorf("%s: %w", keyTimeline, x.err)
	case format != timelineFormat:
		return nil, fmt.Errorf("format %q", format)
	case version != timelineVersion:
		return nil, fmt.Errorf("format version %d (this reader reads %d)", version, timelineVersion)
	case nth != int64(len(rd.threads)):
		return nil, fmt.Errorf("%d threads said, %d thread tracks", nth, len(rd.threads))
	}
	var err error
	if t.Threads, err = rd.threadList(); err != nil {
		return nil, err
	}
	if t.Stacks, err = rd.headerSeq.stacks(nst); err != nil {
		return nil, err
	}
	if t.Waits, err = rd.waitList(nw); err != nil {
		return nil, err
	}
	if err := validate(t); err != nil {
		return nil, err
	}
	for _, r := range rd.waits {
		u := rd.threads[r.w.Thread].uuid
		if d := rd.tracks[r.track]; r.track != u && (d == nil || d.parent != u) {
			return nil, fmt.Errorf("wait %d is not on its thread's track", r.index)
		}
	}
	return t, nil
}

// threadList is the threads, their processes named by their pid's track
// or the header's exceptions.
func (rd *reader) threadList() ([]schema.TimelineThread, error) {
	if len(rd.threads) == 0 {
		return nil, nil
	}
	out := make([]schema.TimelineThread, len(rd.threads))
	for i, d := range rd.threads {
		out[i] = schema.TimelineThread{PID: d.pid, TID: d.tid, Name: d.name, Process: rd.procs[d.pid]}
	}
	p, ok := rd.header["processes"]
	if !ok {
		return out, nil
	}
	if p.kind != 'a' {
		return nil, errors.New(`"processes" is not an array`)
	}
	for _, e := range p.sub {
		x := &dec{d: e.dict()}
		i, name := x.int("thread"), x.str("process")
		if x.err != nil || i < 0 || i >= int64(len(out)) {
			return nil, fmt.Errorf(`"processes": thread %d: %v`, i, x.err)
		}
		out[i].Process = name
	}
	return out, nil
}

// waitList is the waits in their order.
func (rd *reader) waitList(n int64) ([]schema.Wait, error) {
	if n != int64(len(rd.waits)) {
		return nil, fmt.Errorf("%d waits said, %d recorded", n, len(rd.waits))
	}
	if n == 0 {
		return nil, nil
	}
	out := make([]schema.Wait, n)
	seen := make([]bool, n)
	for _, r := range rd.waits {
		if r.index < 0 || r.index >= n || seen[r.index] {
			return nil, fmt.Errorf("wait index %d repeated or out of range", r.index)
		}
		out[r.index], seen[r.index] = r.w, true
	}
	return out, nil
}

// stacks are callstacks 1..n.
func (st *seqState) stacks(n int64) ([][]schema.Frame, error) {
	if n < 0 || n > int64(len(st.calls)) {
		return nil, fmt.Errorf("%d stacks said, %d callstacks interned", n, len(st.calls))
	}
	if n == 0 {
		return nil, nil
	}
	out := make([][]schema.Frame, n)
	for i := range out {
		ids, ok := st.calls[uint64(i)+1]
		if !ok {
			return nil, fmt.Errorf("callstack %d not interned", i+1)
		}
		if len(ids) == 0 {
			continue
		}
		out[i] = make([]schema.Frame, len(ids))
		for j, id := range ids {
			f, err := st.frame(id)
			if err != nil {
				return nil, fmt.Errorf("callstack %d: %w", i+1, err)
			}
			out[i][j] = f
		}
	}
	return out, nil
}

// frame is an interned frame (see appendKind).
func (st *seqState) frame(id uint64) (schema.Frame, error) {
	var f schema.Frame
	r, ok := st.frames[id]
	if !ok {
		return f, fmt.Errorf("frame %d not interned", id)
	}
	if r.name != 0 {
		if f.Name, ok = st.funcs[r.name]; !ok {
			return f, fmt.Errorf("function name %d not interned", r.name)
		}
	}
	if r.mapping != 0 {
		ids, ok := st.mappings[r.mapping]
		if !ok {
			return f, fmt.Errorf("mapping %d not interned", r.mapping)
		}
		parts := make([]string, len(ids))
		for i, p := range ids {
			if parts[i], ok = st.paths[p]; !ok {
				return f, fmt.Errorf("mapping path %d not interned", p)
			}
		}
		f.Module = strings.Join(parts, "/")
	}
	switch {
	case !r.hasKindStr:
		f.Kernel = r.kind == kindKernel
	case strings.HasPrefix(r.kindStr, "kernel/"):
		f.Kernel, f.Runtime = true, strings.TrimPrefix(r.kindStr, "kernel/")
	default:
		f.Runtime = strings.TrimPrefix(r.kindStr, "user/")
	}
	return f, nil
}
