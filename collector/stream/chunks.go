// Package stream keeps the records a BPF ring buffer streams (every wait
// in order, for timelines and the flight recorder): read as they come,
// kept in chunks, packed once full, the oldest dropped past a span.
package stream

import (
	"unsafe"

	"github.com/offcpu/offcpu/bpf"
)

// chunkWaits is the size of a chunk of kept waits (480 KiB unpacked).
const chunkWaits = 4096

// WaitView holds the thread waits; the goroutine stream's are held the
// same way.
type WaitView = View[bpf.OffcpuWaitEvent]

// chunks keeps a stream's records in fixed chunks: memory follows the
// records kept (no slice doubling), the oldest go a chunk at a time, and a
// view is stable without a copy, since a chunk is only appended to past
// what a view shows and never written again. With a codec, each chunk is
// packed once full, and unpacked again only when it is the oldest and
// its records are dropped one by one.
type chunks[T any] struct {
	codec  Codec[T] // nil: records kept as they are
	chunks []chunk[T]
	head   int // the first kept record of chunks[0]
	n      int // records kept
	bytes  int // the memory they take
}

// chunk is a chunk's records, or once packed their bytes and the keys
// they are found by.
type chunk[T any] struct {
	raw  []T
	enc  []byte
	keys []uint64
	n    int
}

func recordSize[T any]() int {
	var zero T
	return int(unsafe.Sizeof(zero))
}

func (c *chunks[T]) add(ev T) {
	if len(c.chunks) == 0 || c.chunks[len(c.chunks)-1].n == chunkWaits {
		c.chunks = append(c.chunks, chunk[T]{raw: make([]T, 0, chunkWaits)})
		c.bytes += chunkWaits * recordSize[T]()
	}
	last := &c.chunks[len(c.chunks)-1]
	last.raw = append(last.raw, ev)
	last.n++
	c.n++
	if last.n == chunkWaits && c.codec != nil && len(c.chunks) > 1 {
		c.pack(last)
	}
}

// pack replaces a full chunk's records by their packed bytes.
func (c *chunks[T]) pack(ch *chunk[T]) {
	enc := c.codec.Encode(nil, ch.raw)
	ch.enc = append(make([]byte, 0, len(enc)), enc...)
	ch.keys = c.codec.Keys(ch.raw)
	c.bytes += len(ch.enc) + 8*len(ch.keys) - cap(ch.raw)*recordSize[T]()
	ch.raw = nil
}

// first is the oldest record kept (nil: none).
func (c *chunks[T]) first() *T {
	if c.n == 0 {
		return nil
	}
	ch := &c.chunks[0]
	if ch.raw == nil { // packed: unpacked while its records are dropped
		ch.raw = make([]T, 0, ch.n)
		c.codec.Decode(ch.enc, 0, func(r *T) bool { ch.raw = append(ch.raw, *r); return true })
		c.bytes += cap(ch.raw)*recordSize[T]() - len(ch.enc) - 8*len(ch.keys)
		ch.enc, ch.keys = nil, nil
	}
	return &ch.raw[c.head]
}

// drop forgets the oldest record.
func (c *chunks[T]) drop() {
	c.head++
	c.n--
	if ch := &c.chunks[0]; c.head == ch.n && (len(c.chunks) > 1 || c.n == 0) {
		c.bytes -= len(ch.enc) + 8*len(ch.keys) + cap(ch.raw)*recordSize[T]()
		c.chunks[0] = chunk[T]{}
		c.chunks = c.chunks[1:]
		c.head = 0
	}
}

// view is what is kept now, stable while more is added and dropped.
func (c *chunks[T]) view() View[T] {
	v := View[T]{codec: c.codec, chunks: make([]chunk[T], len(c.chunks)), head: c.head, n: c.n}
	for i, ch := range c.chunks {
		if ch.raw != nil {
			ch.raw = ch.raw[:len(ch.raw):len(ch.raw)]
		}
		v.chunks[i] = ch
	}
	return v
}

// View is a stable view of kept records, oldest first.
type View[T any] struct {
	codec  Codec[T]
	chunks []chunk[T]
	head   int
	n      int
}

// Each calls fn on every record of the view in order.
func (v View[T]) Each(fn func(*T)) {
	v.EachWith(func([]uint64) bool { return true }, fn)
}

// EachWith calls fn on every record of the view in order, skipping the
// packed chunks none of whose keys want says it wants.
func (v View[T]) EachWith(want func(keys []uint64) bool, fn func(*T)) {
	for i, ch := range v.chunks {
		if ch.raw == nil && !want(ch.keys) {
			continue
		}
		from := 0
		if i == 0 {
			from = v.head
		}
		if ch.raw == nil {
			v.codec.Decode(ch.enc, from, func(r *T) bool { fn(r); return true })
			continue
		}
		for j := from; j < len(ch.raw); j++ {
			fn(&ch.raw[j])
		}
	}
}

// Backward calls fn on the records from the newest until it returns
// false.
func (v View[T]) Backward(fn func(*T) bool) {
	var buf []T
	for i := len(v.chunks) - 1; i >= 0; i-- {
		ch, from := v.chunks[i].raw, 0
		if i == 0 {
			from = v.head
		}
		if ch == nil {
			buf = buf[:0]
			v.codec.Decode(v.chunks[i].enc, 0, func(r *T) bool { buf = append(buf, *r); return true })
			ch = buf
		}
		for j := len(ch) - 1; j >= from; j-- {
			if !fn(&ch[j]) {
				return
			}
		}
	}
}

// Len is the number of records in the view.
func (v View[T]) Len() int { return v.n }
