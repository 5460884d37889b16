// Package collector records off-CPU time with eBPF and turns it into pprof
// profiles and folded stacks.
//
// A Session runs the recorder by stage: probes.go loads and attaches the
// BPF programs of package bpf (which aggregate blocked time in the
// kernel); events.go reads their event ring beside the process table
// while recording; drain.go reads the maps into a recording; build.go
// symbolizes a recording (package symbolize) into Profiles. Continuous
// mode (continuous.go) cuts intervals with the same stages.
//
//	s, err := collector.Start(ctx, collector.Options{PIDs: []int{pid}})
//	...
//	prof, err := s.Stop()
//	wakeups := s.Profiles().Wakeups
package collector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/rlimit"
	"github.com/google/pprof/profile"
	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/budget"
	"github.com/offcpu/offcpu/collector/goroutines"
	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/threadctx"
	"github.com/offcpu/offcpu/kernel"
	"github.com/offcpu/offcpu/runtimes"
	"github.com/offcpu/offcpu/runtimes/registry"
	"github.com/offcpu/offcpu/schema"
)

// Session is one recording. It runs the stages in turn: probes (loaded
// and attached), the event reader beside the process table while
// recording, a drainer that reads the maps into a recording, and build,
// which symbolizes it into Profiles. It is safe to call AddPID from any
// goroutine.
type Session struct {
	opts   Options
	p      *probes
	events *eventReader
	procs  *symbolize.Procs
	unw    *unwinder            // nil with FramePointersOnly
	gor    *goroutines.Recorder // nil without Options.Goroutines
	tctx   *threadctx.Tracker
	parts  parts         // those of the three above the session has
	stream *streamReader // nil without Options.Stream
	spill  *stackSpill
	cont   *continuous
	bpfOn  io.Closer // Options.Stats
	// Goroutines that run while recording; nil where not started.
	unwinding, spilling, flushing, folding *worker

	start     time.Time
	startMono uint64 // CLOCK_MONOTONIC ns when the window opened
	stopMono  uint64 // CLOCK_MONOTONIC ns when recording stopped

	stopOnce sync.Once
	profiles Profiles
	final    *Interval
	stats    Stats
	stopErr  error
}

// Profiles are what a recording gives.
type Profiles struct {
	// OffCPU: blocked stacks with off-CPU time, run-queue time and on-CPU
	// samples, labelled with thread, state, waker and cause.
	OffCPU *profile.Profile
	// Wakeups: waker stacks with sample types wakeups/count and
	// off_cpu/nanoseconds (the blocked time those wake-ups ended),
	// labelled with the woken thread. Nil with NoWakeups.
	Wakeups *profile.Profile
	// Offwake: each blocked stack with the waker stack that ended it, as
	// bcc offwaketime shows them: frames root first are the blocked
	// thread, its stack, "--", the waker stack leaf first and the waker
	// thread. Nil with NoWakeups or NoOffwake.
	Offwake *profile.Profile
	// Goroutines: the goroutine waits of the Go programs recorded (sample
	// types goroutine_blocked, goroutine_runqueue, goroutine_waits,
	// waker_waiting); nil without Options.Goroutines.
	Goroutines *profile.Profile
	// Timeline: every wait in order; nil without Options.Stream.
	Timeline *schema.Timeline
}

// Start loads and attaches the recorder. Recording runs until Stop; ctx
// bounds only the start-up.
func Start(ctx context.Context, o Options) (*Session, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	began := time.Now()
	opts := o.withDefaults()
	cgroupID, err := checkTargets(opts)
	if err != nil {
		return nil, err
	}
	_ = rlimit.RemoveMemlock()

	s := &Session{opts: opts, procs: symbolize.NewProcs()}
	if opts.Continuous {
		s.cont = newContinuous()
	}
	if opts.NoDebugInfo {
		s.procs.Files.DebugDir = ""
	}
	if s.p, err = loadProbes(opts, cgroupID, s.prepare); err != nil {
		s.close()
		return nil, err
	}
	s.opts = s.p.opts // without deferred walks where the kernel cannot defer them
	if s.p.kernelMaps && s.unw != nil {
		s.unw.rescan = false // every code mapping is reported as it is made
	}
	if err := s.afterAttach(ctx); err != nil {
		s.close()
		return nil, err
	}
	s.startWorkers()
	s.stats.StartUp, s.stats.Load = time.Since(began), s.p.loadTime
	return s, nil
}

