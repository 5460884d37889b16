// Package collector records off-CPU time with eBPF and turns it into pprof
// profiles and folded stacks.
//
// A Session loads the BPF programs of package bpf, attaches them to the
// scheduler tracepoints and aggregates blocked time in the kernel; Stop
// drains the maps and symbolizes the stacks:
//
//	s, err := collector.Start(ctx, collector.Options{PIDs: []int{pid}})
//	...
//	prof, err := s.Stop()
package collector

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unique"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/google/pprof/profile"
	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/bpf"
)

// Session is one recording. It is safe to call AddPID from any goroutine.
type Session struct {
	opts          Options
	coll          *ebpf.Collection
	links         []link.Link
	rd            *ringbuf.Reader
	procs         *procTable
	attach        string
	startWarnings []string // partial failures while starting (a tp_btf fallback)

	unw   *unwinder   // nil with FramePointersOnly
	gor   *goRecorder // nil without Options.Goroutines
	spill *stackSpill
	// Goroutines that run while recording; nil where not started.
	unwinding, spilling, flushing, folding *worker
	start                                  time.Time
	// flushIter: open intervals are flushed by the iter/task program
	// (tp_btf); otherwise read from the starts map.
	flushIter bool
	startMono uint64 // CLOCK_MONOTONIC ns when the probes were attached
	stopMono  uint64 // CLOCK_MONOTONIC ns when recording stopped
	bpfOn     io.Closer
	// Deferred walks: the threshold and its controller (--budget).
	budget    *budget
	budgetOn  io.Closer
	budgeting *worker

	readerDone chan struct{}
	// settled: closed for each settleEvents waiting when the reader has
	// handled all that the ring held (ringbuf.ErrFlushed).
	settleMu sync.Mutex
	settled  []chan struct{}
	// kernelMaps: code mappings come from the kernel's map events.
	kernelMaps bool
	// exited: names of threads that exited during the recording, moved
	// out of the threads map at their last switch-out.
	exitedMu sync.Mutex
	exited   map[[2]uint32]thread // by tid and incarnation
	stopOnce sync.Once
	prof     *profile.Profile
	wakeProf *profile.Profile
	offwake  *profile.Profile
	goProf   *profile.Profile
	cont     *continuous // Options.Continuous
	final    *Interval
	stats    Stats
	stopErr  error
}

// Stats describes a finished recording, losses included.
type Stats struct {
	Attach string `json:"attach"` // "tp_btf" or "tracepoint"
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
	Keys           int    `json:"keys"`   // distinct aggregation keys
	Stacks         int    `json:"stacks"` // distinct stacks
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
	JVM    JVMStats     `json:"jvm"` // HotSpot JVMs walked and named through their VMStructs
	// Goroutine waits of Go programs (Options.Goroutines); nil without.
	Goroutines *GoroutineStats `json:"goroutines,omitempty"`
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

// attachCPUSampling opens a CPU-clock perf event per online CPU at
// Options.CPUHz and runs the sampling program on each.
func (s *Session) attachCPUSampling() error {
	if s.opts.CPUHz == 0 {
		return nil
	}
	cpus, err := onlineCPUs()
	if err != nil {
		return err
	}
	for _, cpu := range cpus {
		attr := unix.PerfEventAttr{
			Type:   unix.PERF_TYPE_SOFTWARE,
			Config: unix.PERF_COUNT_SW_CPU_CLOCK,
			Size:   uint32(unsafe.Sizeof(unix.PerfEventAttr{})),
			Sample: uint64(s.opts.CPUHz),
			Bits:   unix.PerfBitFreq,
		}
		fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
		if err != nil {
			return fmt.Errorf("opening a CPU-clock perf event on CPU %d: %w (use --cpu-hz 0 to skip on-CPU samples)", cpu, err)
		}
		l, err := link.AttachRawLink(link.RawLinkOptions{Target: fd, Program: s.coll.Programs[bpf.OffcpuProgOffcpuCpuSample], Attach: ebpf.AttachPerfEvent})
		unix.Close(fd) // the link holds the event
		if err != nil {
			return fmt.Errorf("attaching the on-CPU sampler on CPU %d: %w", cpu, err)
		}
		s.links = append(s.links, l)
	}
	return nil
}

// onlineCPUs parses /sys/devices/system/cpu/online ("0-3,5").
func onlineCPUs() ([]int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return nil, fmt.Errorf("reading online CPUs: %w", err)
	}
	var cpus []int
	for _, part := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, found := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("parsing online CPUs %q: %w", b, err)
		}
		z := a
		if found {
			if z, err = strconv.Atoi(hi); err != nil {
				return nil, fmt.Errorf("parsing online CPUs %q: %w", b, err)
			}
		}
		for c := a; c <= z; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpus, nil
}

