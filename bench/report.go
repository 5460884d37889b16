package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/schema"
	"github.com/offcpu/offcpu/workload"
	"github.com/offcpu/offcpu/workload/dispatcher"
)

// analysisOptions are the analyzed threads and processes, and the
// workload's key metrics.
func analysisOptions(cfg *Config, res *Result) analysis.Options {
	var o analysis.Options
	if cfg.Threads != "" {
		o.Threads = regexp.MustCompile(cfg.Threads)
	}
	o.KeyMetrics, o.NotCompared = cfg.workload.KeyMetrics()
	switch {
	case isPIDFile(cfg.Target):
		o.PIDs = map[int64]bool{}
		for _, r := range res.Runs {
			for _, p := range r.TargetPIDs {
				o.PIDs[p] = true
			}
		}
	case cfg.Target != "":
		o.Processes = regexp.MustCompile("^(?:" + cfg.Target + ")$")
	default:
		o.SkipProcesses = cfg.workload.Harness()
	}
	return o
}

// analyzedLine names the analyzed threads and processes.
func analyzedLine(cfg *Config) string {
	threads := "every thread"
	if cfg.Threads != "" {
		threads = fmt.Sprintf("threads whose name matches `%s`", cfg.Threads)
	}
	procs := "of every process"
	switch h := cfg.workload.Harness(); {
	case isPIDFile(cfg.Target):
		procs = fmt.Sprintf("of the processes whose pids each run wrote to `%s` (--target)", cfg.Target)
	case cfg.Target != "":
		procs = fmt.Sprintf("of the processes named `%s` (--target)", cfg.Target)
	case h != nil:
		procs = fmt.Sprintf("of every process but the harness (processes named `%s`, the shell each run starts; pick the system under test with --target)", h)
	}
	return threads + " " + procs
}

// finish analyzes what ran and writes report.md and report.json.
func finish(cfg *Config, res *Result) error {
	o := analysisOptions(cfg, res)
	res.Analyzed = analyzedLine(cfg)
	res.Setup = setupLine(cfg, res.Runs)
	for i, sc := range cfg.workload.Rotation() {
		dr, err := res.headline, error(nil)
		if i > 0 || dr == nil || res.headlineRuns != len(res.Runs) {
			dr, err = diffScenario(cfg, res, sc, o)
		}
		if err != nil {
			return err
		}
		sr := ScenarioResult{Name: workload.ScenarioLabel(sc), Diff: dr}
		if cfg.Goroutines && i == 0 {
			if sr.Goroutines, err = diffGoroutines(cfg, res, sc, o); err != nil {
				return err
			}
		}
		res.Scenarios = append(res.Scenarios, sr)
	}
	res.Diff = res.Scenarios[0].Diff
	if err := writeFlameGraphs(cfg, res, o); err != nil {
		return err
	}
	var gateErr error
	if len(cfg.FailOn) > 0 && res.Diff != nil {
		res.Gates, gateErr = res.Diff.Gates(cfg.FailOn, cfg.FailAlpha)
	}
	res.Report = markdown(cfg, res)
	if err := os.WriteFile(filepath.Join(cfg.Out, "report.md"), []byte(res.Report), 0o644); err != nil {
		return fmt.Errorf("writing report.md: %w", err)
	}
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cfg.Out, "report.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	return gateErr
}

// diffScenario compares the two sides' runs of one scenario; nil when a
// side has none.
func diffScenario(cfg *Config, res *Result, sc string, o analysis.Options) (*analysis.DiffReport, error) {
	sides := make([]*analysis.Side, 2)
	for i, name := range cfg.Variants {
		var dirs []string
		for _, r := range res.Runs {
			if r.Side == name && r.Scenario == sc {
				dirs = append(dirs, r.Dir)
			}
		}
		if len(dirs) == 0 {
			return nil, nil
		}
		s, err := analysis.LoadSide(name, dirs)
		if err != nil {
			return nil, err
		}
		sides[i] = s
	}
	return analysis.Diff(sides[0], sides[1], cfg.Rules, o)
}

