package analysis

import (
	"sort"
)

// MetricDiff compares one metric over the runs of both sides.
type MetricDiff struct {
	// Unit: "" for a run's own metrics; ns, % or count for profile figures.
	Unit       string    `json:"unit,omitempty"`
	Name       string    `json:"name"`
	Base       []float64 `json:"base"`
	Cand       []float64 `json:"candidate"`
	BaseMean   float64   `json:"base_mean"`
	CandMean   float64   `json:"candidate_mean"`
	ChangePct  float64   `json:"change_pct"`
	BaseMin    float64   `json:"base_min"`
	BaseMax    float64   `json:"base_max"`
	CandMin    float64   `json:"candidate_min"`
	CandMax    float64   `json:"candidate_max"`
	P          float64   `json:"p"` // Mann-Whitney U (benchmath), two-sided
	Alpha      float64   `json:"alpha"`
	Separation string    `json:"separation,omitempty"` // "above" or "below": every candidate run vs every baseline run
	// With as many runs on both sides, run i of each side are a pair (the
	// rotation runs them back to back), so slow drift cancels: the paired
	// t-test on log ratios, and the smallest relative change it would
	// detect with 80% power at the 5% level (a fraction; 0: not computed).
	PairedP             float64 `json:"paired_p,omitempty"`
	MinDetectableChange float64 `json:"min_detectable_change,omitempty"`
}

// ValueDiff is a profile quantity on both sides.
type ValueDiff struct {
	Name      string  `json:"name"`
	Base      int64   `json:"base"`
	Cand      int64   `json:"candidate"`
	ChangePct float64 `json:"change_pct"`
	New       bool    `json:"new,omitempty"` // zero in the baseline: no percentage
}

// DiffReport is what offcpu diff prints.
type DiffReport struct {
	Base, Cand     *Side
	Metrics        []MetricDiff `json:"metrics"`
	BaseReport     *Report      `json:"base_profile,omitempty"`
	CandReport     *Report      `json:"candidate_profile,omitempty"`
	Categories     []ValueDiff  `json:"categories"`      // app-blocked ns per category
	ThreadGroups   []ValueDiff  `json:"thread_groups"`   // app-blocked ns per group
	RunQueueGroups []ValueDiff  `json:"runqueue_groups"` // ns waiting for a CPU per group
	RootCauses     []ValueDiff  `json:"root_causes"`     // blocked ns per root cause (waiters: path)
	FunctionsFlat  []ValueDiff  `json:"functions_flat"`
	FunctionsCum   []ValueDiff  `json:"functions_cumulative"`
	WakerFunctions []ValueDiff  `json:"waker_functions"`
	// Figures: profile figures, one value per profiled run (each run
	// analyzed alone), compared as the metrics are.
	Figures []MetricDiff `json:"figures,omitempty"`
	// Seconds: the wall time of each side's profiled runs, where known.
	Seconds          [2]float64 `json:"profiled_seconds"`
	EventfdPerMsg    [2]float64 `json:"eventfd_wakeups_per_message"`
	Statements       []string   `json:"statements"`
	BaseProfiledRuns int        `json:"base_profiled_runs"`
	CandProfiledRuns int        `json:"candidate_profiled_runs"`
}

// Diff compares two sides. Profile quantities are per profiled run.
func Diff(base, cand *Side, r *Rules, o Options) (*DiffReport, error) {
	dr := &DiffReport{Base: base, Cand: cand}
	dr.Metrics = diffMetrics(base, cand, o)
	var err error
	var perRun [2][]*Report
	if dr.BaseReport, perRun[0], dr.Seconds[0], err = sideProfile(base, r, o); err != nil {
		return nil, err
	}
	if dr.CandReport, perRun[1], dr.Seconds[1], err = sideProfile(cand, r, o); err != nil {
		return nil, err
	}
	dr.BaseProfiledRuns, dr.CandProfiledRuns = len(perRun[0]), len(perRun[1])
	if dr.BaseReport != nil && dr.CandReport != nil {
		b, c := dr.BaseReport, dr.CandReport
		bn, cn := int64(dr.BaseProfiledRuns), int64(dr.CandProfiledRuns)
		for i := range b.Categories {
			dr.Categories = append(dr.Categories, valueDiff(b.Categories[i].Name, b.Categories[i].AppNs/bn, c.Categories[i].AppNs/cn))
		}
		dr.ThreadGroups = mapDiff(groupApp(b), groupApp(c), bn, cn, 0)
		dr.RunQueueGroups = mapDiff(groupRunQueue(b), groupRunQueue(c), bn, cn, 0)
		dr.RootCauses = mapDiff(rootCauses(b), rootCauses(c), bn, cn, 10)
		dr.FunctionsFlat = mapDiff(b.FunctionsFlat, c.FunctionsFlat, bn, cn, 10)
		dr.FunctionsCum = mapDiff(b.FunctionsCum, c.FunctionsCum, bn, cn, 10)
		dr.WakerFunctions = mapDiff(b.WakerFunctions, c.WakerFunctions, bn, cn, 10)
		dr.EventfdPerMsg = [2]float64{b.Wakeups.EventfdPerMessage, c.Wakeups.EventfdPerMessage}
		dr.Figures = compareFigures(perRun[0], perRun[1])
	}
	dr.Statements = diffStatements(dr)
	return dr, nil
}

func groupApp(r *Report) map[string]int64 {
	m := map[string]int64{}
	for _, g := range r.ThreadGroups {
		m[g.Name] = g.AppBlockedNs
	}
	return m
}

func rootCauses(r *Report) map[string]int64 {
	m := map[string]int64{}
	for _, rc := range r.Chains {
		m[rc.Waiters+": "+pathString(rc.Path)] += rc.Ns
	}
	return m
}

func groupRunQueue(r *Report) map[string]int64 {
	m := map[string]int64{}
	for _, g := range r.ThreadGroups {
		if g.RunQueueNs > 0 {
			m[g.Name] = g.RunQueueNs
		}
	}
	return m
}

func valueDiff(name string, b, c int64) ValueDiff {
	v := ValueDiff{Name: name, Base: b, Cand: c}
	if b != 0 {
		v.ChangePct = 100 * float64(c-b) / float64(b)
	} else if c != 0 {
		v.New = true
	}
	return v
}

// mapDiff lists the keys whose value changed most (top n; 0: all).
func mapDiff(b, c map[string]int64, bn, cn int64, n int) []ValueDiff {
	keys := map[string]bool{}
	for k := range b {
		keys[k] = true
	}
	for k := range c {
		keys[k] = true
	}
	var out []ValueDiff
	for k := range keys {
		out = append(out, valueDiff(k, b[k]/bn, c[k]/cn))
	}
	sort.Slice(out, func(i, j int) bool {
		di, dj := abs(out[i].Cand-out[i].Base), abs(out[j].Cand-out[j].Base)
		if di != dj {
			return di > dj
		}
		return out[i].Name < out[j].Name
	})
	if n > 0 && len(out) > n {
		out = out[:n]
	}
	return out
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
