package collector

import (
	"fmt"
	"time"

	"github.com/cilium/ebpf"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/internal/loop"
)

// A continuous session keeps two aggregation maps: the programs add to
// the one in offcpu_maps' slot; at each cut, and between cuts once it is
// half full (each thread's every preemption point is a key, and so is each
// short-lived thread's every wait), the other one takes the slot. The
// kernel returns from that update only once no running program holds the
// old map, so it is read and emptied with nothing adding to it: every
// interval is counted once, in the cut it ended before. (Deleting entries
// under running programs, as an earlier version did, lost the intervals
// added to an entry while it was freed and could add them to another.)

// foldedEntry is an aggregation entry moved to memory since the last cut.
type foldedEntry struct {
	key bpf.OffcpuOffcpuKey
	val bpf.OffcpuOffcpuVal
}

// aggMaps are a continuous session's aggregation maps.
type aggMaps struct {
	slot       *ebpf.Map // offcpu_maps: the programs' slot
	cur, spare *ebpf.Map
	own        *ebpf.Map // the one made here, closed with the session
}

// newAggMaps makes the spare aggregation map, like the loaded one.
// spec: the aggregation map's own, BTF types included: a map to swap in
// must be made as the first was (6.1 compares what BTF gives a map, such
// as the offset of a timer, and refuses one made without).
func newAggMaps(coll *ebpf.Collection, spec *ebpf.MapSpec) (*aggMaps, error) {
	cur, slot := coll.Maps[bpf.OffcpuMapOffcpu], coll.Maps[bpf.OffcpuMapOffcpuMaps]
	if cur == nil || slot == nil || spec == nil {
		return nil, fmt.Errorf("the aggregation maps are missing from the BPF object")
	}
	spec = spec.Copy()
	spec.Name = "offcpu_spare"
	spare, err := ebpf.NewMap(spec)
	if err != nil {
		return nil, fmt.Errorf("making the second aggregation map: %w", err)
	}
	return &aggMaps{slot: slot, cur: cur, spare: spare, own: spare}, nil
}

func (a *aggMaps) close() {
	if a != nil && a.own != nil {
		a.own.Close()
		a.own = nil
	}
}

// swapAgg gives the programs the spare aggregation map and moves every
// entry of the one it replaces to memory.
func (c *continuous) swapAgg() error {
	a := c.agg
	if err := a.slot.Update(uint32(0), a.spare, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("swapping the aggregation maps: %w", err)
	}
	old := a.cur
	a.cur, a.spare = a.spare, old
	c.aggRemoved += uint64(takeAll(old, func(k *bpf.OffcpuOffcpuKey, v *bpf.OffcpuOffcpuVal) {
		c.folded = append(c.folded, foldedEntry{*k, *v})
	}))
	return nil
}

// foldEvery checks the aggregation map's fill and moves it to memory once
// half full (maybeFold). The next check comes before the keys, at the rate
// they came since the last one, could fill half of what is left: checks a
// second apart (a tenth once a quarter full) let a churn under load take
// the map from under a quarter to full between two of them.
func (s *Session) foldEvery(stop <-chan struct{}) {
	var last, rate float64 // fill after the last check; share of the map filled a second
	lastAt := time.Now()
	loop.SleepLoop(100*time.Millisecond, nil, stop, func(now time.Time) time.Duration {
		before, after := s.maybeFold()
		// A cut in between empties the map: the last rate stands.
		if g := before - last; g >= 0 {
			rate = g / max(now.Sub(lastAt).Seconds(), 1e-3)
		}
		last, lastAt = after, now
		return nextFoldCheck(after, rate)
	})
}

// nextFoldCheck is how long until a map fill full, filling at rate (its
// share a second), has filled half of what is left before the fold at
// one half; between 20 ms and a second.
func nextFoldCheck(fill, rate float64) time.Duration {
	const lo, hi = 20 * time.Millisecond, time.Second
	if rate <= 0 {
		return hi
	}
	d := time.Duration((0.5 - fill) / rate / 2 * float64(time.Second)).Round(time.Millisecond)
	return min(max(d, lo), hi)
}

// maybeFold moves the aggregation map to memory once it is half full; it
// returns the share of the map in use before and after.
func (s *Session) maybeFold() (before, after float64) {
	c := s.cont
	stored, err := statSum(s.p.coll.Maps[bpf.OffcpuMapStats], bpf.OffcpuOffcpuStatSTAT_AGG_STORED)
	if err != nil {
		return 0, 0
	}
	c.aggMu.Lock()
	defer c.aggMu.Unlock()
	fill := float64(stored-min(stored, c.aggRemoved)) / float64(c.agg.cur.MaxEntries())
	if fill < 0.5 {
		return fill, fill
	}
	n := len(c.folded)
	if err := c.swapAgg(); err != nil {
		return fill, fill
	}
	c.aggMoved += uint64(len(c.folded) - n)
	c.folds++
	return fill, 0
}

// takeAgg swaps the aggregation maps, calls size with how many entries
// were moved to memory since the last cut and fn with each (one per key:
// a key moved out at a fold and stored again is summed), then forgets
// them.
func (c *continuous) takeAgg(size func(int), fn func(*bpf.OffcpuOffcpuKey, *bpf.OffcpuOffcpuVal)) error {
	c.aggMu.Lock()
	err := c.swapAgg()
	folded, folds := c.folded, c.folds
	c.folded, c.folds = nil, 0
	c.movedAtCut, c.aggMoved = c.aggMoved, 0
	c.aggMu.Unlock()
	if folds > 0 {
		folded = mergeFolded(folded)
	}
	size(len(folded))
	for i := range folded {
		fn(&folded[i].key, &folded[i].val)
	}
	return err
}

// mergeFolded sums the entries of the same key, keeping the first of
// each in place.
func mergeFolded(fs []foldedEntry) []foldedEntry {
	at := make(map[bpf.OffcpuOffcpuKey]int, len(fs))
	out := fs[:0]
	for _, f := range fs {
		i, ok := at[f.key]
		if !ok {
			at[f.key] = len(out)
			out = append(out, f)
			continue
		}
		v := &out[i].val
		v.Ns += f.val.Ns
		v.Count += f.val.Count
		v.RunqNs += f.val.RunqNs
		v.ChainNs += f.val.ChainNs
	}
	return out
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