// diffGoroutines compares the goroutine waits of one scenario's profiled
// runs, for every goroutine of the analyzed processes; nil when a side
// recorded none.
func diffGoroutines(cfg *Config, res *Result, sc string, o analysis.Options) (*analysis.DiffReport, error) {
	o.Threads, o.KeyMetrics, o.NotCompared = nil, nil, nil
	sides := make([]*analysis.Side, 2)
	for i, name := range cfg.Variants {
		sides[i] = &analysis.Side{Name: name}
		for _, r := range res.Runs {
			path := filepath.Join(r.Dir, schema.GoroutinesFile)
			if r.Side == name && r.Scenario == sc && r.Profiled && !r.Failed {
				if _, err := os.Stat(path); err != nil {
					continue
				}
				sides[i].Runs = append(sides[i].Runs, analysis.Run{Name: r.Name, Profiled: true, Profiles: []string{path}})
			}
		}
		if len(sides[i].Runs) == 0 {
			return nil, nil
		}
	}
	return analysis.Diff(sides[0], sides[1], cfg.Rules, o)
}

func markdown(cfg *Config, res *Result) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "## Measurements\n\n")
	profiled := res.ProfiledRuns
	if cfg.ProfiledRuns > 0 {
		profiled += fmt.Sprintf(" (profiled runs under `offcpu record` with wake-ups and on-CPU samples at %d Hz; %s)", cfg.CPUHz, thresholdLine(cfg, res))
	}
	fmt.Fprintf(&b, "Setup: %s. %s and %s interleaved run by run (A B A B ...): %d unprofiled run(s) per side; %s. Cool-down before each run: %s.\n\n",
		res.Setup, cfg.Variants[0], cfg.Variants[1], cfg.Runs, profiled, res.Cooldown)
	fmt.Fprintf(&b, "Analyzed: %s.\n\n", res.Analyzed)
	if res.Interrupted {
		finished := 0
		for _, r := range res.Runs {
			if !r.Failed {
				finished++
			}
		}
		fmt.Fprintf(&b, "**Interrupted**: %d of the %d planned runs finished; this report covers them.\n\n", finished, 2*(cfg.Runs+cfg.ProfiledRuns))
	}
	writeGates(&b, cfg, res)
	writeFailures(&b, cfg, res)
	writeScenarios(&b, cfg, res)
	if res.Diff == nil {
		return b.String()
	}
	writeProfiled(&b, cfg, res)
	writeGoroutines(&b, res)
	writeFlameLinks(&b, cfg, res)
	fmt.Fprintf(&b, "\nRuns, metrics and profiles: `runs/`; machine-readable: `report.json`.\n")
	return b.String()
}

// thresholdLine states what the profiled runs recorded, and how much of
// the recorded threads' off-CPU time their profiles kept.
func thresholdLine(cfg *Config, res *Result) string {
	if cfg.ProfiledRuns == 0 {
		return "no threshold"
	}
	s := "every off-CPU interval recorded"
	if cfg.MinBlock > 0 {
		s = fmt.Sprintf("off-CPU intervals of %v and longer recorded", cfg.MinBlock)
	}
	lo, hi, n := 1.0, 0.0, 0
	for _, r := range res.Runs {
		if r.Kept != nil && !r.Failed {
			lo, hi, n = math.Min(lo, *r.Kept), math.Max(hi, *r.Kept), n+1
		}
	}
	if n > 0 {
		s += fmt.Sprintf(": the profiles kept %.1f–%.1f%% of the recorded threads' off-CPU time", 100*lo, 100*hi)
	}
	return s
}

// writeGates says which --fail-on conditions held.
func writeGates(b *bytes.Buffer, cfg *Config, res *Result) {
	if len(res.Gates) == 0 {
		return
	}
	fmt.Fprintf(b, "**Gates** (--fail-on, significant at %g):\n\n", cfg.FailAlpha)
	for _, g := range res.Gates {
		mark := "passed"
		if g.Fired {
			mark = "**FAILED**"
		}
		fmt.Fprintf(b, "- %s: %s\n", mark, g.Says)
	}
	b.WriteString("\n")
}

