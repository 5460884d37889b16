// Package bench runs a baseline and a candidate interleaved, profiles
// some runs, and writes the PR-ready Measurements section: the method of
// seed 000, end to end.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/procfs"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/collector"
	"github.com/offcpu/offcpu/internal/output"
	"github.com/offcpu/offcpu/schema"
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

	workload workload // resolved by validate
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
		w, err := newBundledWorkload(c)
		if err != nil {
			return err
		}
		c.workload = w
	} else {
		c.workload = commandWorkload{[2]string{c.BaselineCmd, c.CandidateCmd}}
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
	if w, ok := cfg.workload.(*bundledWorkload); ok {
		if err := w.writeSpecs(filepath.Join(cfg.Out, "scenarios")); err != nil {
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
		name = scenarioLabel(pr.scenario) + "-" + name
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

func runOne(ctx context.Context, cfg *Config, side string, pr plannedRun, name string) RunRecord {
	dir := filepath.Join(cfg.Out, "runs", name)
	os.RemoveAll(dir)
	rec := RunRecord{Name: name, Scenario: pr.scenario, Side: side, Index: pr.index, Profiled: pr.profiled, Dir: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		rec.Failed, rec.Error = true, err.Error()
		return rec
	}
	metricsPath := filepath.Join(dir, schema.MetricsFile)
	cmd := cfg.workload.Command(pr.scenario, pr.side, metricsPath)
	logf, err := os.Create(filepath.Join(dir, schema.RunLogFile))
	if err != nil {
		rec.Failed, rec.Error = true, err.Error()
		return rec
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	var sess *collector.Session
	t0 := time.Now()
	if pr.profiled {
		sess, err = collector.Start(ctx, collector.Options{TargetsOnly: true, FollowForks: true, CPUHz: cfg.CPUHz, MinBlock: cfg.MinBlock, Goroutines: cfg.Goroutines})
		if err == nil {
			err = sess.StartCommand(cmd)
		}
	} else {
		err = cmd.Start()
	}
	if err != nil {
		if sess != nil {
			sess.Stop()
		}
		rec.Failed, rec.Error = true, err.Error()
		writeRunInfo(dir, rec)
		return rec
	}
	waitErr := waitRun(ctx, cmd)
	rec.WallS = time.Since(t0).Seconds()
	if sess != nil {
		if err := saveProfiles(sess, dir); err != nil {
			fmt.Fprintf(logf, "offcpu bench: %v\n", err)
			rec.Failed, rec.Error = true, err.Error()
		}
		st := sess.Stats()
		kept := st.KeptShare()
		rec.Kept = &kept
	}
	if isPIDFile(cfg.Target) {
		pids, err := readPIDFile(cfg.Target)
		if err != nil && !rec.Failed {
			rec.Failed, rec.Error = true, fmt.Sprintf("--target: %v", err)
		}
		rec.TargetPIDs = pids
	}
	readMetrics(&rec, metricsPath, cmd)
	if waitErr != nil && !rec.Failed {
		rec.Failed = true
		rec.Error = waitErr.Error()
		if last := lastLine(filepath.Join(dir, schema.RunLogFile)); last != "" {
			rec.Error += ": " + last
		}
	}
	writeRunInfo(dir, rec)
	return rec
}

// waitRun waits for a run; on cancellation it interrupts the run's
// process group, and kills it 5 s later.
func waitRun(ctx context.Context, cmd *exec.Cmd) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		select {
		case err := <-done:
			return err
		case <-time.After(5 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			return <-done
		}
	}
}

// readMetrics reads what the run wrote, adds wall_s and cpu_s, and
// writes the file back.
func readMetrics(rec *RunRecord, metricsPath string, cmd *exec.Cmd) {
	m := map[string]any{}
	if b, err := os.ReadFile(metricsPath); err == nil {
		if err := json.Unmarshal(b, &m); err != nil {
			rec.Failed, rec.Error = true, fmt.Sprintf("metrics file is not a JSON object: %v", err)
		}
	}
	m[schema.MetricWall] = rec.WallS
	if ps := cmd.ProcessState; ps != nil {
		// wait4's rusage: the run and the children it waited for.
		m[schema.MetricCPU] = (ps.UserTime() + ps.SystemTime()).Seconds()
	}
	if b, err := json.MarshalIndent(m, "", "  "); err == nil {
		os.WriteFile(metricsPath, append(b, '\n'), 0o644)
	}
	rec.Metrics = map[string]float64{}
	for k, v := range m {
		if f, ok := v.(float64); ok {
			rec.Metrics[k] = f
		}
	}
}

func writeRunInfo(dir string, rec RunRecord) {
	b, _ := json.MarshalIndent(analysis.RunInfo{Profiled: rec.Profiled, Failed: rec.Failed, Error: rec.Error}, "", "  ")
	os.WriteFile(filepath.Join(dir, schema.RunInfoFile), append(b, '\n'), 0o644)
}

func saveProfiles(s *collector.Session, dir string) error {
	p, err := s.Stop()
	if err != nil {
		return err
	}
	write := func(name string, f func(io.Writer) error) error { return output.WriteFile(filepath.Join(dir, name), f) }
	if err := write(schema.ProfileFile, p.Write); err != nil {
		return err
	}
	if err := write(schema.FoldedFile, func(w io.Writer) error { return schema.WriteFolded(w, p, schema.OffCPU, 1000) }); err != nil {
		return err
	}
	if wp := s.Profiles().Wakeups; wp != nil {
		if err := write(schema.WakeupsFile, wp.Write); err != nil {
			return err
		}
		if err := write(schema.WakeupsFoldedFile, func(w io.Writer) error { return schema.WriteWakeupsFolded(w, wp) }); err != nil {
			return err
		}
	}
	if gp := s.Profiles().Goroutines; gp != nil {
		if err := write(schema.GoroutinesFile, gp.Write); err != nil {
			return err
		}
	}
	st := s.Stats()
	b, _ := json.MarshalIndent(st, "", "  ")
	return os.WriteFile(filepath.Join(dir, schema.RecordStatsFile), append(b, '\n'), 0o644)
}

func lastLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// cooled is what a cool-down did before one run.
type cooled struct {
	Method string        `json:"method"` // "thermal", "idle" or "none"
	Waited time.Duration `json:"waited_ns"`
	GaveUp bool          `json:"gave_up,omitempty"`
	Level  float64       `json:"level"` // °C or % busy when it stopped waiting
}

// cooldown waits before a run until the machine is cool or idle, or
// until --cooldown-max.
func cooldown(ctx context.Context, cfg *Config) cooled {
	start := time.Now()
	deadline := start.Add(cfg.CooldownMax)
	zones, _ := filepath.Glob("/sys/class/thermal/thermal_zone*/temp")
	if len(zones) > 0 && cfg.CooldownTemp > 0 {
		for {
			t := hottest(zones)
			late := time.Now().After(deadline)
			if t < cfg.CooldownTemp || late || sleepCtx(ctx, time.Second) != nil {
				return cooled{Method: "thermal", Waited: time.Since(start), GaveUp: late && t >= cfg.CooldownTemp, Level: t}
			}
		}
	}
	if cfg.CooldownIdle <= 0 {
		return cooled{Method: "none"}
	}
	for {
		busy := cpuBusy(500 * time.Millisecond)
		late := time.Now().After(deadline)
		if busy < cfg.CooldownIdle || late || ctx.Err() != nil {
			return cooled{Method: "idle", Waited: time.Since(start), GaveUp: late && busy >= cfg.CooldownIdle, Level: busy}
		}
	}
}

// cooldownSummary says what the cool-downs did over the runs.
func cooldownSummary(cfg *Config, runs []RunRecord) string {
	if len(runs) == 0 || runs[0].Cooldown.Method == "none" || runs[0].Cooldown.Method == "" {
		return "none"
	}
	var longest time.Duration
	gaveUp := 0
	var worst float64
	for _, r := range runs {
		longest = max(longest, r.Cooldown.Waited)
		if r.Cooldown.GaveUp {
			gaveUp++
			worst = max(worst, r.Cooldown.Level)
		}
	}
	s := fmt.Sprintf("until the CPUs were below %.0f%% busy (/proc/stat; no thermal zones)", cfg.CooldownIdle)
	unit := "% busy"
	if runs[0].Cooldown.Method == "thermal" {
		s, unit = fmt.Sprintf("until the hottest thermal zone was below %.0f °C", cfg.CooldownTemp), " °C"
	}
	s += fmt.Sprintf(", at most %v before a run (longest wait %v)", cfg.CooldownMax, longest.Round(100*time.Millisecond))
	if gaveUp > 0 {
		s += fmt.Sprintf("; before %d of %d runs it gave up after %v, at up to %.0f%s", gaveUp, len(runs), cfg.CooldownMax, worst, unit)
	}
	return s
}

func hottest(zones []string) float64 {
	max := -1e9
	for _, z := range zones {
		b, err := os.ReadFile(z)
		if err != nil {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64); err == nil && v/1000 > max {
			max = v / 1000
		}
	}
	return max
}

func cpuBusy(window time.Duration) float64 {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0
	}
	read := func() (busy, total float64) {
		st, err := fs.Stat()
		if err != nil {
			return 0, 0
		}
		c := st.CPUTotal
		idle := c.Idle + c.Iowait
		total = c.User + c.Nice + c.System + c.Idle + c.Iowait + c.IRQ + c.SoftIRQ + c.Steal
		return total - idle, total
	}
	b0, t0 := read()
	time.Sleep(window)
	b1, t1 := read()
	if t1 <= t0 {
		return 0
	}
	return 100 * (b1 - b0) / (t1 - t0)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
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
	return s + "; " + cfg.workload.Setup(runs)
}

// scenarioLabel names a scenario in run directory names.
func scenarioLabel(name string) string {
	return strings.TrimSuffix(strings.TrimSuffix(filepath.Base(name), ".yaml"), ".yml")
}

// progress shows run i of n, side, elapsed and ETA: a bar on a terminal,
// plain lines otherwise.
type progress struct {
	w     io.Writer
	bar   *progressbar.ProgressBar
	total int
	start time.Time
}

func newProgress(w io.Writer, terminal bool, total int) *progress {
	p := &progress{w: w, total: total, start: time.Now()}
	if w != nil && terminal {
		p.bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(true), progressbar.OptionSetElapsedTime(true), progressbar.OptionSetWidth(30),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }))
	}
	return p
}