// kernelThreadSize is THREAD_SIZE: 16 KiB on x86-64, 32 KiB with KASAN.
func kernelThreadSize() uint64 {
	for _, path := range []string{"/proc/config.gz", "/boot/config-" + kernelRelease()} {
		if kasanEnabled(path) {
			return 32768
		}
	}
	return 16384
}

// Start loads and attaches the recorder. Recording runs until Stop; ctx
// bounds only the start-up.
func Start(ctx context.Context, o Options) (*Session, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	opts := o.withDefaults()
	cgroupID, err := checkTargets(opts)
	if err != nil {
		return nil, err
	}
	_ = rlimit.RemoveMemlock()

	s := &Session{opts: opts, procs: newProcTable(), readerDone: make(chan struct{}), exited: map[[2]uint32]thread{}}
	if opts.Continuous {
		s.cont = newContinuous()
	}
	if opts.NoDebugInfo {
		s.procs.files.DebugDir = ""
	}
	if err := s.loadEither(cgroupID); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		s.closeBPF()
		return nil, err
	}
	if s.cont != nil {
		if s.cont.agg, err = newAggMaps(s.coll); err != nil {
			s.closeBPF()
			return nil, err
		}
	}
	if opts.deferred() {
		if err := s.startBudget(); err != nil {
			s.closeBPF()
			return nil, err
		}
	}
	if opts.Stats {
		closer, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
		if err != nil {
			s.closeBPF()
			return nil, fmt.Errorf("enabling BPF run-time statistics: %w", err)
		}
		s.bpfOn = closer
	}
	if err := s.runIter(bpf.OffcpuProgOffcpuSnapBlocked); err != nil {
		// Costs only the user stacks of threads blocked since before the start.
		s.startWarnings = append(s.startWarnings, fmt.Sprintf("user stacks of threads blocked at the start not walked: %v", err))
	}
	rd, err := ringbuf.NewReader(s.coll.Maps[bpf.OffcpuMapProcEvents])
	if err != nil {
		s.closeBPF()
		return nil, fmt.Errorf("opening the process event ring buffer: %w", err)
	}
	s.rd = rd
	s.startWorkers()
	return s, nil
}

// checkTargets checks what a recording needs before anything is loaded:
// the targets, the privileges, the kernel's BTF; it resolves the cgroup.
func checkTargets(opts Options) (cgroupID uint64, err error) {
	for _, p := range opts.PIDs {
		if !processExists(p) {
			return 0, fmt.Errorf("pid %d not found: check the process is running (ps -p %d)", p, p)
		}
	}
	for _, t := range opts.TIDs {
		if !threadExists(t) {
			return 0, fmt.Errorf("thread %d not found: check the thread is running (ls /proc/*/task/%d)", t, t)
		}
	}
	if err := checkPrivileges(); err != nil {
		return 0, err
	}
	if _, err := os.Stat(vmlinuxBTF); err != nil {
		return 0, fmt.Errorf("kernel BTF not found at %s: use a kernel built with CONFIG_DEBUG_INFO_BTF=y", vmlinuxBTF)
	}
	if opts.Cgroup != "" {
		return cgroupIDOf(opts.Cgroup)
	}
	return 0, nil
}

// loadEither loads and attaches the tp_btf programs, or the classic
// tracepoint ones where those fail or are asked for.
func (s *Session) loadEither(cgroupID uint64) error {
	var err error
	if !s.opts.ForceTracepoint {
		if err = s.load(cgroupID, true); err != nil {
			s.closeBPF()
		}
	}
	if !s.opts.ForceTracepoint && err == nil {
		return nil
	}
	if s.opts.deferred() {
		return fmt.Errorf("--budget and --walk-threshold need the tp_btf programs and the sched_exit_tp tracepoint (Linux 6.16+): %w", err)
	}
	btfErr := err
	if btfErr != nil {
		s.startWarnings = append(s.startWarnings, fmt.Sprintf("tp_btf programs not loaded, using classic tracepoints: %v", btfErr))
	}
	if err = s.load(cgroupID, false); err != nil {
		s.closeBPF()
		if btfErr != nil && !errors.Is(err, errPermission) {
			return fmt.Errorf("%w (tp_btf failed first: %v)", err, btfErr)
		}
		return err
	}
	return nil
}

// startWorkers starts the goroutines that run while recording: process
// events, their flush, the stack spill and the unwind-table builders.
func (s *Session) startWorkers() {
	go s.readEvents()
	s.flushing = goWorker(s.flushEvents)
	s.spill = newStackSpill(s.coll, s.opts.StackEntries)
	if s.cont != nil {
		// An agent's wake-ups cost more than a later move: half the map is
		// free at each move, far more than a second of new stacks.
		s.spill.period = time.Second
	}
	s.spilling = goWorker(s.spill.run)
	if s.cont != nil {
		s.folding = goWorker(s.foldEvery)
	}
	if s.unw != nil {
		s.unwinding = goWorker(func(stop <-chan struct{}) {
			jvms := goWorker(s.unw.jvms.run)
			s.unw.run(s.procs, stop)
			jvms.halt()
		})
	}
}

