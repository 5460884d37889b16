package collector

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/offcpu/offcpu/collector/budget"
)

// MaxWalkThreshold bounds the walk threshold: every wait at least this
// long is walked whatever the budget.
const MaxWalkThreshold = budget.MaxWalkThreshold

// BudgetStats describes deferred walks (nil in Stats without them).
type BudgetStats = budget.Stats

// budgetPart: the walk threshold's controller stops as the window
// closes and reports with the kernel's counters at each drain.
type budgetPart struct {
	quietPart
	*budget.Controller
}

func (b budgetPart) window(open bool, _ uint64) error {
	if !open {
		b.Stop()
	}
	return nil
}
func (b budgetPart) addStats(st *Stats, get statReader) { st.Budget = b.Stats(get) }
func (b budgetPart) close()                             { b.Stop() }

// errNotWalked marks a thread's time below the threshold where none of its
// intervals was drawn (the stack ids the programs write: -EAGAIN).
const errNotWalked = -11

// deferred says whether stacks are walked at the switch-in.
func (o *Options) deferred() bool { return o.WalkThreshold > 0 || o.Budget > 0 }

func (o *Options) validateBudget() error {
	if o.Budget < 0 || o.Budget > 1 {
		return fmt.Errorf("--budget %v out of range: a share of one CPU, above 0 and at most 1 (e.g. 0.01 or 1%%)", o.Budget)
	}
	if o.WalkThreshold < 0 || o.WalkThreshold > MaxWalkThreshold {
		return fmt.Errorf("--walk-threshold %v out of range (0 to %v)", o.WalkThreshold, MaxWalkThreshold)
	}
	if o.deferred() && o.ForceTracepoint {
		return fmt.Errorf("--budget and --walk-threshold need the tp_btf programs: drop --tracepoint")
	}
	if o.deferred() && (o.NoStackReuse || o.NoUserStacks && o.NoKernelStacks) {
		return fmt.Errorf("--budget and --walk-threshold choose which stacks to walk: drop --no-stack-reuse and the --no-*-stacks flags that leave none")
	}
	return nil
}

// calibrate scales each thread's sampled records (per state) so that
// they add up to the exact time and number of its intervals below the
// threshold, and adds a record without stacks where none was drawn.
// Returns the change in intervals, off-CPU time and run-queue time.
func (d *recording) calibrate() (dn int64, dns, drunq time.Duration) {
	type gk struct {
		tid, gen uint32
		state    State
	}
	groups := map[gk][]int{}
	for i := range d.records {
		if r := &d.records[i]; r.sampled {
			k := gk{r.tid, r.gen, r.state}
			groups[k] = append(groups[k], i)
		}
	}
	var keys []gk
	for k, t := range d.oncpu {
		for st := range 4 {
			if t.belowN[st] > 0 {
				keys = append(keys, gk{k[0], k[1], State(st)})
			}
		}
	}
	for k := range groups {
		if t, ok := d.oncpu[[2]uint32{k.tid, k.gen}]; !ok || t.belowN[k.state] == 0 {
			keys = append(keys, k) // no exact total read: left as estimated
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		return a.tid < b.tid || a.tid == b.tid && (a.gen < b.gen || a.gen == b.gen && a.state < b.state)
	})
	for _, k := range keys {
		t, ok := d.oncpu[[2]uint32{k.tid, k.gen}]
		idx := groups[k]
		if !ok || t.belowN[k.state] == 0 {
			continue
		}
		exactNs, exactN := t.belowNs[k.state], t.belowN[k.state]
		if len(idx) == 0 {
			var runq uint64
			if k.state == StatePreempted {
				runq = exactNs
			}
			d.records = append(d.records, record{tgid: t.tgid, tid: k.tid, gen: k.gen, state: k.state, ns: exactNs, count: exactN,
				runq: runq, userErr: errNotWalked, kernelErr: errNotWalked, sampled: true})
			dn += int64(exactN)
			dns += durationNs(exactNs)
			drunq += durationNs(runq)
			continue
		}
		var estNs, estN uint64
		for _, i := range idx {
			estNs += d.records[i].ns
			estN += d.records[i].count
		}
		// The rest over the rest of the records: the sums are exact.
		restNs, restN, leftNs, leftN := exactNs, exactN, estNs, estN
		for _, i := range idx {
			r := &d.records[i]
			ns, n := scale(r.ns, restNs, leftNs), scale(r.count, restN, leftN)
			leftNs, leftN = leftNs-r.ns, leftN-r.count
			restNs, restN = restNs-ns, restN-n
			runq, chain := scale(r.runq, ns, r.ns), scale(r.chain, ns, r.ns)
			dn += int64(n) - int64(r.count)
			dns += durationNs(ns) - durationNs(r.ns)
			drunq += durationNs(runq) - durationNs(r.runq)
			r.ns, r.count, r.runq, r.chain = ns, n, runq, chain
		}
	}
	return
}

// scale is v * num / den without overflow (0 when den is 0).
func scale(v, num, den uint64) uint64 {
	if den == 0 {
		return 0
	}
	return uint64(math.Round(float64(v) / float64(den) * float64(num)))
}
