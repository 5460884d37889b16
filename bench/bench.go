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
	// MinBlock drops shorter off-CPU intervals in profiled runs (seed
	// 000's profiled scenario records waits of 100 µs and more).
	MinBlock time.Duration
	Rules    *analysis.Rules
	Progress io.Writer
	Terminal bool // draw a progress bar instead of lines

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

	// The SVGs written next to report.md, and which were not drawn.
	flameLinks, flameNotes []string
}

// ScenarioResult is the comparison of one scenario's runs.
type ScenarioResult struct {
	Name string               `json:"name"`
	Diff *analysis.DiffReport `json:"diff,omitempty"`
}

func (c *Config) bundled() bool { return c.BaselineCmd == "" && c.CandidateCmd == "" }

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
	prog := newProgress(cfg.Progress, cfg.Terminal, len(plan))
	start := time.Now()
	for n, pr := range plan {
		if ctx.Err() != nil {
			res.Interrupted = true
			break
		}
		side := cfg.Variants[pr.side]
		name := fmt.Sprintf("%s-%d", side, pr.index)
		if pr.profiled {
			name = fmt.Sprintf("%s-profiled-%d", side, pr.index)
		}
		if len(scs) > 1 {
			name = scenarioLabel(pr.scenario) + "-" + name
		}
		method := cooldown(ctx, &cfg)
		if res.Cooldown == "" {
			res.Cooldown = method
		}
		prog.step(n, name, pr.profiled, start)
		rec := runOne(ctx, &cfg, side, pr, name)
		if ctx.Err() != nil && rec.Failed {
			res.Interrupted = true
			rec.Error = "interrupted"
		}
		res.Runs = append(res.Runs, rec)
		prog.done(rec)
	}
	prog.finish()
	if err := finish(&cfg, res); err != nil {
		return res, err
	}
	if res.Interrupted {
		return res, ctx.Err()
	}
	return res, nil
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
		sess, err = collector.Start(ctx, collector.Options{TargetsOnly: true, FollowForks: true, CPUHz: cfg.CPUHz, MinBlock: cfg.MinBlock})
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
	if wp := s.Wakeups(); wp != nil {
		if err := write(schema.WakeupsFile, wp.Write); err != nil {
			return err
		}
		if err := write(schema.WakeupsFoldedFile, func(w io.Writer) error { return schema.WriteWakeupsFolded(w, wp) }); err != nil {
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

// cooldown waits before a run and says how.
func cooldown(ctx context.Context, cfg *Config) string {
	deadline := time.Now().Add(cfg.CooldownMax)
	zones, _ := filepath.Glob("/sys/class/thermal/thermal_zone*/temp")
	if len(zones) > 0 && cfg.CooldownTemp > 0 {
		for {
			t := hottest(zones)
			if t < cfg.CooldownTemp || time.Now().After(deadline) || sleepCtx(ctx, time.Second) != nil {
				return fmt.Sprintf("until the hottest thermal zone was below %.0f °C", cfg.CooldownTemp)
			}
		}
	}
	if cfg.CooldownIdle <= 0 {
		return "none"
	}
	for {
		busy := cpuBusy(500 * time.Millisecond)
		if busy < cfg.CooldownIdle || time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Sprintf("until the CPUs were below %.0f%% busy (/proc/stat; no thermal zones)", cfg.CooldownIdle)
		}
	}
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
