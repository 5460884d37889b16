package schema

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/runtimes/registry"
)

// Kinds of stacks.
const (
	KindOffCPU = "offcpu" // value: nanoseconds blocked
	KindWakeup = "wakeup" // value: wake-ups; the stack is the waker's
	KindCPU    = "cpu"    // value: nanoseconds on CPU
)

// Frame is one function, root-first order in Stack.Frames.
type Frame struct {
	Name   string
	Kernel bool
	Module string // base name of the mapped file, when the profile says
	// Runtime: the language runtime whose own structures named the frame
	// (RuntimeOfMapping), "" for native code.
	Runtime string
}

// RuntimeOfMapping is the runtime whose frames a profile puts in mapping
// file, by its OpenTelemetry frame type (jvm, cpython, v8js...); "" for
// native code.
func RuntimeOfMapping(file string) string {
	if rt, ok := registry.ByMapping(file); ok {
		return rt.FrameType
	}
	return ""
}

// Stack is one aggregated stack of a profile.
type Stack struct {
	Kind   string
	Thread string // thread name ("" when the source has none)
	Frames []Frame
	Value  int64  // ns (offcpu, cpu) or count (wakeup)
	Count  int64  // switches (offcpu)
	Ended  int64  // wakeup: blocked ns the wake-ups ended
	State  string // recorder state; StateRunQueue: the wait for a CPU after a wake-up
	Class  string // wakeup class
	Target string // wakeup: the woken thread
	// wakeup: the woken thread's process, where the recorder named it.
	TargetProcess string
	TargetPID     int64
	Waker         string // offcpu: the waker thread
	// offcpu, where the recorder linked the interval to its waker: the
	// waiter's and the waker's processes and ids, and the waker's stack
	// (root first), for verdicts from the waker's side.
	Process, WakerProcess string
	PID, TID              int64
	WakerPID, WakerTID    int64
	WakerFrames           []Frame
	// InRequest: the thread serves another program (some of its waits are
	// for input another program or the network sends) and this wait is
	// elsewhere in its code: inside a request, not at the top of its loop.
	InRequest bool
	// InRequestWhy says why a goroutine's wait is inside a request (its
	// creator reads connections, or its waker was blocked through it).
	InRequestWhy string
	// Creator: the function whose go statement created the goroutine.
	Creator string
	// WakerDispatching: the waker serves another program too and woke this
	// thread from its own top of loop, a call or two from its input wait:
	// it passed on input it received (a listener handing a connection to a
	// pooled thread), which is a hand-off, not a release.
	WakerDispatching bool
	// Loop: where the wait lies in its thread's loop, found by the
	// analysis from the thread's own waits (LoopTop, LoopBeneath, or ""
	// where it cannot tell); LoopWhy says which wait is the top and why.
	Loop, LoopWhy string
	// WakerPassedOn: the waker had been waiting at this same place through
	// most of this wait, idle there, and passed the wake-up on, handing no
	// work (set by the analysis: it needs the waker's own waits judged).
	WakerPassedOn bool
	// WakerWaitNs: of Value, the time the waker was itself off a CPU in
	// WakerWaitFrames (its own wait): one hop of a wait chain.
	WakerWaitNs     int64
	WakerWaitFrames []Frame
	// An interpreter thread's wait for its lock (Reason "gil": CPython's
	// GIL, CRuby's GVL): the thread that held it when the wait began, and
	// that thread's interpreted stack then (root first).
	GILHolder       string
	GILHolderFrames []Frame
	// Interval: how the recording's window cut the wait (LabelInterval:
	// "whole" began before the start and had not ended at the stop).
	Interval string
	// Goroutine waits (Go programs): the goroutine, its wait reason as
	// the runtime names it ("chan receive", "sync.Mutex.Lock", "IO wait")
	// and the goroutine that made it runnable (0: the scheduler, for
	// network polls and timers). Thread is the goroutine's start function.
	Goid, WakerGoid int64
	Reason          string
	// Links: the labels the program put on the waiting goroutine or thread
	// (ProgramLabels), by its own keys; nil: none.
	Links map[string]string
	// Sample is the pprof sample the stack was read from (nil for folded
	// input); several stacks share one when its wait for a CPU is split.
	Sample *profile.Sample
}