// afterAttach sets up what runs beside the attached programs: the
// continuous mode's maps, the walk budget, run-time statistics, the
// stacks of threads blocked at the start and the event reader.
func (s *Session) afterAttach(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	coll := s.p.coll
	var err error
	if s.cont != nil {
		if s.cont.agg, err = newAggMaps(coll, s.p.aggSpec); err != nil {
			return err
		}
	}
	if s.opts.deferred() {
		b, err := budget.New(coll, s.opts.WalkThreshold, s.opts.Budget)
		if err != nil {
			return err
		}
		s.parts = append(s.parts, budgetPart{Controller: b})
	}
	if s.opts.Stats {
		if s.bpfOn, err = ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME)); err != nil {
			return fmt.Errorf("enabling BPF run-time statistics: %w", err)
		}
	}
	if err := s.p.runIter(bpf.OffcpuProgOffcpuSnapBlocked); err != nil {
		// Costs only the user stacks of threads blocked since before the start.
		s.p.warnings = append(s.p.warnings, fmt.Sprintf("user stacks of threads blocked at the start not walked: %v", err))
	}
	if s.events, err = newEventReader(coll, s.procs, s.cont != nil); err != nil {
		return err
	}
	if s.opts.Stream {
		if s.stream, err = newStreamReader(coll.Maps[bpf.OffcpuMapWaitStream], s.opts.StreamKeep, s.opts.StreamKeepBytes); err != nil {
			return err
		}
	}
	var targets *ebpf.Map
	if len(s.opts.PIDs) > 0 || s.opts.TargetsOnly {
		targets = coll.Maps[bpf.OffcpuMapTargetTgids]
	}
	s.tctx = threadctx.New(coll, targets)
	s.parts = append(s.parts, tctxPart{Tracker: s.tctx})
	s.events.parts, s.events.kernelMaps = s.parts, s.p.kernelMaps
	for _, p := range s.opts.PIDs {
		s.tctx.Add(uint32(p)) // read by its own goroutine: the start waits for none
	}
	return nil
}

// checkTargets checks what a recording needs before anything is loaded:
// the targets, the privileges, the kernel's BTF; it resolves the cgroup.
func checkTargets(opts Options) (cgroupID uint64, err error) {
	for _, p := range opts.PIDs {
		if !symbolize.ProcessExists(p) {
			return 0, fmt.Errorf("pid %d not found: check the process is running (ps -p %d)", p, p)
		}
	}
	for _, t := range opts.TIDs {
		if !threadExists(t) {
			return 0, fmt.Errorf("thread %d not found: check the thread is running (ls /proc/*/task/%d)", t, t)
		}
	}
	// What the user typed first: a bad cgroup is named without root.
	if opts.Cgroup != "" {
		if cgroupID, err = cgroupIDOf(opts.Cgroup); err != nil {
			return 0, err
		}
	}
	if err := checkPrivileges(); err != nil {
		return 0, err
	}
	if _, err := os.Stat(vmlinuxBTF); err != nil {
		return 0, fmt.Errorf("kernel BTF not found at %s: use a kernel built with CONFIG_DEBUG_INFO_BTF=y", vmlinuxBTF)
	}
	return cgroupID, nil
}

