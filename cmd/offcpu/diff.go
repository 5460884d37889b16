package main

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/dispatcher"
)

type diffFlags struct {
	rules    string
	format   string
	threads  string
	failOn   []string
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

--fail-on NAME>+PCT% or NAME<-PCT% (a metric or a category; repeatable or
comma-separated) exits with status 3 when a condition holds.`,
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
			conds, err := analysis.ParseFailOn(f.failOn)
			if err != nil {
				return err
			}
			rules, err := analysis.LoadRules(f.rules)
			if err != nil {
				return err
			}
			// Run directories of the bundled core compare its key metrics
			// first; other benchmarks' metrics follow by name.
			o := analysis.Options{KeyMetrics: dispatcher.KeyMetrics, NotCompared: dispatcher.NotCompared}
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
			return checkFailOn(dr, conds)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.rules, "rules", "", "rules file (YAML; default: the built-in rules)")
	fl.StringVar(&f.format, "format", "text", "text, json or markdown")
	fl.StringVar(&f.threads, "threads", "", "only threads whose name matches this regexp")
	fl.StringArrayVar(&f.failOn, "fail-on", nil, "exit with status 3 when a condition holds, e.g. monitor-wait>+10% or publish_rate<-3%")
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

// checkFailOn returns exit status 3 when a --fail-on condition holds.
func checkFailOn(dr *analysis.DiffReport, conds []analysis.FailOn) error {
	hit, err := dr.Check(conds)
	if err != nil {
		return err
	}
	if len(hit) > 0 {
		return &exitError{code: 3, msg: "fail-on: " + strings.Join(hit, "; ")}
	}
	return nil
}