// Where a wait lies in its thread's loop (Stack.Loop): at the top, where
// the thread waits between work items, or beneath a work item.
const (
	LoopTop     = "top"
	LoopBeneath = "beneath"
)

// StateRunQueue is the state of the part of an off-CPU interval after its
// wake-up, waiting for a CPU; with "preempted" it is not blocked time.
const StateRunQueue = "runqueue"

// WaitsForCPU tells whether a stack is time spent runnable: preempted, or
// woken and not yet running.
func (s *Stack) WaitsForCPU() bool { return s.State == "preempted" || s.State == StateRunQueue }

// LockName names the interpreter lock a wait with Reason "gil" waited
// for, by the runtime of its interpreted frames: the GIL, the GVL.
func (s *Stack) LockName() string {
	for _, f := range s.Frames {
		if rt, ok := registry.ByFrameType(f.Runtime); ok && f.Runtime != "" && rt.Lock != "" {
			return rt.Lock
		}
	}
	return "GIL"
}

// Data is what one or more profiles hold.
type Data struct {
	Stacks  []Stack
	Sources []string
}

// FoldedUnit is the unit of folded-stack values.
type FoldedUnit int64

const (
	FoldedMicroseconds FoldedUnit = 1000 // bcc offcputime -f
	FoldedNanoseconds  FoldedUnit = 1
)

// Load reads offcpu pprof files, other pprof profiles with a time sample
// type (Go block and mutex profiles), and folded stacks, and merges them.
func Load(unit FoldedUnit, paths ...string) (*Data, error) {
	d := &Data{}
	for _, p := range paths {
		if err := d.loadFile(p, unit); err != nil {
			return nil, err
		}
	}
	if len(d.Stacks) == 0 {
		return nil, fmt.Errorf("no samples in %s", strings.Join(paths, ", "))
	}
	return d, nil
}

func (d *Data) loadFile(path string, unit FoldedUnit) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading %s: %w", path, err)
	}
	d.Sources = append(d.Sources, path)
	if IsPprof(b) {
		p, err := profile.ParseData(b)
		if err != nil {
			return fmt.Errorf("%s is not a valid pprof profile (%v): check the file is complete", path, err)
		}
		return d.addProfile(path, p)
	}
	if bytes.IndexByte(b, 0) >= 0 {
		return fmt.Errorf("%s is neither a pprof profile nor folded stacks", path)
	}
	return d.addFolded(path, b, unit)
}

// IsPprof tells a pprof profile (gzipped or raw protobuf) from folded stacks.
func IsPprof(b []byte) bool {
	if len(b) >= 2 && b[0] == 0x1f && b[1] == 0x8b {
		return true // gzip: pprof files are gzipped protobuf
	}
	// Raw protobuf: the first field is a sample_type (field 1, bytes).
	return len(b) > 0 && b[0] == 0x0a
}

func typeIndex(p *profile.Profile, typ, unit string) int {
	for i, st := range p.SampleType {
		if st.Type == typ && (unit == "" || st.Unit == unit) {
			return i
		}
	}
	return -1
}

// FromProfile reads one profile that offcpu (or Go) wrote, as Load does a
// file.
func FromProfile(p *profile.Profile) (*Data, error) {
	d := &Data{}
	if err := d.addProfile("profile", p); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Data) addProfile(path string, p *profile.Profile) error {
	if gIdx := typeIndex(p, GoroutineBlocked, Nanoseconds); gIdx >= 0 {
		d.addGoroutines(p, gIdx)
		return nil
	}
	r, err := NewSampleReader(p)
	if err != nil {
		return fmt.Errorf("%s %v", path, err)
	}
	first := len(d.Stacks)
	for _, s := range p.Sample {
		d.Stacks = r.Stacks(d.Stacks, s)
	}
	if !r.Wakeups() {
		MarkInRequest(d.Stacks[first:])
	}
	return nil
}

