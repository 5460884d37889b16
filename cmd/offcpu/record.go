package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/google/pprof/profile"
	"github.com/spf13/cobra"

	"github.com/offcpu/offcpu/collector"
	"github.com/offcpu/offcpu/internal/output"
	"github.com/offcpu/offcpu/schema"
)

type recordFlags struct {
	pids, tids         []int
	cgroup             string
	minBlock, maxBlock time.Duration
	states             []string
	userOnly           bool
	kernelOnly         bool
	noUserStacks       bool
	noKernelStacks     bool
	noStackReuse       bool
	noDebugInfo        bool
	noWakeups          bool
	cpuHz              int
	cpuFolded          string
	wakeupsOut         string
	wakeupsFolded      string
	offwakeFolded      string
	duration           time.Duration
	output             string
	timeline           timelineFlags
	folded             string
	maxThreads         int
	traceMapPin        string
	stackEntries       int
	unwindRows         int
	fpOnly             bool
	aggEntries         int
	stats              bool
	follow             bool
	tracepoint         bool
	quiet              bool
	goroutines         bool
	goroutinesOut      string
	goroutinesFolded   string
	goroutinesMax      int
	exitedDetail       int
	walkThreshold      time.Duration
	budget             string
	agent              agentFlags
}

func newRecordCmd() *cobra.Command {
	f := &recordFlags{}
	cmd := &cobra.Command{
		Use:   "record [flags] [-- COMMAND [ARGS...]]",
		Short: "Record off-CPU time with user and kernel stacks",
		Long: `Record where threads are blocked, for how long, with their user and kernel
stacks. Without -p, --tid, --cgroup or a command, every thread on the machine
is recorded. Recording ends when --duration elapses, when the command exits,
when every -p process has exited, or on Ctrl-C; what was recorded is always
written.

User stacks are whole through code built without frame pointers (from its
.eh_frame), and through HotSpot JVMs (tested: JDK 17 and 25) started with no
flag: their interpreted, compiled and inlined Java frames are walked and
named, with source lines, from the JVM's own structures.

With --continuous it runs until stopped (SIGTERM or Ctrl-C flush the open
interval) and cuts a profile every --interval: pprof files rotated in
--output-dir, and OTLP profiles (off_cpu, runqueue, wakeups, cpu) sent to an
OpenTelemetry Collector with --otlp-endpoint. Entries of exited threads and
processes are evicted at each cut, so memory follows what is alive. SIGHUP
re-reads --config (otlp:, output_dir:, keep:, rules:).`,
		Example: `  sudo offcpu record -p 1234 -d 10s -o offcpu.pb.gz
  sudo offcpu record -o out.pb.gz --folded out.folded -- ./server --port 8080
  go tool pprof -http :8080 offcpu.pb.gz
  sudo offcpu record --continuous --interval 10s --otlp-endpoint localhost:4317 --otlp-insecure
  sudo offcpu record --continuous --output-dir /var/lib/offcpu --keep 360`,
		RunE: f.run,
	}
	fl := cmd.Flags()
	f.agent.register(fl)
	fl.IntSliceVarP(&f.pids, "pid", "p", nil, "record this process (repeatable, or comma-separated)")
	fl.IntSliceVar(&f.tids, "tid", nil, "record this thread (repeatable)")
	fl.StringVar(&f.cgroup, "cgroup", "", "record threads of this cgroup v2 directory")
	fl.DurationVar(&f.minBlock, "min-block", 0, "keep only off-CPU intervals at least this long (e.g. 100us)")
	fl.DurationVar(&f.maxBlock, "max-block", 0, "keep only off-CPU intervals at most this long (0: no bound)")
	fl.StringSliceVar(&f.states, "state", nil, "states to record: sleeping, uninterruptible, preempted, other (default all)")
	fl.BoolVar(&f.userOnly, "user-only", false, "record user threads only")
	fl.BoolVar(&f.kernelOnly, "kernel-only", false, "record kernel threads only")
	fl.BoolVar(&f.noUserStacks, "no-user-stacks", false, "do not capture user stacks")
	fl.BoolVar(&f.noKernelStacks, "no-kernel-stacks", false, "do not capture kernel stacks")
	fl.DurationVar(&f.walkThreshold, "walk-threshold", 0, "walk stacks at the switch-in: intervals at least this long always, shorter ones with probability length/threshold, weighted so each stack's time is an unbiased estimate; every thread's time stays exact (at most 1ms; 0: walk every interval; --continuous: 100µs unless given)")
	fl.StringVar(&f.budget, "budget", "", "adapt --walk-threshold so the recorder's BPF programs use about this share of one CPU, e.g. 1% or 0.01 (measured with kernel.bpf_stats_enabled)")
	fl.BoolVar(&f.noStackReuse, "no-stack-reuse", false, "walk both stacks at every switch-out (by default a thread sleeping again in the same syscall from the same place reuses its previous stacks)")
	fl.IntVar(&f.cpuHz, "cpu-hz", 99, "also sample on-CPU stacks this often per CPU (sample type cpu/nanoseconds; 0: off)")
	fl.StringVar(&f.cpuFolded, "cpu-folded", "", "write on-CPU samples as folded stacks (µs)")
	fl.BoolVar(&f.noWakeups, "no-wakeups", false, "do not record who woke each thread")
	fl.BoolVar(&f.noDebugInfo, "no-debuginfo", false, "name frames of stripped libraries from their own symbols, without the debug files in /usr/lib/debug")
	fl.StringVar(&f.wakeupsOut, "wakeups-output", "", "wake-up pprof file (default: -o with .wakeups.pb.gz)")
	fl.StringVar(&f.wakeupsFolded, "wakeups-folded", "", "write wake-ups as TARGET;WAKER;waker user;-;waker kernel COUNT")
	fl.StringVar(&f.offwakeFolded, "offwake-folded", "", "write blocked stacks with their waker stacks, as bcc offwaketime (µs)")
	fl.DurationVarP(&f.duration, "duration", "d", 0, "stop after this long (0: until Ctrl-C or the command exits)")
	fl.StringVarP(&f.output, "output", "o", "offcpu.pb.gz", "pprof output file (gzipped profile.proto)")
	fl.StringVar(&f.folded, "folded", "", "also write folded stacks (µs) to this file")
	fl.StringVar(&f.timeline.path, "timeline", "", "also write every wait in order as a Perfetto trace (open it at ui.perfetto.dev; a name ending in .json: Chrome JSON trace events): a track per thread, running, runnable and blocked slices with stacks and verdicts, wake-ups as arrows")
	fl.IntVar(&f.timeline.ringMB, "timeline-ring", 16, "MiB of kernel ring for the --timeline stream (120 bytes a wait, read every 50ms)")
	fl.IntVar(&f.maxThreads, "max-threads", 65536, "threads tracked at once (BPF map size)")
	fl.IntVar(&f.stackEntries, "stack-entries", 32768, "distinct stacks kept (BPF hash map size)")
	fl.IntVar(&f.unwindRows, "unwind-rows", 1<<21, "unwind-table rows kept for code without frame pointers, over all files (8 bytes each)")
	fl.BoolVar(&f.fpOnly, "frame-pointers-only", false, "walk user stacks by frame pointers only, as other tools do (stacks through code built without them end early)")
	fl.IntVar(&f.aggEntries, "agg-entries", 65536, "distinct (thread, stack, state) keys kept (BPF map size)")
	fl.StringVar(&f.traceMapPin, "trace-map-pin", "/sys/fs/bpf", "bpffs directory of the OpenTelemetry eBPF Instrumentation's trace-context map (otel_traces_ctx_v1), shared to link waits to its spans; created if missing (\"\": none)")
	fl.BoolVar(&f.stats, "stats", false, "print the mean cost of each BPF program run (enables kernel.bpf_stats_enabled while recording)")
	fl.BoolVar(&f.follow, "follow-forks", true, "also record processes that the targets start")
	fl.BoolVar(&f.tracepoint, "tracepoint", false, "attach to the classic sched tracepoints instead of tp_btf")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "print no summary")
	fl.BoolVar(&f.goroutines, "goroutines", false, "also record where the goroutines of Go programs among the targets wait, and who wakes them (a uprobe on their runtime; needs -p or a command)")
	fl.StringVar(&f.goroutinesOut, "goroutines-output", "", "goroutine pprof file (default: -o with .goroutines.pb.gz)")
	fl.StringVar(&f.goroutinesFolded, "goroutines-folded", "", "write goroutine waits as folded stacks (µs), the reason as the root frame")
	fl.IntVar(&f.goroutinesMax, "goroutines-max", 131072, "goroutines followed at once, parked or runnable (BPF map size)")
	fl.IntVar(&f.exitedDetail, "exited-detail", collector.DefaultExitedDetail, "exited processes that keep their pid and tid labels, those with the most off-CPU time; the samples of the others are merged per command and stack (label folded=exited) so memory does not grow with every process seen (-1: keep all, for short recordings)")
	return cmd
}

