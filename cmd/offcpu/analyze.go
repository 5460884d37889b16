package main

import (
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/schema"
)

type analyzeFlags struct {
	rules      string
	printRules bool
	format     string
	threads    string
	messages   int64
	metrics    string
	top        int
	foldedNs   bool
	explain    string
	state      string
	chains     bool
	// from, to: the intervals of a continuous recording's directory.
	from, to string
	// With --explain: the waker's side.
	wakerStack, waker, class string
	// One request's waits (--span, --trace), or blocked time per value of
	// a program's label (--by).
	span, trace, by string
	// criticalPath: follow one request through a timeline; tid: the
	// thread, with --from and --to, where no span names it.
	criticalPath bool
	tid          int64
	goid         int64
	pathOut      string // the timeline again, with the path as a track
}

func newAnalyzeCmd() *cobra.Command {
	f := &analyzeFlags{}
	cmd := &cobra.Command{
		Use:   "analyze [flags] PROFILE...",
		Short: "Attribute blocked time to causes (monitor waits, Flow handling, event loops, I/O, timers, runtime)",
		Long: `Reads offcpu pprof files (off-CPU, on-CPU and wake-up samples), any pprof with a
time sample type (Go block and mutex profiles) and folded stacks (bcc
offcputime -f, async-profiler collapsed), merges them, and attributes the
blocked time to categories by ordered rules (--rules FILE; the built-in
rules are printed by --print-rules). A directory stands for the profiles
in it (offcpu.pb.gz, offcpu.wakeups.pb.gz) and its metrics.json.`,
		Example: `  offcpu analyze run.pb.gz run.wakeups.pb.gz
  offcpu analyze --threads '^(broker-io|ml-worker|topic-worker)' --format markdown bench-out/baseline-1
  offcpu analyze --by http.route goroutines.pb.gz
  offcpu analyze --span 00f067aa0ba902b7 goroutines.pb.gz
  offcpu analyze --critical-path --span 00f067aa0ba902b7 run.pftrace
  offcpu analyze --critical-path --tid 4242 --from 1.2s --to 1.25s run.pftrace
  offcpu analyze --print-rules > rules.yaml
  offcpu analyze --explain 'nginx;main;ngx_process_events_and_timers;epoll_wait;-;do_epoll_wait'
  offcpu analyze --explain 'postgres;main;ProcSleep;WaitLatch;epoll_wait;-;do_epoll_wait' \
      --waker same-program --waker-stack 'main;LockReleaseAll;ProcLockWakeup;SetLatch;kill;-;try_to_wake_up'`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.printRules {
				_, err := cmd.OutOrStdout().Write(analysis.DefaultRules())
				return err
			}
			if f.explain != "" && len(args) > 0 {
				return explainRecorded(cmd.OutOrStdout(), f, args)
			}
			if f.explain != "" {
				return explainFolded(cmd.OutOrStdout(), f)
			}
			if len(args) == 0 {
				return fmt.Errorf("give at least one profile, folded-stack file or run directory")
			}
			if f.criticalPath {
				return criticalPath(cmd.OutOrStdout(), f, args)
			}
			if f.pathOut != "" || f.tid != 0 || f.goid != 0 {
				return fmt.Errorf("--timeline-out, --tid and --goid need --critical-path")
			}
			if f.by != "" {
				return analyzeByLabel(cmd.OutOrStdout(), f, args)
			}
			rep, err := analyzeFiles(f, args)
			if err != nil {
				return err
			}
			if f.chains && f.format != "json" {
				return rep.WriteChains(cmd.OutOrStdout(), f.format)
			}
			return rep.Write(cmd.OutOrStdout(), f.format)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.rules, "rules", "", "rules file (YAML; default: the built-in rules)")
	fl.BoolVar(&f.printRules, "print-rules", false, "print the built-in rules and exit")
	fl.StringVar(&f.format, "format", "text", "text, json or markdown")
	fl.StringVar(&f.threads, "threads", "", "only threads whose name matches this regexp")
	fl.Int64Var(&f.messages, "messages", 0, "messages the run moved, for wake-ups per message (read from metrics.json in a run directory)")
	fl.StringVar(&f.metrics, "metrics", "", "metrics JSON with a published count, for wake-ups per message")
	fl.IntVar(&f.top, "top", 10, "stacks and functions to list")
	fl.BoolVar(&f.foldedNs, "folded-ns", false, "folded-stack values are nanoseconds (default: microseconds, as bcc writes)")
	fl.StringVar(&f.explain, "explain", "", "tell how the rules read this stack (folded: THREAD;user frames;-;kernel frames, or one frame) and exit; with profiles, explain their recorded stacks that contain it, waker and all")
	fl.StringVar(&f.state, "state", "sleeping", "with --explain: the thread state (sleeping, uninterruptible, preempted, other)")
	fl.StringVar(&f.from, "from", "", "with a directory of intervals (record --continuous --output-dir): only those that started at or after this time (RFC 3339, or HH:MM[:SS] today, local time)")
	fl.StringVar(&f.to, "to", "", "with a directory of intervals: only those that started before this time")
	fl.BoolVar(&f.chains, "chains", false, "list only the root causes of the blocked time, followed along the wakers' own waits (JSON always has them: chains)")
	fl.StringVar(&f.waker, "waker", "", "with --explain: who woke the thread ("+strings.Join(analysis.WakerRelations, ", ")+")")
	fl.StringVar(&f.wakerStack, "waker-stack", "", "with --explain: the waker's stack (folded: user frames;-;kernel frames)")
	fl.StringVar(&f.class, "wakeup-class", "", "with --explain: the wake-up's class (futex, eventfd, pipe/socket, timer, block-io, net-rx, ...)")
	addPathFlags(cmd, f)
	addLinkFlags(cmd, f)
	return cmd
}

