package collector

import (
	"time"

	"github.com/cilium/ebpf"

	"github.com/offcpu/offcpu/bpf"
)

// An agent's aggregation map can fill within one interval on a busy
// machine: each thread's every preemption point is a key, and so is each
// short-lived thread's every wait. Between cuts, once the map holds half
// its capacity (keys stored less keys removed), its entries are moved to
// memory: their change since the last cut goes to the next one, and the
// threads that block again store their keys anew. A program adding to an
// entry at the instant it is moved loses that one interval, the same race
// as the deletions at cuts.

// foldedEntry is a moved aggregation entry's change since the last cut.
type foldedEntry struct {
	key bpf.OffcpuOffcpuKey
	val bpf.OffcpuOffcpuVal
}

// foldEvery checks the aggregation map's fill every second, every tenth
// of one once it is a quarter full, until stop.
func (s *Session) foldEvery(stop <-chan struct{}) {
	sleepLoop(time.Second, nil, stop, func(time.Time) time.Duration {
		if s.maybeFold() >= 0.25 {
			return 100 * time.Millisecond
		}
		return time.Second
	})
}

// maybeFold moves the aggregation map to memory once it is half full; it
// returns the share of the map in use after.
func (s *Session) maybeFold() float64 {
	c, m := s.cont, s.coll.Maps[bpf.OffcpuMapOffcpu]
	if m == nil {
		return 0
	}
	stored, err := statSum(s.coll.Maps[bpf.OffcpuMapStats], bpf.OffcpuOffcpuStatSTAT_AGG_STORED)
	if err != nil {
		return 0
	}
	c.mapMu.Lock()
	defer c.mapMu.Unlock()
	fill := float64(stored-min(stored, c.aggRemoved)) / float64(m.MaxEntries())
	if fill < 0.5 {
		return fill
	}
	c.fold(m)
	return 0
}

// fold moves every entry of the aggregation map to memory.
func (c *continuous) fold(m *ebpf.Map) {
	c.aggRemoved += uint64(takeAll(m, func(k *bpf.OffcpuOffcpuKey, v *bpf.OffcpuOffcpuVal) { c.foldOne(*k, *v) }))
}

// foldOne keeps a moved entry's change since the last cut and forgets
// its total: a key stored again starts from zero.
func (c *continuous) foldOne(k bpf.OffcpuOffcpuKey, v bpf.OffcpuOffcpuVal) {
	c.aggMoved++
	c.foldedKeys = append(c.foldedKeys, k)
	p := c.recs[k]
	delete(c.recs, k)
	if v.Count < p.count || v.Ns < p.ns {
		p = aggVals{}
	}
	if g, ok := gained(v, p); ok {
		c.folded = append(c.folded, foldedEntry{k, g})
	}
}

// gained is what an entry read at v added since it held p.
func gained(v bpf.OffcpuOffcpuVal, p aggVals) (bpf.OffcpuOffcpuVal, bool) {
	if v.Count <= p.count {
		return bpf.OffcpuOffcpuVal{}, false
	}
	return bpf.OffcpuOffcpuVal{Ns: v.Ns - min(p.ns, v.Ns), Count: v.Count - p.count,
		RunqNs: v.RunqNs - min(p.runq, v.RunqNs), ChainNs: v.ChainNs - min(p.chain, v.ChainNs)}, true
}

// takeFolded turns the entries moved since the last cut into records
// carried into this one.
func (c *continuous) takeFolded(getStack func(int64) []uint64) {
	for _, f := range c.folded {
		c.carry = append(c.carry, aggRecord(f.key, f.val, getStack))
	}
	c.folded = nil
}

// statSum is one of the programs' counters summed over the CPUs.
func statSum(m *ebpf.Map, idx bpf.OffcpuOffcpuStat) (uint64, error) {
	var per []uint64
	if err := m.Lookup(uint32(idx), &per); err != nil {
		return 0, err
	}
	var sum uint64
	for _, v := range per {
		sum += v
	}
	return sum, nil
}