func runRecord(stderr io.Writer, f *recordFlags, command []string) error {
	opts, err := f.options(command)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	sess, err := collector.Start(ctx, opts)
	if err != nil {
		return err
	}
	child, cmdDone, err := startCommand(sess, command)
	if err != nil {
		return err
	}
	if !f.quiet {
		fmt.Fprintf(stderr, "offcpu: recording %s; Ctrl-C to stop\n", describeTargets(f, command))
	}
	cmdErr, cmdEnded := waitForEnd(ctx, f, cmdDone)
	cancel()

	// From here the process builds and writes the profiles once: their
	// garbage is collected sooner rather than held at twice their size.
	debug.SetGCPercent(25)
	prof, err := sess.Stop()
	if err != nil {
		return err
	}
	if err := f.write(sess, prof); err != nil {
		return err
	}
	if err := f.timeline.write(sess.Profiles().Timeline, prof, f.agent.rules); err != nil {
		return err
	}
	if !f.quiet {
		printSummary(stderr, sess.Stats(), prof, f)
	}
	if child != nil {
		if !cmdEnded { // still running: recording ended first
			child.Process.Signal(syscall.SIGTERM)
			cmdErr = <-cmdDone
		}
		var ee *exec.ExitError
		if errors.As(cmdErr, &ee) && ee.ExitCode() > 0 {
			return &exitError{code: ee.ExitCode(), msg: fmt.Sprintf("%s exited with status %d (profile written)", command[0], ee.ExitCode())}
		}
	}
	return nil
}

