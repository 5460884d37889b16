package collector

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/offcpu/offcpu/bpf"
)

// State is why a thread left the CPU. Values match the BPF program's enum.
type State uint32

const (
	StateSleeping        State = bpf.StateSleeping        // S: waiting for an event (and idle kernel threads)
	StateUninterruptible State = bpf.StateUninterruptible // D: usually disk or a kernel lock
	StatePreempted       State = bpf.StatePreempted       // R: runnable, waiting for a CPU
	StateOther           State = bpf.StateOther           // stopped, traced, exiting
	StateUnknown         State = bpf.StateUnknown         // blocked since before the start, woken during it
)

var stateNames = []string{"sleeping", "uninterruptible", "preempted", "other", "unknown"}

func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state%d", uint32(s))
}

// ParseStates turns names such as "sleeping,preempted" into a state mask.
func ParseStates(names []string) (uint32, error) {
	var mask uint32
	for _, list := range names {
		for _, n := range strings.Split(list, ",") {
			n = strings.TrimSpace(strings.ToLower(n))
			if n == "" {
				continue
			}
			found := false
			for i, name := range stateNames[:4] {
				if n == name || (len(n) == 1 && strings.EqualFold(n, []string{"S", "D", "R", "O"}[i])) {
					mask |= 1 << i
					found = true
				}
			}
			if n == "all" {
				mask |= 0xf
				found = true
			}
			if !found {
				return 0, fmt.Errorf("unknown state %q: use sleeping, uninterruptible, preempted, other or all", n)
			}
		}
	}
	return mask, nil
}

// Options selects what a Session records. The zero value records every
// thread on the machine with user and kernel stacks.
type Options struct {
	// PIDs restricts recording to these processes (and, with FollowForks,
	// the processes they start).
	PIDs []int
	// TIDs restricts recording to these threads (union with PIDs).
	TIDs []int
	// Cgroup is a cgroup v2 directory, such as
	// /sys/fs/cgroup/system.slice/foo.service.
	Cgroup string
	// MinBlock and MaxBlock bound the off-CPU intervals kept (0: no bound).
	MinBlock, MaxBlock time.Duration
	// StateMask selects states, 1<<State each; 0 means all.
	StateMask uint32
	// UserThreadsOnly and KernelThreadsOnly select by thread kind.
	UserThreadsOnly, KernelThreadsOnly bool
	// NoUserStacks and NoKernelStacks skip a stack capture, lowering cost.
	NoUserStacks, NoKernelStacks bool
	// NoStackReuse captures both stacks at every switch-out instead of
	// reusing a thread's previous stacks when it sleeps again in the same
	// syscall from the same user instruction and stack pointers.
	NoStackReuse bool
	// CPUHz samples on-CPU stacks this many times a second per CPU into
	// the same profile (sample type cpu/nanoseconds); 0 turns it off.
	CPUHz int
	// NoWakeups skips sched_waking: no waker stacks, no offwake links.
	NoWakeups bool
	// NoOffwake does not build the offwake view (Session.Offwake returns
	// nil): its blocked stacks joined to their wakers' are a third copy of
	// the recording in memory.
	NoOffwake bool
	// ExitedDetail is how many exited processes keep their pid and tid
	// labels: those with the most off-CPU time. The samples of the others
	// are merged per command, state, waker and stack (label folded=exited),
	// so a recording's memory follows what runs, not how many processes
	// came and went. 0: DefaultExitedDetail; negative: every one.
	ExitedDetail int
	// NoDebugInfo names frames of stripped files from their own dynamic
	// symbols only, without the detached debug files in /usr/lib/debug.
	NoDebugInfo bool
	// FollowForks makes processes started by a target targets too.
	FollowForks bool
	// TargetsOnly starts with an empty target set filled by AddPID, as for
	// a command started under the recorder.
	TargetsOnly bool

	// Map sizes; 0 picks the default.
	MaxThreads   int // remembered switch-outs and thread names (default 65536)
	StackEntries int // distinct stacks (default 32768)
	AggEntries   int // distinct (thread, stacks, state) keys (default 65536)
	// TraceMapPin: the bpffs directory where the OpenTelemetry eBPF
	// Instrumentation's thread trace-context map is pinned (OTEP 4855:
	// otel_traces_ctx_v1, created there if missing); "": not shared.
	TraceMapPin string
	// UnwindRows bounds the unwind-table rows loaded for code without
	// frame pointers, over all files (default 2097152, 8 bytes each).
	UnwindRows int

	// FramePointersOnly walks every user stack by frame pointers, as
	// other tools do: stacks through code built without them (glibc on
	// most distributions) end early.
	FramePointersOnly bool

	// ForceTracepoint uses the classic sched:sched_switch tracepoint even
	// where tp_btf works (for testing the fallback).
	ForceTracepoint bool
	// Goroutines records the goroutine waits of the Go programs among
	// the targets (PIDs, or commands started with StartCommand) with a
	// uprobe on their runtime: Session.Goroutines after Stop.
	Goroutines bool
	// MaxGoroutines bounds the goroutines followed at once, parked or
	// runnable (default 131072); beyond it parks are counted as lost.
	MaxGoroutines int

	// ExcludeSelf leaves this process out of the recording (an agent's
	// cuts would otherwise record the work of cutting, each cut adding to
	// the next).
	ExcludeSelf bool
	// Continuous keeps the maps across Session.Snapshot calls: each one
	// returns what ended since the previous one, and the entries of
	// threads and processes that exited are evicted so that memory stays
	// bounded by what is alive.
	Continuous bool

	// Stream keeps every wait in order beside the aggregation, for
	// Profiles.Timeline; StreamRing sizes its ring in bytes (a power of
	// two, DefaultStreamRing when 0). Its stacks are walked at the
	// switch-out: a walk threshold drops the stacks of the waits it does
	// not draw, not the waits.
	Stream     bool
	StreamRing int
	// StreamKeep makes a continuous session's stream a flight recorder:
	// the waits of the last StreamKeep, at most StreamKeepBytes of them
	// (DefaultStreamKeepBytes when 0), for Session.FlightTimeline.
	StreamKeep      time.Duration
	StreamKeepBytes int

	// Stats enables kernel.bpf_stats_enabled while recording, to report
	// the mean cost of a program run.
	Stats bool

	// WalkThreshold walks stacks at the switch-in: intervals at least this
	// long always, shorter ones by lot, weighted (see budget.go); 0 with
	// Budget 0 walks every interval. At most MaxWalkThreshold.
	WalkThreshold time.Duration
	// Budget adapts the walk threshold so that the recorder's programs use
	// about this share of one CPU (0.01: 1%), starting from WalkThreshold
	// or 100µs; it turns kernel.bpf_stats_enabled on while recording.
	Budget float64

	// skipFirstIn (tests): a target's first switch-in runs no program, as
	// the kernel sometimes skips one.
	skipFirstIn bool
}