// worker is a goroutine that runs until halted.
type worker struct{ stop, done chan struct{} }

func goWorker(fn func(stop <-chan struct{})) *worker {
	w := &worker{make(chan struct{}), make(chan struct{})}
	go func() {
		defer close(w.done)
		fn(w.stop)
	}()
	return w
}

// halt stops the goroutine and waits for it to return.
func (w *worker) halt() {
	if w != nil {
		close(w.stop)
		<-w.done
	}
}

// kernelHasFunc says whether the kernel's BTF has the function (a kfunc).
func kernelHasFunc(name string) bool {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return false
	}
	var fn *btf.Func
	return spec.TypeByName(name, &fn) == nil
}

// vmlinuxBTF is where the kernel publishes its BTF (a variable for tests).
var vmlinuxBTF = "/sys/kernel/btf/vmlinux"

var errPermission = errors.New("permission denied: run as root, or grant CAP_BPF, CAP_PERFMON and CAP_SYS_RESOURCE")

func checkPrivileges() error {
	if os.Geteuid() == 0 {
		return nil
	}
	var hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return errPermission
	}
	has := func(c uint) bool { return data[c/32].Effective&(1<<(c%32)) != 0 }
	if (has(unix.CAP_BPF) && has(unix.CAP_PERFMON)) || has(unix.CAP_SYS_ADMIN) {
		return nil
	}
	return errPermission
}

// The programs of each attach mode.
var (
	// The wake-up first: a thread blocked since before the start and woken
	// as the switch program attaches has its wait for a CPU split off.
	btfProgs = []string{bpf.OffcpuProgOffcpuSwitch, bpf.OffcpuProgOffcpuFork, bpf.OffcpuProgOffcpuExec, bpf.OffcpuProgOffcpuRename, bpf.OffcpuProgOffcpuWaking}
	tpProgs  = []string{bpf.OffcpuProgOffcpuSwitchTp, bpf.OffcpuProgOffcpuForkTp, bpf.OffcpuProgOffcpuRenameTp, bpf.OffcpuProgOffcpuWakingTp}
)

// load creates the maps and programs for one attach mode and attaches them.
func (s *Session) load(cgroupID uint64, btfMode bool) error {
	spec, err := s.spec(cgroupID, btfMode)
	if err != nil {
		return err
	}
	if err := s.newCollection(spec); err != nil {
		return err
	}
	if err := s.prepare(); err != nil {
		return err
	}
	if btfMode {
		return s.attachBTF()
	}
	return s.attachTracepoints()
}