// SampleReader reads the stacks of a thread profile (off-CPU or wake-ups)
// one sample at a time, for readers that keep none of them: what
// FromProfile holds, but for MarkInRequest (see RequestIndex).
type SampleReader struct {
	wakeIdx, offIdx, cntIdx, cpuIdx, runqIdx, chainIdx int
	// With Reuse: one buffer for a sample's frames, and folded stacks
	// (waker labels) read once each.
	reuse  bool
	frames []Frame
	parsed map[string][]Frame
}

// Reuse makes the frames of the stacks Stacks returns valid until its
// next call only (and shared between stacks): most of what reading a
// profile allocates, for readers that keep no stack.
func (r *SampleReader) Reuse() {
	r.reuse, r.parsed = true, map[string][]Frame{}
}

func (r *SampleReader) framesOf(s *profile.Sample) []Frame {
	if !r.reuse {
		return frames(s)
	}
	r.frames = AppendFrames(r.frames[:0], s.Location)
	return r.frames
}

// parse is ParseWakerStack, each label read once with Reuse.
func (r *SampleReader) parse(folded string) []Frame {
	if !r.reuse || folded == "" {
		return ParseWakerStack(folded)
	}
	f, ok := r.parsed[folded]
	if !ok {
		f = ParseWakerStack(folded)
		r.parsed[folded] = f
	}
	return f
}

// NewSampleReader reads p's sample types; goroutine profiles are refused.
func NewSampleReader(p *profile.Profile) (*SampleReader, error) {
	if typeIndex(p, GoroutineBlocked, Nanoseconds) >= 0 {
		return nil, errors.New("is a goroutine profile: read it with FromProfile")
	}
	r := &SampleReader{wakeIdx: typeIndex(p, Wakeups, Count), offIdx: typeIndex(p, OffCPU, Nanoseconds), cntIdx: typeIndex(p, Switches, Count),
		cpuIdx: typeIndex(p, CPU, Nanoseconds), runqIdx: typeIndex(p, RunQueue, Nanoseconds), chainIdx: typeIndex(p, WakerWaiting, Nanoseconds)}
	if r.wakeIdx >= 0 || r.offIdx >= 0 {
		return r, nil
	}
	// Any pprof with a time sample type: Go block and mutex profiles
	// ("delay"), or the first nanoseconds type.
	r.offIdx = typeIndex(p, "delay", "nanoseconds")
	for i, st := range p.SampleType {
		if r.offIdx < 0 && st.Unit == "nanoseconds" {
			r.offIdx = i
		}
	}
	r.cntIdx = typeIndex(p, "contentions", "count")
	r.cpuIdx, r.runqIdx = -1, -1
	if r.offIdx < 0 {
		return nil, errors.New("has no time sample type (off_cpu/nanoseconds, delay/nanoseconds): not an off-CPU profile")
	}
	return r, nil
}

// Wakeups tells whether the profile is a wake-up profile.
func (r *SampleReader) Wakeups() bool { return r.wakeIdx >= 0 }

