package workload

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/offcpu/offcpu/schema"
	"github.com/offcpu/offcpu/workload/dispatcher"
)

// Bundled runs the bundled core's scenarios, each resolved once
// (loaded, scaled, variants checked) and written to a file each run
// starts from.
type Bundled struct {
	executable string
	variants   []string
	pin        bool
	names      []string // as given: the rotation's labels
	specs      map[string]dispatcher.Scenario
	files      map[string]string
}

// BundledConfig is how the bundled core runs.
type BundledConfig struct {
	Executable string   // the offcpu binary whose dispatch command runs each side
	Scenarios  []string // built-in names or YAML files; the first is profiled
	Variants   []string // two: baseline first
	Pin        bool     // broker and client threads on CPUs of their own
	Messages   int64    // per run (0: the scenario's)
	Duration   time.Duration
	Rate       float64 // < 0: the scenario's
}

// NewBundled loads, scales and checks each scenario.
func NewBundled(cfg BundledConfig) (*Bundled, error) {
	if len(cfg.Scenarios) == 0 {
		return nil, fmt.Errorf("--scenario: give at least one scenario")
	}
	w := &Bundled{executable: cfg.Executable, variants: cfg.Variants, pin: cfg.Pin, names: cfg.Scenarios,
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

// WriteSpecs writes each resolved scenario under dir.
func (w *Bundled) WriteSpecs(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	for _, name := range w.names {
		b, err := w.specs[name].YAML()
		if err != nil {
			return fmt.Errorf("scenario %s: %w", name, err)
		}
		path := filepath.Join(dir, ScenarioLabel(name)+".yaml")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		w.files[name] = path
	}
	return nil
}

func (w *Bundled) Rotation() []string { return w.names }

func (w *Bundled) Command(scenario string, side int, metricsPath string) *exec.Cmd {
	args := []string{"dispatch", "-q", "--scenario", w.files[scenario], "--variant", w.variants[side], "--json", metricsPath}
	if w.pin {
		args = append(args, "--pin")
	}
	return exec.Command(w.executable, args...)
}

// Threads: the profiled scenario's story is about the broker's threads,
// or the client's pools.
func (w *Bundled) Threads() string { return w.specs[w.names[0]].AnalyzedThreads() }

func (w *Bundled) Setup(ran map[string][]string) string {
	var parts []string
	for _, name := range w.names {
		sc := w.specs[name]
		// What the run says it ran, where one did.
		for _, dir := range ran[name] {
			var res dispatcher.Result
			if b, err := os.ReadFile(filepath.Join(dir, schema.MetricsFile)); err == nil && json.Unmarshal(b, &res) == nil && res.ScenarioDetails.Name != "" {
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

func (w *Bundled) KeyMetrics() (key, notCompared []string) {
	return dispatcher.KeyMetrics, dispatcher.NotCompared
}

// MinBlock: seed 000's profiled scenario records waits of 100 µs and more.
func (w *Bundled) MinBlock() time.Duration { return 100 * time.Microsecond }

// Harness: none; the bundled core is one process, analyzed by thread.
func (w *Bundled) Harness() *regexp.Regexp { return nil }

func (w *Bundled) Story() *Story {
	sc := w.specs[w.names[0]]
	// A client pool's blocked time is its idle wait for tasks: its story
	// is where its CPU goes, as seed 003's flame graphs show it.
	return &Story{CPU: sc.Change != dispatcher.ChangeFlow, Functions: sc.StoryFunctions(), Wakeups: sc.StoryWakeups()}
}

// ScenarioLabel is a scenario's name in file and run names: a YAML
// file's base name without its extension.
func ScenarioLabel(name string) string {
	return strings.TrimSuffix(strings.TrimSuffix(filepath.Base(name), ".yaml"), ".yml")
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