// run checks the arguments and records, once or continuously.
func (f *recordFlags) run(cmd *cobra.Command, args []string) error {
	if n := cmd.ArgsLenAtDash(); n > 0 {
		return fmt.Errorf("unexpected argument %q: put the command to record after --", args[0])
	} else if n < 0 && len(args) > 0 {
		return fmt.Errorf("unexpected argument %q: put the command to record after --", args[0])
	}
	if !cmd.Flags().Changed("trace-map-pin") && !collector.IsBPFFS(f.traceMapPin) {
		f.traceMapPin = "" // the default where no BPF file system is mounted: nothing to share, said nothing
	}
	if f.agent.continuous {
		for _, name := range []string{"output", "folded", "cpu-folded", "wakeups-output", "wakeups-folded", "offwake-folded"} {
			if cmd.Flags().Changed(name) {
				return fmt.Errorf("--%s writes one profile at the end: with --continuous, give --output-dir", name)
			}
		}
		opts, err := f.options(args)
		if err != nil {
			return err
		}
		if !cmd.Flags().Changed("walk-threshold") && opts.Budget == 0 {
			// An agent records all the time: short intervals' stacks
			// are drawn, their time still exact (docs/overhead.md).
			opts.WalkThreshold = collector.DefaultContinuousWalkThreshold
		}
		return runContinuous(cmd.ErrOrStderr(), f, opts, args)
	}
	for _, name := range []string{"interval", "output-dir", "keep", "config", "rules", "otlp-endpoint", "otlp-protocol", "otlp-header", "otlp-insecure", "otlp-ca", "otlp-queue", "otlp-queue-bytes", "otlp-retry", "shutdown-timeout", "memory-limit", "flight-recorder", "flight-recorder-bytes", "flight-dir", "flight-socket", "timeline-trigger"} {
		if cmd.Flags().Changed(name) && !(name == "rules" && f.timeline.path != "") {
			return fmt.Errorf("--%s needs --continuous", name)
		}
	}
	return runRecord(cmd.ErrOrStderr(), f, args)
}

