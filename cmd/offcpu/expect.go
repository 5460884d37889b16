package main

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/offcpu/offcpu/analysis"
)

func newExpectCmd() *cobra.Command {
	var rules, format string
	cmd := &cobra.Command{
		Use:   "expect [--rules FILE] [--format text|json] EXPECTATIONS PROFILE...",
		Short: "Check how a recording's wait sites are judged against what they must be",
		Long: `Reads an expectations file (YAML) that states, for each wait site of a
recorded program, whether its time is idle or blocked (and optionally its
category) and why, then judges the profiles' off-CPU waits with the rules
and compares. It prints a confusion table (expected × got idle/blocked),
the agreement, the mismatches with the rule that decided each, and the
sites no expectation covers; it fails (non-zero exit) when the agreement
is below min_agreement or an uncovered site holds min_site percent of the
judged time or more. Folded-stack values are read as nanoseconds; a
directory stands for the profiles in it.

  program: nginx 1.22 (Debian nginx-light)
  min_agreement: 95   # percent of the covered time (default 95)
  min_site: 1         # percent of the judged time (default 1)
  expect:
    - site: 'ngx_process_events_and_timers'  # regexp on thread;user;-;kernel
      thread: '^nginx'                       # optional regexp on the thread
      verdict: idle                          # idle or blocked
      category: event-loop-idle              # optional
      why: "src/event/ngx_event.c: the worker waits in epoll_wait between events"`,
		Example: `  offcpu expect nginx.expect.yaml nginx.pb.gz nginx.wakeups.pb.gz
  offcpu expect --rules my-rules.yaml --format json postgres.expect.yaml run-dir/`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) < 2 {
				return fmt.Errorf("give an expectations file and at least one profile, folded-stack file or run directory")
			}
			if format != "text" && format != "json" {
				return fmt.Errorf("unknown format %q: use text or json", format)
			}
			data, r, _, _, err := loadAnalysis(&analyzeFlags{rules: rules, foldedNs: true}, args[1:])
			if err != nil {
				return err
			}
			e, err := analysis.LoadExpectations(args[0], r)
			if err != nil {
				return err
			}
			rep := analysis.CheckExpectations(data, r, e)
			if format == "json" {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				err = enc.Encode(rep)
			} else {
				err = rep.Write(cmd.OutOrStdout())
			}
			if err != nil {
				return err
			}
			if rep.Failed() {
				return fmt.Errorf("expectations not met: %s", strings.Join(rep.Failures, "; "))
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&rules, "rules", "", "rules file (YAML; default: the built-in rules)")
	fl.StringVar(&format, "format", "text", "text or json")
	return cmd
}
