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

// flameFlags are offcpu flamegraph's flags.
type flameFlags struct {
	o                                  flamegraph.Options
	sel                                flamegraph.Select
	out, sampleType, diff, threads     string
	process, rules                     string
	normalize, blocked, idle, cpu, wup bool
}

func (f *flameFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVarP(&f.out, "output", "o", "", "output file, .svg or .html (default: SVG on stdout)")
	fl.StringVar(&f.sampleType, "sample-type", "off_cpu", "pprof sample type: off_cpu, cpu or wakeups")
	fl.StringVar(&f.o.Title, "title", "", "title")
	fl.BoolVar(&f.o.Inverted, "inverted", false, "icicle graph: roots at the top")
	fl.Float64Var(&f.o.MinWidth, "min-width", 0.1, "merge frames narrower than this many pixels")
	fl.IntVar(&f.o.Width, "width", 1200, "width in pixels")
	fl.StringVar(&f.o.Palette, "palette", "", "offcpu (blue), wakeup or cpu (warm); default from --sample-type")
	fl.StringVar(&f.diff, "diff", "", "base profile: colour frames by the change from it")
	fl.BoolVar(&f.normalize, "normalize", false, "with --diff, scale the base to the profile's total first")
	fl.StringVar(&f.threads, "threads", "", "draw only threads whose name matches this regexp")
	fl.BoolVar(&f.sel.FullNames, "full-names", false, "keep Go module paths in function names")
	fl.BoolVar(&f.sel.GroupThreads, "group-threads", false, "root stacks at thread groups (broker-io-N) rather than threads")
	fl.BoolVar(&f.blocked, "blocked", false, "only blocked time: not idle (by the rules' verdict) and not waiting for a CPU")
	fl.BoolVar(&f.idle, "idle", false, "only idle time (by the rules' verdict)")
	fl.BoolVar(&f.cpu, "cpu", false, "on-CPU samples (--sample-type cpu)")
	fl.BoolVar(&f.wup, "wakeups", false, "wake-ups by waker stack (--sample-type wakeups)")
	fl.StringVar(&f.process, "process", "", "draw only processes whose name matches this regexp")
	fl.StringVar(&f.rules, "rules", "", "attribution rules file for --blocked and --idle (default: built in)")
	cmd.MarkFlagsMutuallyExclusive("blocked", "idle", "cpu", "wakeups")
}

func newFlamegraphCmd() *cobra.Command {
	f := &flameFlags{}
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
		RunE: func(cmd *cobra.Command, args []string) error { return f.run(cmd, args) },
	}
	f.add(cmd)
	return cmd
}

func (f *flameFlags) run(cmd *cobra.Command, args []string) error {
	o, sel, sampleType := f.o, f.sel, f.sampleType
	if f.threads != "" {
		re, err := regexp.Compile(f.threads)
		if err != nil {
			return fmt.Errorf("--threads: %v", err)
		}
		sel.Threads = re
	}
	st, keep, judge, err := flameSelection(cmd, f.blocked, f.idle, f.cpu, f.wup, f.rules, f.process)
	if err != nil {
		return err
	}
	sel.Judge = judge
	if st != "" {
		sampleType = st
	}
	sel.Keep = keep
	t, err := flamegraph.Load(sampleType, sel, args...)
	if err != nil {
		return err
	}
	if f.diff != "" {
		b, err := flamegraph.Load(sampleType, sel, f.diff)
		if err != nil {
			return err
		}
		t.SetBase(b, f.normalize)
		o.Diff = true
	}
	if o.Palette == "" {
		o.Palette = map[string]string{"cpu": "cpu", "wakeups": "wakeup", "wakeup": "wakeup"}[sampleType]
	}
	o.HTML = strings.HasSuffix(f.out, ".html")
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
	if f.out != "" && f.out != "-" {
		fh, err := os.Create(f.out)
		if err != nil {
			return fmt.Errorf("writing flame graph: %w", err)
		}
		defer fh.Close()
		w = fh
	}
	return flamegraph.Write(w, t, o)
}

// flameSelection turns --blocked, --idle, --cpu, --wakeups and --process
// into a sample type ("" unchanged) and a stack filter.
func flameSelection(cmd *cobra.Command, blocked, idle, cpu, wakeups bool, rulesFile, process string) (string, func(*schema.Stack) bool, func([]schema.Stack), error) {
	var procRE *regexp.Regexp
	if process != "" {
		re, err := regexp.Compile("^(?:" + process + ")$")
		if err != nil {
			return "", nil, nil, fmt.Errorf("--process: %v", err)
		}
		procRE = re
	}
	if (blocked || idle || cpu || wakeups) && cmd.Flags().Changed("sample-type") {
		return "", nil, nil, fmt.Errorf("--sample-type and --blocked/--idle/--cpu/--wakeups pick the same thing: give one")
	}
	var verdict func(*schema.Stack) bool
	var judge func([]schema.Stack)
	if blocked || idle {
		r, err := analysis.LoadRules(rulesFile)
		if err != nil {
			return "", nil, nil, err
		}
		judge = func(st []schema.Stack) { analysis.Judge(st, r) }
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
		return schema.CPU, keep, judge, nil
	case wakeups:
		return schema.Wakeups, keep, judge, nil
	}
	return "", keep, judge, nil
}
