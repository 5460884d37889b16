package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/spf13/cobra"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/flamegraph"
	"github.com/offcpu/offcpu/schema"
)

func newFlamegraphCmd() *cobra.Command {
	var o flamegraph.Options
	var out, sampleType, diff, threads, process, rules string
	var normalize, blocked, idle, cpu, wakeups bool
	var sel flamegraph.Select
	cmd := &cobra.Command{
		Use:   "flamegraph [flags] PROFILE|FOLDED...",
		Short: "Draw an interactive (or differential) flame graph as SVG or HTML",
		Long: `Reads offcpu pprof files, any pprof profile and folded stacks (bcc, async-profiler,
offcpu's own offwake output) and writes a self-contained interactive flame
graph: click to zoom, Reset Zoom, Search (regexp, with the matched share), and
tooltips with the value in ms and %. -o FILE.html adds a table of the top
functions. --diff BASE colours each frame by its change from BASE (red grew,
blue shrank); widths are the profile's.

--blocked draws only blocked time (neither idle, by the attribution rules'
verdict, nor waiting for a CPU), --idle only idle time, --cpu on-CPU samples
and --wakeups the wake-ups' waker stacks.`,
		Example: `  offcpu flamegraph -o offcpu.svg offcpu.pb.gz
  offcpu flamegraph --sample-type wakeups -o wakeups.svg offcpu.wakeups.pb.gz
  offcpu flamegraph --diff base.pb.gz --normalize -o diff.svg cand.pb.gz
  offcpu flamegraph -o offwake.html offwake.folded
  offcpu flamegraph --blocked --process redis-server -o blocked.svg offcpu.pb.gz`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if threads != "" {
				re, err := regexp.Compile(threads)
				if err != nil {
					return fmt.Errorf("--threads: %v", err)
				}
				sel.Threads = re
			}
			st, keep, err := flameSelection(cmd, blocked, idle, cpu, wakeups, rules, process)
			if err != nil {
				return err
			}
			if st != "" {
				sampleType = st
			}
			sel.Keep = keep
			t, err := flamegraph.Load(sampleType, sel, args...)
			if err != nil {
				return err
			}
			if diff != "" {
				b, err := flamegraph.Load(sampleType, sel, diff)
				if err != nil {
					return err
				}
				t.SetBase(b, normalize)
				o.Diff = true
			}
			if o.Palette == "" {
				o.Palette = map[string]string{"cpu": "cpu", "wakeups": "wakeup", "wakeup": "wakeup"}[sampleType]
			}
			o.HTML = strings.HasSuffix(out, ".html")
			if o.Title == "" {
				o.Title = map[bool]string{true: "Differential flame graph", false: "Off-CPU time"}[o.Diff]
				switch o.Palette {
				case "cpu":
					o.Title = "On-CPU time"
				case "wakeup":
					o.Title = "Wake-ups"
				}
			}
			w := cmd.OutOrStdout()
			if out != "" && out != "-" {
				f, err := os.Create(out)
				if err != nil {
					return fmt.Errorf("writing flame graph: %w", err)
				}
				defer f.Close()
				w = f
			}
			return flamegraph.Write(w, t, o)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&out, "output", "o", "", "output file, .svg or .html (default: SVG on stdout)")
	fl.StringVar(&sampleType, "sample-type", "off_cpu", "pprof sample type: off_cpu, cpu or wakeups")
	fl.StringVar(&o.Title, "title", "", "title")
	fl.BoolVar(&o.Inverted, "inverted", false, "icicle graph: roots at the top")
	fl.Float64Var(&o.MinWidth, "min-width", 0.1, "merge frames narrower than this many pixels")
	fl.IntVar(&o.Width, "width", 1200, "width in pixels")
	fl.StringVar(&o.Palette, "palette", "", "offcpu (blue), wakeup or cpu (warm); default from --sample-type")
	fl.StringVar(&diff, "diff", "", "base profile: colour frames by the change from it")
	fl.BoolVar(&normalize, "normalize", false, "with --diff, scale the base to the profile's total first")
	fl.StringVar(&threads, "threads", "", "draw only threads whose name matches this regexp")
	fl.BoolVar(&sel.FullNames, "full-names", false, "keep Go module paths in function names")
	fl.BoolVar(&sel.GroupThreads, "group-threads", false, "root stacks at thread groups (broker-io-N) rather than threads")
	fl.BoolVar(&blocked, "blocked", false, "only blocked time: not idle (by the rules' verdict) and not waiting for a CPU")
	fl.BoolVar(&idle, "idle", false, "only idle time (by the rules' verdict)")
	fl.BoolVar(&cpu, "cpu", false, "on-CPU samples (--sample-type cpu)")
	fl.BoolVar(&wakeups, "wakeups", false, "wake-ups by waker stack (--sample-type wakeups)")
	fl.StringVar(&process, "process", "", "draw only processes whose name matches this regexp")
	fl.StringVar(&rules, "rules", "", "attribution rules file for --blocked and --idle (default: built in)")
	cmd.MarkFlagsMutuallyExclusive("blocked", "idle", "cpu", "wakeups")
	return cmd
}

// flameSelection turns --blocked, --idle, --cpu, --wakeups and --process
// into a sample type ("" unchanged) and a stack filter.
func flameSelection(cmd *cobra.Command, blocked, idle, cpu, wakeups bool, rulesFile, process string) (string, func(*schema.Stack) bool, error) {
	var procRE *regexp.Regexp
	if process != "" {
		re, err := regexp.Compile("^(?:" + process + ")$")
		if err != nil {
			return "", nil, fmt.Errorf("--process: %v", err)
		}
		procRE = re
	}
	if (blocked || idle || cpu || wakeups) && cmd.Flags().Changed("sample-type") {
		return "", nil, fmt.Errorf("--sample-type and --blocked/--idle/--cpu/--wakeups pick the same thing: give one")
	}
	var verdict func(*schema.Stack) bool
	if blocked || idle {
		r, err := analysis.LoadRules(rulesFile)
		if err != nil {
			return "", nil, err
		}
		verdict = func(s *schema.Stack) bool {
			if s.WaitsForCPU() {
				return false
			}
			return r.IsIdle(r.Categorize(s)[0]) == idle
		}
	}
	keep := func(s *schema.Stack) bool {
		proc := s.Process
		if s.Kind == schema.KindWakeup {
			proc = s.TargetProcess
		}
		return (procRE == nil || procRE.MatchString(proc)) && (verdict == nil || verdict(s))
	}
	switch {
	case cpu:
		return schema.CPU, keep, nil
	case wakeups:
		return schema.Wakeups, keep, nil
	}
	return "", keep, nil
}