// startCommand starts the command to record, if any, under sess; its
// exit arrives on the returned channel. On failure the session is stopped.
func startCommand(sess *collector.Session, command []string) (*exec.Cmd, chan error, error) {
	if len(command) == 0 {
		return nil, nil, nil
	}
	child := exec.Command(command[0], command[1:]...)
	child.Stdin, child.Stdout, child.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := sess.StartCommand(child); err != nil {
		sess.Stop()
		return nil, nil, err
	}
	cmdDone := make(chan error, 1)
	go func() { cmdDone <- child.Wait() }()
	return child, cmdDone, nil
}

// options checks the flags and turns them into the recorder's options.
func (f *recordFlags) options(command []string) (collector.Options, error) {
	mask, err := collector.ParseStates(f.states)
	if err != nil {
		return collector.Options{}, err
	}
	if !f.agent.continuous {
		if err := checkWritable(f.output); err != nil {
			return collector.Options{}, err
		}
	}
	if f.noWakeups && (f.wakeupsOut != "" || f.wakeupsFolded != "" || f.offwakeFolded != "") {
		return collector.Options{}, fmt.Errorf("--no-wakeups excludes --wakeups-output, --wakeups-folded and --offwake-folded")
	}
	if !f.noWakeups && f.wakeupsOut == "" && !f.agent.continuous {
		f.wakeupsOut = strings.TrimSuffix(strings.TrimSuffix(f.output, ".gz"), ".pb") + ".wakeups.pb.gz"
	}
	if !f.goroutines && (f.goroutinesOut != "" || f.goroutinesFolded != "") {
		return collector.Options{}, fmt.Errorf("--goroutines-output and --goroutines-folded need --goroutines")
	}
	if f.goroutines && len(f.pids) == 0 && len(command) == 0 {
		return collector.Options{}, fmt.Errorf("--goroutines needs the Go programs to record: -p PID or a command after --")
	}
	if f.agent.continuous && (f.goroutinesOut != "" || f.goroutinesFolded != "") {
		return collector.Options{}, fmt.Errorf("--goroutines-output and --goroutines-folded write one window: with --continuous each interval's goroutine waits go to --output-dir and the OTLP export")
	}
	if f.goroutines && f.goroutinesOut == "" && !f.agent.continuous {
		f.goroutinesOut = strings.TrimSuffix(strings.TrimSuffix(f.output, ".gz"), ".pb") + ".goroutines.pb.gz"
	}
	if f.cpuFolded != "" && f.cpuHz == 0 {
		return collector.Options{}, fmt.Errorf("--cpu-folded needs --cpu-hz above 0")
	}
	for _, p := range []string{f.folded, f.wakeupsOut, f.wakeupsFolded, f.offwakeFolded, f.cpuFolded, f.goroutinesOut, f.goroutinesFolded} {
		if p != "" {
			if err := checkWritable(p); err != nil {
				return collector.Options{}, err
			}
		}
	}
	budget, err := parseShare(f.budget)
	if err != nil {
		return collector.Options{}, err
	}
	if f.exitedDetail == 0 || f.exitedDetail < -1 {
		return collector.Options{}, fmt.Errorf("--exited-detail %d: give at least 1 process, or -1 to keep every one", f.exitedDetail)
	}
	opts := collector.Options{
		ExitedDetail:  f.exitedDetail,
		WalkThreshold: f.walkThreshold, Budget: budget, NoOffwake: f.offwakeFolded == "",
		PIDs: f.pids, TIDs: f.tids, Cgroup: f.cgroup,
		MinBlock: f.minBlock, MaxBlock: f.maxBlock, StateMask: mask,
		UserThreadsOnly: f.userOnly, KernelThreadsOnly: f.kernelOnly,
		NoUserStacks: f.noUserStacks, NoKernelStacks: f.noKernelStacks, NoStackReuse: f.noStackReuse, NoWakeups: f.noWakeups, NoDebugInfo: f.noDebugInfo, CPUHz: f.cpuHz,
		FollowForks: f.follow, TargetsOnly: len(command) > 0,
		MaxThreads: f.maxThreads, StackEntries: f.stackEntries, AggEntries: f.aggEntries,
		UnwindRows: f.unwindRows, FramePointersOnly: f.fpOnly, TraceMapPin: f.traceMapPin,
		ForceTracepoint: f.tracepoint, Stats: f.stats,
		Goroutines: f.goroutines, MaxGoroutines: f.goroutinesMax,
	}
	if err := f.timeline.options(&opts, f.agent.continuous); err != nil {
		return collector.Options{}, err
	}
	return opts, nil
}

