// Package schema names what offcpu's profiles and run directories hold, in
// one place for the packages that write them (collector, bench) and those
// that read them back (analysis, flamegraph, cmd).
package schema

// Sample types (pprof ValueType.Type) and their units.
const (
	OffCPU   = "off_cpu"  // nanoseconds off a CPU
	Switches = "switches" // count of off-CPU intervals
	CPU      = "cpu"      // nanoseconds on a CPU (samples scaled to the exact time)
	Wakeups  = "wakeups"  // count of wake-ups
	// Off-CPU time split at the wake-up: blocked (switch-out to the
	// wake-up) and waiting for a CPU (the wake-up to the switch-in, or all
	// of a preempted interval); off_cpu = blocked + runqueue.
	Blocked  = "blocked"
	RunQueue = "runqueue"
	// Of blocked, the time the waker was itself off a CPU in its own
	// wait (label waker_wait_stack): one hop of a wait chain.
	WakerWaiting = "waker_waiting"
	// Goroutines (Go programs): time from a goroutine's park to being
	// made runnable, then to running again; and the waits counted.
	GoroutineBlocked  = "goroutine_blocked"
	GoroutineRunQueue = "goroutine_runqueue"
	GoroutineWaits    = "goroutine_waits"

	Nanoseconds = "nanoseconds"
	Count       = "count"
)

// Wake-up classes (label wakeup_class): what the waker's kernel path was.
const (
	// A thread's wake-up.
	WakeEventfd    = "eventfd"
	WakeFutex      = "futex"
	WakeTimer      = "timer" // also an interrupt's: a timer expired
	WakePipeSocket = "pipe/socket"
	WakeOther      = "other"
	// An interrupt's.
	WakeBlockIO = "block-io"  // block I/O completion
	WakeNetRx   = "net-rx"    // network receive
	WakeIPI     = "ipi"       // another CPU's request (function call, irq work)
	WakeIRQ     = "irq-other" // any other interrupt
)

// Waker names of interrupt context (label waker).
const (
	WakerInterrupt = "[interrupt]"
	WakerSoftirq   = "[softirq]"
)

// Sample label keys.
const (
	LabelThread      = "thread"        // thread name
	LabelProcess     = "process"       // process name
	LabelState       = "state"         // sleeping, uninterruptible, preempted, other
	LabelTID         = "tid"           // numeric
	LabelPID         = "pid"           // numeric
	LabelWaker       = "waker"         // waker thread name, [interrupt] or [softirq]
	LabelWakerTID    = "waker_tid"     // numeric
	LabelWakeupClass = "wakeup_class"  // eventfd, futex, pipe/socket, timer, other
	LabelTarget      = "target_thread" // wake-ups: the woken thread
	LabelTargetTID   = "target_tid"    // numeric
	// wake-ups: the woken thread's process, by name and id (numeric).
	LabelTargetProcess = "target_process"
	LabelTargetPID     = "target_pid"
	LabelInterval      = "interval" // open, before-start, whole (threads and goroutines)
	// LabelFolded "exited": the sample merges those of exited processes
	// of one command (no pid or tid labels; Options.ExitedDetail).
	LabelFolded = "folded"
	// The waker of an off-CPU interval: its process (numeric) and its
	// stack, folded (user frames root first, "-", kernel frames), so that
	// a verdict can read what the waker was doing (a lock release, a
	// hand-off of work, an I/O completion).
	LabelWakerPID     = "waker_pid"
	LabelWakerStack   = "waker_stack"
	LabelWakerProcess = "waker_process" // the waker's process name
	// The waker's own wait that overlapped the interval (user frames root
	// first, "-", kernel frames), when waker_waiting is not 0.
	LabelWakerWaitStack = "waker_wait_stack"
	// Goroutine waits: the goroutine (numeric; -1: waits merged without
	// their ids, more goroutines than the recorder aggregates), its wait reason as the Go
	// runtime names it ("chan receive", "sync.Mutex.Lock", "IO wait"), and
	// the goroutine that made it runnable (numeric; 0: the scheduler, for
	// network polls and timers); waker_stack is that goroutine's stack.
	LabelGoid      = "goid"
	LabelReason    = "reason"
	LabelWakerGoid = "waker_goid"
	// The function whose go statement created the goroutine (the
	// runtime's g.gopc), where the recorder can read it.
	LabelGoCreator = "go_creator"
	// The function the goroutine runs (g.startpc), where the recorder can
	// read it and it is not a go statement's wrapper.
	LabelGoStart = "go_start"
	// A CPython thread's wait for the GIL: "1"; the thread that held the
	// GIL when the wait began (its name; numeric: its tid) and that
	// thread's Python stack then (root first, as a folded stack).
	LabelGIL            = "gil"
	ReasonGIL           = "gil" // schema.Stack.Reason of a GIL wait
	LabelGILHolder      = "gil_holder"
	LabelGILHolderTID   = "gil_holder_tid"
	LabelGILHolderStack = "gil_holder_stack"
)

// OnCPUUnsampled is the frame of on-CPU time no sample fell in (a thread
// that ran less than a sampling period, or sampling off): the thread's
// exact time is in the profile all the same.
const OnCPUUnsampled = "[on-CPU: not sampled]"

// OffCPUNotWalked is the frame of a thread's off-CPU time below the walk
// threshold (--budget, --walk-threshold) when none of those intervals was
// drawn for a walk: the time is exact, its stacks unknown.
const OffCPUNotWalked = "[off-CPU: below the walk threshold, not walked]"

// Files of a run directory (offcpu bench runs/NAME/).
const (
	MetricsFile       = "metrics.json"            // the run's metrics, a JSON object
	RunInfoFile       = "run.json"                // profiled, failed, error
	RunLogFile        = "run.log"                 // the run's output
	ProfileFile       = "offcpu.pb.gz"            // off-CPU and on-CPU samples
	WakeupsFile       = "offcpu.wakeups.pb.gz"    // wake-ups
	GoroutinesFile    = "offcpu.goroutines.pb.gz" // goroutine waits (Go programs)
	FoldedFile        = "offcpu.folded"           // off-CPU folded stacks (µs)
	WakeupsFoldedFile = "wakeups.folded"
	RecordStatsFile   = "record-stats.json" // the recorder's counters and losses
)

// RunProfiles are the profiles a run directory may hold, in reading order.
var RunProfiles = []string{ProfileFile, WakeupsFile}

// Metrics every run's metrics file may carry, whatever the workload:
// the messages it moved (for wake-ups per message), and what offcpu bench
// adds, its wall-clock and CPU time.
const (
	MetricMessages = "published"
	MetricWall     = "wall_s"
	MetricCPU      = "cpu_s"
	// MetricKeyOrder: a list of the file's metric names a diff compares
	// first, in that order; MetricNotCompared: its counts that are not
	// measurements (never compared).
	MetricKeyOrder    = "key_metrics"
	MetricNotCompared = "not_compared"
)
