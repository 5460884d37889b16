package analysis

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/aclements/go-moremath/stats"
	"golang.org/x/perf/benchmath"

	"github.com/offcpu/offcpu/schema"
)

// Run is one benchmark run: its metrics and profiles.
type Run struct {
	Name     string             `json:"name"`
	Metrics  map[string]float64 `json:"metrics"`
	Profiles []string           `json:"profiles,omitempty"`
	Failed   bool               `json:"failed,omitempty"`
	// Profiled runs are perturbed by the recorder: their metrics are
	// compared only when a side has no unprofiled run.
	Profiled bool `json:"profiled,omitempty"`
}

// RunInfo is a run directory's run.json, written by offcpu bench.
type RunInfo struct {
	Profiled bool   `json:"profiled"`
	Failed   bool   `json:"failed"`
	Error    string `json:"error,omitempty"`
}

// Side is the baseline or the candidate: one or more runs.
type Side struct {
	Name string `json:"name"`
	Runs []Run  `json:"runs"`
}

// LoadSide reads run directories (metrics.json and offcpu*.pb.gz, as
// offcpu bench writes them), metrics JSON files and profile files.
// A run whose metrics say "failed": true is kept but not compared.
func LoadSide(name string, paths []string) (*Side, error) {
	s := &Side{Name: name}
	var loose []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		switch {
		case st.IsDir():
			r := Run{Name: filepath.Base(p)}
			if m := filepath.Join(p, schema.MetricsFile); fileExists(m) {
				if r.Metrics, r.Failed, err = readMetrics(m); err != nil {
					return nil, err
				}
			}
			if b, err := os.ReadFile(filepath.Join(p, schema.RunInfoFile)); err == nil {
				var info RunInfo
				if err := json.Unmarshal(b, &info); err != nil {
					return nil, fmt.Errorf("%s/%s: %v", p, schema.RunInfoFile, err)
				}
				r.Profiled, r.Failed = info.Profiled, r.Failed || info.Failed
			}
			for _, f := range schema.RunProfiles {
				if fileExists(filepath.Join(p, f)) {
					r.Profiles = append(r.Profiles, filepath.Join(p, f))
				}
			}
			if r.Metrics == nil && r.Profiles == nil {
				return nil, fmt.Errorf("%s holds neither metrics.json nor offcpu.pb.gz", p)
			}
			s.Runs = append(s.Runs, r)
		case strings.HasSuffix(p, ".json"):
			m, failed, err := readMetrics(p)
			if err != nil {
				return nil, err
			}
			s.Runs = append(s.Runs, Run{Name: filepath.Base(p), Metrics: m, Failed: failed})
		default:
			loose = append(loose, p)
		}
	}
	if len(loose) > 0 {
		s.Runs = append(s.Runs, Run{Name: "profiles", Profiles: loose})
	}
	if len(s.Runs) == 0 {
		return nil, fmt.Errorf("%s: no runs given", name)
	}
	return s, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// readMetrics keeps the numeric top-level fields of a metrics file.
func readMetrics(path string) (map[string]float64, bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, false, fmt.Errorf("reading metrics: %w", err)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, false, fmt.Errorf("%s is not a JSON object of metrics: %v", path, err)
	}
	m := map[string]float64{}
	failed := false
	for k, v := range raw {
		switch x := v.(type) {
		case float64:
			m[k] = x
		case bool:
			if k == "failed" {
				failed = x
			}
		}
	}
	return m, failed, nil
}

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

// sideProfile analyzes a side's profiled runs together, and each alone;
// secs is their wall time where the runs report it.
func sideProfile(s *Side, r *Rules, o Options) (all *Report, each []*Report, secs float64, err error) {
	var files []string
	var messages int64
	o.Top = 1 << 30 // keep every function for the diff
	for _, run := range s.Runs {
		if run.Failed || len(run.Profiles) == 0 {
			continue
		}
		files = append(files, run.Profiles...)
		messages += int64(run.Metrics[schema.MetricMessages])
		secs += run.Metrics[schema.MetricWall]
		d, err := Load(schema.FoldedMicroseconds, run.Profiles...)
		if err != nil {
			return nil, nil, 0, err
		}
		one := o
		if one.Messages == 0 {
			one.Messages = int64(run.Metrics[schema.MetricMessages])
		}
		each = append(each, Analyze(d, r, one))
	}
	if len(each) == 0 {
		return nil, nil, 0, nil
	}
	d, err := Load(schema.FoldedMicroseconds, files...)
	if err != nil {
		return nil, nil, 0, err
	}
	if o.Messages == 0 {
		o.Messages = messages
	}
	return Analyze(d, r, o), each, secs, nil
}

