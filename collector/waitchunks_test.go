package collector

import (
	"testing"

	"github.com/offcpu/offcpu/bpf"
)

// A view stays what it was while waits are added and dropped; memory is
// whole chunks of what is kept.
func TestWaitChunks(t *testing.T) {
	var c waitChunks
	for i := range 3 * chunkWaits {
		c.add(bpf.OffcpuWaitEvent{InNs: uint64(i)})
	}
	for range chunkWaits + 10 {
		c.drop()
	}
	v := c.view()
	for i := range chunkWaits {
		c.add(bpf.OffcpuWaitEvent{InNs: uint64(100000 + i)})
		c.drop()
	}
	if len(c.chunks) > 3 || c.n != 2*chunkWaits-10 {
		t.Errorf("%d chunks for %d waits", len(c.chunks), c.n)
	}
	var got []uint64
	v.each(func(w *bpf.OffcpuWaitEvent) { got = append(got, w.InNs) })
	if v.len() != len(got) || len(got) != 2*chunkWaits-10 || got[0] != chunkWaits+10 || got[len(got)-1] != 3*chunkWaits-1 {
		t.Fatalf("the view changed: %d waits, %d..%d", len(got), got[0], got[len(got)-1])
	}
	for i := 1; i < len(got); i++ {
		if got[i] != got[i-1]+1 {
			t.Fatalf("the view is out of order at %d", i)
		}
	}
	n := 0
	v.backward(func(w *bpf.OffcpuWaitEvent) bool { n++; return w.InNs > 2*chunkWaits })
	if n != chunkWaits {
		t.Errorf("backward visited %d waits, want %d", n, chunkWaits)
	}
	for c.n > 0 {
		c.drop()
	}
	if c.first() != nil || len(c.chunks) > 1 {
		t.Errorf("emptied: %d chunks left", len(c.chunks))
	}
}
