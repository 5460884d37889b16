package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/bench"
)

const benchLong = `Runs the baseline and the candidate in rotation (A B A B ...), first the
unprofiled runs, then the profiled runs under the recorder (off-CPU, wake-ups,
on-CPU samples), with a cool-down before each run. Every run of the bundled
dispatch core verifies its deliveries; a failed run is reported and left out
of the statistics. Writes, under --out: runs/NAME/ (metrics.json, run.log,
run.json, profiles and folded stacks), scenarios/ (each bundled scenario as
resolved, which its runs start from), report.md (a PR-ready Measurements
section), report.json and flame graphs. Ctrl-C keeps the finished runs and
writes the report for them.

With --baseline-cmd and --candidate-cmd any benchmark can be compared: each run
is 'sh -c CMD'; it may write a JSON object of metrics to the file named by
$OFFCPU_METRICS; offcpu adds wall_s and cpu_s. Profiled runs of commands
record every off-CPU interval; the analysis leaves out the shell each run
starts, and --target picks the system under test (a process name, or a pid
file the command writes).

Profile figures (blocked time by category, process and thread group, shares,
wake-ups, root causes) are compared over the profiled runs as metrics are.
With --max-profiled-runs above --profiled-runs, profiled pairs are added until
the headline share ranges within ±5 points on each side.

Exit status: 0 the report was written; 1 bad input or a failed start;
3 a --fail-on condition held (crossed and significant at --fail-alpha);
130 interrupted (the report covers the finished runs).`

func newBenchCmd() *cobra.Command {
	var cfg bench.Config
	var variants, rules, format string
	var gates gateFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Run a baseline and a candidate interleaved, profile them, and write the Measurements report",
		Long:  benchLong,
		Example: `  sudo offcpu bench
  sudo offcpu bench --scenario key-shared-500x20 --runs 4
  sudo offcpu bench --scenario telemetry-high-rate --duration 10s --runs 2
  offcpu bench --profiled-runs 0 --baseline-cmd './old --bench' --candidate-cmd './new --bench'
  sudo offcpu bench --baseline-cmd ./bench-old.sh --candidate-cmd ./bench-new.sh --target redis-server \
      --fail-on 'app_blocked>+10%,io>+5ms' --format github`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			conds, err := gates.parse()
			if err != nil {
				return err
			}
			if format != "text" && format != "json" && format != "github" {
				return fmt.Errorf("--format %q: give text, json or github", format)
			}
			cfg.FailOn, cfg.FailAlpha = conds, gates.alpha
			if !cmd.Flags().Changed("min-block") {
				cfg.MinBlock = -1 // the workload's
			}
			cfg.Variants = strings.Split(variants, ",")
			if cfg.Rules, err = analysis.LoadRules(rules); err != nil {
				return err
			}
			stderr := cmd.ErrOrStderr()
			cfg.Progress = stderr
			if f, ok := stderr.(*os.File); ok {
				_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
				cfg.Terminal = err == nil
			}
			ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			res, err := bench.Run(ctx, cfg)
			if res == nil {
				return err
			}
			fmt.Fprintf(stderr, "offcpu bench: wrote %s/report.md and %s/report.json (%d runs)\n", cfg.Out, cfg.Out, len(res.Runs))
			if perr := printBench(cmd.OutOrStdout(), res, cfg.Out, format); perr != nil && err == nil {
				err = perr
			}
			if res.Interrupted {
				return &exitError{code: 130, msg: fmt.Sprintf("interrupted: the report covers %d finished runs", len(res.Runs))}
			}
			if err != nil {
				return err
			}
			return failOnExit(res.Gates, stderr, format == "github")
		},
	}
	benchFlags(cmd, &cfg, &variants, &rules)
	gates.add(cmd)
	cmd.Flags().StringVar(&format, "format", "text", "what to print on stdout: text (the statements), json (report.json) or github (statements, --fail-on as annotations, report.md appended to $GITHUB_STEP_SUMMARY)")
	return cmd
}

