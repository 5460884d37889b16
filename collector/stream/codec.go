package stream

import (
	"encoding/binary"
	"slices"

	"github.com/offcpu/offcpu/bpf"
)

// Codec packs a full chunk of records into bytes and unpacks them:
// a flight recorder keeps seconds of waits, most of whose 120 bytes are
// ids repeated from wait to wait and small numbers.
type Codec[T any] interface {
	Encode(dst []byte, recs []T) []byte
	// Decode calls fn on each record from the first'th on, in order,
	// until fn returns false.
	Decode(b []byte, first int, fn func(*T) bool)
	// Keys are what a packed chunk's records are found by without
	// unpacking them, sorted (nil: none).
	Keys(recs []T) []uint64
}

// WaitCodec packs thread waits to about a third: each chunk's 64-bit ids
// (stacks, request links) in a table read by varint index, times as
// varint deltas, the rest as varints.
type WaitCodec struct{}

// Flags of a packed wait.
const (
	packOpen  = 1 << 8
	packGIL   = 1 << 9
	packWaker = 1 << 10
)

func (WaitCodec) Encode(dst []byte, ws []bpf.OffcpuWaitEvent) []byte {
	ids := map[uint64]uint64{}
	var table []uint64
	id := func(v int64) uint64 {
		i, ok := ids[uint64(v)]
		if !ok {
			i = uint64(len(table))
			ids[uint64(v)] = i
			table = append(table, uint64(v))
		}
		return i
	}
	var body []byte
	var prevOut uint64
	for i := range ws {
		w := &ws[i]
		flags := uint64(w.State)
		if w.Open != 0 {
			flags |= packOpen
		}
		if w.Gil != 0 {
			flags |= packGIL
		}
		if w.Waker != (bpf.OffcpuWakerRec{}) {
			flags |= packWaker
		}
		body = binary.AppendUvarint(body, flags)
		body = binary.AppendVarint(body, int64(w.OutNs-prevOut))
		body = binary.AppendUvarint(body, w.InNs-w.OutNs)
		body = binary.AppendUvarint(body, w.RunqNs)
		prevOut = w.OutNs
		body = binary.AppendUvarint(body, uint64(w.Tgid))
		body = binary.AppendUvarint(body, uint64(w.Tid))
		body = binary.AppendUvarint(body, id(w.Ustack))
		body = binary.AppendUvarint(body, id(w.Kstack))
		body = binary.AppendUvarint(body, id(int64(w.Link)))
		body = binary.AppendUvarint(body, uint64(w.Gen))
		body = binary.AppendUvarint(body, uint64(w.GilHolder))
		if flags&packWaker != 0 {
			k := &w.Waker
			body = binary.AppendUvarint(body, uint64(k.Tgid))
			body = binary.AppendUvarint(body, uint64(k.Tid))
			body = binary.AppendUvarint(body, id(k.Ustack))
			body = binary.AppendUvarint(body, id(k.Kstack))
			body = binary.AppendUvarint(body, uint64(k.Irq))
			body = binary.AppendUvarint(body, uint64(k.Valid))
			body = binary.AppendUvarint(body, id(k.WaitUstack))
			body = binary.AppendUvarint(body, id(k.WaitKstack))
		}
	}
	dst = binary.AppendUvarint(dst, uint64(len(table)))
	for _, v := range table {
		dst = binary.LittleEndian.AppendUint64(dst, v)
	}
	return append(dst, body...)
}

func (WaitCodec) Decode(b []byte, first int, fn func(*bpf.OffcpuWaitEvent) bool) {
	r := packReader{b: b}
	table := make([]uint64, r.u())
	for i := range table {
		table[i] = binary.LittleEndian.Uint64(r.b[:8])
		r.b = r.b[8:]
	}
	id := func() uint64 { return table[r.u()] }
	var prevOut uint64
	var w bpf.OffcpuWaitEvent
	for i := 0; len(r.b) > 0; i++ {
		w = bpf.OffcpuWaitEvent{}
		flags := r.u()
		w.State = uint8(flags)
		if flags&packOpen != 0 {
			w.Open = 1
		}
		if flags&packGIL != 0 {
			w.Gil = 1
		}
		w.OutNs = prevOut + uint64(r.s())
		prevOut = w.OutNs
		w.InNs = w.OutNs + r.u()
		w.RunqNs = r.u()
		w.Tgid, w.Tid = uint32(r.u()), uint32(r.u())
		w.Ustack, w.Kstack, w.Link = int64(id()), int64(id()), id()
		w.Gen, w.GilHolder = uint32(r.u()), uint32(r.u())
		if flags&packWaker != 0 {
			k := &w.Waker
			k.Tgid, k.Tid = uint32(r.u()), uint32(r.u())
			k.Ustack, k.Kstack = int64(id()), int64(id())
			k.Irq, k.Valid = uint32(r.u()), uint32(r.u())
			k.WaitUstack, k.WaitKstack = int64(id()), int64(id())
		}
		if i >= first && !fn(&w) {
			return
		}
	}
}

// Keys are the chunk's requests (RequestKey), for FlightRequests.
func (WaitCodec) Keys(ws []bpf.OffcpuWaitEvent) []uint64 {
	var ks []uint64
	for i := range ws {
		if ws[i].Link != 0 {
			ks = append(ks, RequestKey(ws[i].Tgid, ws[i].Link))
		}
	}
	slices.Sort(ks)
	return slices.Clip(slices.Compact(ks))
}

// RequestKey is a request's (a process's thread-context link) key.
func RequestKey(tgid uint32, link uint64) uint64 {
	return link*0x9e3779b97f4a7c15 ^ uint64(tgid)
}

// packReader reads the varints a codec wrote (its own bytes: never short).
type packReader struct{ b []byte }

func (r *packReader) u() uint64 {
	v, n := binary.Uvarint(r.b)
	r.b = r.b[n:]
	return v
}

func (r *packReader) s() int64 {
	v, n := binary.Varint(r.b)
	r.b = r.b[n:]
	return v
}
