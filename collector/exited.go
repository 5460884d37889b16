package collector

import (
	"cmp"
	"hash/maphash"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/schema"
)

// DefaultExitedDetail is how many exited processes keep their pid and tid
// labels by default: a recording under process churn has samples for
// every process seen (three profiles, ~15 KB a process), and merged per
// command they cost what one process does.
const DefaultExitedDetail = 1000

// DefaultContinuousWalkThreshold is the walk threshold of an agent that
// records all the time: every wait of 100 µs or more keeps its stacks,
// shorter ones are drawn with probability length/100 µs and weighted
// (each stack's time unbiased, each thread's exact); on a ping-pong of
// microsecond switches the programs cost 301 ns a switch against 1,005
// with every interval walked (docs/overhead.md).
const DefaultContinuousWalkThreshold = 100 * time.Microsecond

// exitedProcs is the name of each process whose main thread exited.
func (d *recording) exitedProcs() map[uint32]string {
	if d.exitedNames == nil {
		d.exitedNames = map[uint32]string{}
		for k, th := range d.exited {
			if k[0] == th.tgid {
				d.exitedNames[th.tgid] = th.comm
			}
		}
	}
	return d.exitedNames
}

// foldedPIDs returns the exited processes whose samples are merged: all
// but the keep with the most off-CPU time (ties by pid); nil when none.
func (d *recording) foldedPIDs(keep int) map[uint32]bool {
	if keep < 0 {
		return nil
	}
	exited := map[uint32]uint64{}
	for pid := range d.exitedProcs() {
		exited[pid] = 0
	}
	if len(exited) <= keep {
		return nil
	}
	for _, r := range d.records {
		if ns, ok := exited[r.tgid]; ok {
			exited[r.tgid] = ns + r.ns
		}
	}
	pids := slices.Collect(maps.Keys(exited))
	slices.SortFunc(pids, func(a, b uint32) int { return cmp.Or(cmp.Compare(exited[b], exited[a]), cmp.Compare(a, b)) })
	fold := make(map[uint32]bool, len(pids)-keep)
	for _, pid := range pids[keep:] {
		fold[pid] = true
	}
	return fold
}

// folds says whether a sample of process tgid with this waker is merged:
// either process is folded (a parent woken by each of its children would
// otherwise keep a sample per child).
func (d *recording) folds(tgid uint32, w waker) bool {
	return d.fold[tgid] || (w.valid && !w.irq && d.fold[w.tgid])
}

// sampleMerger adds samples to a profile, merging a folded one into an
// earlier folded sample with the same locations and labels. Samples with
// equal labels share one label map (two maps were most of a sample's
// memory; nothing changes a built sample's labels one sample at a time);
// the maps are found by a 128-bit hash of their contents, so that the
// pools hold no copy of them.
type sampleMerger struct {
	p      *profile.Profile
	at     map[string]*profile.Sample
	key    []byte
	seeds  [2]maphash.Seed
	labels map[[2]uint64]map[string][]string
	nums   map[[2]uint64]map[string][]int64
}

func newSampleMerger(p *profile.Profile) *sampleMerger {
	return &sampleMerger{p: p, at: map[string]*profile.Sample{}, seeds: [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
		labels: map[[2]uint64]map[string][]string{}, nums: map[[2]uint64]map[string][]int64{}}
}

// add appends smp, or with fold drops its numeric labels (pids and tids),
// marks it folded and adds its values to its twin's.
func (m *sampleMerger) add(smp *profile.Sample, fold bool) {
	if !fold {
		m.share(smp)
		m.p.Sample = append(m.p.Sample, smp)
		return
	}
	smp.NumLabel = nil
	smp.Label[schema.LabelFolded] = []string{"exited"}
	k := m.sampleKey(smp)
	if o, ok := m.at[k]; ok {
		for i := range o.Value {
			o.Value[i] += smp.Value[i]
		}
		return
	}
	m.at[k] = smp
	m.share(smp)
	m.p.Sample = append(m.p.Sample, smp)
}

// share replaces smp's label maps by equal ones already in the profile.
func (m *sampleMerger) share(smp *profile.Sample) {
	if smp.Label != nil {
		smp.Label = shared(m, m.labels, smp.Label, appendStrings)
	}
	if smp.NumLabel != nil && len(smp.NumUnit) == 0 {
		smp.NumLabel = shared(m, m.nums, smp.NumLabel, appendInts)
	}
}

// shared returns the map in pool equal to l, adding l when there is none.
func shared[V any](m *sampleMerger, pool map[[2]uint64]map[string]V, l map[string]V, values func([]byte, V) []byte) map[string]V {
	m.key = appendLabels(m.key[:0], l, values)
	k := [2]uint64{maphash.Bytes(m.seeds[0], m.key), maphash.Bytes(m.seeds[1], m.key)}
	if s, ok := pool[k]; ok {
		return s
	}
	pool[k] = l
	return l
}

// appendLabels appends a label map's keys and values, keys in order, to b.
func appendLabels[V any](b []byte, l map[string]V, values func([]byte, V) []byte) []byte {
	for _, k := range slices.Sorted(maps.Keys(l)) {
		b = append(b, k...)
		b = values(b, l[k])
		b = append(b, 1)
	}
	return b
}

// sampleKey is a sample's locations and string labels.
func (m *sampleMerger) sampleKey(smp *profile.Sample) string {
	b := m.key[:0]
	for _, l := range smp.Location {
		b = strconv.AppendUint(b, l.ID, 36)
		b = append(b, ',')
	}
	m.key = appendLabels(b, smp.Label, appendStrings)
	return string(m.key)
}

func appendStrings(b []byte, v []string) []byte {
	for _, s := range v {
		b = append(b, 0)
		b = append(b, s...)
	}
	return b
}

func appendInts(b []byte, v []int64) []byte {
	for _, n := range v {
		b = append(b, 0)
		b = strconv.AppendInt(b, n, 36)
	}
	return b
}
