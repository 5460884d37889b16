package analysis

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
)

// Units of profile figures.
const (
	UnitNs    = "ns"
	UnitPct   = "%"
	UnitCount = "count"
)

// Prefixes of profile figure names; a category's blocked time is named
// by the category alone, as --fail-on reads it.
const (
	FigShare   = "share:"   // a category's share of the app-blocked time (%)
	FigProcess = "process:" // a process's app-blocked time
	FigGroup   = "group:"   // a thread group's app-blocked time
	FigWakeups = "wakeups:" // wake-ups of one class
	FigPair    = "wake:"    // wake-ups from one thread group to another
	FigCause   = "cause:"   // blocked time of one root cause
)

// Whole-profile figures.
const (
	FigAppBlocked = "app_blocked"
	FigRunQueue   = "runqueue"
	FigIdle       = "idle"
	FigOffCPU     = "offcpu"
	FigCPU        = "cpu"
	FigWakeupsAll = "wakeups"
)

type figure struct {
	name, unit string
	v          float64
}

// figures reads one profiled run's report as named values.
func figures(rep *Report) []figure {
	out := []figure{
		{FigAppBlocked, UnitNs, float64(rep.AppBlockedNs)},
		{FigRunQueue, UnitNs, float64(rep.RunQueueNs)},
		{FigIdle, UnitNs, float64(rep.IdleNs)},
		{FigOffCPU, UnitNs, float64(rep.TotalOffCPUNs)},
		{FigCPU, UnitNs, float64(rep.CPUNs)},
	}
	for _, c := range rep.Categories {
		if c.AppNs > 0 {
			out = append(out, figure{c.Name, UnitNs, float64(c.AppNs)}, figure{FigShare + c.Name, UnitPct, 100 * c.Share})
		}
	}
	for _, p := range rep.Processes {
		out = append(out, figure{FigProcess + p.Name, UnitNs, float64(p.AppBlockedNs)})
	}
	for _, g := range rep.ThreadGroups {
		out = append(out, figure{FigGroup + g.Name, UnitNs, float64(g.AppBlockedNs)})
	}
	if rep.Wakeups.Total > 0 {
		out = append(out, figure{FigWakeupsAll, UnitCount, float64(rep.Wakeups.Total)})
	}
	for class, n := range rep.Wakeups.ByClass {
		out = append(out, figure{FigWakeups + class, UnitCount, float64(n)})
	}
	for pair, n := range rep.Wakeups.ByPair {
		out = append(out, figure{FigPair + pair, UnitCount, float64(n)})
	}
	for k, ns := range rootCauses(rep) {
		out = append(out, figure{FigCause + k, UnitNs, float64(ns)})
	}
	return out
}

// compareFigures compares each figure over the profiled runs of both
// sides, as metrics are compared: every run's value, min–max and tests.
// A run without a figure counts 0 for it.
func compareFigures(base, cand []*Report) []MetricDiff {
	type col struct {
		unit string
		v    [2][]float64
	}
	cols := map[string]*col{}
	var order []string
	for side, reps := range [2][]*Report{base, cand} {
		for i, rep := range reps {
			for _, f := range figures(rep) {
				c := cols[f.name]
				if c == nil {
					c = &col{unit: f.unit, v: [2][]float64{make([]float64, len(base)), make([]float64, len(cand))}}
					cols[f.name] = c
					order = append(order, f.name)
				}
				c.v[side][i] = f.v
			}
		}
	}
	var out []MetricDiff
	for _, name := range order {
		c := cols[name]
		if allZero(c.v[0]) && allZero(c.v[1]) {
			continue
		}
		md := compare(name, c.v[0], c.v[1])
		md.Unit = c.unit
		out = append(out, md)
	}
	sort.SliceStable(out, func(i, j int) bool { return figureRank(out[i]) < figureRank(out[j]) })
	return out
}

// figureRank orders whole-profile figures first, then categories and
// their shares, then the rest by prefix.
func figureRank(m MetricDiff) int {
	switch {
	case !strings.Contains(m.Name, ":") && m.Unit == UnitNs && isWhole(m.Name):
		return 0
	case !strings.Contains(m.Name, ":") && m.Name != FigWakeupsAll:
		return 1
	case strings.HasPrefix(m.Name, FigShare):
		return 2
	case strings.HasPrefix(m.Name, FigProcess):
		return 3
	case strings.HasPrefix(m.Name, FigGroup):
		return 4
	case strings.HasPrefix(m.Name, FigCause):
		return 5
	case m.Name == FigWakeupsAll || strings.HasPrefix(m.Name, FigWakeups):
		return 6
	}
	return 7
}

func isWhole(name string) bool {
	switch name {
	case FigAppBlocked, FigRunQueue, FigIdle, FigOffCPU, FigCPU:
		return true
	}
	return false
}

