package collector

import (
	"sync"
	"time"

	"github.com/cilium/ebpf"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/internal/loop"
)

// stackSpill moves stacks out of the BPF stacks map into memory whenever
// the map is half full. Short-lived processes each have their own
// addresses, so a recording of many of them stores far more distinct
// stacks than the map holds. A stack id is a hash of its addresses:
// intervals that name a moved stack still find it here, and a stack
// stored again after the move gets the same id.
type stackSpill struct {
	m        *ebpf.Map
	stats    *ebpf.Map
	capacity uint64
	period   time.Duration // how often the map's fill is checked

	mu     sync.Mutex
	stacks map[int64][]uint64
	moved  uint64
}

func newStackSpill(coll *ebpf.Collection, capacity int) *stackSpill {
	return &stackSpill{m: coll.Maps[bpf.OffcpuMapStacks], stats: coll.Maps[bpf.OffcpuMapStats],
		capacity: uint64(capacity), stacks: map[int64][]uint64{}, period: 100 * time.Millisecond}
}

// run checks the map's fill every 100 ms until stop is closed.
func (sp *stackSpill) run(stop <-chan struct{}) {
	loop.Every(sp.period, stop, func(time.Time) { sp.maybeMove() })
}

// maybeMove moves every stack out once the map holds half its capacity
// (stored less moved: an estimate, stores and moves race).
func (sp *stackSpill) maybeMove() {
	stored, err := statSum(sp.stats, bpf.OffcpuOffcpuStatSTAT_STACKS_STORED)
	if err != nil {
		return
	}
	sp.mu.Lock()
	held := stored - min(stored, sp.moved)
	sp.mu.Unlock()
	if held < sp.capacity/2 {
		return
	}
	sp.move()
}

func (sp *stackSpill) move() {
	n := takeAll(sp.m, func(id *int64, raw *bpf.OffcpuStackBuf) {
		ips := trimStack(raw.Ips[:])
		sp.mu.Lock()
		sp.stacks[*id] = ips
		sp.mu.Unlock()
	})
	sp.mu.Lock()
	sp.moved += uint64(n)
	sp.mu.Unlock()
}

// get returns a moved stack.
func (sp *stackSpill) get(id int64) ([]uint64, bool) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	st, ok := sp.stacks[id]
	return st, ok
}

// put keeps a stack in memory.
func (sp *stackSpill) put(id int64, ips []uint64) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.stacks[id] = ips
}

// forget drops moved stacks no longer used.
func (sp *stackSpill) forget(ids []int64) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for _, id := range ids {
		delete(sp.stacks, id)
	}
}

// count is how many stacks were moved out.
func (sp *stackSpill) count() uint64 {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return sp.moved
}

// trimStack copies the addresses up to the first zero.
func trimStack(ips []uint64) []uint64 {
	n := 0
	for n < len(ips) && ips[n] != 0 {
		n++
	}
	return append([]uint64(nil), ips[:n]...)
}
