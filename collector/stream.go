package collector

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"

	"github.com/offcpu/offcpu/bpf"
)

// DefaultStreamRing is the wait ring's size in bytes: at 120 bytes a wait
// and a read every streamEvery, room for 2.8 million switches a second.
const DefaultStreamRing = 16 << 20

// streamEvery is how often the stream's reader empties the ring: the
// programs never wake it (a wake-up per switch would cost more than the
// switch's own accounting).
const streamEvery = 50 * time.Millisecond

// streamReader keeps the thread waits the programs stream.
type streamReader = ringStream[bpf.OffcpuWaitEvent]

// ringStream keeps every record a ring streams (Options.Stream), in the
// order they were sent: the thread waits, the goroutine waits.
type ringStream[T any] struct {
	rd   *ringbuf.Reader
	done chan struct{}
	// keep: a flight recorder's span (0: keep all, for one window), in
	// at most maxBytes, the oldest dropped first (overflow).
	keep     uint64
	maxBytes int

	// end is when a record's wait ended (the clock keep counts on).
	end func(*T) uint64

	mu       sync.Mutex
	waits    chunks[T]
	overflow uint64
}

func newStreamReader(m *ebpf.Map, keep time.Duration, maxBytes int) (*streamReader, error) {
	return newRingStream(m, keep, maxBytes, func(w *bpf.OffcpuWaitEvent) uint64 { return w.InNs }, waitCodec{})
}

// newRingStream reads ring m; end is when a record's wait ended, codec
// (nil: none) packs full chunks.
func newRingStream[T any](m *ebpf.Map, keep time.Duration, maxBytes int, end func(*T) uint64, codec chunkCodec[T]) (*ringStream[T], error) {
	rd, err := ringbuf.NewReader(m)
	if err != nil {
		return nil, fmt.Errorf("opening the wait stream's ring buffer: %w", err)
	}
	r := &ringStream[T]{rd: rd, done: make(chan struct{}), keep: uint64(keep), maxBytes: maxBytes, end: end}
	r.waits.codec = codec
	go r.run()
	return r, nil
}

// run reads the ring until it is closed.
func (r *ringStream[T]) run() {
	defer close(r.done)
	var rec ringbuf.Record
	var zero T
	size := int(unsafe.Sizeof(zero))
	for {
		r.rd.SetDeadline(time.Now().Add(streamEvery))
		err := r.rd.ReadInto(&rec)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, ringbuf.ErrFlushed):
			continue
		case err != nil:
			return // closed
		case len(rec.RawSample) < size:
			continue
		}
		ev := *(*T)(unsafe.Pointer(&rec.RawSample[0]))
		r.mu.Lock()
		r.waits.add(ev)
		if r.keep > 0 {
			r.trim(r.end(&ev))
		}
		r.mu.Unlock()
	}
}

// close reads what the ring still holds and stops the reader; the
// programs must send nothing more.
func (r *ringStream[T]) close() {
	for i := 0; i < 500 && r.rd.AvailableBytes() > 0; i++ {
		time.Sleep(2 * time.Millisecond)
	}
	r.rd.Close()
	<-r.done
}

// trim drops the waits that ended more than keep before now, and the
// oldest beyond maxBytes (overflow).
func (r *ringStream[T]) trim(now uint64) {
	for w := r.waits.first(); w != nil; w = r.waits.first() {
		old := r.end(w)+r.keep < now
		if !old && r.waits.bytes <= r.maxBytes {
			return
		}
		if !old {
			r.overflow++
		}
		r.waits.drop()
	}
}

// kept is a view of the waits kept now (not a copy) and the overflow.
func (r *ringStream[T]) kept() (chunkView[T], uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waits.view(), r.overflow
}

// requests are the extents of the kept waits of each request (tgid and
// thread-context link) with a wait that ended after since.
func streamRequests(r *streamReader, since uint64) map[[2]uint64]*FlightRequest {
	v, _ := r.kept()
	out := map[[2]uint64]*FlightRequest{}
	v.backward(func(w *bpf.OffcpuWaitEvent) bool {
		if w.InNs <= since {
			return false
		}
		if w.Link != 0 {
			out[[2]uint64{uint64(w.Tgid), w.Link}] = &FlightRequest{Start: w.OutNs}
		}
		return true
	})
	if len(out) == 0 {
		return nil
	}
	// Only the chunks that hold one of those requests are unpacked.
	var keys []uint64
	for k := range out {
		keys = append(keys, requestKey(uint32(k[0]), k[1]))
	}
	want := func(ks []uint64) bool {
		for _, k := range keys {
			if _, ok := slices.BinarySearch(ks, k); ok {
				return true
			}
		}
		return false
	}
	v.eachWith(want, func(w *bpf.OffcpuWaitEvent) {
		if q := out[[2]uint64{uint64(w.Tgid), w.Link}]; q != nil && w.Link != 0 {
			q.Start, q.End = min(q.Start, w.OutNs), max(q.End, w.InNs)
			q.Waits++
		}
	})
	return out
}

// take returns the waits read so far and forgets them.
func (r *ringStream[T]) take() chunkView[T] {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := r.waits.view()
	r.waits = chunks[T]{codec: r.waits.codec}
	return v
}