// writeFailures lists the failed runs, or says every run verified.
func writeFailures(b *bytes.Buffer, cfg *Config, res *Result) {
	var failed []string
	for _, r := range res.Runs {
		if r.Failed {
			failed = append(failed, fmt.Sprintf("- `%s` failed and is excluded from the statistics: %s", r.Name, r.Error))
		}
	}
	if len(failed) == 0 && cfg.bundled() {
		fmt.Fprintf(b, "Every run delivered all messages to every subscription with no duplicates, no ordering violations and no invalid messages.\n\n")
	} else if len(failed) > 0 {
		fmt.Fprintf(b, "%s\n\n", strings.Join(failed, "\n"))
	}
}

// writeScenarios writes each scenario's comparison of the two sides.
func writeScenarios(b *bytes.Buffer, cfg *Config, res *Result) {
	for i, sr := range res.Scenarios {
		if len(res.Scenarios) > 1 {
			kind := "unprofiled runs"
			if i == 0 && cfg.ProfiledRuns > 0 {
				kind = "unprofiled and profiled runs"
			}
			fmt.Fprintf(b, "### %s (%s)\n\n", sr.Name, kind)
		}
		if sr.Diff == nil {
			fmt.Fprintf(b, "Not enough runs to compare the two sides.\n\n")
			continue
		}
		var d bytes.Buffer
		sr.Diff.Write(&d, "markdown")
		// The diff's own heading is this section's.
		b.WriteString(strings.TrimPrefix(d.String(), "### Measurements\n\n"))
		if subs := perApplication(res, sr.Name, cfg); subs != "" {
			b.WriteString(subs)
		}
		b.WriteString("\n")
	}
}

// writeGoroutines writes the comparison of the profiled runs' goroutine
// waits, where they were recorded.
func writeGoroutines(b *bytes.Buffer, res *Result) {
	if len(res.Scenarios) == 0 || res.Scenarios[0].Goroutines == nil {
		return
	}
	fmt.Fprintf(b, "\n### Goroutine waits (profiled runs)\n\n")
	var d bytes.Buffer
	res.Scenarios[0].Goroutines.Write(&d, "markdown")
	b.WriteString(strings.TrimPrefix(d.String(), "### Measurements\n\n"))
}

// writeProfiled writes the profiled runs' attribution and wake-ups.
func writeProfiled(b *bytes.Buffer, cfg *Config, res *Result) {
	for i, rep := range []*analysis.Report{res.Diff.BaseReport, res.Diff.CandReport} {
		if rep == nil {
			continue
		}
		fmt.Fprintf(b, "\n### Off-CPU attribution: %s (profiled run%s)\n\n", cfg.Variants[i], plural(cfg.ProfiledRuns))
		var a bytes.Buffer
		rep.Write(&a, "markdown")
		b.Write(a.Bytes())
	}
	if res.Diff.BaseReport != nil && res.Diff.CandReport != nil {
		b.WriteString(processTable(res.Diff, cfg))
	}
	if res.Diff.BaseReport != nil && res.Diff.CandReport != nil && (res.Diff.BaseReport.Messages == 0 || res.Diff.CandReport.Messages == 0) {
		b.WriteString(wakeupsPerRun(res.Diff, cfg))
	} else if res.Diff.BaseReport != nil && res.Diff.CandReport != nil {
		bw, cw := res.Diff.BaseReport.Wakeups, res.Diff.CandReport.Wakeups
		fmt.Fprintf(b, "\n### Wake-ups per message\n\n| | %s | %s |\n|---|---:|---:|\n", cfg.Variants[0], cfg.Variants[1])
		fmt.Fprintf(b, "| all wake-ups of the analyzed threads | %.4f | %.4f |\n| eventfd wake-ups (event loops woken) | %.4f | %.4f |\n",
			bw.PerMessage, cw.PerMessage, bw.EventfdPerMessage, cw.EventfdPerMessage)
		for _, m := range res.Diff.Metrics {
			switch m.Name {
			case "broker_wakeups_per_msg":
				fmt.Fprintf(b, "| eventfd writes counted by the model (unprofiled runs) | %.4f | %.4f |\n", m.BaseMean, m.CandMean)
			case "listener_wake_calls_per_msg":
				fmt.Fprintf(b, "| futex wake calls of hand-offs between the client pools, counted by the model (unprofiled runs; per message received; a call finds no sleeper when the thread has not gone to sleep yet) | %.4f | %.4f |\n", m.BaseMean, m.CandMean)
			}
		}
		b.WriteString(wakeupsByGroup(res.Diff, cfg))
		b.WriteString(wakeupsByPair(res.Diff, cfg))
		b.WriteString(storyTable(cfg, res))
	}
}

