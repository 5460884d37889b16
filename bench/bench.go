// Package bench runs a baseline and a candidate interleaved, profiles
// some runs, and writes the PR-ready Measurements section: the method of
// seed 000, end to end.
package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/workload"
)

// Config is one benchmark.
type Config struct {
	// Bundled scenario names or YAML files, run in rotation (each round:
	// every scenario, baseline then candidate). Profiled runs use the
	// first, as seed 000 profiles only its Key_Shared scenario.
	Scenarios    []string
	Pin          bool     // broker and client threads on CPUs of their own
	Variants     []string // two: baseline first
	Runs         int      // unprofiled runs per side
	ProfiledRuns int      // profiled runs per side
	Messages     int64    // per run (0: the scenario's)
	Duration     time.Duration
	Rate         float64 // < 0: the scenario's (with --rate, for every scenario)
	Out          string

	CooldownTemp float64       // °C, where thermal zones exist
	CooldownIdle float64       // % busy, otherwise
	CooldownMax  time.Duration // give up waiting after this

	// Any benchmark: each run is `sh -c CMD`, which may write metrics as
	// a JSON object to the file named by $OFFCPU_METRICS.
	BaselineCmd, CandidateCmd string

	Executable string // offcpu binary for the bundled runs (default: this one)
	Threads    string // analysis thread filter (default: broker threads for the bundled core)
	CPUHz      int    // on-CPU sampling in profiled runs
	// Goroutines records the goroutine waits of Go programs in profiled
	// runs (collector.Options.Goroutines): the report compares them.
	Goroutines bool
	// MinBlock drops shorter off-CPU intervals in profiled runs; < 0: the
	// workload's default (the bundled core: 100 µs as seed 000's profiled
	// scenario; commands: every interval).
	MinBlock time.Duration
	// Target picks the analyzed processes: a regexp of process names, or
	// a pid file (a path: it holds a "/") the command writes. "": every
	// process but the workload's harness.
	Target string
	// MaxProfiledRuns: above ProfiledRuns, profiled pairs are added until
	// the headline share's range is within ±HeadlineSpread points on both
	// sides, or this many runs a side.
	MaxProfiledRuns int
	// FailOn conditions are checked on the first scenario's diff; one
	// fires when crossed and significant at FailAlpha.
	FailOn    []analysis.FailOn
	FailAlpha float64
	Rules     *analysis.Rules
	Progress  io.Writer
	Terminal  bool // draw a progress bar instead of lines

	workload workload.Workload // resolved by validate
}

// RunRecord is one run as the report lists it.
type RunRecord struct {
	Name     string             `json:"name"`
	Scenario string             `json:"scenario,omitempty"`
	Side     string             `json:"side"`
	Index    int                `json:"index"`
	Profiled bool               `json:"profiled"`
	Failed   bool               `json:"failed"`
	Error    string             `json:"error,omitempty"`
	WallS    float64            `json:"wall_s"`
	Dir      string             `json:"dir"`
	Metrics  map[string]float64 `json:"metrics,omitempty"`
	// TargetPIDs: read from the --target pid file after the run.
	TargetPIDs []int64  `json:"target_pids,omitempty"`
	Cooldown   cooled   `json:"cooldown"`
	Kept       *float64 `json:"kept_share,omitempty"` // profiled: share of the recorded off-CPU time kept
}

// Result is a finished (or interrupted) benchmark.
type Result struct {
	Setup       string               `json:"setup"`
	Cooldown    string               `json:"cooldown"`
	Runs        []RunRecord          `json:"runs"`
	Diff        *analysis.DiffReport `json:"diff,omitempty"` // the first scenario's
	Scenarios   []ScenarioResult     `json:"scenarios,omitempty"`
	Interrupted bool                 `json:"interrupted"`
	Report      string               `json:"-"`
	// Analyzed says which threads and processes the profiles were read for.
	Analyzed string `json:"analyzed"`
	// ProfiledRuns says how many profiled runs a side were run and why.
	ProfiledRuns string          `json:"profiled_runs"`
	Gates        []analysis.Gate `json:"gates,omitempty"`
	// Story: on-CPU µs per message in the scenario's story functions,
	// run by run.
	Story []analysis.MetricDiff `json:"story_cpu,omitempty"`

	// The SVGs written next to report.md, and which were not drawn.
	flameLinks []flameLink
	flameNotes []string
	// headline: the first scenario's diff over the first headlineRuns
	// runs, which finish reuses while no run was added.
	headline     *analysis.DiffReport
	headlineRuns int
}

