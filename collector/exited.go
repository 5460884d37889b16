package collector

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/schema"
)

// DefaultExitedDetail is how many exited processes keep their pid and tid
// labels by default: a recording under process churn has samples for
// every process seen (three profiles, ~15 KB a process), and merged per
// command they cost what one process does.
const DefaultExitedDetail = 1000

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
// memory; nothing changes a built sample's labels one sample at a time).
type sampleMerger struct {
	p      *profile.Profile
	at     map[string]*profile.Sample
	key    strings.Builder
	labels map[string]map[string][]string
	nums   map[string]map[string][]int64
}

func newSampleMerger(p *profile.Profile) *sampleMerger {
	return &sampleMerger{p: p, at: map[string]*profile.Sample{}, labels: map[string]map[string][]string{}, nums: map[string]map[string][]int64{}}
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
		smp.Label = shared(m.labels, &m.key, smp.Label, writeStrings)
	}
	if smp.NumLabel != nil && len(smp.NumUnit) == 0 {
		smp.NumLabel = shared(m.nums, &m.key, smp.NumLabel, writeInts)
	}
}

// shared returns the map in pool equal to l, adding l when there is none.
func shared[V any](pool map[string]map[string]V, b *strings.Builder, l map[string]V, values func(*strings.Builder, V)) map[string]V {
	b.Reset()
	k := labelKey(b, l, values)
	if s, ok := pool[k]; ok {
		return s
	}
	pool[k] = l
	return l
}

// labelKey appends a label map's keys and values, keys in order, to b.
func labelKey[V any](b *strings.Builder, l map[string]V, values func(*strings.Builder, V)) string {
	for _, k := range slices.Sorted(maps.Keys(l)) {
		b.WriteString(k)
		values(b, l[k])
		b.WriteByte(1)
	}
	return b.String()
}

// sampleKey is a sample's locations and string labels.
func (m *sampleMerger) sampleKey(smp *profile.Sample) string {
	b := &m.key
	b.Reset()
	for _, l := range smp.Location {
		b.WriteString(strconv.FormatUint(l.ID, 36))
		b.WriteByte(',')
	}
	return labelKey(b, smp.Label, writeStrings)
}

func writeStrings(b *strings.Builder, v []string) {
	for _, s := range v {
		b.WriteByte(0)
		b.WriteString(s)
	}
}

func writeInts(b *strings.Builder, v []int64) {
	for _, n := range v {
		b.WriteByte(0)
		b.WriteString(strconv.FormatInt(n, 36))
	}
}
