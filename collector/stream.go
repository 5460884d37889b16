package collector

import (
	"errors"
	"fmt"
	"os"
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

// streamReader keeps every wait the programs stream (Options.Stream), in
// the order they ended.
type streamReader struct {
	rd   *ringbuf.Reader
	done chan struct{}

	mu    sync.Mutex
	waits []bpf.OffcpuWaitEvent
}

func newStreamReader(m *ebpf.Map) (*streamReader, error) {
	rd, err := ringbuf.NewReader(m)
	if err != nil {
		return nil, fmt.Errorf("opening the wait stream's ring buffer: %w", err)
	}
	r := &streamReader{rd: rd, done: make(chan struct{})}
	go r.run()
	return r, nil
}

// run reads the ring until it is closed.
func (r *streamReader) run() {
	defer close(r.done)
	var rec ringbuf.Record
	const size = int(unsafe.Sizeof(bpf.OffcpuWaitEvent{}))
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
		ev := *(*bpf.OffcpuWaitEvent)(unsafe.Pointer(&rec.RawSample[0]))
		r.mu.Lock()
		r.waits = append(r.waits, ev)
		r.mu.Unlock()
	}
}

// close reads what the ring still holds and stops the reader; the
// programs must send nothing more.
func (r *streamReader) close() {
	for i := 0; i < 500 && r.rd.AvailableBytes() > 0; i++ {
		time.Sleep(2 * time.Millisecond)
	}
	r.rd.Close()
	<-r.done
}

// take returns the waits read so far and forgets them.
func (r *streamReader) take() []bpf.OffcpuWaitEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.waits
	r.waits = nil
	return w
}