func allZero(v []float64) bool {
	for _, x := range v {
		if x != 0 {
			return false
		}
	}
	return true
}

// Compare compares a figure's values over the runs of both sides, as
// metrics and profile figures are compared.
func Compare(name, unit string, base, cand []float64) MetricDiff {
	m := compare(name, base, cand)
	m.Unit = unit
	return m
}

// Figure is the named profile figure, or nil.
func (dr *DiffReport) Figure(name string) *MetricDiff {
	for i := range dr.Figures {
		if dr.Figures[i].Name == name {
			return &dr.Figures[i]
		}
	}
	return nil
}

// Headline is the baseline's largest cause (the category with the most
// blocked time with an application frame, first-matching) and its share
// figure; nil without profiles or blocked time.
func (dr *DiffReport) Headline() (category string, share *MetricDiff) {
	b := dr.BaseReport
	if b == nil || dr.CandReport == nil {
		return "", nil
	}
	var top *CategoryResult
	for i := range b.Categories {
		x := &b.Categories[i]
		if x.Name != "other" && x.Name != "runqueue" && x.AppNs > 0 && (top == nil || x.FirstNs > top.FirstNs) {
			top = x
		}
	}
	if top == nil {
		return "", nil
	}
	return top.Name, dr.Figure(FigShare + top.Name)
}

// Significant says whether a comparison's change is significant at
// level alpha: the paired test on log ratios where it applies (every value
// positive, three pairs or more), else the U test.
func (m *MetricDiff) Significant(alpha float64) bool { return m.TestP() < alpha }

// TestP is the p of the test that applies: the paired test on log
// ratios where every value is positive (three pairs or more), else the U
// test.
func (m *MetricDiff) TestP() float64 {
	if m.MinDetectableChange > 0 {
		return m.PairedP
	}
	return m.P
}

// MostChangedCategory is the category whose blocked time with an
// application frame changed most per profiled run, or nil.
func (dr *DiffReport) MostChangedCategory() *MetricDiff {
	var most *MetricDiff
	for i := range dr.Figures {
		m := &dr.Figures[i]
		if figureRank(*m) == 1 && m.Unit == UnitNs && (most == nil || math.Abs(m.CandMean-m.BaseMean) > math.Abs(most.CandMean-most.BaseMean)) {
			most = m
		}
	}
	return most
}

// Range is a figure's or metric's min–max over runs, in its unit.
func (m *MetricDiff) Range(side int) string {
	lo, hi := m.BaseMin, m.BaseMax
	if side == 1 {
		lo, hi = m.CandMin, m.CandMax
	}
	return formatUnit(lo, m.Unit) + "–" + formatUnit(hi, m.Unit)
}

// formatUnit writes a value in its unit.
func formatUnit(v float64, unit string) string {
	switch unit {
	case UnitNs:
		return Secs(int64(math.Round(v)))
	case UnitPct:
		return fmt.Sprintf("%.1f%%", v)
	case UnitCount:
		return fmt.Sprintf("%.0f", v)
	}
	return num(v)
}

// RunsString writes each run's value in its unit.
func RunsString(v []float64, unit string) string {
	s := make([]string, len(v))
	for i, x := range v {
		s[i] = formatUnit(x, unit)
	}
	return strings.Join(s, ", ")
}

// writeFigures tabulates the profile figures in markdown: the whole
// profile, categories and shares, then the largest changes of the rest.
func (dr *DiffReport) writeFigures(w io.Writer) {
	if len(dr.Figures) == 0 {
		return
	}
	fmt.Fprintf(w, "\nProfile figures, each profiled run (a run's value is its own analysis; the change is of the means; p: paired test on log ratios where every value is positive, else U test):\n\n| figure | %s (each run) | %s (each run) | change | %s min–max | %s min–max | p |\n|---|---|---|---:|---|---|---:|\n",
		dr.Base.Name, dr.Cand.Name, dr.Base.Name, dr.Cand.Name)
	rest, omitted := 0, 0
	for _, m := range dr.Figures {
		if figureRank(m) > 2 {
			if rest >= 15 {
				omitted++
				continue
			}
			rest++
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %.3f |\n", m.Name, RunsString(m.Base, m.Unit), RunsString(m.Cand, m.Unit), figChange(m),
			m.Range(0), m.Range(1), m.TestP())
	}
	if omitted > 0 {
		fmt.Fprintf(w, "\n%d more figures (processes, thread groups, root causes, wake-ups): `figures` in the JSON report.\n", omitted)
	}
}

// figChange is a figure's change: percentage points for shares.
func figChange(m MetricDiff) string {
	if m.Unit == UnitPct {
		return fmt.Sprintf("%+.1f pp", m.CandMean-m.BaseMean)
	}
	if m.BaseMean == 0 {
		return "new"
	}
	return fmt.Sprintf("%+.1f%%", m.ChangePct)
}