// ScenarioResult is the comparison of one scenario's runs.
type ScenarioResult struct {
	Name string               `json:"name"`
	Diff *analysis.DiffReport `json:"diff,omitempty"`
	// Goroutines compares the profiled runs' goroutine waits (--goroutines).
	Goroutines *analysis.DiffReport `json:"goroutines,omitempty"`
}

func (c *Config) bundled() bool { return c.BaselineCmd == "" && c.CandidateCmd == "" }

// isPIDFile: a --target with a "/" is a pid file, else process names.
func isPIDFile(target string) bool { return strings.Contains(target, "/") }

// readPIDFile reads the pids (one or more, white-space separated) the
// run wrote, then removes the file so the next run writes its own.
func readPIDFile(path string) ([]int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("the run wrote no pid file: %v", err)
	}
	os.Remove(path)
	var pids []int64
	for _, f := range strings.Fields(string(b)) {
		pid, err := strconv.ParseInt(f, 10, 64)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("%s: %q is not a pid", path, f)
		}
		pids = append(pids, pid)
	}
	if len(pids) == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	return pids, nil
}

func (c *Config) validate() error {
	if len(c.Variants) != 2 || c.Variants[0] == c.Variants[1] {
		return fmt.Errorf("--variants takes two different names, baseline first (e.g. baseline,candidate)")
	}
	if (c.BaselineCmd == "") != (c.CandidateCmd == "") {
		return fmt.Errorf("give both --baseline-cmd and --candidate-cmd, or neither")
	}
	if c.Runs < 0 || c.ProfiledRuns < 0 || c.Runs+c.ProfiledRuns == 0 {
		return fmt.Errorf("--runs and --profiled-runs must not be negative, and not both 0")
	}
	if c.Messages > 0 && c.Duration > 0 {
		return fmt.Errorf("give --messages or --duration, not both")
	}
	if c.bundled() {
		w, err := workload.NewBundled(workload.BundledConfig{Executable: c.Executable, Scenarios: c.Scenarios, Variants: c.Variants,
			Pin: c.Pin, Messages: c.Messages, Duration: c.Duration, Rate: c.Rate})
		if err != nil {
			return err
		}
		c.workload = w
	} else {
		c.workload = workload.Commands(c.BaselineCmd, c.CandidateCmd)
	}
	if c.Threads != "" {
		if _, err := regexp.Compile(c.Threads); err != nil {
			return fmt.Errorf("--threads %q: %v", c.Threads, err)
		}
	}
	if c.Target != "" && !isPIDFile(c.Target) {
		if _, err := regexp.Compile(c.Target); err != nil {
			return fmt.Errorf("--target %q: not a process-name regexp (%v) nor a pid file path", c.Target, err)
		}
	}
	if c.MaxProfiledRuns > 0 && c.MaxProfiledRuns < c.ProfiledRuns {
		return fmt.Errorf("--max-profiled-runs %d is below --profiled-runs %d", c.MaxProfiledRuns, c.ProfiledRuns)
	}
	if c.FailAlpha == 0 {
		c.FailAlpha = 0.05
	}
	if c.ProfiledRuns > 0 && os.Geteuid() != 0 {
		return fmt.Errorf("profiled runs need root for eBPF: run with sudo, or --profiled-runs 0")
	}
	return nil
}

type plannedRun struct {
	scenario string
	side     int
	index    int
	profiled bool
}

// Run runs the benchmark. On ctx cancellation it keeps the finished runs
// and writes the report for them.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Rules == nil {
		r, err := analysis.LoadRules("")
		if err != nil {
			return nil, err
		}
		cfg.Rules = r
	}
	if cfg.Executable == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("finding the offcpu binary: %w", err)
		}
		cfg.Executable = exe
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Threads == "" {
		cfg.Threads = cfg.workload.Threads()
	}
	if cfg.MinBlock < 0 {
		cfg.MinBlock = cfg.workload.MinBlock()
	}
	if err := os.MkdirAll(filepath.Join(cfg.Out, "runs"), 0o755); err != nil {
		return nil, fmt.Errorf("creating %s: %w", cfg.Out, err)
	}
	if w, ok := cfg.workload.(*workload.Bundled); ok {
		if err := w.WriteSpecs(filepath.Join(cfg.Out, "scenarios")); err != nil {
			return nil, err
		}
	}
	var plan []plannedRun
	scs := cfg.workload.Rotation()
	for i := 1; i <= cfg.Runs; i++ {
		for _, sc := range scs {
			plan = append(plan, plannedRun{sc, 0, i, false}, plannedRun{sc, 1, i, false})
		}
	}
	for i := 1; i <= cfg.ProfiledRuns; i++ {
		plan = append(plan, plannedRun{scs[0], 0, i, true}, plannedRun{scs[0], 1, i, true})
	}
	res := &Result{}
	b := &batch{ctx: ctx, cfg: &cfg, res: res, start: time.Now(), multi: len(scs) > 1}
	b.prog = newProgress(cfg.Progress, cfg.Terminal, len(plan))
	for _, pr := range plan {
		b.run(pr)
	}
	res.ProfiledRuns = b.moreProfiled(scs[0])
	b.prog.finish()
	res.Cooldown = cooldownSummary(&cfg, res.Runs)
	if err := finish(&cfg, res); err != nil {
		return res, err
	}
	if res.Interrupted {
		return res, ctx.Err()
	}
	return res, nil
}

