package collector

import (
	"time"

	"github.com/offcpu/offcpu/collector/goroutines"
	"github.com/offcpu/offcpu/collector/threadctx"
	"github.com/offcpu/offcpu/runtimes"
)

// Stats describes a finished recording, losses included.
type Stats struct {
	Attach string `json:"attach"` // "tp_btf" or "tracepoint"
	// StartUp: from Start to the programs attached and the recording
	// running; Load: of it, loading the programs (the verifier's time,
	// failed attach modes included).
	StartUp time.Duration `json:"start_up_ns"`
	Load    time.Duration `json:"load_ns"`
	// CodeMaps: how libraries mapped while recording become known:
	// "loader" (a uprobe on the dynamic loader's hook), "mmap" (the mmap
	// syscall tracepoints: every syscall then takes the slow path), or ""
	// (re-read from /proc only).
	CodeMaps  string        `json:"code_maps"`
	Duration  time.Duration `json:"duration_ns"` // wall time recorded
	Intervals uint64        `json:"intervals"`   // off-CPU intervals aggregated
	OffCPU    time.Duration `json:"off_cpu_ns"`  // their total
	// RunQueue: of OffCPU, the time spent waiting for a CPU (from the
	// wake-up to the switch-in, and preempted intervals); the rest is
	// blocked.
	RunQueue time.Duration `json:"runqueue_ns"`
	// OnCPU: the recorded threads' exact time on a CPU (the scheduler's
	// own count between their switches); ExactOnCPU says it was recorded
	// (tp_btf mode).
	OnCPU         time.Duration `json:"on_cpu_ns"`
	ExactOnCPU    bool          `json:"exact_on_cpu"`
	ThreadCPUFull uint64        `json:"thread_cpu_full"` // threads whose on-CPU total was not stored: map full
	// ForkUnwindFull: forked children walked by frame pointers only, for
	// lack of room in the unwind entries.
	ForkUnwindFull uint64 `json:"fork_unwind_full"`
	// StreamWaits: the waits the stream kept (Options.Stream); StreamLost:
	// those it lost to a full ring.
	StreamWaits uint64 `json:"stream_waits,omitempty"`
	StreamLost  uint64 `json:"stream_lost,omitempty"`
	Keys        int    `json:"keys"`   // distinct aggregation keys
	Stacks      int    `json:"stacks"` // distinct stacks
	// StacksMoved: stacks moved from the full BPF map to memory while
	// recording (many short-lived processes), not lost.
	StacksMoved uint64 `json:"stacks_moved"`
	// StacksMissing: stack ids found neither in the map nor in memory
	// (continuous mode: evicted with the last thread that used them while
	// another thread still waited with the same stack); their intervals
	// are kept without that stack.
	StacksMissing uint64 `json:"stacks_missing,omitempty"`
	// AggMoved: continuous mode, aggregation entries moved to memory
	// between cuts because the map was half full (not lost).
	AggMoved uint64 `json:"agg_moved,omitempty"`

	UserStackLost   uint64        `json:"user_stack_lost"` // user stack not stored (map full or collision)
	KernelStackLost uint64        `json:"kernel_stack_lost"`
	UserStackFault  uint64        `json:"user_stack_fault"` // user stack could not be walked
	AggFull         uint64        `json:"agg_full"`         // intervals dropped: aggregation map full
	AggFullTime     time.Duration `json:"agg_full_ns"`
	StartFull       uint64        `json:"start_full"`       // switch-outs not remembered
	NoStart         uint64        `json:"no_start"`         // threads blocked since before the start (counted from the start)
	OutOfRange      uint64        `json:"out_of_range"`     // intervals outside --min-block/--max-block (filtered)
	OutOfRangeTime  time.Duration `json:"out_of_range_ns"`  // their off-CPU time
	EventsLost      uint64        `json:"events_lost"`      // new-process notifications lost
	StacksReused    uint64        `json:"stacks_reused"`    // switch-outs that reused the thread's previous stacks
	SwitchMissed    uint64        `json:"switch_missed"`    // context switches the kernel ran no program for (recursion)
	MissedSwitchIn  uint64        `json:"missed_switch_in"` // switch-ins the kernel ran no program for, recovered from the thread's CPU time

	Wakeups        uint64            `json:"wakeups"`          // wake-ups of recorded threads
	WakeupsByClass map[string]uint64 `json:"wakeups_by_class"` // eventfd, futex, pipe/socket, timer, other
	WakeFull       uint64            `json:"wake_full"`        // wake-ups dropped: map full
	WakerStackLost uint64            `json:"waker_stack_lost"` // waker stacks not stored
	WakesReused    uint64            `json:"wakes_reused"`     // wake-ups that reused the waker's previous stacks
	IRQWakesReused uint64            `json:"irq_wakes_reused"` // interrupt wake-ups that reused a kernel stack of the same path

	Warnings []string `json:"warnings"` // problems that cost part of the data, not all of it

	OpenIntervals uint64        `json:"open_intervals"` // threads still off-CPU at the end: counted up to the end
	OpenTime      time.Duration `json:"open_ns"`        // their off-CPU time so far

	CPUSamples uint64 `json:"cpu_samples"` // on-CPU samples (Options.CPUHz)
	CPUFull    uint64 `json:"cpu_full"`    // on-CPU samples dropped: map full

	Programs []ProgramStat `json:"programs"` // with Options.Stats

	Unwind *UnwindStats `json:"unwind"` // .eh_frame unwinding; nil with FramePointersOnly
	// Budget: deferred walks (--budget, --walk-threshold); nil without.
	Budget *BudgetStats `json:"budget,omitempty"`
	// Runtimes: each runtime whose processes were recorded, the same
	// figures for each (runtimes/registry), with the runtime's own in
	// Detail.
	Runtimes []runtimes.Stats `json:"runtimes,omitempty"`
	// Goroutine waits of Go programs (Options.Goroutines); nil without.
	Goroutines *GoroutineStats `json:"goroutines,omitempty"`
	// ThreadContext: the OpenTelemetry thread context (OTEP 4947) and Go
	// threads' labels read.
	ThreadContext *ThreadContextStats `json:"thread_context,omitempty"`
	// User stacks of the off-CPU profile that reach a thread-start frame
	// (clone3, start_thread, _start, runtime.goexit...) versus the others,
	// by distinct stack and by off-CPU time.
	CompleteStacks  int           `json:"complete_stacks"`
	TruncatedStacks int           `json:"truncated_stacks"`
	CompleteTime    time.Duration `json:"complete_time_ns"`
	TruncatedTime   time.Duration `json:"truncated_time_ns"`
}

