package timeline

import (
	"errors"
	"fmt"
	"io"
	"strconv"
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
	last      []recBase // by thread: the last wait record's
}

// recBase is what a thread's next wait record is relative to.
type recBase struct{ index, in int64 }

// seqState is a packet sequence's interned data.
type seqState struct {
	funcs, paths, annNames, strs map[uint64]string
	mappings, calls              map[uint64][]uint64
	frames                       map[uint64]frameRec
}

func newSeqState() *seqState {
	return &seqState{funcs: map[uint64]string{}, paths: map[uint64]string{},
		annNames: map[uint64]string{}, strs: map[uint64]string{}, mappings: map[uint64][]uint64{},
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
	goid         int64 // a goroutine's track
	name         string
	thread       int32 // the thread whose track or lane it is; -1: none
	proc         bool  // a process's track
}

type waitRec struct {
	index int64
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
		case fInternedAnnStrings:
			strs = st.strs
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
	d := &trackDesc{thread: -1}
	var thread, proc []byte
	err := fields(b, func(f field) error {
		switch f.num {
		case fTrackUUID:
			d.uuid = f.u
		case fTrackParent:
			d.parent = f.u
		case fTrackName:
			d.name = string(f.b)
			return f.want(protowire.BytesType)
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
	p := rd.tracks[d.parent]
	if d.parent != 0 && p != nil {
		d.thread = p.thread
	}
	if goid, name, ok := parseGoroutineTrack(d.name); ok && p != nil && p.proc {
		d.pid, d.goid, d.name = p.pid, goid, name
		d.thread = int32(len(rd.threads))
		rd.threads = append(rd.threads, d)
		return nil
	}
	if proc != nil {
		pid, _, name, err := descriptor(proc, fProcessPID, 0, fProcessName)
		if err != nil {
			return err
		}
		d.proc, d.pid = true, pid
		if _, ok := rd.procs[pid]; !ok {
			rd.procs[pid] = name
		}
	}
	if thread != nil {
		if d.pid, d.tid, d.name, err = descriptor(thread, fThreadPID, fThreadTID, fThreadName); err != nil {
			return err
		}
		d.thread = int32(len(rd.threads))
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
			// Known at once, so that an older trace's records are not
			// misread as this version's.
			if v := rd.header["version"]; v.u < oldestVersion || v.u > timelineVersion {
				return fmt.Errorf("format version %d (this reader reads %d to %d)", v.u, oldestVersion, timelineVersion)
			}
		case a.name == keyWait:
			if err := rd.wait(st, track, a); err != nil {
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
		case f.num == fAnnotationStrIID:
			s, ok := st.strs[f.u]
			if !ok {
				return fmt.Errorf("debug annotation string value %d not interned", f.u)
			}
			a.kind, a.s = 's', s
			return f.want(protowire.VarintType)
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
func (x *dec) str(k string) string {
	return x.get(k, "s").s
}

// recordFields is how many integers a wait record has at most.
const recordFields = 15

// wait reads a wait record (see pbEncoder.record) on a track of its
// thread's.
func (rd *reader) wait(st *seqState, track uint64, a annot) error {
	d := rd.tracks[track]
	switch {
	case d == nil || d.thread < 0:
		return fmt.Errorf("%s on track %d, no thread's", keyWait, track)
	case a.kind != 's':
		return errors.New(keyWait + " is not a string")
	}
	var v [recordFields]int64
	n := 0
	for f := range strings.FieldsSeq(a.s) {
		x, err := strconv.ParseInt(f, 10, 64)
		switch {
		case err != nil:
			return fmt.Errorf("%s %q: %w", keyWait, a.s, err)
		case n == recordFields:
			return fmt.Errorf("%s %q: too long", keyWait, a.s)
		}
		v[n], n = x, n+1
	}
	for len(rd.last) <= int(d.thread) {
		rd.last = append(rd.last, recBase{index: -1})
	}
	b := &rd.last[d.thread]
	w, err := st.waitOf(d.thread, rd.threads[d.thread].goid != 0, b.in+v[1], v)
	if err != nil {
		return fmt.Errorf("%s %q: %w", keyWait, a.s, err)
	}
	b.index, b.in = b.index+v[0], w.In
	rd.waits = append(rd.waits, waitRec{index: b.index, w: w})
	return nil
}

// waitOf is the wait a record's integers (from the third on) say.
func (st *seqState) waitOf(th int32, goroutine bool, out int64, v [recordFields]int64) (schema.Wait, error) {
	w := schema.Wait{Thread: th, Out: out, Wake: out + v[2], In: out + v[2] + v[3],
		Stack: int32(v[4]), Waker: int32(v[5]), WakerStack: int32(v[6]), Open: v[7]&1 != 0, IRQ: v[7]&2 != 0}
	if goroutine {
		w.OutThread, w.InThread = int32(v[13]-1), int32(v[14]-1)
	}
	for _, x := range append(v[4:8:8], v[13:]...) {
		if x != int64(int32(x)) {
			return w, fmt.Errorf("%d out of range", x)
		}
	}
	if v[7]&^7 != 0 || v[7]&4 == 0 && v[12] != 0 {
		return w, fmt.Errorf("flags %d with labels %d", v[7], v[12])
	}
	var strs [5]string
	for i, iid := range v[8:13] {
		s, ok := st.strs[uint64(iid)]
		if !ok && iid != 0 {
			return w, fmt.Errorf("string %d not interned", iid)
		}
		strs[i] = s
	}
	w.State, w.Class, w.Verdict, w.Category = strs[0], strs[1], strs[2], strs[3]
	if v[7]&4 == 0 {
		return w, nil
	}
	var err error
	w.Labels, err = parseLabelSet(strs[4])
	return w, err
}

// parseLabelSet reads what labelSet wrote.
func parseLabelSet(s string) (map[string]string, error) {
	l := map[string]string{}
	for s != "" {
		var kv [2]string
		for i := range kv {
			q, err := strconv.QuotedPrefix(s)
			if err != nil {
				return nil, fmt.Errorf("labels: %w", err)
			}
			kv[i], _ = strconv.Unquote(q)
			s = s[len(q):]
			if sep := "= "[i : i+1]; i == 0 || s != "" {
				if !strings.HasPrefix(s, sep) {
					return nil, fmt.Errorf("labels: %q where %q", s, sep)
				}
				s = s[1:]
			}
		}
		l[kv[0]] = kv[1]
	}
	return l, nil
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
	case version < oldestVersion || version > timelineVersion:
		return nil, fmt.Errorf("format version %d (this reader reads %d to %d)", version, oldestVersion, timelineVersion)
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
		out[i] = schema.TimelineThread{PID: d.pid, TID: d.tid, GoID: d.goid, Name: d.name, Process: rd.procs[d.pid]}
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