// explainFolded tells how the rules read the --explain stack.
func explainFolded(w io.Writer, f *analyzeFlags) error {
	rules, err := analysis.LoadRules(f.rules)
	if err != nil {
		return err
	}
	st := schema.FoldedStack(f.explain)
	st.State = f.state
	if err := explainWaker(&st, f); err != nil {
		return err
	}
	for _, l := range rules.Explain(&st) {
		fmt.Fprintln(w, l)
	}
	return nil
}

// addPathFlags adds the critical path's flags.
func addPathFlags(cmd *cobra.Command, f *analyzeFlags) {
	fl := cmd.Flags()
	fl.BoolVar(&f.criticalPath, "critical-path", false, "read a timeline (record --timeline) and follow one request's wall time (--span, --trace, or --tid/--goid with --from/--to: a duration from the timeline's start or CLOCK_MONOTONIC ns) through the threads and goroutines that woke it")
	fl.Int64Var(&f.tid, "tid", 0, "with --critical-path: the thread whose time to follow")
	fl.Int64Var(&f.goid, "goid", 0, "with --critical-path: the goroutine whose time to follow (record --goroutines --timeline)")
	fl.StringVar(&f.pathOut, "timeline-out", "", "with --critical-path: write the timeline again with the path as a track of nested slices (Perfetto: .pftrace, .pftrace.gz)")
}

// addLinkFlags adds the flags that pick waits by a program's labels.
func addLinkFlags(cmd *cobra.Command, f *analyzeFlags) {
	fl := cmd.Flags()
	fl.StringVar(&f.span, "span", "", "only the waits that carry this span_id (a request's span: Go's pprof labels, offcpu record --goroutines)")
	fl.StringVar(&f.trace, "trace", "", "only the waits that carry this trace_id (every span of one trace)")
	fl.StringVar(&f.by, "by", "", "blocked time per value of this program label (http.route, a tenant, span_id) with each value's top causes")
	cmd.MarkFlagsMutuallyExclusive("span", "trace")
}

