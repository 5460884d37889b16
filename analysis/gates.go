package analysis

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"
)

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