// startWorkers starts the goroutines that run while recording: process
// events, their flush, the stack spill and the unwind-table builders.
func (s *Session) startWorkers() {
	go s.events.run()
	s.flushing = goWorker(s.events.flushEvery)
	s.spill = newStackSpill(s.p.coll, s.opts.StackEntries)
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
			var ws []*worker
			for _, rt := range s.unw.rts {
				ws = append(ws, goWorker(rt.Run))
			}
			s.unw.run(s.procs, stop)
			for _, w := range ws {
				w.halt()
			}
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

// vmlinuxBTF is where the kernel publishes its BTF (a variable for tests).
var vmlinuxBTF = kernel.BTFPath

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

// prepare snapshots the processes whose mappings must be known before
// the probes attach, fills the target maps and opens the window.
func (s *Session) prepare(p *probes) error {
	o, coll := s.opts, p.coll
	// Mappings, and with them unwind tables, before the probes attach:
	// the first sleeps walk whole. With tables: system-wide, every
	// process already running; otherwise also this process, whose C
	// library and loader are most likely what a command started later
	// maps too.
	pids := o.PIDs
	if !o.FramePointersOnly {
		s.unw = newUnwinder(coll, uint32(o.UnwindRows))
		s.unw.rts = newRuntimes(s.unw, coll)
		s.parts = append(s.parts, s.unw)
		s.procs.OnChange = s.unw.update
		pids = append([]int{os.Getpid()}, o.PIDs...)
		if len(o.PIDs) == 0 && len(o.TIDs) == 0 && !o.TargetsOnly {
			pids = allProcesses()
		}
	}
	for _, p := range pids {
		s.procs.Snapshot(uint32(p))
	}
	if s.unw != nil {
		for _, rt := range s.unw.rts {
			if st, ok := rt.(runtimes.Starter); ok {
				st.Start()
			}
		}
	}
	if o.Goroutines && s.gor == nil {
		gor, err := goroutines.New(goroutines.Config{MaxGoroutines: o.MaxGoroutines, Stream: o.Stream, StreamRing: o.StreamRing,
			StreamKeep: o.StreamKeep, StreamKeepBytes: o.StreamKeepBytes, Now: monotonicNow})
		if err != nil {
			return err
		}
		s.gor = gor
		s.parts = append(s.parts, goPart{Recorder: gor})
	}
	if err := s.fillTargets(coll); err != nil {
		return err
	}
	// The window opens before the first probe attaches, so that no
	// interval it counts began before it.
	return s.markWindowStart(p)
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

func (s *Session) fillTargets(coll *ebpf.Collection) error {
	one := uint8(1)
	for _, p := range s.opts.PIDs {
		if err := coll.Maps[bpf.OffcpuMapTargetTgids].Put(uint32(p), one); err != nil {
			return fmt.Errorf("adding pid %d to the filter: %w", p, err)
		}
	}
	for _, t := range s.opts.TIDs {
		if err := coll.Maps[bpf.OffcpuMapTargetTids].Put(uint32(t), one); err != nil {
			return fmt.Errorf("adding tid %d to the filter: %w", t, err)
		}
	}
	// Before the window opens: the goroutine probe. Thread context, not
	// yet a part, reads them after attaching (afterAttach).
	for _, p := range s.opts.PIDs {
		s.parts.processAdded(uint32(p))
	}
	return nil
}

// AddPID adds a process to the recorded set (Options.TargetsOnly or PIDs
// must have been given) and snapshots its mappings.
func (s *Session) AddPID(pid int) error {
	if len(s.opts.PIDs) == 0 && !s.opts.TargetsOnly {
		return fmt.Errorf("AddPID needs a session started with PIDs or TargetsOnly")
	}
	if err := s.p.coll.Maps[bpf.OffcpuMapTargetTgids].Put(uint32(pid), uint8(1)); err != nil {
		return fmt.Errorf("adding pid %d to the filter: %w", pid, err)
	}
	s.procs.Snapshot(uint32(pid))
	s.parts.processAdded(uint32(pid))
	return nil
}

// close frees what a session holds in the kernel.
func (s *Session) close() {
	s.parts.close() // thread context reads the maps until closed
	s.parts = nil
	if s.p != nil {
		s.p.close()
	}
	if s.cont != nil {
		s.cont.agg.close()
	}
}

// Stop ends the recording, drains the kernel maps and returns the
// symbolized off-CPU profile; Profiles has the others. It may be called
// more than once.
func (s *Session) Stop() (*profile.Profile, error) {
	s.stopOnce.Do(func() {
		s.stats.Attach, s.stats.CodeMaps = s.p.attach, s.p.codeMaps
		s.stats.Warnings = append(s.stats.Warnings, s.p.warnings...)
		s.closeWindow()
		s.halt()
		if s.cont != nil {
			s.stopContinuous()
		} else if d, drained, err := s.drainer().drain(true); err != nil {
			s.stopErr = err
		} else {
			sw, moved := s.stats.SwitchMissed, s.stats.StacksMoved
			s.stats = drained.withSession(s.stats)
			s.stats.SwitchMissed, s.stats.StacksMoved = sw, moved
			// The goroutines' waits (cut per interval when continuous)
			// drained first: the timeline holds them too.
			var waits []goroutines.Wait
			var stacks map[uint64][]uint64
			if s.gor != nil {
				waits, stacks = finishGoroutines(s.gor, d, s.startMono, s.stopMono)
			}
			s.profiles, s.stats, s.stopErr = s.build(d)
			if s.gor != nil && s.stopErr == nil {
				s.profiles.Goroutines, s.stopErr = goProfile(s.gor, symbolize.NewSymbolizer(s.procs), waits, stacks, s.start, s.stats.Duration)
			}
		}
		if s.gor != nil {
			s.stats.Goroutines = s.gor.Stats()
		}
		s.close()
		s.procs.Close()
	})
	return s.profiles.OffCPU, s.stopErr
}

// closeWindow ends the window: the programs account nothing after it and
// the open intervals are flushed up to it.
func (s *Session) closeWindow() {
	warn := func(format string, err error) {
		s.stats.Warnings = append(s.stats.Warnings, fmt.Sprintf(format, err))
	}
	s.stopMono = monotonicNow()
	s.stats.Duration = time.Duration(s.stopMono - s.startMono)
	if err := s.p.setWindow(false, s.stopMono); err != nil {
		warn("closing the window: %v", err)
	}
	if err := s.parts.window(false, s.stopMono); err != nil {
		warn("closing the window: %v", err)
	}
	if s.p.flushIter && s.opts.deferred() {
		// The user stacks of the intervals still open, walked nowhere else.
		if err := s.p.runIter(bpf.OffcpuProgOffcpuSnapBlocked); err != nil {
			warn("user stacks of threads blocked at the end not walked: %v", err)
		}
	}
	if s.p.flushIter {
		// A failure here costs only the open intervals: keep going.
		if err := s.p.flushOpen(); err != nil {
			warn("open intervals not counted: %v", err)
		}
	}
}

// halt stops the workers, detaches the programs so that the maps no
// longer change while drained, and reads the last events.
func (s *Session) halt() {
	s.unwinding.halt()
	s.folding.halt()
	if s.spilling != nil {
		s.spilling.halt()
		s.stats.StacksMoved = s.spill.count()
	}
	s.p.closeLinks()
	if s.stream != nil {
		s.stream.Close()
	}
	s.parts.halt()
	if s.unw != nil {
		var warnings []string
		s.stats.Runtimes, warnings = finalFigures(s.unw.rts)
		s.stats.Warnings = append(s.stats.Warnings, warnings...)
	}
	s.stats.SwitchMissed = s.p.switchMisses()
	if s.opts.Stats {
		s.stats.Programs = s.p.programStats()
		progs := s.parts.programs()
		for _, name := range slices.Sorted(maps.Keys(progs)) {
			s.stats.Programs = appendProgramStat(s.stats.Programs, name, progs[name])
		}
		s.bpfOn.Close()
	}
	s.flushing.halt()
	s.events.close()
}

// drainer reads the maps.
func (s *Session) drainer() *drainer {
	return &drainer{p: s.p, opts: s.opts, cont: s.cont, spill: s.spill, events: s.events, parts: s.parts, stream: s.stream, stopMono: s.stopMono}
}

// stopContinuous cuts the last interval; the session's stats become the
// sum of its intervals.
func (s *Session) stopContinuous() {
	s.final, s.stopErr = s.cut(true)
	if s.final != nil {
		s.profiles.OffCPU, s.profiles.Wakeups = s.final.Profile, s.final.Wakeups
	}
	s.stats = s.cont.total.withSession(s.stats)
}

// Profiles returns, after Stop, every profile the recording gave.
func (s *Session) Profiles() Profiles { return s.profiles }

// markWindowStart tells the programs when the recorded window began, for
// threads blocked since before it.
func (s *Session) markWindowStart(p *probes) error {
	s.startMono, s.start = monotonicNow(), time.Now()
	if err := s.parts.window(true, s.startMono); err != nil {
		return fmt.Errorf("setting the start of the recorded window: %w", err)
	}
	if err := p.setWindow(true, s.startMono); err != nil {
		return fmt.Errorf("setting the start of the recorded window: %w", err)
	}
	return nil
}

// Stats returns, after Stop, what the recording counted and lost.
func (s *Session) Stats() Stats { return s.stats }

// LoadWarnings are what loading the programs could not give (a mode or a
// program the kernel refused, walks at the switch-in it cannot make),
// known from the start; Stats repeats them at the end.
func (s *Session) LoadWarnings() []string { return append([]string(nil), s.p.warnings...) }

// monotonicNow is CLOCK_MONOTONIC in ns, the clock of bpf_ktime_get_ns.
func monotonicNow() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}

// finalFigures are each runtime's figures once the runtimes are halted,
// and a warning for each process whose frames were not read.
func finalFigures(rts []runtimes.Reader) (figs []runtimes.Stats, warnings []string) {
	figs = runtimeFigures(rts)
	for _, st := range figs {
		rt, _ := registry.ByName(st.Runtime)
		for _, why := range st.Skipped {
			warnings = append(warnings, rt.Title+" frames not read: "+why)
		}
	}
	return figs, warnings
}

// runtimeFigures: the figures of each runtime that met a process.
func runtimeFigures(rts []runtimes.Reader) []runtimes.Stats {
	var out []runtimes.Stats
	for _, rt := range rts {
		if st := rt.Stats(); st.Processes+st.Unsupported > 0 {
			out = append(out, st)
		}
	}
	return out
}
