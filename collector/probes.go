package collector

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/kernel"
)

// probes is the first stage of a recording: the BPF programs loaded for
// one attach mode (tp_btf, or classic tracepoints where those fail) and
// attached, with what the kernel allowed.
type probes struct {
	opts  Options
	coll  *ebpf.Collection
	links []link.Link
	// attach: "tp_btf" or "tracepoint".
	attach string
	// flushIter: open intervals are flushed by the iter/task program
	// (tp_btf); otherwise read from the starts map.
	flushIter bool
	// kernelMaps: code mappings come from the kernel's map events.
	kernelMaps bool
	// codeMaps: how libraries mapped while recording become known (Stats.CodeMaps).
	codeMaps string
	// warnings: partial failures while loading (a tp_btf fallback).
	warnings []string
	// loadTime: spent loading programs, failed attach modes included.
	loadTime time.Duration
	// aggSpec: the aggregation map's spec as loaded (continuous mode
	// makes a second one like it).
	aggSpec *ebpf.MapSpec
}

// The programs of each attach mode.
var (
	// The wake-up first: a thread blocked since before the start and woken
	// as the switch program attaches has its wait for a CPU split off.
	btfProgs = []string{bpf.OffcpuProgOffcpuSwitch, bpf.OffcpuProgOffcpuFork, bpf.OffcpuProgOffcpuExec, bpf.OffcpuProgOffcpuRename, bpf.OffcpuProgOffcpuWaking}
	tpProgs  = []string{bpf.OffcpuProgOffcpuSwitchTp, bpf.OffcpuProgOffcpuForkTp, bpf.OffcpuProgOffcpuRenameTp, bpf.OffcpuProgOffcpuWakingTp}
)

// optionalProgs are the programs a recording does without, with what
// that costs.
var optionalProgs = map[string]string{
	bpf.OffcpuProgOffcpuSnapBlocked: "user stacks of threads blocked at the start not walked",
	bpf.OffcpuProgOffcpuDlState:     "libraries mapped while recording read from /proc",
	bpf.OffcpuProgOffcpuExec:        "programs started while recording read from /proc",
	bpf.OffcpuProgOffcpuRename:      "thread names changed while recording read from /proc",
	bpf.OffcpuProgOffcpuMmapEnter:   "libraries mapped while recording read from /proc",
	bpf.OffcpuProgOffcpuMmapExit:    "libraries mapped while recording read from /proc",
}

// loadProbes loads and attaches the tp_btf programs, or the classic
// tracepoint ones where those fail or are asked for. prepare runs between
// loading and attaching, with the maps created.
func loadProbes(opts Options, cgroupID uint64, prepare func(*probes) error) (*probes, error) {
	var warnings []string
	if opts.deferred() && !opts.ForceTracepoint && !kernel.HasRawTracepoint("sched_exit_tp") {
		warnings = append(warnings, noDeferral("the kernel has no sched_exit_tp tracepoint (Linux 6.16+), where a thread's stacks are walked after its switch-in"))
		opts.WalkThreshold, opts.Budget = 0, 0
	}
	var btfErr error
	var spent time.Duration
	if !opts.ForceTracepoint {
		p := &probes{opts: opts, warnings: warnings}
		if btfErr = p.load(cgroupID, true, prepare); btfErr == nil {
			return p, nil
		}
		spent = p.loadTime
		p.close()
	}
	p := &probes{opts: opts, warnings: warnings, loadTime: spent}
	if btfErr != nil {
		p.warnings = append(p.warnings, fmt.Sprintf("tp_btf programs not loaded, using classic tracepoints: %v", btfErr))
	}
	if p.opts.deferred() {
		p.warnings = append(p.warnings, noDeferral("the tp_btf programs were not loaded"))
		p.opts.WalkThreshold, p.opts.Budget = 0, 0
	}
	if err := p.load(cgroupID, false, prepare); err != nil {
		p.close()
		if btfErr != nil && !errors.Is(err, errPermission) {
			return nil, fmt.Errorf("%w (tp_btf failed first: %v)", err, btfErr)
		}
		return nil, err
	}
	return p, nil
}