// waitForEnd waits for Ctrl-C, --duration, the --pid processes' exit or
// the command's; it returns the command's result if it ended.
func waitForEnd(ctx context.Context, f *recordFlags, cmdDone chan error) (cmdErr error, cmdEnded bool) {
	var timer <-chan time.Time
	if f.duration > 0 {
		timer = time.After(f.duration)
	}
	var pidsGone <-chan struct{}
	if len(f.pids) > 0 {
		pidsGone = watchPIDs(ctx, f.pids)
	}
	select {
	case <-ctx.Done():
	case <-timer:
	case <-pidsGone:
	case cmdErr = <-cmdDone:
		cmdEnded = true
	}
	return cmdErr, cmdEnded
}

// write writes the profiles and folded files the flags ask for.
func (f *recordFlags) write(sess *collector.Session, prof *profile.Profile) error {
	if err := writeProfile(f.output, prof); err != nil {
		return err
	}
	if f.folded != "" {
		if err := writeFile(f.folded, func(w io.Writer) error { return schema.WriteFolded(w, prof, schema.OffCPU, 1000) }); err != nil {
			return err
		}
	}
	if f.cpuFolded != "" {
		if err := writeFile(f.cpuFolded, func(w io.Writer) error { return schema.WriteFolded(w, prof, schema.CPU, 1000) }); err != nil {
			return err
		}
	}
	if gp := sess.Profiles().Goroutines; gp != nil {
		if err := writeProfile(f.goroutinesOut, gp); err != nil {
			return err
		}
		if f.goroutinesFolded != "" {
			if err := writeFile(f.goroutinesFolded, func(w io.Writer) error { return schema.WriteGoroutinesFolded(w, gp) }); err != nil {
				return err
			}
		}
	}
	if wp := sess.Profiles().Wakeups; wp != nil {
		if err := writeProfile(f.wakeupsOut, wp); err != nil {
			return err
		}
		if f.wakeupsFolded != "" {
			if err := writeFile(f.wakeupsFolded, func(w io.Writer) error { return schema.WriteWakeupsFolded(w, wp) }); err != nil {
				return err
			}
		}
		if f.offwakeFolded != "" {
			if err := writeFile(f.offwakeFolded, func(w io.Writer) error {
				return schema.WriteFoldedPlain(w, sess.Profiles().Offwake, schema.OffCPU, 1000)
			}); err != nil {
				return err
			}
		}
	}
	return nil
}

func describeTargets(f *recordFlags, command []string) string {
	var parts []string
	if len(command) > 0 {
		parts = append(parts, fmt.Sprintf("%q", strings.Join(command, " ")))
	}
	for _, p := range f.pids {
		parts = append(parts, fmt.Sprintf("pid %d", p))
	}
	for _, t := range f.tids {
		parts = append(parts, fmt.Sprintf("tid %d", t))
	}
	if f.cgroup != "" {
		parts = append(parts, "cgroup "+f.cgroup)
	}
	if len(parts) == 0 {
		return "all threads"
	}
	return strings.Join(parts, ", ")
}

// watchPIDs closes the returned channel once every pid has exited.
func watchPIDs(ctx context.Context, pids []int) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			alive := false
			for _, p := range pids {
				if syscall.Kill(p, 0) == nil {
					alive = true
					break
				}
			}
			if !alive {
				close(done)
				return
			}
		}
	}()
	return done
}

func checkWritable(path string) error {
	_, statErr := os.Stat(path)
	fh, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("cannot write %s: %v (choose another path with -o)", path, errors.Unwrap(err))
	}
	fh.Close()
	if statErr != nil {
		os.Remove(path)
	}
	return nil
}