// spec is the BPF object set up for the options and the attach mode.
func (s *Session) spec(cgroupID uint64, btfMode bool) (*ebpf.CollectionSpec, error) {
	spec, err := bpf.LoadOffcpu()
	if err != nil {
		return nil, fmt.Errorf("reading the embedded BPF object: %w", err)
	}
	o := s.opts
	set := func(name string, v any) error {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("BPF object has no variable %s", name)
		}
		return vs.Set(v)
	}
	maxNs := uint64(1<<64 - 1)
	if o.MaxBlock > 0 {
		maxNs = uint64(o.MaxBlock)
	}
	// Code mappings from the kernel need bpf_find_vma (Linux 5.17+); with
	// want_maps off the verifier skips the call as dead code.
	wantMaps := !o.NoUserStacks && features.HaveProgramHelper(ebpf.TracePoint, asm.FnFindVma) == nil
	for name, v := range map[string]any{
		bpf.OffcpuVarFilterTgid:        len(o.PIDs) > 0 || o.TargetsOnly,
		bpf.OffcpuVarFilterTid:         len(o.TIDs) > 0,
		bpf.OffcpuVarFilterCgroup:      cgroupID,
		bpf.OffcpuVarFollowForks:       o.FollowForks,
		bpf.OffcpuVarMinBlockNs:        uint64(o.MinBlock),
		bpf.OffcpuVarMaxBlockNs:        maxNs,
		bpf.OffcpuVarStateMask:         o.StateMask,
		bpf.OffcpuVarUserThreadsOnly:   o.UserThreadsOnly,
		bpf.OffcpuVarKernelThreadsOnly: o.KernelThreadsOnly,
		bpf.OffcpuVarWantKernelStacks:  !o.NoKernelStacks,
		bpf.OffcpuVarWantUserStacks:    !o.NoUserStacks,
		bpf.OffcpuVarReuseStacks:       !o.NoStackReuse,
		bpf.OffcpuVarWantWakeups:       !o.NoWakeups,
		bpf.OffcpuVarThreadSize:        kernelThreadSize(),
		bpf.OffcpuVarWantUnwind:        !o.FramePointersOnly,
		bpf.OffcpuVarWantMaps:          wantMaps,
		bpf.OffcpuVarDeferredWalks:     o.deferred() && btfMode,
	} {
		if err := set(name, v); err != nil {
			return nil, fmt.Errorf("setting %s: %w", name, err)
		}
	}
	sizeMaps(spec, o)
	// The exec program reports the new program's mappings only where the
	// kernel has the VMA iterator (Linux 6.7+); elsewhere execs are read
	// from /proc.
	s.kernelMaps = wantMaps && btfMode && kernelHasFunc("bpf_iter_task_vma_new")
	if !o.deferred() || !btfMode {
		delete(spec.Programs, bpf.OffcpuProgOffcpuSwitchedIn)
	}
	if !s.kernelMaps {
		delete(spec.Programs, bpf.OffcpuProgOffcpuDlState)
	}
	if btfMode {
		for _, p := range tpProgs {
			delete(spec.Programs, p)
		}
		s.flushIter = true
		delete(spec.Maps, bpf.OffcpuMapStarts)
		delete(spec.Maps, bpf.OffcpuMapLastWaker)
		s.attach = "tp_btf"
	} else {
		for _, p := range btfProgs {
			delete(spec.Programs, p)
		}
		delete(spec.Programs, bpf.OffcpuProgOffcpuFlushOpen)
		delete(spec.Programs, bpf.OffcpuProgOffcpuSnapBlocked)
		delete(spec.Programs, bpf.OffcpuProgOffcpuSnapOncpu)
		delete(spec.Programs, bpf.OffcpuProgOffcpuLiveStacks)
		delete(spec.Maps, bpf.OffcpuMapTaskStarts)
		delete(spec.Maps, bpf.OffcpuMapThreadCpus)
		delete(spec.Maps, bpf.OffcpuMapTaskWaits)
		s.attach = "tracepoint"
	}
	return spec, nil
}

// sizeMaps sizes the maps from the options.
func sizeMaps(spec *ebpf.CollectionSpec, o Options) {
	spec.Maps[bpf.OffcpuMapStarts].MaxEntries = uint32(o.MaxThreads)
	spec.Maps[bpf.OffcpuMapThreads].MaxEntries = uint32(o.MaxThreads)
	spec.Maps[bpf.OffcpuMapThreadCpus].MaxEntries = uint32(o.MaxThreads)
	spec.Maps[bpf.OffcpuMapStacks].MaxEntries = uint32(o.StackEntries)
	spec.Maps[bpf.OffcpuMapOffcpu].MaxEntries = uint32(o.AggEntries)
	spec.Maps[bpf.OffcpuMapOffcpuMaps].InnerMap.MaxEntries = uint32(o.AggEntries)
	spec.Maps[bpf.OffcpuMapWakeups].MaxEntries = uint32(o.AggEntries)
	spec.Maps[bpf.OffcpuMapCpuSamples].MaxEntries = uint32(o.AggEntries)
	spec.Maps[bpf.OffcpuMapLastWaker].MaxEntries = uint32(o.MaxThreads)
	spec.Maps[bpf.OffcpuMapBlockedUstacks].MaxEntries = uint32(o.MaxThreads)
	spec.Maps[bpf.OffcpuMapBlockedRd].MaxEntries = uint32(o.MaxThreads)
	if !o.FramePointersOnly {
		spec.Maps[bpf.OffcpuMapUnwindRows].MaxEntries = uint32(o.UnwindRows)
		spec.Maps[bpf.OffcpuMapUnwindProcs].MaxEntries = MaxUnwindProcs
	}
}

// newCollection loads the maps and programs, turning the kernel's
// refusals into errors that say what to do.
func (s *Session) newCollection(spec *ebpf.CollectionSpec) error {
	coll, err := ebpf.NewCollection(spec)
	if err != nil {
		// The verifier answers EACCES too: look at its log first.
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			if os.Getenv("OFFCPU_VERIFIER_LOG") != "" {
				fmt.Fprintf(os.Stderr, "%+v\n", ve)
			}
			return fmt.Errorf("the kernel rejected the %s programs: %v", s.attach, ve)
		}
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			return errPermission
		}
		return fmt.Errorf("creating BPF maps and programs (%s): %w; if a map is too large, lower --max-threads, --stack-entries or --agg-entries", s.attach, err)
	}
	s.coll = coll
	return nil
}