// noDeferral is the warning for --walk-threshold and --budget dropped.
func noDeferral(why string) string {
	return "--walk-threshold and --budget not used: " + why + "; every interval's stacks are walked at its switch-out, which costs more a switch (docs/overhead.md)"
}

// attachCPUSampling opens a CPU-clock perf event per online CPU at
// Options.CPUHz and runs the sampling program on each.
func (p *probes) attachCPUSampling() error {
	if p.opts.CPUHz == 0 {
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
			Sample: uint64(p.opts.CPUHz),
			Bits:   unix.PerfBitFreq,
		}
		fd, err := unix.PerfEventOpen(&attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
		if err != nil {
			return fmt.Errorf("opening a CPU-clock perf event on CPU %d: %w (use --cpu-hz 0 to skip on-CPU samples)", cpu, err)
		}
		l, err := link.AttachRawLink(link.RawLinkOptions{Target: fd, Program: p.coll.Programs[bpf.OffcpuProgOffcpuCpuSample], Attach: ebpf.AttachPerfEvent})
		unix.Close(fd) // the link holds the event
		if err != nil {
			return fmt.Errorf("attaching the on-CPU sampler on CPU %d: %w", cpu, err)
		}
		p.links = append(p.links, l)
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

// load creates the maps and programs for one attach mode and attaches them.
func (p *probes) load(cgroupID uint64, btfMode bool, prepare func(*probes) error) error {
	spec, err := p.spec(cgroupID, btfMode)
	if err != nil {
		return err
	}
	if err := p.newCollection(spec); err != nil {
		return err
	}
	if err := prepare(p); err != nil {
		return err
	}
	if err := p.attachCPUSampling(); err != nil {
		return err
	}
	if btfMode {
		return p.attachBTF()
	}
	return p.attachTracepoints()
}

// spec is the BPF object set up for the options and the attach mode.
func (p *probes) spec(cgroupID uint64, btfMode bool) (*ebpf.CollectionSpec, error) {
	spec, err := bpf.LoadOffcpu()
	if err != nil {
		return nil, fmt.Errorf("reading the embedded BPF object: %w", err)
	}
	o := p.opts
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
		bpf.OffcpuVarExcludeTgid:       excludeTgid(&o),
		bpf.OffcpuVarMinBlockNs:        uint64(o.MinBlock),
		bpf.OffcpuVarMaxBlockNs:        maxNs,
		bpf.OffcpuVarStateMask:         o.StateMask,
		bpf.OffcpuVarUserThreadsOnly:   o.UserThreadsOnly,
		bpf.OffcpuVarKernelThreadsOnly: o.KernelThreadsOnly,
		bpf.OffcpuVarWantKernelStacks:  !o.NoKernelStacks,
		bpf.OffcpuVarWantUserStacks:    !o.NoUserStacks,
		bpf.OffcpuVarReuseStacks:       !o.NoStackReuse,
		bpf.OffcpuVarWantWakeups:       !o.NoWakeups,
		bpf.OffcpuVarThreadSize:        kernel.ThreadSize(),
		bpf.OffcpuVarWantUnwind:        !o.FramePointersOnly,
		bpf.OffcpuVarWantMaps:          wantMaps,
		bpf.OffcpuVarDeferredWalks:     o.deferred() && btfMode,
		bpf.OffcpuVarSkipFirstIn:       o.skipFirstIn,
		bpf.OffcpuVarWantStream:        o.Stream,
	} {
		if err := set(name, v); err != nil {
			return nil, fmt.Errorf("setting %s: %w", name, err)
		}
	}
	sizeMaps(spec, o)
	p.aggSpec = spec.Maps[bpf.OffcpuMapOffcpu].Copy()
	// The exec program reports the new program's mappings only where the
	// kernel has the VMA iterator (Linux 6.7+); elsewhere execs are read
	// from /proc.
	p.kernelMaps = wantMaps && btfMode && kernel.HasFunc("bpf_iter_task_vma_new")
	if !o.deferred() || !btfMode {
		delete(spec.Programs, bpf.OffcpuProgOffcpuSwitchedIn)
	}
	if !p.kernelMaps {
		delete(spec.Programs, bpf.OffcpuProgOffcpuDlState)
	}
	if btfMode {
		for _, p := range tpProgs {
			delete(spec.Programs, p)
		}
		p.flushIter = true
		delete(spec.Maps, bpf.OffcpuMapStarts)
		delete(spec.Maps, bpf.OffcpuMapLastWaker)
		p.attach = "tp_btf"
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
		p.attach = "tracepoint"
	}
	return spec, nil
}

// sizeMaps sizes the maps from the options.
func sizeMaps(spec *ebpf.CollectionSpec, o Options) {
	spec.Maps[bpf.OffcpuMapStarts].MaxEntries = uint32(o.MaxThreads)
	spec.Maps[bpf.OffcpuMapThreads].MaxEntries = uint32(o.MaxThreads)
	spec.Maps[bpf.OffcpuMapThreadCpus].MaxEntries = uint32(o.MaxThreads)
	spec.Maps[bpf.OffcpuMapStacks].MaxEntries = uint32(o.StackEntries)
	if o.Stream {
		spec.Maps[bpf.OffcpuMapWaitStream].MaxEntries = uint32(o.StreamRing)
	} else {
		spec.Maps[bpf.OffcpuMapWaitStream].MaxEntries = uint32(os.Getpagesize())
	}
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

// IsBPFFS tells whether dir is a BPF file system.
func IsBPFFS(dir string) bool {
	var st unix.Statfs_t
	return unix.Statfs(dir, &st) == nil && st.Type == unix.BPF_FS_MAGIC
}

// traceMapPin pins OTEP 4855's map in Options.TraceMapPin where that is
// a BPF file system; elsewhere it is left unshared (noted).
func (p *probes) traceMapPin(spec *ebpf.CollectionSpec) ebpf.CollectionOptions {
	dir := p.opts.TraceMapPin
	if dir == "" {
		return ebpf.CollectionOptions{}
	}
	if !IsBPFFS(dir) {
		p.warnings = append(p.warnings, fmt.Sprintf("%s is not a BPF file system: trace-context map not shared (mount -t bpf bpf %s)", dir, dir))
		return ebpf.CollectionOptions{}
	}
	spec.Maps[bpf.OffcpuMapOtelTracesCtxV1].Pinning = ebpf.PinByName
	return ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}
}

// newCollection loads the maps and programs, turning the kernel's
// refusals into errors that say what to do.
func (p *probes) newCollection(spec *ebpf.CollectionSpec) error {
	start := time.Now()
	defer func() { p.loadTime += time.Since(start) }()
	copts := p.traceMapPin(spec)
	coll, err := ebpf.NewCollectionWithOptions(spec, copts)
	if err != nil && copts.Maps.PinPath != "" && strings.Contains(err.Error(), bpf.OffcpuMapOtelTracesCtxV1) {
		// A map of that name that is not OTEP 4855's: not shared.
		p.warnings = append(p.warnings, fmt.Sprintf("%s/%s not shared: %v", copts.Maps.PinPath, bpf.OffcpuMapOtelTracesCtxV1, err))
		spec.Maps[bpf.OffcpuMapOtelTracesCtxV1].Pinning = ebpf.PinNone
		copts.Maps.PinPath = ""
		coll, err = ebpf.NewCollectionWithOptions(spec, copts)
	}
	for err != nil {
		// A program with a fallback is left out rather than the mode.
		name := kernel.FailedProgram(err, spec)
		why, ok := optionalProgs[name]
		var ve *ebpf.VerifierError
		if !ok || !errors.As(err, &ve) {
			break
		}
		p.warnings = append(p.warnings, fmt.Sprintf("%s: the kernel rejected %s (%s)", why, name, kernel.VerifierReason(ve.Log)))
		delete(spec.Programs, name)
		coll, err = ebpf.NewCollectionWithOptions(spec, copts)
	}
	if err != nil {
		// The verifier answers EACCES too: look at its log first.
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			if os.Getenv("OFFCPU_VERIFIER_LOG") != "" {
				fmt.Fprintf(os.Stderr, "%+v\n", ve)
			}
			return fmt.Errorf("the kernel rejected the %s programs: %v", p.attach, ve)
		}
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			return errPermission
		}
		return fmt.Errorf("creating BPF maps and programs (%s): %w; if a map is too large, lower --max-threads, --stack-entries or --agg-entries", p.attach, err)
	}
	p.coll = coll
	return nil
}

