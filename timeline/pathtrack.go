package timeline

import (
	"bufio"
	"io"
	"sort"

	"google.golang.org/protobuf/encoding/protowire"
)

// PathSlice is one segment of a critical path as a slice of its track:
// followed segments hold, at the next depth, what their waker did.
type PathSlice struct {
	Start, End int64
	Depth      int
	Name       string
}

// Fields of the path track's packets not used elsewhere (trace_packet.proto,
// track_event.proto).
const (
	fPacketClockID protowire.Number = 58 // TracePacket.timestamp_clock_id
	fEventName     protowire.Number = 23 // TrackEvent.name, not interned
	// pathSeq and pathTrack: a sequence and track of their own, apart from
	// WritePerfetto's (ReadPerfetto skips them).
	pathSeq   = 0x9a7b
	pathTrack = 1 << 40
)

// AppendPathTrack writes, after a trace WritePerfetto wrote (a trace is a
// sequence of packets: appending one adds to it), a track named name
// whose slices are the critical path's segments, nested by depth, in
// CLOCK_MONOTONIC times. segs: in order, each followed segment before
// the segments it holds.
func AppendPathTrack(w io.Writer, name string, segs []PathSlice) error {
	bw := bufio.NewWriter(w)
	var td, pkt []byte
	td = protowire.AppendTag(td, fTrackUUID, protowire.VarintType)
	td = protowire.AppendVarint(td, pathTrack)
	td = protowire.AppendTag(td, fTrackName, protowire.BytesType)
	td = protowire.AppendString(td, name)
	pkt = protowire.AppendTag(pkt, fPacketSequenceID, protowire.VarintType)
	pkt = protowire.AppendVarint(pkt, pathSeq)
	pkt = protowire.AppendTag(pkt, fPacketTrackDesc, protowire.BytesType)
	pkt = protowire.AppendBytes(pkt, td)
	writePacket(bw, pkt)
	for _, ev := range pathEvents(segs) {
		writePacket(bw, pathEvent(ev))
	}
	return bw.Flush()
}

// pathEv is a begin (name set) or an end of a path slice.
type pathEv struct {
	ts    int64
	begin bool
	name  string
	seq   int
}

// pathEvents are the slices' begins and ends in time order: ends first at
// equal times, inner ones before outer; begins outer before inner.
func pathEvents(segs []PathSlice) []pathEv {
	var evs []pathEv
	for i, s := range segs {
		if s.End <= s.Start {
			continue // an instant would end before it began
		}
		evs = append(evs, pathEv{ts: s.Start, begin: true, name: s.Name, seq: i}, pathEv{ts: s.End, seq: -i - 1})
	}
	sort.SliceStable(evs, func(i, j int) bool {
		a, b := evs[i], evs[j]
		if a.ts != b.ts {
			return a.ts < b.ts
		}
		if a.begin != b.begin {
			return !a.begin
		}
		return a.seq < b.seq // begins in order; ends of later (inner) slices first
	})
	return evs
}

func pathEvent(ev pathEv) []byte {
	var te, pkt []byte
	typ := uint64(typeSliceEnd)
	if ev.begin {
		typ = typeSliceBegin
	}
	te = protowire.AppendTag(te, fEventType, protowire.VarintType)
	te = protowire.AppendVarint(te, typ)
	te = protowire.AppendTag(te, fEventTrackUUID, protowire.VarintType)
	te = protowire.AppendVarint(te, pathTrack)
	if ev.begin {
		te = protowire.AppendTag(te, fEventName, protowire.BytesType)
		te = protowire.AppendString(te, ev.name)
	}
	pkt = protowire.AppendTag(pkt, fPacketTimestamp, protowire.VarintType)
	pkt = protowire.AppendVarint(pkt, uint64(ev.ts))
	pkt = protowire.AppendTag(pkt, fPacketClockID, protowire.VarintType)
	pkt = protowire.AppendVarint(pkt, clockMonotonic)
	pkt = protowire.AppendTag(pkt, fPacketSequenceID, protowire.VarintType)
	pkt = protowire.AppendVarint(pkt, pathSeq)
	pkt = protowire.AppendTag(pkt, fPacketTrackEvent, protowire.BytesType)
	return protowire.AppendBytes(pkt, te)
}

// writePacket writes one Trace.packet.
func writePacket(w *bufio.Writer, pkt []byte) {
	var hdr []byte
	hdr = protowire.AppendTag(hdr, fTracePacket, protowire.BytesType)
	hdr = protowire.AppendVarint(hdr, uint64(len(pkt)))
	w.Write(hdr)
	w.Write(pkt)
}