// batch runs planned runs one after another.
type batch struct {
	ctx   context.Context
	cfg   *Config
	res   *Result
	prog  *progress
	start time.Time
	n     int
	multi bool // several scenarios: run names carry the scenario
}

func (b *batch) run(pr plannedRun) {
	cfg, res := b.cfg, b.res
	if b.ctx.Err() != nil {
		res.Interrupted = true
		return
	}
	side := cfg.Variants[pr.side]
	name := fmt.Sprintf("%s-%d", side, pr.index)
	if pr.profiled {
		name = fmt.Sprintf("%s-profiled-%d", side, pr.index)
	}
	if b.multi {
		name = workload.ScenarioLabel(pr.scenario) + "-" + name
	}
	cool := cooldown(b.ctx, cfg)
	b.prog.step(b.n, name, pr.profiled, b.start)
	b.n++
	rec := runOne(b.ctx, cfg, side, pr, name)
	rec.Cooldown = cool
	if b.ctx.Err() != nil && rec.Failed {
		res.Interrupted = true
		rec.Error = "interrupted"
	}
	res.Runs = append(res.Runs, rec)
	b.prog.done(rec)
}

// HeadlineSpread is how far (±percentage points) the headline share may
// range over a side's profiled runs before more runs are added.
const HeadlineSpread = 5.0

// moreProfiled adds profiled pairs while the headline share ranges more
// than ±HeadlineSpread points on a side, up to MaxProfiledRuns, and says
// how many runs it took.
func (b *batch) moreProfiled(sc string) string {
	cfg := b.cfg
	n := cfg.ProfiledRuns
	if n == 0 {
		return "no profiled runs"
	}
	for {
		cat, spread, ok := b.headlineSpread(sc)
		switch {
		case !ok:
			return fmt.Sprintf("%d profiled run%s a side (no headline share to settle)", n, plural(n))
		case spread <= HeadlineSpread:
			return fmt.Sprintf("%d profiled run%s a side: the headline share (%s) ranged within ±%.1f points on each side (target ±%.0f)", n, plural(n), cat, spread, HeadlineSpread)
		case n >= cfg.MaxProfiledRuns || b.res.Interrupted:
			return fmt.Sprintf("%d profiled run%s a side: the headline share (%s) still ranged ±%.1f points on a side (target ±%.0f; --max-profiled-runs %d)", n, plural(n), cat, spread, HeadlineSpread, max(cfg.MaxProfiledRuns, n))
		}
		n++
		b.prog.grow(2)
		b.run(plannedRun{sc, 0, n, true})
		b.run(plannedRun{sc, 1, n, true})
	}
}

// headlineSpread is the headline category and the larger half-range of
// its share over either side's profiled runs.
func (b *batch) headlineSpread(sc string) (string, float64, bool) {
	dr, err := diffScenario(b.cfg, b.res, sc, analysisOptions(b.cfg, b.res))
	if err != nil || dr == nil {
		return "", 0, false
	}
	b.res.headline, b.res.headlineRuns = dr, len(b.res.Runs)
	cat, share := dr.Headline()
	if share == nil {
		return "", 0, false
	}
	return cat, max(share.BaseMax-share.BaseMin, share.CandMax-share.CandMin) / 2, true
}

// setupLine describes the machine and the workload, as its runs ran it.
func setupLine(cfg *Config, runs []RunRecord) string {
	var u unix.Utsname
	unix.Uname(&u)
	cpu := "unknown CPU"
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		if m := regexp.MustCompile(`(?m)^model name\s*:\s*(.+)$`).FindSubmatch(b); m != nil {
			cpu = string(m[1])
		}
	}
	s := fmt.Sprintf("Linux %s, %s (%d CPUs), %s", unix.ByteSliceToString(u.Release[:]), cpu, runtime.NumCPU(), runtime.Version())
	ran := map[string][]string{}
	for _, r := range runs {
		if !r.Failed {
			ran[r.Scenario] = append(ran[r.Scenario], r.Dir)
		}
	}
	return s + "; " + cfg.workload.Setup(ran)
}