// prepare snapshots the processes whose mappings must be known before
// the probes attach, fills the target maps and opens the window.
func (s *Session) prepare() error {
	o, coll := s.opts, s.coll
	// Mappings, and with them unwind tables, before the probes attach:
	// the first sleeps walk whole. With tables: system-wide, every
	// process already running; otherwise also this process, whose C
	// library and loader are most likely what a command started later
	// maps too.
	pids := o.PIDs
	if !o.FramePointersOnly {
		s.unw = newUnwinder(coll, uint32(o.UnwindRows))
		s.unw.jvms = newJVMTracker(s.unw, coll.Maps[bpf.OffcpuMapJavaMethods], coll.Maps[bpf.OffcpuMapJavaProcs])
		s.procs.onChange = s.unw.update
		pids = append([]int{os.Getpid()}, o.PIDs...)
		if len(o.PIDs) == 0 && len(o.TIDs) == 0 && !o.TargetsOnly {
			pids = allProcesses()
		}
	}
	for _, p := range pids {
		s.procs.snapshot(uint32(p))
	}
	if s.unw != nil {
		s.unw.jvms.now()
	}
	if o.Goroutines && s.gor == nil {
		gor, err := newGoRecorder(o.MaxGoroutines)
		if err != nil {
			return err
		}
		s.gor = gor
	}
	if err := s.fillTargets(); err != nil {
		return err
	}
	// The window opens before the first probe attaches, so that no
	// interval it counts began before it.
	if err := s.markWindowStart(); err != nil {
		return err
	}
	if err := s.attachCPUSampling(); err != nil {
		return err
	}
	return nil
}

func (s *Session) attachBTF() error {
	o, coll := s.opts, s.coll
	if o.deferred() {
		// Before the switch program, which hands it the walks.
		l, err := link.AttachTracing(link.TracingOptions{Program: coll.Programs[bpf.OffcpuProgOffcpuSwitchedIn], AttachType: ebpf.AttachTraceRawTp})
		if err != nil {
			return fmt.Errorf("attaching to sched_exit_tp (Linux 6.16+), where deferred walks happen: %w", err)
		}
		s.links = append(s.links, l)
	}
	for _, name := range btfProgs {
		if name == bpf.OffcpuProgOffcpuWaking && o.NoWakeups {
			continue
		}
		l, err := link.AttachTracing(link.TracingOptions{Program: coll.Programs[name], AttachType: ebpf.AttachTraceRawTp})
		if err != nil {
			if name == bpf.OffcpuProgOffcpuRename || name == bpf.OffcpuProgOffcpuExec {
				if name == bpf.OffcpuProgOffcpuExec {
					s.kernelMaps = false
				}
				continue // optional: names and exec snapshots are also read from /proc
			}
			return fmt.Errorf("attaching %s (tp_btf): %w", name, err)
		}
		s.links = append(s.links, l)
	}
	if !s.attachMmap() {
		s.kernelMaps = false
	}
	if s.kernelMaps && s.unw != nil {
		s.unw.rescan = false // every code mapping is reported as it is made
	}
	return nil
}

func (s *Session) attachTracepoints() error {
	if err := ensureTracefs(); err != nil {
		return err
	}
	for _, tp := range []struct{ prog, group, name string }{
		{bpf.OffcpuProgOffcpuSwitchTp, "sched", "sched_switch"},
		{bpf.OffcpuProgOffcpuForkTp, "sched", "sched_process_fork"},
		{bpf.OffcpuProgOffcpuRenameTp, "task", "task_rename"},
		{bpf.OffcpuProgOffcpuWakingTp, "sched", "sched_waking"},
	} {
		if tp.prog == bpf.OffcpuProgOffcpuWakingTp && s.opts.NoWakeups {
			continue
		}
		l, err := link.Tracepoint(tp.group, tp.name, s.coll.Programs[tp.prog], nil)
		if err != nil {
			return fmt.Errorf("attaching tracepoint %s:%s: %w", tp.group, tp.name, err)
		}
		s.links = append(s.links, l)
	}
	s.attachMmap()
	return nil
}

// attachMmap follows the code the targets map so that a library's unwind
// table is loaded and its mapping known as soon as the dynamic loader
// maps it: by a uprobe on the loader's debugger hook where the kernel
// walks mappings (attachLoaders), else by the mmap syscall tracepoints.
// Optional: without either, mappings are re-read on a timer only.
func (s *Session) attachMmap() bool {
	if s.attachLoaders() {
		s.stats.CodeMaps = "loader"
		return true
	}
	enter, exit := s.coll.Programs[bpf.OffcpuProgOffcpuMmapEnter], s.coll.Programs[bpf.OffcpuProgOffcpuMmapExit]
	if enter == nil || exit == nil || ensureTracefs() != nil {
		return false
	}
	le, err := link.Tracepoint("syscalls", "sys_enter_mmap", enter, nil)
	if err != nil {
		return false
	}
	lx, err := link.Tracepoint("syscalls", "sys_exit_mmap", exit, nil)
	if err != nil {
		le.Close()
		return false
	}
	s.links = append(s.links, le, lx)
	s.stats.CodeMaps = "mmap"
	return true
}

