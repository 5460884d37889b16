package collector

import "github.com/offcpu/offcpu/bpf"

// chunkWaits is the size of a chunk of kept waits (480 KiB).
const chunkWaits = 4096

// waitChunks and waitView hold the thread waits; the goroutine stream's
// are held the same way.
type (
	waitChunks = chunks[bpf.OffcpuWaitEvent]
	waitView   = chunkView[bpf.OffcpuWaitEvent]
)

// chunks keeps a stream's records in fixed chunks: memory follows the
// waits kept (no slice doubling), the oldest go a chunk at a time, and a
// view is stable without a copy, since a chunk is only appended to past
// what a view shows and never written again.
type chunks[T any] struct {
	chunks [][]T
	head   int // the first kept wait of chunks[0]
	n      int // waits kept
}

func (c *chunks[T]) add(ev T) {
	if len(c.chunks) == 0 || len(c.chunks[len(c.chunks)-1]) == chunkWaits {
		c.chunks = append(c.chunks, make([]T, 0, chunkWaits))
	}
	last := len(c.chunks) - 1
	c.chunks[last] = append(c.chunks[last], ev)
	c.n++
}

// first is the oldest wait kept (nil: none).
func (c *chunks[T]) first() *T {
	if c.n == 0 {
		return nil
	}
	return &c.chunks[0][c.head]
}

// drop forgets the oldest wait.
func (c *chunks[T]) drop() {
	c.head++
	c.n--
	if c.head == len(c.chunks[0]) && (len(c.chunks) > 1 || c.n == 0) {
		c.chunks[0] = nil
		c.chunks = c.chunks[1:]
		c.head = 0
	}
}

// view is what is kept now, stable while more is added and dropped.
func (c *chunks[T]) view() chunkView[T] {
	v := chunkView[T]{chunks: make([][]T, len(c.chunks)), head: c.head, n: c.n}
	for i, ch := range c.chunks {
		v.chunks[i] = ch[:len(ch):len(ch)]
	}
	return v
}

// chunkView is a stable view of kept records, oldest first.
type chunkView[T any] struct {
	chunks [][]T
	head   int
	n      int
}

// each calls fn on every wait of the view in order.
func (v chunkView[T]) each(fn func(*T)) {
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
func (v chunkView[T]) backward(fn func(*T) bool) {
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
func (v chunkView[T]) len() int { return v.n }