func writeProfile(path string, p *profile.Profile) error { return output.WriteFile(path, p.Write) }

var writeFile = output.WriteFile

func printSummary(w io.Writer, st collector.Stats, p *profile.Profile, f *recordFlags) {
	fmt.Fprintf(w, "offcpu: %v recorded (%s): %d off-CPU intervals, %v off-CPU (%v blocked, %v waiting for a CPU), %d stacks\n",
		st.Duration.Round(time.Millisecond), st.Attach, st.Intervals, st.OffCPU.Round(time.Microsecond),
		(st.OffCPU - st.RunQueue).Round(time.Microsecond), st.RunQueue.Round(time.Microsecond), st.Stacks)
	if st.StartUp > 0 {
		fmt.Fprintf(w, "started in %v (programs loaded and verified in %v)\n", st.StartUp.Round(time.Millisecond), st.Load.Round(time.Millisecond))
	}
	if st.ExactOnCPU {
		fmt.Fprintf(w, "on-CPU: %v, exact per thread (the scheduler's own count between switches)\n", st.OnCPU.Round(time.Microsecond))
	}
	if totals := schema.ThreadTotals(p); len(totals) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "blocked\twaiting for a CPU\ton-CPU\tswitches\tthread\t")
		for _, t := range totals[:min(len(totals), 10)] {
			who := fmt.Sprintf("%s (tid %d)", t.Thread, t.TID)
			if t.TID < 0 {
				who = t.Thread + " (exited processes, merged)"
			}
			fmt.Fprintf(tw, "%v\t%v\t%v\t%d\t%s\t\n", t.Blocked.Round(time.Microsecond), t.RunQueue.Round(time.Microsecond),
				t.OnCPU.Round(time.Microsecond), t.Switches, who)
		}
		tw.Flush()
	}
	for _, warn := range st.Warnings {
		fmt.Fprintf(w, "offcpu: warning: %s\n", warn)
	}
	if st.OpenIntervals > 0 {
		fmt.Fprintf(w, "still blocked at the end: %d threads, %v so far (included, label interval=open)\n", st.OpenIntervals, st.OpenTime.Round(time.Millisecond))
	}
	if st.CPUSamples > 0 {
		fmt.Fprintf(w, "on-CPU samples: %d at %d Hz per CPU\n", st.CPUSamples, f.cpuHz)
	}
	if st.Wakeups > 0 {
		var classes []string
		for c, n := range st.WakeupsByClass {
			classes = append(classes, fmt.Sprintf("%s %d", c, n))
		}
		sort.Strings(classes)
		fmt.Fprintf(w, "wake-ups: %d (%s)\n", st.Wakeups, strings.Join(classes, ", "))
	}
	if b := st.Budget; b != nil {
		printBudget(w, b, st.OffCPU)
	}
	if st.StacksReused > 0 {
		fmt.Fprintf(w, "stacks reused: %d switch-outs (same syscall and user registers as the thread's last sleep)\n", st.StacksReused)
	}
	if st.WakesReused+st.IRQWakesReused > 0 {
		fmt.Fprintf(w, "waker stacks reused: %d thread wake-ups (same place, same target), %d interrupt wake-ups (same path fingerprint; one in 128 walked again)\n",
			st.WakesReused, st.IRQWakesReused)
	}
	if st.StacksMoved > 0 {
		fmt.Fprintf(w, "stacks moved from the full stack map to memory while recording: %d (none lost by it)\n", st.StacksMoved)
	}
	if share := st.CompleteShare(); share >= 0 {
		fmt.Fprintf(w, "user stacks reaching a thread start: %.1f%% of off-CPU time (%d complete, %d truncated distinct stacks)\n",
			100*share, st.CompleteStacks, st.TruncatedStacks)
	}
	printGoroutines(w, st.Goroutines, f)
	printThreadContext(w, st.ThreadContext)
	printWalkers(w, st)
	printRuntimes(w, st)
	if st.NoStart > 0 {
		fmt.Fprintf(w, "blocked since before the start: %d threads (counted from the start; label interval=before-start or whole)\n", st.NoStart)
	}
	fmt.Fprintf(w, "losses: %d (user stacks %d, kernel stacks %d, aggregation full %d, starts %d, events %d, switches the kernel skipped %d); switch-ins not reported by the kernel %d (recovered); unreadable user stacks %d; %d intervals outside the block bounds (%v, %.1f%% of the off-CPU time kept)\n",
		st.Lost(), st.UserStackLost, st.KernelStackLost, st.AggFull, st.StartFull, st.EventsLost, st.SwitchMissed, st.MissedSwitchIn, st.UserStackFault, st.OutOfRange, st.OutOfRangeTime.Round(time.Microsecond), 100*st.KeptShare())
	if st.Lost() > 0 {
		fmt.Fprintln(w, "offcpu: some data was lost: raise --stack-entries or --agg-entries")
	}
	for _, ps := range st.Programs {
		fmt.Fprintf(w, "bpf %s: %d runs, mean %d ns per run\n", ps.Name, ps.Runs, ps.MeanCost.Nanoseconds())
	}
	f.timeline.summary(w, st)
	printWritten(w, f)
}