// analyzeByLabel writes the blocked time per value of the label --by.
func analyzeByLabel(w io.Writer, f *analyzeFlags, args []string) error {
	data, rules, opts, _, err := loadAnalysis(f, args)
	if err != nil {
		return err
	}
	analysis.Analyze(data, rules, opts) // marks the waits inside requests and chains
	rows := analysis.ByLabel(data, rules, f.by, f.top)
	if len(rows) == 0 {
		return noLabel(data, "--by "+f.by, f.by)
	}
	return analysis.WriteByLabel(w, f.by, rows, f.format)
}

// noLabel is the error for a label no wait carries, naming those that do.
func noLabel(data *schema.Data, flag, key string) error {
	if keys := analysis.LabelKeys(data); len(keys) > 0 {
		return fmt.Errorf("%s: no wait carries that label; the waits carry %s", flag, strings.Join(keys, ", "))
	}
	return fmt.Errorf("%s: no wait carries a program's label: record with --goroutines a Go program that sets pprof labels (pprof.Do) to get %s", flag, key)
}

// explainWaker gives a stack to explain the waker --waker, --waker-stack
// and --wakeup-class describe.
func explainWaker(st *schema.Stack, f *analyzeFlags) error {
	if f.waker == "" && f.wakerStack == "" && f.class == "" {
		return nil
	}
	st.Kind, st.Value, st.PID, st.Process, st.Class = schema.KindOffCPU, 1, 1, "process", f.class
	st.Waker, st.WakerTID, st.WakerPID, st.WakerProcess = "waker", 2, 1, "process"
	switch f.waker {
	case "", "same-process":
	case "same-program":
		st.WakerPID = 3
	case "other-program":
		st.WakerPID, st.WakerProcess = 3, "other"
	case "interrupt":
		st.Waker, st.WakerTID, st.WakerPID, st.WakerProcess = schema.WakerInterrupt, 0, 0, ""
	default:
		return fmt.Errorf("--waker %q: use same-process, same-program, other-program or interrupt", f.waker)
	}
	st.WakerFrames = schema.ParseWakerStack(f.wakerStack)
	return nil
}

// explainRecorded explains the recorded off-CPU stacks that contain
// f.explain (as their folded form reads), largest first, each with what
// the recording says of it: its waker, its creator, its chain.
func explainRecorded(w io.Writer, f *analyzeFlags, args []string) error {
	data, rules, opts, _, err := loadAnalysis(f, args)
	if err != nil {
		return err
	}
	analysis.Analyze(data, rules, opts) // marks the waits inside requests and chains
	var hits []*schema.Stack
	for i := range data.Stacks {
		st := &data.Stacks[i]
		if st.Kind == schema.KindOffCPU && strings.Contains(st.Folded(), f.explain) && (opts.Threads == nil || opts.Threads.MatchString(st.Thread)) {
			hits = append(hits, st)
		}
	}
	if len(hits) == 0 {
		return fmt.Errorf("no recorded off-CPU stack contains %q (give frames as the folded stacks read: a;b;c)", f.explain)
	}
	sort.SliceStable(hits, func(i, j int) bool { return hits[i].Value > hits[j].Value })
	for i, st := range hits[:min(len(hits), f.top)] {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "%s (%s, %d waits)\n", st.Folded(), analysis.Secs(st.Value), st.Count)
		for _, l := range rules.Explain(st) {
			fmt.Fprintln(w, "  "+l)
		}
	}
	if len(hits) > f.top {
		fmt.Fprintf(w, "\n(%d more stacks contain it: --top)\n", len(hits)-f.top)
	}
	return nil
}

func analyzeFiles(f *analyzeFlags, args []string) (*analysis.Report, error) {
	data, rules, opts, ivs, err := loadAnalysis(f, args)
	if err != nil {
		return nil, err
	}
	rep := analysis.Analyze(data, rules, opts)
	if len(ivs) > 1 {
		if err := rep.AddIntervals(ivs, rules, opts); err != nil {
			return nil, err
		}
	}
	return rep, nil
}

