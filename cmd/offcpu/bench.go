package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/bench"
)

func newBenchCmd() *cobra.Command {
	var cfg bench.Config
	var variants, rules string
	var failOn []string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Run a baseline and a candidate interleaved, profile them, and write the Measurements report",
		Long: `Runs the baseline and the candidate in rotation (A B A B ...), first the
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
$OFFCPU_METRICS; offcpu adds wall_s and cpu_s.`,
		Example: `  sudo offcpu bench
  sudo offcpu bench --scenario key-shared-500x20 --runs 4
  sudo offcpu bench --scenario telemetry-high-rate --duration 10s --runs 2
  offcpu bench --profiled-runs 0 --baseline-cmd './old --bench' --candidate-cmd './new --bench'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			conds, err := analysis.ParseFailOn(failOn)
			if err != nil {
				return err
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
			if res.Diff != nil {
				for _, s := range res.Diff.Statements {
					fmt.Fprintln(cmd.OutOrStdout(), s)
				}
			}
			if res.Interrupted {
				return &exitError{code: 130, msg: fmt.Sprintf("interrupted: the report covers %d finished runs", len(res.Runs))}
			}
			if err != nil {
				return err
			}
			if len(conds) > 0 && res.Diff != nil {
				return checkFailOn(res.Diff, conds)
			}
			return nil
		},
	}
	benchFlags(cmd, &cfg, &variants, &rules, &failOn)
	return cmd
}

func benchFlags(cmd *cobra.Command, cfg *bench.Config, variants, rules *string, failOn *[]string) {
	fl := cmd.Flags()
	fl.StringSliceVar(&cfg.Scenarios, "scenario", []string{"key-shared-500x20", "key-shared-500x20-fixed", "telemetry-high-rate"}, "bundled scenario names or YAML files, run in rotation (profiled runs: the first)")
	fl.BoolVar(&cfg.Pin, "pin", false, "pin the bundled core's broker threads to the first half of the CPUs and its clients to the rest")
	fl.StringVar(variants, "variants", "baseline,candidate", "the two variants to compare, baseline first")
	fl.IntVar(&cfg.Runs, "runs", 12, "unprofiled runs per side and scenario")
	fl.IntVar(&cfg.ProfiledRuns, "profiled-runs", 3, "profiled runs per side of the first scenario (needs root)")
	fl.Int64Var(&cfg.Messages, "messages", 0, "messages per run (default: each scenario's)")
	fl.DurationVar(&cfg.Duration, "duration", 0, "publish for this long per run instead of --messages")
	fl.Float64Var(&cfg.Rate, "rate", -1, "publish rate in msg/s (default: the scenario's)")
	fl.StringVar(&cfg.Out, "out", "offcpu-bench", "output directory")
	fl.Float64Var(&cfg.CooldownTemp, "cooldown-temp", 55, "before each run, wait until the hottest thermal zone is below this (°C)")
	fl.Float64Var(&cfg.CooldownIdle, "cooldown-idle", 10, "without thermal zones, wait until the CPUs are less busy than this (%)")
	fl.DurationVar(&cfg.CooldownMax, "cooldown-max", time.Minute, "longest cool-down wait")
	fl.StringVar(&cfg.BaselineCmd, "baseline-cmd", "", "run this command (sh -c) as the baseline instead of the bundled core")
	fl.StringVar(&cfg.CandidateCmd, "candidate-cmd", "", "run this command (sh -c) as the candidate")
	fl.StringVar(&cfg.Threads, "threads", "", "analyze only threads matching this regexp (default for the bundled core: broker threads)")
	fl.IntVar(&cfg.CPUHz, "cpu-hz", 99, "on-CPU sampling rate in profiled runs")
	fl.DurationVar(&cfg.MinBlock, "min-block", 100*time.Microsecond, "profiled runs record off-CPU intervals at least this long (seed 000's profile: 100µs)")
	fl.StringVar(rules, "rules", "", "attribution rules file (default: built in)")
	fl.StringArrayVar(failOn, "fail-on", nil, "after the report, exit with status 3 when a condition holds, e.g. publish_rate<-3% or monitor-wait>+10%")
}