// diffMetrics compares every metric both sides have: the workload's key
// metrics first, then wall and CPU time, then the rest by name.
func diffMetrics(base, cand *Side, o Options) []MetricDiff {
	skip := map[string]bool{schema.MetricMessages: true}
	for _, k := range o.NotCompared {
		skip[k] = true
	}
	names := map[string]bool{}
	for _, run := range append(append([]Run{}, base.Runs...), cand.Runs...) {
		for k := range run.Metrics {
			if !skip[k] {
				names[k] = true
			}
		}
	}
	var order []string
	for _, k := range append(append([]string{}, o.KeyMetrics...), schema.MetricWall, schema.MetricCPU) {
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

// minStatedChangePct: smaller changes are not stated even when the paired
// test finds them (a fixed-rate run's 0.1% publish-rate difference).
const minStatedChangePct = 1

func diffStatements(dr *DiffReport) []string {
	var out []string
	for _, m := range dr.Metrics {
		switch {
		case m.Separation != "":
			out = append(out, fmt.Sprintf("%s: %+.1f%% (%s → %s), with every candidate run %s every baseline run (p=%.3f; paired p=%s).",
				m.Name, m.ChangePct, num(m.BaseMean), num(m.CandMean), m.Separation, m.P, pairedP(m)))
		case m.MinDetectableChange > 0 && m.PairedP < 0.05 && math.Abs(m.ChangePct) >= minStatedChangePct:
			out = append(out, fmt.Sprintf("%s: %+.1f%% (%s → %s), paired p=%.3f (runs overlap; changes of ±%.1f%% are detectable).",
				m.Name, m.ChangePct, num(m.BaseMean), num(m.CandMean), m.PairedP, 100*m.MinDetectableChange))
		}
	}
	if dr.BaseReport == nil || dr.CandReport == nil {
		return out
	}
	return append(out, profileStatements(dr)...)
}

// profileStatements state the profiled runs' figures: absolute times per
// run, the change, and the runs' range.
func profileStatements(dr *DiffReport) []string {
	var out []string
	b, c := dr.BaseReport, dr.CandReport
	// Threads whose waits are all idle (client pools waiting for tasks)
	// have no cause worth naming: a few milliseconds would read as 100% of
	// it. Idle time and the wait for a CPU are left out of the comparison,
	// so many idle event loops on saturated CPUs do not hide a real wait.
	negligible := b.AppBlockedNs*100 < b.TotalOffCPUNs-b.IdleNs-b.RunQueueNs && c.AppBlockedNs*100 < c.TotalOffCPUNs-c.IdleNs-c.RunQueueNs
	if negligible {
		bn, cn := int64(dr.BaseProfiledRuns), int64(dr.CandProfiledRuns)
		out = append(out, fmt.Sprintf("Blocked time with an application frame: %s → %s per profiled run, under 1%% of the analyzed threads' blocked time that is not idle on both sides (their waits are idle).",
			Secs(b.AppBlockedNs/bn), Secs(c.AppBlockedNs/cn)))
	} else {
		out = append(out, causeStatements(dr)...)
	}
	if f := dr.Figure(FigRunQueue); f != nil {
		out = append(out, "Waiting for a CPU (woken or preempted; not blocked): "+timeChange(f)+".")
	}
	return append(out, wakeupStatements(dr)...)
}

// causeStatements: the app-blocked time, the baseline's largest cause
// with its share and its own top function, the category that changed
// most, and the function that changed most.
func causeStatements(dr *DiffReport) []string {
	var out []string
	b, c := dr.BaseReport, dr.CandReport
	bn, cn := int64(dr.BaseProfiledRuns), int64(dr.CandProfiledRuns)
	if f := dr.Figure(FigAppBlocked); f != nil {
		out = append(out, "Blocked time with an application frame: "+timeChange(f)+".")
	}
	cat, sh := dr.Headline()
	if f := dr.Figure(cat); f != nil && sh != nil {
		out = append(out, fmt.Sprintf("%s, the largest cause in the baseline: %s; %.0f%% → %.0f%% of the blocked time with an application frame (runs %s → %s)%s.",
			cat, timeChange(f), sh.BaseMean, sh.CandMean, sh.Range(0), sh.Range(1), categoryFunctions(b, c, cat)))
	}
	// The category whose time changed most, where that is another one.
	if most := dr.MostChangedCategory(); most != nil && most.Name != cat {
		out = append(out, fmt.Sprintf("%s changed most: %s%s.", most.Name, timeChange(most), categoryFunctions(b, c, most.Name)))
	}
	if len(dr.FunctionsFlat) > 0 {
		f := dr.FunctionsFlat[0]
		out = append(out, fmt.Sprintf("The function whose blocked time changed most: %s, %s → %s per profiled run (%s; %.0f%% → %.0f%% of the blocked time with an application frame).",
			schema.ShortFunc(f.Name), Secs(f.Base), Secs(f.Cand), changeStr(f), pctOf(f.Base, b.AppBlockedNs/bn), pctOf(f.Cand, c.AppBlockedNs/cn)))
	}
	return out
}

func pctOf(ns, total int64) float64 {
	if total == 0 {
		return 0
	}
	return 100 * float64(ns) / float64(total)
}

// categoryFunctions names a category's own top function on each side.
func categoryFunctions(b, c *Report, cat string) string {
	fn := func(r *Report) string {
		for _, x := range r.Categories {
			if x.Name == cat {
				return schema.ShortFunc(x.TopFunction)
			}
		}
		return ""
	}
	fb, fc := fn(b), fn(c)
	switch {
	case fb == "" && fc == "":
		return ""
	case fb == fc || fc == "":
		return "; mostly in " + fb
	case fb == "":
		return "; in the candidate mostly in " + fc
	}
	return fmt.Sprintf("; mostly in %s (baseline), %s (candidate)", fb, fc)
}

// timeChange states a time figure: means per profiled run, the change,
// and the runs' ranges.
func timeChange(f *MetricDiff) string {
	s := fmt.Sprintf("%s → %s per profiled run", formatUnit(f.BaseMean, f.Unit), formatUnit(f.CandMean, f.Unit))
	if f.BaseMean != 0 {
		s += fmt.Sprintf(" (%+.0f%%", f.ChangePct)
	} else {
		s += " (new"
	}
	if len(f.Base) > 1 || len(f.Cand) > 1 {
		s += fmt.Sprintf("; runs %s → %s", f.Range(0), f.Range(1))
	}
	if f.Significant(0.05) {
		s += "; significant at 0.05"
	}
	return s + ")"
}

// wakeupStatements count wake-ups by class per profiled run, and per
// message where the runs count messages, else per second.
func wakeupStatements(dr *DiffReport) []string {
	var out []string
	b, c := dr.BaseReport, dr.CandReport
	if b.Wakeups.Total == 0 && c.Wakeups.Total == 0 {
		return nil
	}
	bn, cn := float64(dr.BaseProfiledRuns), float64(dr.CandProfiledRuns)
	per := func(nb, nc float64) string {
		switch {
		case b.Messages > 0 && c.Messages > 0:
			return fmt.Sprintf(" (%.4f → %.4f per message)", nb/float64(b.Messages), nc/float64(c.Messages))
		case dr.Seconds[0] > 0 && dr.Seconds[1] > 0:
			return fmt.Sprintf(" (%.0f → %.0f per second)", nb/dr.Seconds[0], nc/dr.Seconds[1])
		}
		return ""
	}
	if b.Messages == 0 || c.Messages == 0 {
		nb, nc := float64(b.Wakeups.Total), float64(c.Wakeups.Total)
		out = append(out, fmt.Sprintf("Wake-ups of the analyzed threads: %.0f → %.0f per profiled run%s; by class: %s.", nb/bn, nc/cn, per(nb, nc), classChanges(b, c, bn, cn)))
	}
	for _, class := range []string{"eventfd", "futex"} {
		nb, nc := float64(b.Wakeups.ByClass[class]), float64(c.Wakeups.ByClass[class])
		if nb == 0 && nc == 0 {
			continue
		}
		name := strings.ToUpper(class[:1]) + class[1:]
		out = append(out, fmt.Sprintf("%s wake-ups: %.0f → %.0f per profiled run%s.", name, nb/bn, nc/cn, per(nb, nc)))
	}
	return out
}

// classChanges lists wake-up classes per profiled run, largest first.
func classChanges(b, c *Report, bn, cn float64) string {
	m := map[string]int64{}
	for k, v := range b.Wakeups.ByClass {
		m[k] += v
	}
	for k, v := range c.Wakeups.ByClass {
		m[k] += v
	}
	var parts []string
	for _, t := range TopCounts(m, 5) {
		parts = append(parts, fmt.Sprintf("%s %.0f → %.0f", t.Name, float64(b.Wakeups.ByClass[t.Name])/bn, float64(c.Wakeups.ByClass[t.Name])/cn))
	}
	return strings.Join(parts, ", ")
}

func num(x float64) string {
	switch {
	case math.Abs(x) >= 1000:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case math.Abs(x) >= 10:
		return strconv.FormatFloat(x, 'f', 1, 64)
	}
	return strconv.FormatFloat(x, 'f', 3, 64)
}

// FailOn is a --fail-on condition such as "monitor-wait>+10%" (relative
// to the baseline's mean), "monitor-wait>+5ms" (absolute, per run),
// "share:io>+5pp" (percentage points) or "wakeups:futex>+1000" (a count).
type FailOn struct {
	Name    string  `json:"name"`
	Greater bool    `json:"greater"`
	Value   float64 `json:"value"` // % for Unit "%"; ns for "ns"; else as written
	Unit    string  `json:"unit"`  // "%", "ns", "pp" or "" (the figure's own unit)
	Text    string  `json:"condition"`
}

var failOnRE = regexp.MustCompile(`^\s*([^<>]+?)\s*([<>])\s*([+-]?\d+(?:\.\d+)?)\s*(%|pp|ns|us|µs|ms|s)?\s*$`)

var timeUnits = map[string]float64{"ns": 1, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}

// ParseFailOn parses conditions separated by commas.
func ParseFailOn(exprs []string) ([]FailOn, error) {
	var out []FailOn
	for _, list := range exprs {
		for _, e := range strings.Split(list, ",") {
			m := failOnRE.FindStringSubmatch(e)
			if m == nil {
				return nil, fmt.Errorf("--fail-on %q: write NAME>+CHANGE or NAME<-CHANGE, CHANGE in %% of the baseline, ms/µs/s per run, or pp for shares, e.g. monitor-wait>+10%% or app_blocked>+5ms", e)
			}
			v, _ := strconv.ParseFloat(m[3], 64)
			c := FailOn{Name: m[1], Greater: m[2] == ">", Value: v, Unit: m[4], Text: strings.TrimSpace(e)}
			if f, ok := timeUnits[c.Unit]; ok {
				c.Value, c.Unit = v*f, UnitNs
			}
			out = append(out, c)
		}
	}
	return out, nil
}

// Gate is a --fail-on condition checked against a diff.
type Gate struct {
	FailOn
	Change      float64 `json:"change"` // in the condition's unit
	P           float64 `json:"p"`
	Significant bool    `json:"significant"`
	Fired       bool    `json:"fired"`
	Says        string  `json:"says"`
}

// Gates checks conditions on metrics and profile figures. A condition
// fires when its threshold is crossed and the change is significant at
// level alpha (MetricDiff.Significant).
func (dr *DiffReport) Gates(conds []FailOn, alpha float64) ([]Gate, error) {
	var out []Gate
	for _, c := range conds {
		m := dr.lookup(c.Name)
		if m == nil {
			return nil, fmt.Errorf("--fail-on: %s is neither a metric nor a profile figure of these runs (figures: app_blocked, runqueue, a category such as monitor-wait, share:CATEGORY, process:NAME; see report.json)", c.Name)
		}
		g := Gate{FailOn: c, P: m.TestP(), Significant: m.Significant(alpha)}
		switch c.Unit {
		case "%":
			g.Change = m.ChangePct
			if m.BaseMean == 0 && m.CandMean != 0 {
				g.Change = math.Copysign(math.Inf(1), m.CandMean)
			}
		case UnitNs:
			if m.Unit != UnitNs {
				return nil, fmt.Errorf("--fail-on %s: %s is not a time; give its change in %% or as a number", c.Text, c.Name)
			}
			g.Change = m.CandMean - m.BaseMean
		default:
			g.Change = m.CandMean - m.BaseMean
		}
		crossed := (c.Greater && g.Change > c.Value) || (!c.Greater && g.Change < c.Value)
		g.Fired = crossed && g.Significant
		g.Says = fmt.Sprintf("%s changed %s (p=%.3f)", c.Name, formatChange(g.Change, c.Unit), g.P)
		switch {
		case g.Fired:
			g.Says += ": " + c.Text + " holds"
		case crossed:
			g.Says += fmt.Sprintf(": past %s but not significant at %g", c.Text, alpha)
		default:
			g.Says += ": " + c.Text + " does not hold"
		}
		out = append(out, g)
	}
	return out, nil
}

func formatChange(v float64, unit string) string {
	switch unit {
	case "%":
		return fmt.Sprintf("%+.1f%%", v)
	case UnitNs:
		sign := "+"
		if v < 0 {
			sign = "-"
		}
		return sign + time.Duration(math.Abs(v)).Round(time.Microsecond).String() + " per run"
	case "pp":
		return fmt.Sprintf("%+.1f pp", v)
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// lookup is a metric or a profile figure by name.
func (dr *DiffReport) lookup(name string) *MetricDiff {
	for i := range dr.Metrics {
		if dr.Metrics[i].Name == name {
			return &dr.Metrics[i]
		}
	}
	return dr.Figure(name)
}

// Write renders the diff as text, json or markdown.
func (dr *DiffReport) Write(w io.Writer, format string) error {
	return write(w, format, dr, dr.writeText, dr.writeMarkdown)
}

func runs(v []float64) string {
	var s []string
	for _, x := range v {
		s = append(s, num(x))
	}
	return strings.Join(s, ", ")
}

func pairedP(m MetricDiff) string {
	if m.MinDetectableChange == 0 {
		return "–"
	}
	return fmt.Sprintf("%.3f", m.PairedP)
}

func mdcStr(m MetricDiff) string {
	if m.MinDetectableChange == 0 {
		return "–"
	}
	return fmt.Sprintf("±%.1f%%", 100*m.MinDetectableChange)
}

func changeStr(v ValueDiff) string {
	if v.New {
		return "new"
	}
	return fmt.Sprintf("%+.1f%%", v.ChangePct)
}

func (dr *DiffReport) writeText(w io.Writer) error {
	for _, s := range dr.Statements {
		fmt.Fprintln(w, s)
	}
	fmt.Fprintln(w)
	for _, m := range dr.Metrics {
		sep := ""
		if m.Separation != "" {
			sep = " every candidate run " + m.Separation
		}
		fmt.Fprintf(w, "%-24s base [%s]  cand [%s]  %+.1f%%  p=%.3f  paired p=%s  detectable %s%s\n", m.Name, runs(m.Base), runs(m.Cand), m.ChangePct, m.P, pairedP(m), mdcStr(m), sep)
	}
	if len(dr.Categories) > 0 {
		fmt.Fprintln(w, "\nblocked time with an application frame, per profiled run:")
		for _, c := range dr.Categories {
			if c.Base != 0 || c.Cand != 0 {
				fmt.Fprintf(w, "  %-20s %10s → %-10s %s\n", c.Name, Secs(c.Base), Secs(c.Cand), changeStr(c))
			}
		}
		fmt.Fprintln(w, "functions (innermost application frame):")
		for _, f := range dr.FunctionsFlat {
			fmt.Fprintf(w, "  %-60s %10s → %-10s %s\n", schema.ShortFunc(f.Name), Secs(f.Base), Secs(f.Cand), changeStr(f))
		}
		if len(dr.WakerFunctions) > 0 {
			fmt.Fprintln(w, "wake-ups by waker function:")
			for _, f := range dr.WakerFunctions {
				fmt.Fprintf(w, "  %-60s %10d → %-10d %s\n", schema.ShortFunc(f.Name), f.Base, f.Cand, changeStr(f))
			}
		}
	}
	return nil
}

func (dr *DiffReport) writeMarkdown(w io.Writer) error {
	fmt.Fprintf(w, "### Measurements\n\n")
	for _, s := range dr.Statements {
		fmt.Fprintf(w, "- %s\n", s)
	}
	if len(dr.Metrics) > 0 {
		fmt.Fprintf(w, "\n| metric | %s (each run) | %s (each run) | change | %s min–max | %s min–max | p (U test) | p (paired) | smallest detectable change |\n|---|---|---|---:|---|---|---:|---:|---:|\n",
			dr.Base.Name, dr.Cand.Name, dr.Base.Name, dr.Cand.Name)
		for _, m := range dr.Metrics {
			fmt.Fprintf(w, "| %s | %s | %s | %+.1f%% | %s–%s | %s–%s | %.3f | %s | %s |\n", m.Name, runs(m.Base), runs(m.Cand), m.ChangePct,
				num(m.BaseMin), num(m.BaseMax), num(m.CandMin), num(m.CandMax), m.P, pairedP(m), mdcStr(m))
		}
	}
	dr.writeFigures(w)
	if len(dr.Categories) > 0 {
		fmt.Fprintf(w, "\nBlocked time with an application frame, per profiled run:\n\n| category | %s | %s | change |\n|---|---:|---:|---:|\n", dr.Base.Name, dr.Cand.Name)
		for _, c := range dr.Categories {
			if c.Base != 0 || c.Cand != 0 {
				fmt.Fprintf(w, "| %s | %s | %s | %s |\n", c.Name, Secs(c.Base), Secs(c.Cand), changeStr(c))
			}
		}
		group := "thread group"
		if dr.BaseReport != nil && dr.BaseReport.Goroutines {
			group = "goroutines by start function"
		}
		fmt.Fprintf(w, "\n| %s | %s | %s | change |\n|---|---:|---:|---:|\n", group, dr.Base.Name, dr.Cand.Name)
		for _, g := range dr.ThreadGroups {
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", g.Name, Secs(g.Base), Secs(g.Cand), changeStr(g))
		}
		if len(dr.RootCauses) > 0 {
			fmt.Fprintf(w, "\nRoot causes of the blocked time (followed along the wakers' own waits), per profiled run:\n\n| waiters: root cause | %s | %s | change |\n|---|---:|---:|---:|\n", dr.Base.Name, dr.Cand.Name)
			for _, g := range dr.RootCauses {
				fmt.Fprintf(w, "| %s | %s | %s | %s |\n", g.Name, Secs(g.Base), Secs(g.Cand), changeStr(g))
			}
		}
		if len(dr.RunQueueGroups) > 0 {
			fmt.Fprintf(w, "\nWaiting for a CPU (not blocked), per profiled run:\n\n| %s | %s | %s | change |\n|---|---:|---:|---:|\n", group, dr.Base.Name, dr.Cand.Name)
			for _, g := range dr.RunQueueGroups {
				fmt.Fprintf(w, "| %s | %s | %s | %s |\n", g.Name, Secs(g.Base), Secs(g.Cand), changeStr(g))
			}
		}
		fmt.Fprintf(w, "\nFunctions whose blocked time changed most (innermost application frame):\n\n| function | %s | %s | change |\n|---|---:|---:|---:|\n", dr.Base.Name, dr.Cand.Name)
		for _, f := range dr.FunctionsFlat {
			fmt.Fprintf(w, "| `%s` | %s | %s | %s |\n", schema.ShortFunc(f.Name), Secs(f.Base), Secs(f.Cand), changeStr(f))
		}
		fmt.Fprintf(w, "\nCumulative (anywhere in the stack):\n\n| function | %s | %s | change |\n|---|---:|---:|---:|\n", dr.Base.Name, dr.Cand.Name)
		for _, f := range dr.FunctionsCum {
			fmt.Fprintf(w, "| `%s` | %s | %s | %s |\n", schema.ShortFunc(f.Name), Secs(f.Base), Secs(f.Cand), changeStr(f))
		}
		if len(dr.WakerFunctions) > 0 {
			fmt.Fprintf(w, "\nWake-ups by waker function, per profiled run:\n\n| waker function | %s | %s | change |\n|---|---:|---:|---:|\n", dr.Base.Name, dr.Cand.Name)
			for _, f := range dr.WakerFunctions {
				fmt.Fprintf(w, "| `%s` | %d | %d | %s |\n", schema.ShortFunc(f.Name), f.Base, f.Cand, changeStr(f))
			}
		}
	}
	return nil
}