// Stacks appends to dst the stacks sample s holds: a wake-up; or its
// blocked time, its wait for a CPU (appendOffCPU) and its on-CPU time.
func (r *SampleReader) Stacks(dst []Stack, s *profile.Sample) []Stack {
	if r.wakeIdx >= 0 {
		st := Stack{Kind: KindWakeup, Thread: sampleLabel(s, LabelThread), Frames: r.framesOf(s), Value: s.Value[r.wakeIdx], Sample: s,
			Class: sampleLabel(s, LabelWakeupClass), Target: sampleLabel(s, LabelTarget),
			TargetProcess: sampleLabel(s, LabelTargetProcess), TargetPID: numLabel(s, LabelTargetPID), PID: numLabel(s, LabelPID), Process: sampleLabel(s, LabelProcess)}
		if r.offIdx >= 0 {
			st.Ended = s.Value[r.offIdx]
		}
		return append(dst, st)
	}
	fr := r.framesOf(s)
	th := sampleLabel(s, LabelThread)
	if v := s.Value[r.offIdx]; v != 0 {
		st := Stack{Kind: KindOffCPU, Thread: th, Frames: fr, Value: v, Sample: s, State: sampleLabel(s, LabelState), Waker: sampleLabel(s, LabelWaker),
			Class: sampleLabel(s, LabelWakeupClass), Process: sampleLabel(s, LabelProcess), WakerProcess: sampleLabel(s, LabelWakerProcess),
			PID: numLabel(s, LabelPID), TID: numLabel(s, LabelTID), WakerPID: numLabel(s, LabelWakerPID),
			WakerTID: numLabel(s, LabelWakerTID), WakerFrames: r.parse(sampleLabel(s, LabelWakerStack)), Links: ProgramLabels(s),
			Interval: sampleLabel(s, LabelInterval)}
		if r.cntIdx >= 0 {
			st.Count = s.Value[r.cntIdx]
		}
		if r.chainIdx >= 0 && s.Value[r.chainIdx] > 0 {
			st.WakerWaitNs = s.Value[r.chainIdx]
			st.WakerWaitFrames = r.parse(sampleLabel(s, LabelWakerWaitStack))
		}
		if sampleLabel(s, LabelGIL) != "" {
			st.Reason, st.GILHolder = ReasonGIL, sampleLabel(s, LabelGILHolder)
			st.GILHolderFrames = r.parse(sampleLabel(s, LabelGILHolderStack))
		}
		dst = appendOffCPU(dst, st, r.runqIdx, s)
	}
	if r.cpuIdx >= 0 && s.Value[r.cpuIdx] != 0 {
		dst = append(dst, Stack{Kind: KindCPU, Thread: th, Frames: fr, Value: s.Value[r.cpuIdx], Sample: s,
			Process: sampleLabel(s, LabelProcess), PID: numLabel(s, LabelPID), TID: numLabel(s, LabelTID)})
	}
	return dst
}

// addGoroutines adds a goroutine profile's waits: the blocked part (from
// the park to being made runnable) and, as stacks of their own, the wait
// for a CPU after it, grouped by the goroutine's start function.
func (d *Data) addGoroutines(p *profile.Profile, blockedIdx int) {
	runqIdx, waitsIdx := typeIndex(p, GoroutineRunQueue, Nanoseconds), typeIndex(p, GoroutineWaits, Count)
	chainIdx := typeIndex(p, WakerWaiting, Nanoseconds)
	first := len(d.Stacks)
	for _, s := range p.Sample {
		fr := frames(s)
		st := Stack{Kind: KindOffCPU, Thread: goroutineGroup(sampleLabel(s, LabelGoStart), fr), Frames: fr, Value: s.Value[blockedIdx],
			Process: sampleLabel(s, LabelProcess), PID: numLabel(s, LabelPID), Goid: numLabel(s, LabelGoid),
			Reason: sampleLabel(s, LabelReason), WakerGoid: numLabel(s, LabelWakerGoid), WakerFrames: ParseWakerStack(sampleLabel(s, LabelWakerStack)),
			Creator: sampleLabel(s, LabelGoCreator), Links: ProgramLabels(s), Sample: s}
		switch {
		case st.WakerGoid != 0:
			st.Waker, st.WakerPID, st.WakerProcess = goroutineGroup("", st.WakerFrames), st.PID, st.Process
		case len(st.WakerFrames) > 0:
			// A network poll or a timer: the runtime's interrupts.
			st.Waker = "[scheduler]"
		}
		if waitsIdx >= 0 {
			st.Count = s.Value[waitsIdx]
		}
		if chainIdx >= 0 && s.Value[chainIdx] > 0 {
			st.WakerWaitNs = s.Value[chainIdx]
			st.WakerWaitFrames = ParseWakerStack(sampleLabel(s, LabelWakerWaitStack))
		}
		if st.Value > 0 {
			d.Stacks = append(d.Stacks, st)
		}
		if runqIdx >= 0 && s.Value[runqIdx] > 0 {
			rq := st
			rq.Value, rq.Count, rq.State = s.Value[runqIdx], 0, StateRunQueue
			d.Stacks = append(d.Stacks, rq)
		}
	}
	// A waker's group as its own waits have it (its start function), where
	// the profile holds some: its stack at the wake-up may be cut short.
	groups := map[[2]int64]string{}
	for _, st := range d.Stacks[first:] {
		groups[[2]int64{st.PID, st.Goid}] = st.Thread
	}
	for i := range d.Stacks[first:] {
		st := &d.Stacks[first+i]
		if g, ok := groups[[2]int64{st.PID, st.WakerGoid}]; ok && st.WakerGoid > 0 {
			st.Waker = g
		}
	}
	MarkInRequest(d.Stacks[first:])
	markCreatedByReaders(d.Stacks[first:])
}