func (p *progress) step(n int, name string, profiled bool, start time.Time) {
	if p.w == nil {
		return
	}
	kind := "unprofiled"
	if profiled {
		kind = "profiled"
	}
	if p.bar != nil {
		p.bar.Describe(fmt.Sprintf("%s (%s)", name, kind))
		return
	}
	eta := "?"
	if n > 0 {
		per := time.Since(start) / time.Duration(n)
		eta = (per * time.Duration(p.total-n)).Round(time.Second).String()
	}
	fmt.Fprintf(p.w, "run %d of %d: %s (%s), elapsed %v, ETA %s\n", n+1, p.total, name, kind, time.Since(start).Round(time.Second), eta)
}

// grow adds runs to the plan.
func (p *progress) grow(n int) {
	p.total += n
	if p.bar != nil {
		p.bar.ChangeMax(p.total)
	}
}

func (p *progress) done(rec RunRecord) {
	if p.w == nil {
		return
	}
	if p.bar != nil {
		p.bar.Add(1)
	}
	if rec.Failed {
		if p.bar != nil {
			fmt.Fprintln(p.w)
		}
		fmt.Fprintf(p.w, "  %s failed: %s\n", rec.Name, rec.Error)
	}
}

func (p *progress) finish() {
	if p.bar != nil {
		p.bar.Finish()
	}
}