func (p *probes) attachBTF() error {
	o, coll := p.opts, p.coll
	if o.deferred() {
		// Before the switch program, which hands it the walks.
		l, err := link.AttachTracing(link.TracingOptions{Program: coll.Programs[bpf.OffcpuProgOffcpuSwitchedIn], AttachType: ebpf.AttachTraceRawTp})
		if err != nil {
			return fmt.Errorf("attaching to sched_exit_tp (Linux 6.16+), where deferred walks happen: %w", err)
		}
		p.links = append(p.links, l)
	}
	for _, name := range btfProgs {
		if name == bpf.OffcpuProgOffcpuWaking && o.NoWakeups {
			continue
		}
		l, err := link.AttachTracing(link.TracingOptions{Program: coll.Programs[name], AttachType: ebpf.AttachTraceRawTp})
		if err != nil {
			if name == bpf.OffcpuProgOffcpuRename || name == bpf.OffcpuProgOffcpuExec {
				if name == bpf.OffcpuProgOffcpuExec {
					p.kernelMaps = false
				}
				continue // optional: names and exec snapshots are also read from /proc
			}
			return fmt.Errorf("attaching %s (tp_btf): %w", name, err)
		}
		p.links = append(p.links, l)
	}
	if !p.attachMmap() {
		p.kernelMaps = false
	}
	return nil
}

