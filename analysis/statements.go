package analysis

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/offcpu/offcpu/schema"
)

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
	for _, class := range []string{schema.WakeEventfd, schema.WakeFutex} {
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