// allProcesses lists the processes running now (none if /proc cannot be
// read: they are then taken as they show up).
func allProcesses() []int {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return nil
	}
	procs, err := fs.AllProcs()
	if err != nil {
		return nil
	}
	var pids []int
	for _, p := range procs {
		pids = append(pids, p.PID)
	}
	return pids
}

func ensureTracefs() error {
	for _, d := range []string{"/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events"} {
		if _, err := os.Stat(d); err == nil {
			return nil
		}
	}
	if err := unix.Mount("nodev", "/sys/kernel/tracing", "tracefs", 0, ""); err != nil {
		return fmt.Errorf("tracefs is not mounted and mounting it failed (%v): run mount -t tracefs nodev /sys/kernel/tracing", err)
	}
	return nil
}

func (s *Session) fillTargets() error {
	one := uint8(1)
	for _, p := range s.opts.PIDs {
		if err := s.coll.Maps[bpf.OffcpuMapTargetTgids].Put(uint32(p), one); err != nil {
			return fmt.Errorf("adding pid %d to the filter: %w", p, err)
		}
	}
	for _, t := range s.opts.TIDs {
		if err := s.coll.Maps[bpf.OffcpuMapTargetTids].Put(uint32(t), one); err != nil {
			return fmt.Errorf("adding tid %d to the filter: %w", t, err)
		}
	}
	if s.gor != nil {
		for _, p := range s.opts.PIDs {
			s.gor.add(uint32(p))
		}
	}
	return nil
}

// AddPID adds a process to the recorded set (Options.TargetsOnly or PIDs
// must have been given) and snapshots its mappings.
func (s *Session) AddPID(pid int) error {
	if len(s.opts.PIDs) == 0 && !s.opts.TargetsOnly {
		return fmt.Errorf("AddPID needs a session started with PIDs or TargetsOnly")
	}
	if err := s.coll.Maps[bpf.OffcpuMapTargetTgids].Put(uint32(pid), uint8(1)); err != nil {
		return fmt.Errorf("adding pid %d to the filter: %w", pid, err)
	}
	s.procs.snapshot(uint32(pid))
	if s.gor != nil {
		s.gor.add(uint32(pid))
	}
	return nil
}

// flushEvents hands the reader what is queued every 50 ms: most events
// do not wake it (the ones the unwinder needs at once do).
func (s *Session) flushEvents(stop <-chan struct{}) {
	every := 50 * time.Millisecond
	if s.cont != nil {
		// An agent's wake-ups count more than its latency; the events the
		// unwinder needs at once wake the reader themselves.
		every = time.Second
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			if s.rd.AvailableBytes() > 0 {
				s.rd.Flush()
			}
		}
	}
}

func (s *Session) readEvents() {
	defer close(s.readerDone)
	for {
		rec, err := s.rd.Read()
		if errors.Is(err, ringbuf.ErrFlushed) {
			// The ring was empty and every record before handled.
			s.settleMu.Lock()
			for _, c := range s.settled {
				close(c)
			}
			s.settled = nil
			s.settleMu.Unlock()
			continue
		}
		if err != nil {
			return // closed
		}
		s.procEvent(rec.RawSample)
	}
}

// Process event kinds (enum proc_event_kind).
const (
	evSeen = iota
	evExec
	evFork
	evExit
	evThreadExit
	evMap
	evReread
)

func (s *Session) procEvent(raw []byte) {
	if len(raw) < 4 {
		return
	}
	switch binary.NativeEndian.Uint32(raw) {
	case evMap:
		var ev bpf.OffcpuMapEvent
		if _, err := binary.Decode(raw, binary.NativeEndian, &ev); err != nil {
			return
		}
		s.procs.addMapping(ev.Tgid, kernelMapping(&ev, s.procs))
		return
	}
	var ev bpf.OffcpuProcEvent
	if _, err := binary.Decode(raw, binary.NativeEndian, &ev); err != nil {
		return
	}
	switch ev.Kind {
	case evSeen:
		if !s.kernelMaps || !s.procs.known(ev.Tgid) {
			s.procs.snapshot(ev.Tgid)
		}
	case evReread:
		s.procs.snapshot(ev.Tgid)
	case evExec:
		if s.unw != nil {
			s.unw.exec(ev.Tgid)
		}
		s.procs.exec(ev.Tgid)
		if !s.kernelMaps {
			s.procs.snapshot(ev.Tgid)
		}
		if s.gor != nil { // a target that runs a Go program now
			s.gor.add(ev.Tgid)
		}
	case evFork:
		s.procs.fork(ev.Tgid, ev.Parent)
	case evExit:
		if s.unw != nil {
			s.unw.forget(ev.Tgid)
		}
		if s.gor != nil {
			s.gor.exit(ev.Tgid)
		}
		if s.cont != nil {
			s.exitedMu.Lock()
			s.cont.deadProcs[ev.Tgid] = true
			s.exitedMu.Unlock()
		}
	case evThreadExit:
		s.exitedMu.Lock()
		s.exited[[2]uint32{ev.Tid, ev.Gen}] = thread{tgid: ev.Tgid, gen: ev.Gen, comm: cString(ev.Comm[:]), exited: true}
		s.exitedMu.Unlock()
	}
}

