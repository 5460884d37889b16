package stream

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/offcpu/offcpu/bpf"
)

// A view stays what it was while waits are added and dropped; memory is
// whole chunks of what is kept.
func TestWaitChunks(t *testing.T) {
	var c chunks[bpf.OffcpuWaitEvent]
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
	v.Each(func(w *bpf.OffcpuWaitEvent) { got = append(got, w.InNs) })
	if v.Len() != len(got) || len(got) != 2*chunkWaits-10 || got[0] != chunkWaits+10 || got[len(got)-1] != 3*chunkWaits-1 {
		t.Fatalf("the view changed: %d waits, %d..%d", len(got), got[0], got[len(got)-1])
	}
	for i := 1; i < len(got); i++ {
		if got[i] != got[i-1]+1 {
			t.Fatalf("the view is out of order at %d", i)
		}
	}
	n := 0
	v.Backward(func(w *bpf.OffcpuWaitEvent) bool { n++; return w.InNs > 2*chunkWaits })
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

// randomWait is a wait with every field set, drawn as a server's are:
// ids and threads from a few, some of any value.
func randomWait(rng *rand.Rand, out uint64) bpf.OffcpuWaitEvent {
	ids := []int64{-1, 0, 0x7fffffffffffffff, -0x7000000000000000, 12345}
	id := func() int64 { return ids[rng.IntN(len(ids))] ^ int64(rng.IntN(3)) }
	w := bpf.OffcpuWaitEvent{OutNs: out, InNs: out + rng.Uint64N(1<<40), RunqNs: rng.Uint64N(1 << 30),
		Tgid: few(rng), Tid: few(rng), Ustack: id(), Kstack: id(), Link: uint64(id()), Gen: few(rng),
		State: uint8(rng.IntN(4)), Open: uint8(rng.IntN(2)), Gil: uint8(rng.IntN(2)), GilHolder: few(rng)}
	if rng.IntN(2) == 0 {
		w.Waker = bpf.OffcpuWakerRec{Tgid: few(rng), Tid: few(rng), Ustack: id(), Kstack: id(),
			Irq: uint32(rng.IntN(2)), Valid: 1, WaitUstack: id(), WaitKstack: id()}
	}
	return w
}

// few is one of a few thread ids, or at times any value.
func few(rng *rand.Rand) uint32 {
	if rng.IntN(100) == 0 {
		return rng.Uint32()
	}
	return []uint32{0, 1, 4242, 4194303}[rng.IntN(4)]
}

// Packed chunks read back as they were written, from any first record,
// forward and backward, through a view taken before they were packed or
// unpacked again; and take less memory.
func TestWaitChunksPacked(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	c := chunks[bpf.OffcpuWaitEvent]{codec: WaitCodec{}}
	var want []bpf.OffcpuWaitEvent
	out := uint64(1 << 50)
	early := c.view()
	for range 3*chunkWaits + 100 {
		out += rng.Uint64N(1 << 20)
		if rng.IntN(10) == 0 {
			out -= rng.Uint64N(1 << 10) // out of order: waits are sent as they end
		}
		w := randomWait(rng, out)
		want = append(want, w)
		c.add(w)
	}
	if early.Len() != 0 {
		t.Errorf("an empty view holds %d", early.Len())
	}
	mid := c.view()
	packed, size := 0, 0
	for _, ch := range c.chunks {
		if ch.raw == nil {
			packed++
			size += len(ch.enc)
		}
	}
	if unpacked := 2 * chunkWaits * recordSize[bpf.OffcpuWaitEvent](); packed != 2 || size > unpacked/2 {
		t.Errorf("%d chunks packed in %d bytes, %d unpacked", packed, size, unpacked)
	}
	t.Logf("%.1f bytes a wait packed", float64(size)/float64(2*chunkWaits))
	for range chunkWaits + 7 {
		c.drop()
	}
	if f := c.first(); f == nil || *f != want[chunkWaits+7] {
		t.Fatalf("first after drops: %+v", f)
	}
	var got []bpf.OffcpuWaitEvent
	mid.Each(func(w *bpf.OffcpuWaitEvent) { got = append(got, *w) })
	if !slices.Equal(got, want) {
		t.Fatalf("view read back %d waits, differing from the %d written", len(got), len(want))
	}
	// Packed chunks are found by their requests without unpacking.
	raw, visited := 0, 0
	for _, ch := range c.chunks {
		raw += len(ch.raw)
	}
	c.view().EachWith(func([]uint64) bool { return false }, func(*bpf.OffcpuWaitEvent) { visited++ })
	if visited != raw-c.head {
		t.Errorf("eachWith wanting no packed chunk visited %d waits, %d unpacked", visited, raw-c.head)
	}
	k := RequestKey(want[2*chunkWaits+1].Tgid, want[2*chunkWaits+1].Link)
	visited = 0
	c.view().EachWith(func(ks []uint64) bool { _, ok := slices.BinarySearch(ks, k); return ok }, func(*bpf.OffcpuWaitEvent) { visited++ })
	if visited != raw-c.head+chunkWaits {
		t.Errorf("eachWith wanting one chunk's request visited %d waits, want %d", visited, raw-c.head+chunkWaits)
	}
	got = got[:0]
	c.view().Backward(func(w *bpf.OffcpuWaitEvent) bool { got = append(got, *w); return true })
	slices.Reverse(got)
	if !slices.Equal(got, want[chunkWaits+7:]) {
		t.Fatalf("backward read %d waits, differing", len(got))
	}
}

// The codec's cost per wait, packing and unpacking a chunk:
//
//	go test -run XXX -bench WaitCodec ./collector
func BenchmarkWaitCodec(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	ws := make([]bpf.OffcpuWaitEvent, chunkWaits)
	out := uint64(1 << 50)
	for i := range ws {
		out += rng.Uint64N(1 << 20)
		ws[i] = randomWait(rng, out)
	}
	enc := WaitCodec{}.Encode(nil, ws)
	b.Run("pack", func(b *testing.B) {
		var buf []byte
		for b.Loop() {
			buf = WaitCodec{}.Encode(buf[:0], ws)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chunkWaits), "ns/wait")
		b.ReportMetric(float64(len(buf))/chunkWaits, "bytes/wait")
	})
	b.Run("unpack", func(b *testing.B) {
		for b.Loop() {
			WaitCodec{}.Decode(enc, 0, func(*bpf.OffcpuWaitEvent) bool { return true })
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*chunkWaits), "ns/wait")
	})
}
