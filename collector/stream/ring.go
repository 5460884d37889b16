package stream

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
)

// every is how often a ring's reader empties it: the programs never wake
// it (a wake-up per switch would cost more than the switch's own
// accounting).
const every = 50 * time.Millisecond

// Ring keeps every record a BPF ring buffer streams, in the order they
// were sent: the thread waits, the goroutine waits.
type Ring[T any] struct {
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

// New reads ring m; end is when a record's wait ended, codec (nil: none)
// packs full chunks.
func New[T any](m *ebpf.Map, keep time.Duration, maxBytes int, end func(*T) uint64, codec Codec[T]) (*Ring[T], error) {
	rd, err := ringbuf.NewReader(m)
	if err != nil {
		return nil, fmt.Errorf("opening the wait stream's ring buffer: %w", err)
	}
	r := &Ring[T]{rd: rd, done: make(chan struct{}), keep: uint64(keep), maxBytes: maxBytes, end: end}
	r.waits.codec = codec
	go r.run()
	return r, nil
}

// run reads the ring until it is closed.
func (r *Ring[T]) run() {
	defer close(r.done)
	var rec ringbuf.Record
	size := recordSize[T]()
	for {
		r.rd.SetDeadline(time.Now().Add(every))
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
		r.Add(ev)
	}
}

// Add keeps a record as if the ring had sent it.
func (r *Ring[T]) Add(ev T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waits.add(ev)
	if r.keep > 0 {
		r.trim(r.end(&ev))
	}
}

// Close reads what the ring still holds and stops the reader; the
// programs must send nothing more.
func (r *Ring[T]) Close() {
	for i := 0; i < 500 && r.rd.AvailableBytes() > 0; i++ {
		time.Sleep(2 * time.Millisecond)
	}
	r.rd.Close()
	<-r.done
}

// trim drops the waits that ended more than keep before now, and the
// oldest beyond maxBytes (overflow).
func (r *Ring[T]) trim(now uint64) {
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

// Kept is a view of the waits kept now (not a copy) and the overflow.
func (r *Ring[T]) Kept() (View[T], uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.waits.view(), r.overflow
}

// Take returns the waits read so far and forgets them.
func (r *Ring[T]) Take() View[T] {
	r.mu.Lock()
	defer r.mu.Unlock()
	v := r.waits.view()
	r.waits = chunks[T]{codec: r.waits.codec}
	return v
}