// loopWaits: a goroutine that waits at one place more often than this in
// a recording is at the top of its own loop there, waiting for work.
const loopWaits = 3

// markCreatedByReaders marks the waits of goroutines that serve input a
// reader passed them: a goroutine with no network wait of its own that a
// goroutine reading the network created (its go statement is in a
// function on the stack of one of the reader's waits: an accept loop, a
// connection's handler, a stream's reader) handles a request, and its
// waits for other goroutines are inside it, unless it waits at that place
// again and again (its own loop). No function is named: the creator comes
// from the runtime (g.gopc), the readers from their wait reason.
func markCreatedByReaders(stacks []Stack) {
	type gkey struct{ pid, goid int64 }
	hasInput := map[gkey]bool{}
	waits := map[gkey]map[string]int64{} // a goroutine's waits by place
	for i := range stacks {
		s := &stacks[i]
		if s.Kind != KindOffCPU || s.Goid <= 0 || s.WaitsForCPU() {
			continue
		}
		g := gkey{s.PID, s.Goid}
		hasInput[g] = hasInput[g] || s.Reason == goNetworkWait
		if waits[g] == nil {
			waits[g] = map[string]int64{}
		}
		waits[g][userFolded(s)] += max(s.Count, 1)
	}
	readers := map[int64]map[string]bool{} // by process: functions on the readers' stacks
	for i := range stacks {
		s := &stacks[i]
		if s.Kind != KindOffCPU || !hasInput[gkey{s.PID, s.Goid}] {
			continue
		}
		if readers[s.PID] == nil {
			readers[s.PID] = map[string]bool{}
		}
		for _, f := range s.Frames {
			readers[s.PID][f.Name] = true
		}
	}
	for i := range stacks {
		s := &stacks[i]
		g := gkey{s.PID, s.Goid}
		if s.Kind != KindOffCPU || s.Goid <= 0 || s.WaitsForCPU() || s.InRequest || hasInput[g] ||
			s.Creator == "" || !readers[s.PID][s.Creator] && !readers[s.PID][enclosingFunc(s.Creator)] {
			continue
		}
		if n := waits[g][userFolded(s)]; n > loopWaits {
			continue
		}
		s.InRequest = true
		s.InRequestWhy = "created by " + s.Creator + " in a goroutine that reads the network: it serves a request, and waits here at most " +
			fmt.Sprint(loopWaits) + " times (not its own loop)"
	}
}

// enclosingFunc is the function a Go closure is written in ("F" of
// "F.func1.2"; a reader may run F, which hands each request to a closure
// that starts the goroutine), or name itself.
func enclosingFunc(name string) string {
	for {
		i := strings.LastIndexByte(name, '.')
		if i < 0 {
			return name
		}
		last := name[i+1:]
		if !strings.HasPrefix(last, "func") && strings.Trim(last, "0123456789") != "" {
			return name
		}
		name = name[:i]
	}
}

// goroutineGroup names a goroutine by the function it runs, as Go's
// tracebacks show it: its start function (start, g.startpc, where
// recorded) unless that is the runtime's; else the outermost frame of its
// stack (root first) that is not the runtime's (goexit, main; the go
// statements' wrappers are left out by the recorder); a goroutine of the
// runtime's own by its outermost frame below goexit.
func goroutineGroup(start string, frames []Frame) string {
	if start != "" && !strings.HasPrefix(start, "runtime.") {
		return start
	}
	rt := ""
	for _, f := range frames {
		switch {
		case f.Kernel || f.Name == "runtime.goexit":
		case !strings.HasPrefix(f.Name, "runtime."):
			return f.Name
		case rt == "":
			rt = f.Name
		}
	}
	if rt != "" {
		return rt
	}
	return "[goroutine]"
}

