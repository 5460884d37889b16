package analysis

import (
	"math"
	"slices"
	"sort"

	"github.com/aclements/go-moremath/stats"
	"github.com/offcpu/offcpu/schema"
	"golang.org/x/perf/benchmath"
)

// diffMetrics compares every metric both sides have: the workload's key
// metrics first, then wall and CPU time, then the rest by name.
func diffMetrics(base, cand *Side, o Options) []MetricDiff {
	skip := map[string]bool{schema.MetricMessages: true}
	key := slices.Clone(o.KeyMetrics)
	runs := append(append([]Run{}, base.Runs...), cand.Runs...)
	for _, k := range o.NotCompared {
		skip[k] = true
	}
	for _, run := range runs {
		for _, k := range run.NotCompared {
			skip[k] = true
		}
		for _, k := range run.KeyMetrics {
			if !slices.Contains(key, k) {
				key = append(key, k)
			}
		}
	}
	names := map[string]bool{}
	for _, run := range runs {
		for k := range run.Metrics {
			if !skip[k] {
				names[k] = true
			}
		}
	}
	var order []string
	for _, k := range append(key, schema.MetricWall, schema.MetricCPU) {
		if names[k] {
			order = append(order, k)
			delete(names, k)
		}
	}
	var rest []string
	for k := range names {
		rest = append(rest, k)
	}
	sort.Strings(rest)
	order = append(order, rest...)
	var out []MetricDiff
	for _, name := range order {
		b, c := values(base, name), values(cand, name)
		if len(b) == 0 || len(c) == 0 {
			continue
		}
		out = append(out, compare(name, b, c))
	}
	return out
}

func values(s *Side, name string) []float64 {
	var plain, profiled []float64
	for _, r := range s.Runs {
		if v, ok := r.Metrics[name]; ok && !r.Failed {
			if r.Profiled {
				profiled = append(profiled, v)
			} else {
				plain = append(plain, v)
			}
		}
	}
	if len(plain) > 0 {
		return plain
	}
	return profiled
}

func compare(name string, b, c []float64) MetricDiff {
	md := MetricDiff{Name: name, Base: b, Cand: c, BaseMean: mean(b), CandMean: mean(c)}
	md.BaseMin, md.BaseMax = minMax(b)
	md.CandMin, md.CandMax = minMax(c)
	if md.BaseMean != 0 {
		md.ChangePct = 100 * (md.CandMean - md.BaseMean) / md.BaseMean
	}
	th := benchmath.DefaultThresholds
	// NewSample sorts its input in place: give it copies, so the report
	// lists runs in their order.
	cmp := benchmath.AssumeNothing.Compare(benchmath.NewSample(slices.Clone(b), &th), benchmath.NewSample(slices.Clone(c), &th))
	md.P, md.Alpha = cmp.P, cmp.Alpha
	switch {
	case len(b) < 2 || len(c) < 2: // one run proves nothing
	case md.CandMin > md.BaseMax:
		md.Separation = "above"
	case md.CandMax < md.BaseMin:
		md.Separation = "below"
	}
	md.PairedP, md.MinDetectableChange = paired(b, c)
	return md
}

// paired compares run i of the baseline with run i of the candidate on
// log ratios: the paired t-test's p, and the smallest change detectable at
// α = 0.05 (two-sided) with power 0.8: (t(0.975) + t(0.8)) · sd / √n on the
// log scale. Needs 3 pairs and positive values.
func paired(b, c []float64) (p, mdc float64) {
	n := len(b)
	if n != len(c) || n < 3 {
		return 0, 0
	}
	lb, lc := make([]float64, n), make([]float64, n)
	for i := range b {
		if b[i] <= 0 || c[i] <= 0 {
			return 0, 0
		}
		lb[i], lc[i] = math.Log(b[i]), math.Log(c[i])
	}
	d := make([]float64, n)
	for i := range d {
		d[i] = lc[i] - lb[i]
	}
	sd := stats.StdDev(d)
	if sd == 0 {
		return 0, 0
	}
	if r, err := stats.PairedTTest(lc, lb, 0, stats.LocationDiffers); err == nil {
		p = r.P
	}
	q := stats.InvCDF(stats.TDist{V: float64(n - 1)})
	return p, math.Expm1((q(0.975) + q(0.8)) * sd / math.Sqrt(float64(n)))
}

func mean(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

func minMax(v []float64) (float64, float64) {
	lo, hi := v[0], v[0]
	for _, x := range v {
		lo, hi = math.Min(lo, x), math.Max(hi, x)
	}
	return lo, hi
}
