package collector

import "github.com/offcpu/offcpu/bpf"

// chunkWaits is the size of a chunk of kept waits (480 KiB).
const chunkWaits = 4096

// waitChunks keeps the stream's waits in fixed chunks: memory follows the
// waits kept (no slice doubling), the oldest go a chunk at a time, and a
// view is stable without a copy, since a chunk is only appended to past
// what a view shows and never written again.
type waitChunks struct {
	chunks [][]bpf.OffcpuWaitEvent
	head   int // the first kept wait of chunks[0]
	n      int // waits kept
}

func (c *waitChunks) add(ev bpf.OffcpuWaitEvent) {
	if len(c.chunks) == 0 || len(c.chunks[len(c.chunks)-1]) == chunkWaits {
		c.chunks = append(c.chunks, make([]bpf.OffcpuWaitEvent, 0, chunkWaits))
	}
	last := len(c.chunks) - 1
	c.chunks[last] = append(c.chunks[last], ev)
	c.n++
}

// first is the oldest wait kept (nil: none).
func (c *waitChunks) first() *bpf.OffcpuWaitEvent {
	if c.n == 0 {
		return nil
	}
	return &c.chunks[0][c.head]
}

// drop forgets the oldest wait.
func (c *waitChunks) drop() {
	c.head++
	c.n--
	if c.head == len(c.chunks[0]) && (len(c.chunks) > 1 || c.n == 0) {
		c.chunks[0] = nil
		c.chunks = c.chunks[1:]
		c.head = 0
	}
}

// view is what is kept now, stable while more is added and dropped.
func (c *waitChunks) view() waitView {
	v := waitView{chunks: make([][]bpf.OffcpuWaitEvent, len(c.chunks)), head: c.head, n: c.n}
	for i, ch := range c.chunks {
		v.chunks[i] = ch[:len(ch):len(ch)]
	}
	return v
}

// waitView is a stable view of kept waits, oldest first.
type waitView struct {
	chunks [][]bpf.OffcpuWaitEvent
	head   int
	n      int
}

// each calls fn on every wait of the view in order.
func (v waitView) each(fn func(*bpf.OffcpuWaitEvent)) {
	for i, ch := range v.chunks {
		from := 0
		if i == 0 {
			from = v.head
		}
		for j := from; j < len(ch); j++ {
			fn(&ch[j])
		}
	}
}

// backward calls fn on the waits from the newest until it returns false.
func (v waitView) backward(fn func(*bpf.OffcpuWaitEvent) bool) {
	for i := len(v.chunks) - 1; i >= 0; i-- {
		ch, from := v.chunks[i], 0
		if i == 0 {
			from = v.head
		}
		for j := len(ch) - 1; j >= from; j-- {
			if !fn(&ch[j]) {
				return
			}
		}
	}
}

// len is the number of waits in the view.
func (v waitView) len() int { return v.n }