func sampleLabel(s *profile.Sample, k string) string {
	if v := s.Label[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// appendOffCPU appends an off-CPU stack; where the profile splits
// off-CPU time at the wake-up (RunQueue), the wait for a CPU after it
// becomes a stack of its own in state StateRunQueue, so that only the
// blocked part counts as blocked.
func appendOffCPU(dst []Stack, st Stack, runqIdx int, s *profile.Sample) []Stack {
	var runq int64
	if runqIdx >= 0 && st.State != "preempted" {
		runq = min(s.Value[runqIdx], st.Value)
	}
	if runq > 0 {
		rq := st
		rq.Value, rq.Count, rq.State = runq, 0, StateRunQueue
		rq.WakerWaitNs, rq.WakerWaitFrames = 0, nil
		st.Value -= runq
		st.WakerWaitNs = min(st.WakerWaitNs, st.Value)
		dst = append(dst, rq)
	}
	if st.Value > 0 {
		dst = append(dst, st)
	}
	return dst
}

func numLabel(s *profile.Sample, k string) int64 {
	if v := s.NumLabel[k]; len(v) > 0 {
		return v[0]
	}
	return 0
}

// ParseWakerStack reads a waker_stack label: user frames root first, "-",
// kernel frames.
func ParseWakerStack(folded string) []Frame {
	if folded == "" {
		return nil
	}
	var out []Frame
	kernel := false
	for _, p := range strings.Split(folded, ";") {
		if p == "-" {
			kernel = true
			continue
		}
		out = append(out, Frame{Name: p, Kernel: kernel})
	}
	return out
}

// frames returns a sample's frames root first, inlined ones expanded.
func frames(s *profile.Sample) []Frame { return Frames(s.Location) }

// addFolded reads "frame;frame;... VALUE" lines. bcc's offcputime -f
// puts the thread first and a "-" between user and kernel frames; lines
// without "-" (async-profiler collapsed) have no thread.
// FoldedStack reads one folded stack without its value: frames root
// first, user then kernel after "-"; with a "-", the first frame is the
// thread (bcc offcputime -f), without one there is no thread
// (async-profiler collapsed).
func FoldedStack(stack string) Stack {
	parts := strings.Split(stack, ";")
	st := Stack{Kind: KindOffCPU, Count: 1}
	kernel := false
	if slices.Contains(parts, "-") {
		st.Thread, parts = parts[0], parts[1:]
	}
	for _, p := range parts {
		if p == "-" {
			kernel = true
			continue
		}
		st.Frames = append(st.Frames, Frame{Name: p, Kernel: kernel})
	}
	return st
}

func (d *Data) addFolded(path string, b []byte, unit FoldedUnit) error {
	err := ScanFolded(b, func(stack []byte, v int64) error {
		line := string(stack)
		if strings.Contains(line, ";--;") {
			return nil // offwake lines: blocked and waker stacks together
		}
		st := FoldedStack(line)
		st.Value = v * int64(unit)
		d.Stacks = append(d.Stacks, st)
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// Folded is the stack as a folded line without its value: the thread if
// known, user frames, then "-" and kernel frames.
func (s *Stack) Folded() string {
	parts := []string{}
	if s.Thread != "" {
		parts = append(parts, FoldedFrame(s.Thread))
	}
	kernel := false
	for _, f := range s.Frames {
		if f.Kernel && !kernel && f.Name != "-" {
			parts = append(parts, "-")
			kernel = true
		}
		parts = append(parts, FoldedFrame(f.Name))
	}
	if s.Reason != "" {
		parts = append(parts, FoldedFrame("["+s.Reason+"]"))
	}
	return strings.Join(parts, ";")
}

// WakerRelation says who ended an off-CPU interval, relative to the
// waiter (one of WakerRelations).
func (s *Stack) WakerRelation() string {
	switch {
	case s.Waker == "":
		return "none"
	case s.WakerTID == 0 && strings.HasPrefix(s.Waker, "["):
		return "interrupt"
	case s.WakerPID == 0:
		return "unknown"
	case s.WakerPID == s.PID:
		return "same-process"
	case s.WakerProcess != "" && s.WakerProcess == s.Process:
		return "same-program"
	}
	return "other-program"
}