// writeFlameLinks links the flame graphs.
func writeFlameLinks(b *bytes.Buffer, cfg *Config, res *Result) {
	if len(res.flameLinks)+len(res.flameNotes) > 0 {
		fmt.Fprintf(b, "\n### Flame graphs\n\nThe analyzed threads, by thread group; a diff is drawn at the baseline's widths, blue where the candidate has less, red where it has more.\n\n")
		for _, l := range res.flameLinks {
			fmt.Fprintf(b, "- [%s](%s): %s\n", l.file, l.file, l.what)
		}
		for _, n := range res.flameNotes {
			fmt.Fprintf(b, "- %s\n", n)
		}
	}
}

// processTable tabulates the analyzed time by process, per profiled run:
// a command's server, load generator and the rest apart.
func processTable(d *analysis.DiffReport, cfg *Config) string {
	br, cr := d.BaseReport, d.CandReport
	if len(br.Processes)+len(cr.Processes) == 0 {
		return ""
	}
	rows := map[string][2]analysis.ProcessResult{}
	var names []string
	for i, rep := range []*analysis.Report{br, cr} {
		for _, p := range rep.Processes {
			r, seen := rows[p.Name]
			if !seen {
				names = append(names, p.Name)
			}
			r[i] = p
			rows[p.Name] = r
		}
	}
	bn, cn := int64(max(d.BaseProfiledRuns, 1)), int64(max(d.CandProfiledRuns, 1))
	var b bytes.Buffer
	a, c := cfg.Variants[0], cfg.Variants[1]
	fmt.Fprintf(&b, "\n### By process (profiled runs, per run)\n\n| process | blocked w/ app frame %s | %s | idle %s | %s | waiting for a CPU %s | %s | on-CPU %s | %s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n", a, c, a, c, a, c, a, c)
	for _, n := range names {
		x, y := rows[n][0], rows[n][1]
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", n, analysis.Secs(x.AppBlockedNs/bn), analysis.Secs(y.AppBlockedNs/cn),
			analysis.Secs(x.IdleNs/bn), analysis.Secs(y.IdleNs/cn), analysis.Secs(x.RunQueueNs/bn), analysis.Secs(y.RunQueueNs/cn), analysis.Secs(x.CPUNs/bn), analysis.Secs(y.CPUNs/cn))
	}
	return b.String()
}

// wakeupsPerRun tabulates wake-ups by class per profiled run and per
// second, for runs that count no messages.
func wakeupsPerRun(d *analysis.DiffReport, cfg *Config) string {
	br, cr := d.BaseReport, d.CandReport
	if br.Wakeups.Total+cr.Wakeups.Total == 0 {
		return ""
	}
	bn, cn := float64(max(d.BaseProfiledRuns, 1)), float64(max(d.CandProfiledRuns, 1))
	classes := map[string]bool{}
	for _, rep := range []*analysis.Report{br, cr} {
		for k := range rep.Wakeups.ByClass {
			classes[k] = true
		}
	}
	names := make([]string, 0, len(classes))
	for k := range classes {
		names = append(names, k)
	}
	sort.Strings(names)
	per := func(n int64, runs, secs float64) string {
		s := fmt.Sprintf("%.0f", float64(n)/runs)
		if secs > 0 {
			s += fmt.Sprintf(" (%.0f/s)", float64(n)/secs)
		}
		return s
	}
	var b bytes.Buffer
	a, c := cfg.Variants[0], cfg.Variants[1]
	fmt.Fprintf(&b, "\n### Wake-ups of the analyzed threads (per profiled run, and per second; the runs count no messages)\n\n| class | %s | %s |\n|---|---:|---:|\n| all | %s | %s |\n", a, c,
		per(br.Wakeups.Total, bn, d.Seconds[0]), per(cr.Wakeups.Total, cn, d.Seconds[1]))
	for _, k := range names {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", k, per(br.Wakeups.ByClass[k], bn, d.Seconds[0]), per(cr.Wakeups.ByClass[k], cn, d.Seconds[1]))
	}
	return b.String()
}