// printWritten names the files record wrote.
func printWritten(w io.Writer, f *recordFlags) {
	written := []string{f.output}
	for _, p := range []string{f.folded, f.wakeupsOut, f.wakeupsFolded, f.offwakeFolded, f.cpuFolded, f.goroutinesOut, f.goroutinesFolded} {
		if p != "" {
			written = append(written, p)
		}
	}
	fmt.Fprintf(w, "offcpu: wrote %s\n", strings.Join(written, ", "))
}

// printWalkers describes the unwind tables and the JVMs read.
func printWalkers(w io.Writer, st collector.Stats) {
	if u := st.Unwind; u != nil && u.Files > 0 {
		fmt.Fprintf(w, "unwind tables: %d files without frame pointers (%d rows of %d), %d processes; %d stacks walked with them, %d reached the thread start\n",
			u.Files, u.Rows, u.RowCapacity, u.Processes, u.Stacks, u.Ends)
		if u.RowsFull > 0 {
			fmt.Fprintf(w, "offcpu: warning: %d files left to frame pointers for lack of room: raise --unwind-rows\n", u.RowsFull)
		}
		if u.ProcsFull > 0 {
			fmt.Fprintf(w, "offcpu: warning: %d processes left to frame pointers: more than %d processes need unwind tables at once\n", u.ProcsFull, collector.MaxUnwindProcs)
		}
	}

}

// printRuntimes describes each runtime read from its own structures, the
// same line for each.
func printRuntimes(w io.Writer, st collector.Stats) {
	for _, r := range st.Runtimes {
		fmt.Fprintf(w, "offcpu: %s frames: %d processes read", r.Runtime, r.Processes)
		if r.Unsupported > 0 {
			fmt.Fprintf(w, ", %d of a build not read", r.Unsupported)
		}
		fmt.Fprintf(w, "; %d functions named, %d unreadable", r.Named, r.Unnamed)
		if d, ok := r.Detail.(fmt.Stringer); ok {
			fmt.Fprintf(w, " (%s)", d)
		}
		fmt.Fprintln(w)
	}
}

// printGoroutines describes the goroutine waits recorded (nil: not asked).
// printThreadContext: the OpenTelemetry thread context read, if any.
func printThreadContext(w io.Writer, tc *collector.ThreadContextStats) {
	if tc == nil {
		return
	}
	if tc.Processes > 0 || tc.Records > 0 {
		fmt.Fprintf(w, "thread context (OpenTelemetry): %d processes, %d records (%d from the eBPF instrumentation's map), %d lost, %d cut short\n",
			tc.Processes, tc.Records, tc.Instrumentation, tc.Lost, tc.Truncated)
	}
	if tc.GoProcesses > 0 {
		procs := "processes"
		if tc.GoProcesses == 1 {
			procs = "process"
		}
		fmt.Fprintf(w, "Go threads' labels: %d %s, %d label sets, %d lost, %d cut short\n",
			tc.GoProcesses, procs, tc.GoLabelSets, tc.LostGoLabelSets, tc.TruncatedGoSets)
	}
	for _, s := range tc.Skipped {
		fmt.Fprintf(w, "  not read: %s\n", s)
	}
}