// ProgramStat is the kernel's run-time accounting of one BPF program.
type ProgramStat struct {
	Name     string        `json:"name"`
	Runs     uint64        `json:"runs"`
	Runtime  time.Duration `json:"runtime_ns"`
	MeanCost time.Duration `json:"mean_cost_ns"`
}

// Lost reports the number of intervals or stacks that were not recorded
// in full.
func (s *Stats) Lost() uint64 {
	return s.UserStackLost + s.KernelStackLost + s.AggFull + s.StartFull + s.EventsLost + s.WakeFull + s.WakerStackLost + s.CPUFull + s.SwitchMissed + s.ThreadCPUFull
}

// KeptShare is the share of the recorded threads' off-CPU time that the
// profile kept: all of it but the intervals outside --min-block and
// --max-block.
func (s *Stats) KeptShare() float64 {
	t := s.OffCPU + s.OutOfRangeTime
	if t == 0 {
		return 1
	}
	return float64(s.OffCPU) / float64(t)
}

// CompleteShare is the share of off-CPU time whose user stack reaches a
// thread-start frame, or -1 without user stacks.
func (s *Stats) CompleteShare() float64 {
	t := s.CompleteTime + s.TruncatedTime
	if t == 0 {
		return -1
	}
	return float64(s.CompleteTime) / float64(t)
}