// wakeupsByGroup tabulates, per woken thread group, the wake-ups per
// published message of the profiled runs, all and through a futex.
func wakeupsByGroup(d *analysis.DiffReport, cfg *Config) string {
	br, cr := d.BaseReport, d.CandReport
	if br.Messages == 0 || cr.Messages == 0 {
		return ""
	}
	type pair struct{ b, c analysis.TargetWakeups }
	groups := map[string]*pair{}
	var names []string
	for i, rep := range []*analysis.Report{br, cr} {
		for _, t := range rep.Wakeups.ByTargetGroup {
			p := groups[t.Group]
			if p == nil {
				p = &pair{}
				groups[t.Group] = p
				names = append(names, t.Group)
			}
			if i == 0 {
				p.b = t
			} else {
				p.c = t
			}
		}
	}
	if len(names) == 0 {
		return ""
	}
	sort.Strings(names)
	per := func(n int64, rep *analysis.Report) float64 { return float64(n) / float64(rep.Messages) }
	var b bytes.Buffer
	a, c := cfg.Variants[0], cfg.Variants[1]
	fmt.Fprintf(&b, "\nBy woken thread group (profiled runs, per published message):\n\n| woken | all %s | all %s | futex %s | futex %s | eventfd %s | eventfd %s | timer %s | timer %s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
		a, c, a, c, a, c, a, c)
	for _, n := range names {
		p := groups[n]
		fmt.Fprintf(&b, "| %s | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f |\n", n, per(p.b.Total, br), per(p.c.Total, cr),
			per(p.b.ByClass[schema.WakeFutex], br), per(p.c.ByClass[schema.WakeFutex], cr), per(p.b.ByClass[schema.WakeEventfd], br), per(p.c.ByClass[schema.WakeEventfd], cr),
			per(p.b.ByClass["timer"], br), per(p.c.ByClass["timer"], cr))
	}
	return b.String()
}

// wakeupsByPair tabulates who woke whom (thread groups), per published
// message of the profiled runs, the pairs that changed most first.
func wakeupsByPair(d *analysis.DiffReport, cfg *Config) string {
	br, cr := d.BaseReport, d.CandReport
	if br.Messages == 0 || cr.Messages == 0 || len(br.Wakeups.ByPair)+len(cr.Wakeups.ByPair) == 0 {
		return ""
	}
	rows := map[string][2]float64{}
	for i, rep := range []*analysis.Report{br, cr} {
		for k, v := range rep.Wakeups.ByPair {
			r := rows[k]
			r[i] = float64(v) / float64(rep.Messages)
			rows[k] = r
		}
	}
	keys := make([]string, 0, len(rows))
	for k := range rows {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		di, dj := math.Abs(rows[keys[i]][1]-rows[keys[i]][0]), math.Abs(rows[keys[j]][1]-rows[keys[j]][0])
		return di > dj || (di == dj && keys[i] < keys[j])
	})
	if len(keys) > 12 {
		// The story's pairs stay, however little they moved.
		top := keys[:12:12]
		if st := storyOf(cfg); st != nil {
			for _, k := range keys[12:] {
				if slices.Contains(st.Wakeups, k) {
					top = append(top, k)
				}
			}
		}
		keys = top
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "\nWho woke whom (waker group → woken group; profiled runs, per published message):\n\n| wake-up | %s | %s |\n|---|---:|---:|\n", cfg.Variants[0], cfg.Variants[1])
	for _, k := range keys {
		fmt.Fprintf(&b, "| %s | %.4f | %.4f |\n", k, rows[k][0], rows[k][1])
	}
	return b.String()
}