func (p *probes) attachTracepoints() error {
	if err := ensureTracefs(); err != nil {
		return err
	}
	for _, tp := range []struct{ prog, group, name string }{
		{bpf.OffcpuProgOffcpuSwitchTp, "sched", "sched_switch"},
		{bpf.OffcpuProgOffcpuForkTp, "sched", "sched_process_fork"},
		{bpf.OffcpuProgOffcpuRenameTp, "task", "task_rename"},
		{bpf.OffcpuProgOffcpuWakingTp, "sched", "sched_waking"},
	} {
		if tp.prog == bpf.OffcpuProgOffcpuWakingTp && p.opts.NoWakeups {
			continue
		}
		l, err := link.Tracepoint(tp.group, tp.name, p.coll.Programs[tp.prog], nil)
		if err != nil {
			return fmt.Errorf("attaching tracepoint %s:%s: %w", tp.group, tp.name, err)
		}
		p.links = append(p.links, l)
	}
	p.attachMmap()
	return nil
}

// attachMmap follows the code the targets map so that a library's unwind
// table is loaded and its mapping known as soon as the dynamic loader
// maps it: by a uprobe on the loader's debugger hook where the kernel
// walks mappings (attachLoaders), else by the mmap syscall tracepoints.
// Optional: without either, mappings are re-read on a timer only.
func (p *probes) attachMmap() bool {
	if p.attachLoaders() {
		p.codeMaps = "loader"
		return true
	}
	enter, exit := p.coll.Programs[bpf.OffcpuProgOffcpuMmapEnter], p.coll.Programs[bpf.OffcpuProgOffcpuMmapExit]
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
	p.links = append(p.links, le, lx)
	p.codeMaps = "mmap"
	return true
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

// closeLinks detaches every probe.
func (p *probes) closeLinks() {
	for _, l := range p.links {
		l.Close()
	}
	p.links = nil
}

// flushOpen runs the iter/task program once: every thread still off-CPU
// gets its interval so far accounted, flagged open.
func (p *probes) flushOpen() error { return p.runIter(bpf.OffcpuProgOffcpuFlushOpen) }

// runIter runs a task iterator program once over every task; absent in
// classic-tracepoint mode.
func (p *probes) runIter(name string) error { return p.readIter(name, io.Discard) }

// readIter runs a task iterator program and copies what it writes to w.
func (p *probes) readIter(name string, w io.Writer) error {
	prog := p.coll.Programs[name]
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

// switchMisses counts the sched_switch events the kernel did not run the
// recorder's program for (recursion_misses: another BPF program, or a
// bpf() syscall of user space, held the CPU's BPF guard). Each costs a
// switch-out or switch-in, so an interval.
func (p *probes) switchMisses() uint64 {
	var n uint64
	for _, name := range []string{bpf.OffcpuProgOffcpuSwitch, bpf.OffcpuProgOffcpuSwitchTp} {
		if p := p.coll.Programs[name]; p != nil {
			if st, err := p.Stats(); err == nil {
				n += st.RecursionMisses
			}
		}
	}
	return n
}

func (p *probes) programStats() []ProgramStat {
	var out []ProgramStat
	for name, p := range p.coll.Programs {
		out = appendProgramStat(out, name, p)
	}
	return out
}

// appendProgramStat appends prog's run-time accounting, if it has one.
func appendProgramStat(out []ProgramStat, name string, prog *ebpf.Program) []ProgramStat {
	st, err := prog.Stats()
	if err != nil {
		return out
	}
	ps := ProgramStat{Name: name, Runs: st.RunCount, Runtime: st.Runtime}
	if st.RunCount > 0 {
		ps.MeanCost = st.Runtime / time.Duration(st.RunCount)
	}
	return append(out, ps)
}

// attachLoaders puts a uprobe on the hook of every dynamic loader the
// running programs use (their executables' PT_INTERP, in their own root).
// A loader seen first after the start is not hooked: programs started
// from it have their mappings re-read from /proc. False when none was
// hooked (the caller then follows mmap by its syscall tracepoints).
func (p *probes) attachLoaders() bool {
	prog := p.coll.Programs[bpf.OffcpuProgOffcpuDlState]
	if prog == nil || !p.kernelMaps {
		return false
	}
	seen := map[[2]uint64]bool{}
	hooked := false
	for _, path := range loaderPaths() {
		var st unix.Stat_t
		if unix.Stat(path, &st) != nil || seen[[2]uint64{st.Dev, st.Ino}] {
			continue
		}
		seen[[2]uint64{st.Dev, st.Ino}] = true
		ex, err := link.OpenExecutable(path)
		if err != nil {
			continue
		}
		l, err := ex.Uprobe(loaderHook, prog, nil)
		if err != nil {
			continue
		}
		p.links = append(p.links, l)
		hooked = true
	}
	return hooked
}

// close detaches every probe and frees the maps.
func (p *probes) close() {
	p.closeLinks()
	if p.coll != nil {
		p.coll.Close()
		p.coll = nil
	}
}

// setWindow tells the programs when the recorded window starts or stops
// (absent in classic tracepoint mode: not used there).
func (p *probes) setWindow(start bool, ns uint64) error {
	name := bpf.OffcpuVarRecStopNs
	if start {
		name = bpf.OffcpuVarRecStartNs
	}
	v, ok := p.coll.Variables[name]
	if !ok {
		return nil
	}
	return v.Set(ns)
}

// excludeTgid is the process not recorded: this one, with ExcludeSelf.
func excludeTgid(o *Options) uint32 {
	if o.ExcludeSelf {
		return uint32(os.Getpid())
	}
	return 0
}