// kernelMapping turns a map event into a mapping, opening its file.
func kernelMapping(ev *bpf.OffcpuMapEvent, procs *procTable) mapping {
	names := make([]string, 0, ev.Depth)
	for i := int(min(ev.Depth, uint32(len(ev.Names)))) - 1; i >= 0; i-- {
		names = append(names, cString(ev.Names[i][:]))
	}
	// One copy of each path however many processes map it (a churn of
	// short-lived processes maps the same few files thousands of times).
	path := unique.Make("/" + strings.Join(names, "/")).Value()
	dev := unix.Mkdev(ev.Dev>>20, ev.Dev&0xfffff)
	m := mapping{start: ev.Start, end: ev.End, offset: ev.Offset, path: path}
	m.file = procs.kernelFile(ev.Tgid, dev, ev.Ino, path)
	return m
}

// closeLinks detaches every probe.
func (s *Session) closeLinks() {
	for _, l := range s.links {
		l.Close()
	}
	s.links = nil
}

func (s *Session) closeBPF() {
	s.stopBudget()
	s.closeLinks()
	if s.gor != nil {
		s.gor.close()
		s.gor = nil
	}
	if s.coll != nil {
		s.coll.Close()
		s.coll = nil
	}
	if s.cont != nil {
		s.cont.agg.close()
	}
}

// Stop ends the recording, drains the kernel maps and returns the
// symbolized profile. It may be called more than once.
func (s *Session) Stop() (*profile.Profile, error) {
	s.stopOnce.Do(func() {
		s.stats.Attach = s.attach
		s.stats.Warnings = append(s.stats.Warnings, s.startWarnings...)
		// The window ends here: the programs account nothing after it and
		// the open intervals are flushed up to it.
		s.stopMono = monotonicNow()
		s.stats.Duration = time.Duration(s.stopMono - s.startMono)
		if v, ok := s.coll.Variables[bpf.OffcpuVarRecStopNs]; ok {
			if err := v.Set(s.stopMono); err != nil {
				s.stats.Warnings = append(s.stats.Warnings, fmt.Sprintf("closing the window: %v", err))
			}
		}
		if s.gor != nil {
			if err := s.gor.setWindow(false, s.stopMono); err != nil {
				s.stats.Warnings = append(s.stats.Warnings, fmt.Sprintf("closing the goroutines' window: %v", err))
			}
		}
		s.stopBudget()
		if s.flushIter && s.opts.deferred() {
			// The user stacks of the intervals still open, walked nowhere else.
			if err := s.runIter(bpf.OffcpuProgOffcpuSnapBlocked); err != nil {
				s.stats.Warnings = append(s.stats.Warnings, fmt.Sprintf("user stacks of threads blocked at the end not walked: %v", err))
			}
		}
		if s.flushIter {
			// A failure here costs only the open intervals: keep going.
			if err := s.flushOpen(); err != nil {
				s.stats.Warnings = append(s.stats.Warnings, fmt.Sprintf("open intervals not counted: %v", err))
			}
		}
		s.unwinding.halt()
		s.folding.halt()
		if s.spilling != nil {
			s.spilling.halt()
			s.stats.StacksMoved = s.spill.count()
		}
		// Detach first so that the maps no longer change while drained.
		s.closeLinks()
		if s.gor != nil {
			s.gor.detach()
		}
		if s.unw != nil && s.unw.jvms != nil {
			s.unw.jvms.final()
			s.stats.JVM = s.unw.jvms.snapshotStats()
		}
		s.stats.SwitchMissed = s.switchMisses()
		if s.opts.Stats {
			s.stats.Programs = s.programStats()
			s.bpfOn.Close()
		}
		s.flushing.halt()
		s.rd.Flush() // the last events are read before the reader closes
		for i := 0; i < 100 && s.rd.AvailableBytes() > 0; i++ {
			time.Sleep(2 * time.Millisecond)
		}
		s.rd.Close()
		<-s.readerDone
		if s.cont != nil {
			s.stopContinuous()
		} else if d, err := s.drain(true); err != nil {
			s.stopErr = err
		} else {
			s.prof, s.wakeProf, s.offwake, s.stopErr = s.buildProfiles(d)
		}
		if s.gor != nil && s.stopErr == nil {
			waits, stacks := s.gor.drain(s.startMono, s.stopMono)
			s.stats.Goroutines = &s.gor.stats
			s.goProf, s.stopErr = s.gor.profile(newSymbolizer(s.procs), waits, stacks, s.start, s.stats.Duration)
		}
		s.closeBPF()
		s.procs.close()
	})
	return s.prof, s.stopErr
}