// storyTable reports the on-CPU time of the scenario's story functions,
// each profiled run's value with its range and test.
func storyTable(cfg *Config, res *Result) string {
	res.Story = storyCPU(cfg, res)
	if len(res.Story) == 0 {
		return ""
	}
	var b bytes.Buffer
	a, c := cfg.Variants[0], cfg.Variants[1]
	fmt.Fprintf(&b, "\nOn-CPU time of the analyzed threads in the scenario's functions (inclusive; µs per published message, each profiled run):\n\n| function | %s (each run) | %s (each run) | change | %s min–max | %s min–max | p |\n|---|---|---|---:|---|---|---:|\n", a, c, a, c)
	for _, m := range res.Story {
		fmt.Fprintf(&b, "| %s | %s | %s | %+.1f%% | %s | %s | %.3f |\n", m.Name, analysis.RunsString(m.Base, m.Unit), analysis.RunsString(m.Cand, m.Unit), m.ChangePct, m.Range(0), m.Range(1), m.TestP())
	}
	return b.String()
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// perApplication tabulates each subscription's end-to-end latency and
// backlog over a scenario's unprofiled runs (the ranges over the runs, as
// seed 000 reports its high-rate scenario); empty with one subscription.
func perApplication(res *Result, scenario string, cfg *Config) string {
	type key struct{ side, app string }
	vals := map[key][4][]float64{}
	var apps []string
	for _, r := range res.Runs {
		if workload.ScenarioLabel(r.Scenario) != scenario || r.Failed || r.Profiled {
			continue
		}
		b, err := os.ReadFile(filepath.Join(r.Dir, schema.MetricsFile))
		if err != nil {
			continue
		}
		var m struct {
			Subscriptions []dispatcher.SubResult `json:"subscriptions"`
		}
		if json.Unmarshal(b, &m) != nil {
			continue
		}
		for _, s := range m.Subscriptions {
			k := key{r.Side, s.Name}
			if _, seen := vals[key{cfg.Variants[0], s.Name}]; !seen && r.Side == cfg.Variants[0] {
				apps = append(apps, s.Name)
			}
			v := vals[k]
			v[0], v[1], v[2], v[3] = append(v[0], s.E2EP50ms), append(v[1], s.E2EP99ms), append(v[2], float64(s.Backlog)), append(v[3], s.ConsumeRate)
			vals[k] = v
		}
	}
	if len(apps) < 2 {
		return ""
	}
	span := func(v []float64) string {
		if len(v) == 0 {
			return "–"
		}
		lo, hi := v[0], v[0]
		for _, x := range v {
			lo, hi = min(lo, x), max(hi, x)
		}
		return fmt.Sprintf("%.1f–%.1f", lo, hi)
	}
	var b bytes.Buffer
	a, c := cfg.Variants[0], cfg.Variants[1]
	fmt.Fprintf(&b, "\nPer application (ranges over the unprofiled runs):\n\n| application | e2e p50 ms %s | e2e p50 ms %s | e2e p99 ms %s | e2e p99 ms %s | backlog %s | backlog %s | consumed msg/s %s | consumed msg/s %s |\n|---|---|---|---|---|---|---|---|---|\n", a, c, a, c, a, c, a, c)
	for _, app := range apps {
		x, y := vals[key{a, app}], vals[key{c, app}]
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", app, span(x[0]), span(y[0]), span(x[1]), span(y[1]), span(x[2]), span(y[2]), span(x[3]), span(y[3]))
	}
	return b.String()
}

// storyOf is the profiled scenario's story; nil for commands.
func storyOf(cfg *Config) *workload.Story {
	if cfg.workload == nil {
		return nil
	}
	return cfg.workload.Story()
}