func printGoroutines(w io.Writer, g *collector.GoroutineStats, f *recordFlags) {
	if g == nil {
		return
	}
	if g.Processes == 0 {
		fmt.Fprintf(w, "goroutines: no Go program among the targets\n")
	} else {
		fmt.Fprintf(w, "goroutines: %d Go processes, %d parks, %d made runnable, %d put back on a run queue, %d suspended by the GC, %d still waiting at the end; written to %s\n",
			g.Processes, g.Parks, g.Readies, g.Requeues, g.Suspends, g.Open, f.goroutinesOut)
	}
	if g.Merged > 0 {
		fmt.Fprintf(w, "goroutines: %d waits counted without their goroutine ids (goid -1): more goroutines than the aggregation map holds\n", g.Merged)
	}
	if lost := g.LostParks + g.LostWaits; lost > 0 || g.LostStack > 0 {
		fmt.Fprintf(w, "goroutines: lost %d parks (--goroutines-max), %d waits (aggregation full), %d stacks\n", g.LostParks, g.LostWaits, g.LostStack)
	}
	for _, s := range g.Skipped {
		fmt.Fprintf(w, "goroutines: skipped %s\n", s)
	}
}

// parseShare reads a share of a CPU: "1%" or "0.01"; "" is 0.
func parseShare(s string) (float64, error) {
	if s == "" {
		return 0, nil
	}
	t, pct := strings.CutSuffix(strings.TrimSpace(s), "%")
	v, err := strconv.ParseFloat(t, 64)
	if err == nil && pct {
		v /= 100
	}
	if err != nil || v <= 0 || v > 1 {
		return 0, fmt.Errorf("--budget %q: want a share of one CPU above 0 and at most 100%%, such as 1%% or 0.01", s)
	}
	return v, nil
}

// printBudget says how the stacks were chosen and how good the estimate is.
func printBudget(w io.Writer, b *collector.BudgetStats, off time.Duration) {
	how := fmt.Sprintf("fixed at %v", b.Threshold)
	if b.Budget > 0 {
		how = fmt.Sprintf("%v at the end, between %v and %v, for --budget %.2g%% of a CPU (the recorder's programs used %.2f%%)",
			b.Threshold, b.ThresholdMin, b.ThresholdMax, 100*b.Budget, 100*b.Cost)
	}
	fmt.Fprintf(w, "walk threshold: %s; every interval at least that long walked\n", how)
	if b.Budget > 0 && b.Cost > 1.1*b.Budget && b.ThresholdMax >= collector.MaxWalkThreshold {
		fmt.Fprintf(w, "offcpu: --budget %.2g%% not met (%.2f%%): the threshold reached its cap (%v, so that no longer wait loses its stack), and the programs' fixed cost per switch and wake-up is above the budget at this rate; --no-wakeups drops the wake-up program\n",
			100*b.Budget, 100*b.Cost, collector.MaxWalkThreshold)
	}
	if b.Below == 0 {
		return
	}
	share := 100 * float64(b.Walked) / float64(b.Below)
	fmt.Fprintf(w, "below it: %d intervals, %v (exact), %d walked (%.2f%%), their time per stack estimated (threshold/length weights), each thread's total exact; estimate of the below-threshold time ±%v (2σ, %.3f%% of the off-CPU time)",
		b.Below, b.BelowTime.Round(time.Microsecond), b.Walked, share, (2 * b.StdDev).Round(time.Microsecond), 100*2*b.StdDev.Seconds()/max(off.Seconds(), 1e-9))
	if e := b.StackError(0.01, off); !math.IsInf(e, 0) {
		fmt.Fprintf(w, "; a stack with 1%% of it within ±%.1f%%", 100*e)
	}
	fmt.Fprintln(w)
	if b.WakersSkipped > 0 {
		fmt.Fprintf(w, "waker stacks not walked: %d wake-ups ending a wait below the threshold (not drawn); the waker is named all the same\n", b.WakersSkipped)
	}
	if b.Missed > 0 {
		fmt.Fprintf(w, "offcpu: %d intervals drawn for a walk had none (no program ran at their switch-in): counted without stacks\n", b.Missed)
	}
}