// printBench prints the result in a format; github also appends report.md
// to the job summary.
func printBench(w io.Writer, res *bench.Result, out, format string) error {
	switch format {
	case "json":
		b, err := os.ReadFile(filepath.Join(out, "report.json"))
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	case "github":
		if path := os.Getenv("GITHUB_STEP_SUMMARY"); path != "" {
			f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
			if err != nil {
				return fmt.Errorf("$GITHUB_STEP_SUMMARY: %v", err)
			}
			defer f.Close()
			if _, err := io.WriteString(f, res.Report+"\n"); err != nil {
				return fmt.Errorf("$GITHUB_STEP_SUMMARY: %v", err)
			}
		}
	}
	if res.Diff != nil {
		for _, s := range res.Diff.Statements {
			fmt.Fprintln(w, s)
		}
	}
	return nil
}

func benchFlags(cmd *cobra.Command, cfg *bench.Config, variants, rules *string) {
	fl := cmd.Flags()
	fl.StringSliceVar(&cfg.Scenarios, "scenario", []string{"key-shared-500x20", "key-shared-500x20-fixed", "telemetry-high-rate"}, "bundled scenario names or YAML files, run in rotation (profiled runs: the first)")
	fl.BoolVar(&cfg.Pin, "pin", false, "pin the bundled core's broker threads to the first half of the CPUs and its clients to the rest")
	fl.StringVar(variants, "variants", "baseline,candidate", "the two variants to compare, baseline first")
	fl.IntVar(&cfg.Runs, "runs", 12, "unprofiled runs per side and scenario")
	fl.IntVar(&cfg.ProfiledRuns, "profiled-runs", 3, "profiled runs per side of the first scenario (needs root)")
	fl.IntVar(&cfg.MaxProfiledRuns, "max-profiled-runs", 0, "add profiled pairs, up to this many runs a side, until the headline share ranges within ±5 points (default: --profiled-runs, none added)")
	fl.Int64Var(&cfg.Messages, "messages", 0, "messages per run (default: each scenario's)")
	fl.DurationVar(&cfg.Duration, "duration", 0, "publish for this long per run instead of --messages")
	fl.Float64Var(&cfg.Rate, "rate", -1, "publish rate in msg/s (default: the scenario's)")
	fl.StringVar(&cfg.Out, "out", "offcpu-bench", "output directory")
	fl.Float64Var(&cfg.CooldownTemp, "cooldown-temp", 55, "before each run, wait until the hottest thermal zone is below this (°C)")
	fl.Float64Var(&cfg.CooldownIdle, "cooldown-idle", 10, "without thermal zones, wait until the CPUs are less busy than this (%)")
	fl.DurationVar(&cfg.CooldownMax, "cooldown-max", time.Minute, "longest cool-down wait")
	fl.StringVar(&cfg.BaselineCmd, "baseline-cmd", "", "run this command (sh -c) as the baseline instead of the bundled core")
	fl.StringVar(&cfg.CandidateCmd, "candidate-cmd", "", "run this command (sh -c) as the candidate")
	fl.StringVar(&cfg.Target, "target", "", "the system under test: a regexp of process names, or a pid file the command writes (a path) (default: every process but the harness shell)")
	fl.StringVar(&cfg.Threads, "threads", "", "analyze only threads matching this regexp (default for the bundled core: broker threads)")
	fl.IntVar(&cfg.CPUHz, "cpu-hz", 99, "on-CPU sampling rate in profiled runs")
	fl.BoolVar(&cfg.Goroutines, "goroutines", false, "profiled runs also record the goroutine waits of Go programs (the bundled core is one): the report compares them")
	fl.DurationVar(&cfg.MinBlock, "min-block", 0, "profiled runs record off-CPU intervals at least this long (default: the bundled core 100µs, as seed 000's profile; commands every interval)")
	fl.StringVar(rules, "rules", "", "attribution rules file (default: built in)")
}