// addCounters adds sign times o's running kernel counters to st.
func (st *Stats) addCounters(o *Stats, sign int) {
	add := func(dst *uint64, v uint64) {
		if sign > 0 {
			*dst += v
		} else {
			*dst -= min(v, *dst)
		}
	}
	addD := func(dst *time.Duration, v time.Duration) { *dst += time.Duration(sign) * v }
	add(&st.UserStackLost, o.UserStackLost)
	add(&st.KernelStackLost, o.KernelStackLost)
	add(&st.UserStackFault, o.UserStackFault)
	add(&st.AggFull, o.AggFull)
	addD(&st.AggFullTime, o.AggFullTime)
	add(&st.StartFull, o.StartFull)
	add(&st.NoStart, o.NoStart)
	add(&st.MissedSwitchIn, o.MissedSwitchIn)
	add(&st.OutOfRange, o.OutOfRange)
	addD(&st.OutOfRangeTime, o.OutOfRangeTime)
	add(&st.EventsLost, o.EventsLost)
	add(&st.StacksReused, o.StacksReused)
	add(&st.WakeFull, o.WakeFull)
	add(&st.WakerStackLost, o.WakerStackLost)
	add(&st.WakesReused, o.WakesReused)
	add(&st.IRQWakesReused, o.IRQWakesReused)
	add(&st.CPUFull, o.CPUFull)
	add(&st.ThreadCPUFull, o.ThreadCPUFull)
	add(&st.ForkUnwindFull, o.ForkUnwindFull)
	add(&st.StreamWaits, o.StreamWaits)
	add(&st.StreamLost, o.StreamLost)
	add(&st.SwitchMissed, o.SwitchMissed)
}

// add sums an interval into a whole recording's stats.
func (st *Stats) add(o *Stats) {
	st.Attach, st.ExactOnCPU = o.Attach, o.ExactOnCPU
	st.Duration += o.Duration
	st.Intervals += o.Intervals
	st.OffCPU += o.OffCPU
	st.RunQueue += o.RunQueue
	st.OnCPU += o.OnCPU
	st.OpenIntervals += o.OpenIntervals
	st.OpenTime += o.OpenTime
	st.Wakeups += o.Wakeups
	st.CPUSamples += o.CPUSamples
	st.CompleteStacks += o.CompleteStacks
	st.TruncatedStacks += o.TruncatedStacks
	st.CompleteTime += o.CompleteTime
	st.TruncatedTime += o.TruncatedTime
	st.StacksMissing = o.StacksMissing
	st.AggMoved += o.AggMoved
	st.Keys, st.Stacks, st.StacksMoved, st.Unwind = o.Keys, o.Stacks, o.StacksMoved, o.Unwind
	if o.ThreadContext != nil { // running totals
		st.ThreadContext = o.ThreadContext
	}
	for k, v := range o.WakeupsByClass {
		if st.WakeupsByClass == nil {
			st.WakeupsByClass = map[string]uint64{}
		}
		st.WakeupsByClass[k] += v
	}
	st.addCounters(o, 1)
}

// ThreadContextStats describes the OpenTelemetry thread context and the
// Go threads' labels read.
type ThreadContextStats = threadctx.Stats

// withSession is st, counted by a drain or by the cuts, with what the
// session itself knows: how it attached and loaded, its warnings, the
// programs' costs and the window's length.
func (st Stats) withSession(s Stats) Stats {
	st.Attach, st.CodeMaps, st.Warnings, st.Programs = s.Attach, s.CodeMaps, s.Warnings, s.Programs
	st.StartUp, st.Load = s.StartUp, s.Load
	st.Duration = s.Duration
	return st
}

// GoroutineStats describes the goroutine waits recorded.
type GoroutineStats = goroutines.Stats