// stopContinuous cuts the last interval; the session's stats become the
// sum of its intervals.
func (s *Session) stopContinuous() {
	s.final, s.stopErr = s.cut(true)
	if s.final != nil {
		s.prof, s.wakeProf = s.final.Profile, s.final.Wakeups
	}
	kept := s.stats
	s.stats = s.cont.total
	s.stats.Attach, s.stats.CodeMaps, s.stats.Warnings, s.stats.Programs = kept.Attach, kept.CodeMaps, kept.Warnings, kept.Programs
	s.stats.Duration = kept.Duration
}

// Wakeups returns, after Stop, the wake-up profile: waker stacks with
// sample types wakeups/count and off_cpu/nanoseconds (the blocked time
// those wake-ups ended), labelled with the woken thread. Nil with
// NoWakeups.
func (s *Session) Wakeups() *profile.Profile { return s.wakeProf }

// Offwake returns, after Stop, each blocked stack with the waker stack
// that ended it, as bcc offwaketime shows them: frames root first are
// the blocked thread, its stack, "--", the waker stack leaf first and the
// waker thread. Nil with NoWakeups.
func (s *Session) Offwake() *profile.Profile { return s.offwake }

// Goroutines returns, after Stop, the goroutine waits of the Go programs
// recorded (sample types goroutine_blocked, goroutine_runqueue,
// goroutine_waits, waker_waiting); nil without Options.Goroutines.
func (s *Session) Goroutines() *profile.Profile { return s.goProf }

// markWindowStart tells the programs when the recorded window began, for
// threads blocked since before it.
func (s *Session) markWindowStart() error {
	s.startMono, s.start = monotonicNow(), time.Now()
	if s.gor != nil {
		if err := s.gor.setWindow(true, s.startMono); err != nil {
			return fmt.Errorf("setting the start of the goroutines' window: %w", err)
		}
	}
	v, ok := s.coll.Variables[bpf.OffcpuVarRecStartNs]
	if !ok {
		return nil // classic tracepoints: not used
	}
	if err := v.Set(s.startMono); err != nil {
		return fmt.Errorf("setting the start of the recorded window: %w", err)
	}
	return nil
}

// flushOpen runs the iter/task program once: every thread still off-CPU
// gets its interval so far accounted, flagged open.
func (s *Session) flushOpen() error { return s.runIter(bpf.OffcpuProgOffcpuFlushOpen) }

// runIter runs a task iterator program once over every task; absent in
// classic-tracepoint mode.
func (s *Session) runIter(name string) error { return s.readIter(name, io.Discard) }

// readIter runs a task iterator program and copies what it writes to w.
func (s *Session) readIter(name string, w io.Writer) error {
	prog := s.coll.Programs[name]
	if prog == nil {
		return nil
	}
	it, err := link.AttachIter(link.IterOptions{Program: prog})
	if err != nil {
		return fmt.Errorf("attaching %s: %w", name, err)
	}
	defer it.Close()
	rd, err := it.Open()
	if err != nil {
		return fmt.Errorf("running %s: %w", name, err)
	}
	defer rd.Close()
	_, err = io.Copy(w, rd)
	return err
}

func (s *Session) Stats() Stats { return s.stats }

// switchMisses counts the sched_switch events the kernel did not run the
// recorder's program for (recursion_misses: another BPF program, or a
// bpf() syscall of user space, held the CPU's BPF guard). Each costs a
// switch-out or switch-in, so an interval.
func (s *Session) switchMisses() uint64 {
	var n uint64
	for _, name := range []string{bpf.OffcpuProgOffcpuSwitch, bpf.OffcpuProgOffcpuSwitchTp} {
		if p := s.coll.Programs[name]; p != nil {
			if st, err := p.Stats(); err == nil {
				n += st.RecursionMisses
			}
		}
	}
	return n
}

func (s *Session) programStats() []ProgramStat {
	var out []ProgramStat
	for name, p := range s.coll.Programs {
		st, err := p.Stats()
		if err != nil {
			continue
		}
		ps := ProgramStat{Name: name, Runs: st.RunCount, Runtime: st.Runtime}
		if st.RunCount > 0 {
			ps.MeanCost = st.Runtime / time.Duration(st.RunCount)
		}
		out = append(out, ps)
	}
	return out
}

// monotonicNow is CLOCK_MONOTONIC in ns, the clock of bpf_ktime_get_ns.
func monotonicNow() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}
