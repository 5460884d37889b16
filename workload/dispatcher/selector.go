package dispatcher

import (
	"sort"
	"strconv"
	"sync"

	"github.com/twmb/murmur3"
)

// hashRange is the sticky-key hash space, as Pulsar's
// DEFAULT_RANGE_SIZE.
const hashRange = 65536

// StickyKeyHash is murmur3_32 of the key bytes mod 65536.
func StickyKeyHash(key uint32) uint32 {
	var buf [10]byte
	return murmur3.Sum32(strconv.AppendUint(buf[:0], uint64(key), 10)) % hashRange
}

// autoSplitSelector is HashRangeAutoSplitStickyKeyConsumerSelector: each
// consumer owns a range of hash slots; a new consumer takes half of the
// largest range; a leaving consumer's range goes to its neighbour.
type autoSplitSelector struct {
	ends   []uint32    // range ends, ascending; range i is (ends[i-1], ends[i]]
	owners []*Consumer // owner of range i
}

func (s *autoSplitSelector) selectConsumer(hash uint32) *Consumer {
	i := sort.Search(len(s.ends), func(i int) bool { return s.ends[i] >= hash })
	if i == len(s.ends) {
		return nil
	}
	return s.owners[i]
}

func (s *autoSplitSelector) add(c *Consumer) {
	if len(s.ends) == 0 {
		s.ends = []uint32{hashRange - 1}
		s.owners = []*Consumer{c}
		return
	}
	// Largest range; ties go to the lowest.
	best, bestSize := 0, uint32(0)
	for i, end := range s.ends {
		start := uint32(0)
		if i > 0 {
			start = s.ends[i-1] + 1
		}
		if size := end - start + 1; size > bestSize {
			best, bestSize = i, size
		}
	}
	start := uint32(0)
	if best > 0 {
		start = s.ends[best-1] + 1
	}
	if bestSize < 2 {
		return // no room: the consumer gets no hashes
	}
	mid := start + bestSize/2 - 1
	s.ends = append(s.ends[:best], append([]uint32{mid}, s.ends[best:]...)...)
	s.owners = append(s.owners[:best], append([]*Consumer{c}, s.owners[best:]...)...)
}

func (s *autoSplitSelector) remove(c *Consumer) {
	for i, o := range s.owners {
		if o != c {
			continue
		}
		if len(s.owners) == 1 {
			s.ends, s.owners = nil, nil
			return
		}
		if i == len(s.owners)-1 {
			// The last range merges into the previous one.
			s.ends[i-1] = s.ends[i]
		}
		s.ends = append(s.ends[:i], s.ends[i+1:]...)
		s.owners = append(s.owners[:i], s.owners[i+1:]...)
		return
	}
}

// drainingHashes keeps a hash away from its new owner while the previous
// owner still has unacknowledged messages of it.
type drainingHashes struct {
	mu sync.Mutex
	m  map[uint32]*drainingHash
}

type drainingHash struct {
	owner *Consumer
	refs  int
}

// blocks reports whether dispatching hash to c must wait.
func (d *drainingHashes) blocks(hash uint32, c *Consumer) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	h := d.m[hash]
	return h != nil && h.owner != c
}

func (d *drainingHashes) add(hash uint32, owner *Consumer, refs int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.m == nil {
		d.m = map[uint32]*drainingHash{}
	}
	if h := d.m[hash]; h != nil && h.owner == owner {
		h.refs = refs
		return
	}
	d.m[hash] = &drainingHash{owner: owner, refs: refs}
}

// acked returns true when the hash stopped draining.
func (d *drainingHashes) acked(hash uint32, owner *Consumer) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	h := d.m[hash]
	if h == nil || h.owner != owner {
		return false
	}
	h.refs--
	if h.refs <= 0 {
		delete(d.m, hash)
		return true
	}
	return false
}

func (d *drainingHashes) dropOwner(owner *Consumer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k, h := range d.m {
		if h.owner == owner {
			delete(d.m, k)
		}
	}
}

func (d *drainingHashes) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.m)
}
