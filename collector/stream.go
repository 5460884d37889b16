package collector

import (
	"slices"
	"time"

	"github.com/cilium/ebpf"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/stream"
)

// DefaultStreamRing is the wait ring's size in bytes: at 120 bytes a wait
// and a read every 50 ms, room for 2.8 million switches a second.
const DefaultStreamRing = 16 << 20

// streamReader keeps the thread waits the programs stream.
type streamReader = stream.Ring[bpf.OffcpuWaitEvent]

func newStreamReader(m *ebpf.Map, keep time.Duration, maxBytes int) (*streamReader, error) {
	return stream.New(m, keep, maxBytes, func(w *bpf.OffcpuWaitEvent) uint64 { return w.InNs }, stream.WaitCodec{})
}

// requests are the extents of the kept waits of each request (tgid and
// thread-context link) with a wait that ended after since.
func streamRequests(r *streamReader, since uint64) map[[2]uint64]*FlightRequest {
	v, _ := r.Kept()
	out := map[[2]uint64]*FlightRequest{}
	v.Backward(func(w *bpf.OffcpuWaitEvent) bool {
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
		keys = append(keys, stream.RequestKey(uint32(k[0]), k[1]))
	}
	want := func(ks []uint64) bool {
		for _, k := range keys {
			if _, ok := slices.BinarySearch(ks, k); ok {
				return true
			}
		}
		return false
	}
	v.EachWith(want, func(w *bpf.OffcpuWaitEvent) {
		if q := out[[2]uint64{uint64(w.Tgid), w.Link}]; q != nil && w.Link != 0 {
			q.Start, q.End = min(q.Start, w.OutNs), max(q.End, w.InNs)
			q.Waits++
		}
	})
	return out
}
