package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/offcpu/offcpu/analysis"
)

// finish analyzes what ran and writes report.md and report.json.
func finish(cfg *Config, res *Result) error {
	var o analysis.Options
	if cfg.Threads != "" {
		o.Threads = regexp.MustCompile(cfg.Threads)
	}
	sides := make([]*analysis.Side, 2)
	for i, name := range cfg.Variants {
		var dirs []string
		for _, r := range res.Runs {
			if r.Side == name {
				dirs = append(dirs, r.Dir)
			}
		}
		if len(dirs) == 0 {
			continue
		}
		s, err := analysis.LoadSide(name, dirs)
		if err != nil {
			return err
		}
		sides[i] = s
	}
	if sides[0] != nil && sides[1] != nil {
		dr, err := analysis.Diff(sides[0], sides[1], cfg.Rules, o)
		if err != nil {
			return err
		}
		res.Diff = dr
	}
	if cfg.bundled() {
		if err := flameGraphs(cfg, res); err != nil {
			return err
		}
	}
	res.Report = markdown(cfg, res)
	if err := os.WriteFile(filepath.Join(cfg.Out, "report.md"), []byte(res.Report), 0o644); err != nil {
		return fmt.Errorf("writing report.md: %w", err)
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(cfg.Out, "report.json"), append(b, '\n'), 0o644)
}

// flameGraphs are written by the flamegraph package when it is linked
// in (see flame.go); it is a variable so the report works without it.
var flameGraphs = func(cfg *Config, res *Result) error { return nil }

// flameLinks lists the SVGs written next to report.md.
var flameLinks []string

func markdown(cfg *Config, res *Result) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "## Measurements\n\n")
	fmt.Fprintf(&b, "Setup: %s. %s and %s interleaved run by run (A B A B ...): %d unprofiled and %d profiled run(s) per side (profiled runs under `offcpu record` with wake-ups and on-CPU samples at %d Hz). Cool-down before each run: %s.\n\n",
		res.Setup, cfg.Variants[0], cfg.Variants[1], cfg.Runs, cfg.ProfiledRuns, cfg.CPUHz, res.Cooldown)
	if res.Interrupted {
		finished := 0
		for _, r := range res.Runs {
			if !r.Failed {
				finished++
			}
		}
		fmt.Fprintf(&b, "**Interrupted**: %d of the %d planned runs finished; this report covers them.\n\n", finished, 2*(cfg.Runs+cfg.ProfiledRuns))
	}
	var failed []string
	for _, r := range res.Runs {
		if r.Failed {
			failed = append(failed, fmt.Sprintf("- `%s` failed and is excluded from the statistics: %s", r.Name, r.Error))
		}
	}
	if len(failed) == 0 && cfg.bundled() {
		fmt.Fprintf(&b, "Every run delivered all messages to every subscription with no duplicates, no ordering violations and no invalid messages.\n\n")
	} else if len(failed) > 0 {
		fmt.Fprintf(&b, "%s\n\n", strings.Join(failed, "\n"))
	}
	if res.Diff == nil {
		fmt.Fprintf(&b, "Not enough runs to compare the two sides.\n")
		return b.String()
	}
	var d bytes.Buffer
	res.Diff.Write(&d, "markdown")
	// The diff's own heading is this section's.
	b.WriteString(strings.TrimPrefix(d.String(), "### Measurements\n\n"))
	for i, rep := range []*analysis.Report{res.Diff.BaseReport, res.Diff.CandReport} {
		if rep == nil {
			continue
		}
		fmt.Fprintf(&b, "\n### Off-CPU attribution: %s (profiled run%s)\n\n", cfg.Variants[i], plural(cfg.ProfiledRuns))
		var a bytes.Buffer
		rep.Write(&a, "markdown")
		b.Write(a.Bytes())
	}
	if res.Diff.BaseReport != nil && res.Diff.CandReport != nil {
		bw, cw := res.Diff.BaseReport.Wakeups, res.Diff.CandReport.Wakeups
		fmt.Fprintf(&b, "\n### Wake-ups per message\n\n| | %s | %s |\n|---|---:|---:|\n", cfg.Variants[0], cfg.Variants[1])
		fmt.Fprintf(&b, "| all wake-ups of the analyzed threads | %.4f | %.4f |\n| eventfd wake-ups (event loops woken) | %.4f | %.4f |\n",
			bw.PerMessage, cw.PerMessage, bw.EventfdPerMessage, cw.EventfdPerMessage)
		for _, m := range res.Diff.Metrics {
			if m.Name == "broker_wakeups_per_msg" {
				fmt.Fprintf(&b, "| eventfd writes counted by the model (unprofiled runs) | %.4f | %.4f |\n", m.BaseMean, m.CandMean)
			}
		}
	}
	if len(flameLinks) > 0 {
		fmt.Fprintf(&b, "\n### Flame graphs\n\n")
		for _, l := range flameLinks {
			fmt.Fprintf(&b, "- [%s](%s)\n", l, l)
		}
	}
	fmt.Fprintf(&b, "\nRuns, metrics and profiles: `runs/`; machine-readable: `report.json`.\n")
	return b.String()
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