func (o *Options) withDefaults() Options {
	c := *o
	if c.MaxThreads == 0 {
		c.MaxThreads = 65536
	}
	if c.StackEntries == 0 {
		c.StackEntries = 32768
	}
	if c.AggEntries == 0 {
		c.AggEntries = 65536
	}
	if c.UnwindRows == 0 {
		c.UnwindRows = 1 << 21
	}
	if c.StreamRing == 0 {
		c.StreamRing = DefaultStreamRing
	}
	if c.StreamKeepBytes == 0 {
		c.StreamKeepBytes = DefaultStreamKeepBytes
	}
	if c.StateMask == 0 {
		c.StateMask = 0xf
	}
	if c.ExitedDetail == 0 {
		c.ExitedDetail = DefaultExitedDetail
	}
	return c
}

func (o *Options) validate() error {
	if o.UserThreadsOnly && o.KernelThreadsOnly {
		return fmt.Errorf("--user-only and --kernel-only exclude each other: pick one")
	}
	if o.MaxBlock != 0 && o.MaxBlock < o.MinBlock {
		return fmt.Errorf("--max-block %v is below --min-block %v", o.MaxBlock, o.MinBlock)
	}
	if o.MinBlock < 0 || o.MaxBlock < 0 {
		return fmt.Errorf("block-time bounds must not be negative")
	}
	if err := o.validateBudget(); err != nil {
		return err
	}
	if r := o.StreamRing; r != 0 && (r < os.Getpagesize() || r&(r-1) != 0) {
		return fmt.Errorf("stream ring of %d bytes: give a power of two of at least %d", r, os.Getpagesize())
	}
	if o.StreamKeep != 0 && (!o.Continuous || !o.Stream) {
		return fmt.Errorf("a flight recorder (StreamKeep) needs a continuous session with its stream on")
	}
	if o.CPUHz < 0 || o.CPUHz > 10000 {
		return fmt.Errorf("--cpu-hz %d out of range (0 to 10000)", o.CPUHz)
	}
	for _, m := range []struct {
		flag string
		n    int
	}{{"--max-threads", o.MaxThreads}, {"--stack-entries", o.StackEntries}, {"--agg-entries", o.AggEntries}, {"--unwind-rows", o.UnwindRows}} {
		if m.n < 0 || m.n > maxMapEntries {
			return fmt.Errorf("%s %d out of range (1 to %d)", m.flag, m.n, maxMapEntries)
		}
	}
	for _, p := range o.PIDs {
		if p <= 0 {
			return fmt.Errorf("pid %d is not valid", p)
		}
	}
	for _, p := range o.TIDs {
		if p <= 0 {
			return fmt.Errorf("tid %d is not valid", p)
		}
	}
	return nil
}

// maxMapEntries bounds every map-size flag; for --unwind-rows it is what
// sizes the BPF unwinder's unrolled row search.
const maxMapEntries = bpf.UnwindMaxRows
