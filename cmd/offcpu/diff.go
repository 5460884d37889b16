package main

import (
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/offcpu/offcpu/analysis"
)

type diffFlags struct {
	rules    string
	format   string
	threads  string
	gates    gateFlags
	baseName string
	candName string
}

func newDiffCmd() *cobra.Command {
	f := &diffFlags{}
	cmd := &cobra.Command{
		Use:   "diff [flags] BASE CANDIDATE",
		Short: "Compare a baseline with a candidate: run metrics with statistics, blocked time by cause, wake-ups",
		Long: `Each side is one or more runs, separated by commas: run directories (metrics.json
and offcpu*.pb.gz, as offcpu bench writes them), metrics JSON files (offcpu
dispatch --json), or profiles. Globs are expanded, and a directory of run
directories stands for its runs. Metrics are compared run by run with a
Mann-Whitney U test (golang.org/x/perf/benchmath); profiles per category,
thread group and function, per profiled run.

--fail-on NAME>+CHANGE or NAME<-CHANGE (a metric or a profile figure;
repeatable or comma-separated) exits with status 3 when a condition holds and
the change is significant at --fail-alpha. Exit status: 0 compared, 1 bad
input, 3 a --fail-on condition held.`,
		Example: `  offcpu diff 'out/runs/baseline-*' 'out/runs/candidate-*'
  offcpu diff base1.json,base2.json,base3.json cand1.json,cand2.json,cand3.json --format markdown
  offcpu diff --fail-on 'monitor-wait>+10%,publish_rate<-3%' base/ cand/`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 2 {
				return fmt.Errorf("give two sides, BASE and CANDIDATE (comma-separated lists for several runs)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			conds, err := f.gates.parse()
			if err != nil {
				return err
			}
			rules, err := analysis.LoadRules(f.rules)
			if err != nil {
				return err
			}
			// A run's metrics file names its key metrics, compared first;
			// the others follow by name.
			var o analysis.Options
			if f.threads != "" {
				if o.Threads, err = regexp.Compile(f.threads); err != nil {
					return fmt.Errorf("--threads: %v", err)
				}
			}
			base, err := loadSide(f.baseName, args[0])
			if err != nil {
				return err
			}
			cand, err := loadSide(f.candName, args[1])
			if err != nil {
				return err
			}
			dr, err := analysis.Diff(base, cand, rules, o)
			if err != nil {
				return err
			}
			if err := dr.Write(cmd.OutOrStdout(), f.format); err != nil {
				return err
			}
			gates, err := dr.Gates(conds, f.gates.alpha)
			if err != nil {
				return err
			}
			return failOnExit(gates, cmd.ErrOrStderr(), false)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.rules, "rules", "", "rules file (YAML; default: the built-in rules)")
	fl.StringVar(&f.format, "format", "text", "text, json or markdown")
	fl.StringVar(&f.threads, "threads", "", "only threads whose name matches this regexp")
	f.gates.add(cmd)
	fl.StringVar(&f.baseName, "base-name", "baseline", "name of the first side in reports")
	fl.StringVar(&f.candName, "candidate-name", "candidate", "name of the second side in reports")
	return cmd
}

// loadSide reads one side from a comma-separated list of paths and globs.
func loadSide(name, list string) (*analysis.Side, error) {
	paths, err := analysis.SidePaths(list)
	if err != nil {
		return nil, err
	}
	return analysis.LoadSide(name, paths)
}

// gateFlags are --fail-on and its significance level.
type gateFlags struct {
	failOn []string
	alpha  float64
}

func (g *gateFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringArrayVar(&g.failOn, "fail-on", nil, "exit with status 3 when a condition holds and its change is significant: a metric or profile figure, its change in % of the baseline, ms/µs/s per run, or pp (shares), e.g. publish_rate<-3%, monitor-wait>+5ms, share:io>+5pp")
	fl.Float64Var(&g.alpha, "fail-alpha", 0.05, "significance level a --fail-on change must reach (paired test on log ratios where every run's value is positive, else the U test)")
}

func (g *gateFlags) parse() ([]analysis.FailOn, error) {
	if g.alpha <= 0 || g.alpha > 1 {
		return nil, fmt.Errorf("--fail-alpha %g: give a level in (0, 1], e.g. 0.05", g.alpha)
	}
	return analysis.ParseFailOn(g.failOn)
}

// failOnExit reports checked gates on w, as GitHub annotations too with
// github set, and returns exit status 3 when one fired.
func failOnExit(gates []analysis.Gate, w io.Writer, github bool) error {
	var fired []string
	for _, g := range gates {
		if github {
			level := "notice"
			if g.Fired {
				level = "error"
			}
			fmt.Fprintf(w, "::%s title=offcpu --fail-on::%s\n", level, g.Says)
		} else if !g.Fired {
			fmt.Fprintf(w, "fail-on: %s\n", g.Says)
		}
		if g.Fired {
			fired = append(fired, g.Says)
		}
	}
	if len(fired) > 0 {
		return &exitError{code: 3, msg: fmt.Sprintf("%d of %d --fail-on conditions held: %s", len(fired), len(gates), strings.Join(fired, "; "))}
	}
	return nil
}
