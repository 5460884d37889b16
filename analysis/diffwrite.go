package analysis

import (
	"fmt"
	"io"
	"strings"

	"github.com/offcpu/offcpu/schema"
)

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
