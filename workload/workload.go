// Package workload is what offcpu bench runs on each side: two shell
// commands, or the bundled dispatch core (package workload/dispatcher, a
// Go model of Apache Pulsar's dispatch paths, with the baseline and
// candidate variants of the changes in seeds.md). The profiler's own
// commands (record, analyze, diff, flamegraph) never import it; bench is
// the one bridge.
package workload

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"time"
)

// Workload is what a benchmark runs on each side: the bundled dispatch
// core's scenarios, or two shell commands.
type Workload interface {
	// Rotation names the scenarios run in turn ("" for a command).
	Rotation() []string
	// Command is one run of scenario on side (0: baseline); the run may
	// write its metrics, a JSON object, to metricsPath.
	Command(scenario string, side int, metricsPath string) *exec.Cmd
	// Threads is the analysis's default thread filter ("": every thread).
	Threads() string
	// Setup describes the workload for the report, from what its runs
	// reported where they did (ran: the directories of the runs that
	// completed, by scenario).
	Setup(ran map[string][]string) string
	// KeyMetrics are compared first; NotCompared are counts, not
	// measurements.
	KeyMetrics() (key, notCompared []string)
	// Story is what the profiled scenario's report draws and tabulates;
	// nil: blocked-time flame graphs and no story table.
	Story() *Story
	// MinBlock is the profiled runs' default shortest recorded interval.
	MinBlock() time.Duration
	// Harness names the processes that only run the benchmark (nil:
	// none), left out of the analysis unless --target picks processes.
	Harness() *regexp.Regexp
}

// Story is a profiled scenario's story: the kind of flame graph it needs
// and the functions whose on-CPU time it follows.
type Story struct {
	// CPU: its flame graphs draw on-CPU samples rather than blocked time.
	CPU       bool
	Functions []string
	// Wakeups: the wake-up pairs ("waker group → woken group") it follows.
	Wakeups []string
}

// Commands runs `sh -c CMD`, baseline's on side 0 and candidate's on 1.
func Commands(baseline, candidate string) Workload {
	return commandWorkload{[2]string{baseline, candidate}}
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

func (w commandWorkload) Setup(map[string][]string) string {
	return fmt.Sprintf("baseline `%s`, candidate `%s`", w.cmds[0], w.cmds[1])
}

func (w commandWorkload) KeyMetrics() (key, notCompared []string) { return nil, nil }
func (w commandWorkload) Story() *Story                           { return nil }

// MinBlock: every interval, so that the profile holds all of the
// analyzed threads' off-CPU time.
func (w commandWorkload) MinBlock() time.Duration { return 0 }

// Harness: the shell each run starts (sh -c CMD), and its subshells.
func (w commandWorkload) Harness() *regexp.Regexp { return regexp.MustCompile(`^sh$`) }
