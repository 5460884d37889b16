package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/offcpu/offcpu/dispatcher"
	"github.com/offcpu/offcpu/schema"
)

// workload is what a benchmark runs on each side: the bundled dispatch
// core's scenarios, or two shell commands.
type workload interface {
	// Rotation names the scenarios run in turn ("" for a command).
	Rotation() []string
	// Command is one run of scenario on side (0: baseline); the run may
	// write its metrics, a JSON object, to metricsPath.
	Command(scenario string, side int, metricsPath string) *exec.Cmd
	// Threads is the analysis's default thread filter ("": every thread).
	Threads() string
	// Setup describes the workload for the report, from what its runs
	// reported where they did.
	Setup(runs []RunRecord) string
	// KeyMetrics are compared first; NotCompared are counts, not
	// measurements.
	KeyMetrics() (key, notCompared []string)
	// Story is what the profiled scenario's report draws and tabulates;
	// nil: blocked-time flame graphs and no story table.
	Story() *story
	// MinBlock is the profiled runs' default shortest recorded interval.
	MinBlock() time.Duration
	// Harness names the processes that only run the benchmark (nil:
	// none), left out of the analysis unless --target picks processes.
	Harness() *regexp.Regexp
}

// story is a profiled scenario's story: the kind of flame graph it needs
// and the functions whose on-CPU time it follows.
type story struct {
	Flames    flameKind
	Functions []string
}

// commandWorkload runs `sh -c CMD` per side.
type commandWorkload struct{ cmds [2]string }

func (w commandWorkload) Rotation() []string { return []string{""} }

func (w commandWorkload) Command(_ string, side int, metricsPath string) *exec.Cmd {
	cmd := exec.Command("sh", "-c", w.cmds[side])
	cmd.Env = append(os.Environ(), "OFFCPU_METRICS="+metricsPath)
	return cmd
}

func (w commandWorkload) Threads() string { return "" }

func (w commandWorkload) Setup([]RunRecord) string {
	return fmt.Sprintf("baseline `%s`, candidate `%s`", w.cmds[0], w.cmds[1])
}

func (w commandWorkload) KeyMetrics() (key, notCompared []string) { return nil, nil }
func (w commandWorkload) Story() *story                           { return nil }

// MinBlock: every interval, so that the profile holds all of the
// analyzed threads' off-CPU time.
func (w commandWorkload) MinBlock() time.Duration { return 0 }

// Harness: the shell each run starts (sh -c CMD), and its subshells.
func (w commandWorkload) Harness() *regexp.Regexp { return regexp.MustCompile(`^sh$`) }

// bundledWorkload runs the bundled core's scenarios, each resolved once
// (loaded, scaled, variants checked) and written to a file each run
// starts from.
type bundledWorkload struct {
	executable string
	variants   []string
	pin        bool
	names      []string // as given: the rotation's labels
	specs      map[string]dispatcher.Scenario
	files      map[string]string
}

func newBundledWorkload(cfg *Config) (*bundledWorkload, error) {
	if len(cfg.Scenarios) == 0 {
		return nil, fmt.Errorf("--scenario: give at least one scenario")
	}
	w := &bundledWorkload{executable: cfg.Executable, variants: cfg.Variants, pin: cfg.Pin, names: cfg.Scenarios,
		specs: map[string]dispatcher.Scenario{}, files: map[string]string{}}
	for _, name := range cfg.Scenarios {
		sc, err := dispatcher.LoadScenario(name)
		if err != nil {
			return nil, err
		}
		if sc, err = sc.Scaled(dispatcher.Scale{Messages: cfg.Messages, Duration: cfg.Duration, Rate: cfg.Rate, Churn: -1}); err != nil {
			return nil, err
		}
		for _, v := range cfg.Variants {
			if err := sc.CheckVariant(v); err != nil {
				return nil, fmt.Errorf("scenario %s: %w", sc.Name, err)
			}
		}
		w.specs[name] = sc
	}
	return w, nil
}

// writeSpecs writes each resolved scenario under dir.
func (w *bundledWorkload) writeSpecs(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	for _, name := range w.names {
		b, err := w.specs[name].YAML()
		if err != nil {
			return fmt.Errorf("scenario %s: %w", name, err)
		}
		path := filepath.Join(dir, scenarioLabel(name)+".yaml")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		w.files[name] = path
	}
	return nil
}

func (w *bundledWorkload) Rotation() []string { return w.names }

func (w *bundledWorkload) Command(scenario string, side int, metricsPath string) *exec.Cmd {
	args := []string{"dispatch", "-q", "--scenario", w.files[scenario], "--variant", w.variants[side], "--json", metricsPath}
	if w.pin {
		args = append(args, "--pin")
	}
	return exec.Command(w.executable, args...)
}

// Threads: the profiled scenario's story is about the broker's threads,
// or the client's pools.
func (w *bundledWorkload) Threads() string { return w.specs[w.names[0]].AnalyzedThreads() }

func (w *bundledWorkload) Setup(runs []RunRecord) string {
	var parts []string
	for _, name := range w.names {
		sc := w.specs[name]
		// What the run says it ran, where one did.
		for _, r := range runs {
			if r.Scenario != name || r.Failed {
				continue
			}
			var res dispatcher.Result
			if b, err := os.ReadFile(filepath.Join(r.Dir, schema.MetricsFile)); err == nil && json.Unmarshal(b, &res) == nil && res.ScenarioDetails.Name != "" {
				sc = res.ScenarioDetails
				break
			}
		}
		parts = append(parts, scenarioLine(sc))
	}
	s := strings.Join(parts, "; ")
	if w.pin {
		s += "; broker threads pinned to the first half of the CPUs, clients to the rest"
	}
	return s
}

func (w *bundledWorkload) KeyMetrics() (key, notCompared []string) {
	return dispatcher.KeyMetrics, dispatcher.NotCompared
}

// MinBlock: seed 000's profiled scenario records waits of 100 µs and more.
func (w *bundledWorkload) MinBlock() time.Duration { return 100 * time.Microsecond }

// Harness: none; the bundled core is one process, analyzed by thread.
func (w *bundledWorkload) Harness() *regexp.Regexp { return nil }

func (w *bundledWorkload) Story() *story {
	sc := w.specs[w.names[0]]
	st := &story{Flames: blockedFlames, Functions: sc.StoryFunctions()}
	// A client pool's blocked time is its idle wait for tasks: its story
	// is where its CPU goes, as seed 003's flame graphs show it.
	if sc.Change != dispatcher.ChangeFlow {
		st.Flames = cpuFlames
	}
	return st
}

// scenarioLine describes a scenario as it ran.
func scenarioLine(sc dispatcher.Scenario) string {
	amount := fmt.Sprintf("%d messages per run", sc.Messages)
	if sc.Messages == 0 {
		amount = fmt.Sprintf("publishing for %v per run", sc.Duration)
	}
	rate := "as fast as possible"
	if sc.Rate > 0 {
		rate = fmt.Sprintf("at %.0f msg/s", sc.Rate)
	}
	subs := 0
	for _, x := range sc.Subscriptions {
		subs += x.Consumers
	}
	return fmt.Sprintf("bundled dispatch core, scenario %s (%d producers, %d subscription(s), %d consumers in all, %d broker IO loops, %d-byte messages, %d keys, %s, %s)",
		sc.Name, sc.Producers, len(sc.Subscriptions), subs, sc.BrokerIOThreads, sc.PayloadSize, sc.KeySpace, rate, amount)
}