// intervalsOf lists the intervals of the arguments that are a continuous
// recording's directories, within --from and --to.
func intervalsOf(f *analyzeFlags, args []string) ([]analysis.IntervalFile, error) {
	from, err := parseWhen(f.from, "--from")
	if err != nil {
		return nil, err
	}
	to, err := parseWhen(f.to, "--to")
	if err != nil {
		return nil, err
	}
	var out []analysis.IntervalFile
	for _, a := range args {
		if !analysis.IsIntervalDir(a) {
			continue
		}
		ivs, err := analysis.IntervalFiles(a, from, to)
		if err != nil {
			return nil, err
		}
		if len(ivs) == 0 {
			return nil, fmt.Errorf("%s: no interval started between %s and %s", a, orNone(f.from), orNone(f.to))
		}
		out = append(out, ivs...)
	}
	if (f.from != "" || f.to != "") && len(out) == 0 {
		return nil, fmt.Errorf("--from and --to need a directory of intervals (offcpu record --continuous --output-dir DIR)")
	}
	return out, nil
}

func orNone(s string) string {
	if s == "" {
		return "any time"
	}
	return s
}

// parseWhen reads a time: RFC 3339, or a clock time today (local).
func parseWhen(s, flag string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	for _, layout := range []string{"15:04:05", "15:04"} {
		if c, err := time.ParseInLocation(layout, s, time.Local); err == nil {
			y, m, d := time.Now().Date()
			return time.Date(y, m, d, c.Hour(), c.Minute(), c.Second(), 0, time.Local), nil
		}
	}
	return time.Time{}, fmt.Errorf("%s %q: give a time as 2026-12-03T10:00:00Z or 10:00", flag, s)
}

// loadAnalysis reads the rules and the profiles the flags and arguments
// name; ivs are the intervals of the continuous recordings among them.
func loadAnalysis(f *analyzeFlags, args []string) (*schema.Data, *analysis.Rules, analysis.Options, []analysis.IntervalFile, error) {
	var none analysis.Options
	rules, err := analysis.LoadRules(f.rules)
	if err != nil {
		return nil, nil, none, nil, err
	}
	var re *regexp.Regexp
	if f.threads != "" {
		if re, err = regexp.Compile(f.threads); err != nil {
			return nil, nil, none, nil, fmt.Errorf("--threads: %v", err)
		}
	}
	// A continuous recording's directory stands for its intervals.
	ivs, err := intervalsOf(f, args)
	if err != nil {
		return nil, nil, none, nil, err
	}
	var paths []string
	for _, a := range args {
		if !analysis.IsIntervalDir(a) {
			paths = append(paths, a)
		}
	}
	for _, iv := range ivs {
		paths = append(paths, iv.Profiles...)
	}
	files, metrics, err := analysis.RunFiles(paths)
	if err != nil {
		return nil, nil, none, nil, err
	}
	if f.metrics != "" {
		metrics = append(metrics, f.metrics)
	}
	messages := f.messages
	if messages == 0 {
		messages = analysis.Published(metrics)
	}
	unit := schema.FoldedMicroseconds
	if f.foldedNs {
		unit = schema.FoldedNanoseconds
	}
	data, err := analysis.Load(unit, files...)
	if err != nil {
		return nil, nil, none, nil, err
	}
	for _, l := range [][3]string{{"--span", schema.LabelSpanID, f.span}, {"--trace", schema.LabelTraceID, f.trace}} {
		if l[2] == "" {
			continue
		}
		values := map[string]bool{}
		for i := range data.Stacks {
			if v, ok := data.Stacks[i].Links[l[1]]; ok {
				values[v] = true
			}
		}
		if len(values) == 0 {
			return nil, nil, none, nil, noLabel(data, l[0], l[1])
		}
		if analysis.KeepLinked(data, l[1], l[2]) == 0 {
			return nil, nil, none, nil, fmt.Errorf("%s %s: no wait carries it (%d values of %s recorded: offcpu analyze --by %s lists them)", l[0], l[2], len(values), l[1], l[1])
		}
	}
	return data, rules, analysis.Options{Threads: re, Messages: messages, Top: f.top}, ivs, nil
}
