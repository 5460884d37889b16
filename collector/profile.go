package collector

import (
	"fmt"
	"sort"
	"time"

	"github.com/google/pprof/profile"
	"golang.org/x/sys/unix"
)

// KernelMapping is the File of the pprof mapping that holds kernel frames;
// folded output puts those frames after the "-" separator.
const KernelMapping = "[kernel.kallsyms]"

// Sample label keys written by the recorder.
const (
	LabelThread  = "thread"  // thread name
	LabelProcess = "process" // process name
	LabelState   = "state"   // sleeping, uninterruptible, preempted, other
	LabelTID     = "tid"     // numeric
	LabelPID     = "pid"     // numeric
)

type profBuilder struct {
	p       *profile.Profile
	sym     *symbolizer
	kmap    *profile.Mapping
	maps    map[string]*profile.Mapping
	locs    map[[2]uint64]*profile.Location
	funcs   map[[2]string]*profile.Function
	unknown map[uint32]*profile.Mapping
	markers map[string]*profile.Location
}

func (s *Session) buildProfile(d *drained) (*profile.Profile, error) {
	// Snapshot live targets once more: covers execs and late mappings.
	seen := map[uint32]bool{}
	for _, r := range d.records {
		if !seen[r.tgid] {
			seen[r.tgid] = true
			if processExists(int(r.tgid)) {
				s.procs.snapshot(r.tgid)
			}
		}
	}
	b := &profBuilder{
		sym:     newSymbolizer(s.procs),
		maps:    map[string]*profile.Mapping{},
		locs:    map[[2]uint64]*profile.Location{},
		funcs:   map[[2]string]*profile.Function{},
		unknown: map[uint32]*profile.Mapping{},
		markers: map[string]*profile.Location{},
	}
	p := &profile.Profile{
		SampleType: []*profile.ValueType{
			{Type: "off_cpu", Unit: "nanoseconds"},
			{Type: "switches", Unit: "count"},
		},
		DefaultSampleType: "off_cpu",
		PeriodType:        &profile.ValueType{Type: "off_cpu", Unit: "nanoseconds"},
		Period:            1,
		TimeNanos:         s.start.UnixNano(),
		DurationNanos:     int64(s.stats.Duration),
	}
	b.p = p
	b.kmap = &profile.Mapping{ID: 1, File: KernelMapping, HasFunctions: true}
	p.Mapping = append(p.Mapping, b.kmap)

	sort.Slice(d.records, func(i, j int) bool { return d.records[i].ns > d.records[j].ns })
	for _, r := range d.records {
		th := d.threads[r.tid]
		var locs []*profile.Location
		for _, a := range trimKernel(r.kernel, b.sym.kern) {
			locs = append(locs, b.kernelLoc(a))
		}
		for _, a := range r.user {
			locs = append(locs, b.userLoc(r.tgid, a))
		}
		if len(r.user) == 0 && r.userErr < 0 && th.tgid != 0 && !isKernelThread(r) {
			locs = append(locs, b.marker(fmt.Sprintf("[user stack: %s]", errnoName(r.userErr))))
		}
		proc := processName(d, r.tgid, b.sym.procs)
		p.Sample = append(p.Sample, &profile.Sample{
			Location: locs,
			Value:    []int64{int64(r.ns), int64(r.count)},
			Label: map[string][]string{
				LabelThread:  {th.comm},
				LabelProcess: {proc},
				LabelState:   {r.state.String()},
			},
			NumLabel: map[string][]int64{LabelTID: {int64(r.tid)}, LabelPID: {int64(r.tgid)}},
		})
	}
	st := s.stats
	p.Comments = append(p.Comments,
		fmt.Sprintf("offcpu record: attach=%s duration=%v intervals=%d off_cpu=%v keys=%d stacks=%d",
			st.Attach, st.Duration.Round(time.Millisecond), st.Intervals, st.OffCPU.Round(time.Microsecond), st.Keys, st.Stacks),
		fmt.Sprintf("losses: user_stack_lost=%d kernel_stack_lost=%d user_stack_fault=%d agg_full=%d (%v) start_full=%d events_lost=%d",
			st.UserStackLost, st.KernelStackLost, st.UserStackFault, st.AggFull, st.AggFullTime, st.StartFull, st.EventsLost),
		fmt.Sprintf("stacks_reused=%d (same syscall, argument and user registers as the thread's previous sleep)", st.StacksReused),
		fmt.Sprintf("not measured: no_start=%d (blocked since before the start), out_of_range=%d (--min-block/--max-block)", st.NoStart, st.OutOfRange),
	)
	if err := p.CheckValid(); err != nil {
		return nil, fmt.Errorf("building the profile: %w", err)
	}
	return p, nil
}

func isKernelThread(r record) bool { return len(r.user) == 0 && r.userErr == -1 }

func errnoName(e int32) string {
	if e == 0 {
		return "none"
	}
	return unix.ErrnoName(unix.Errno(-e))
}

func processName(d *drained, tgid uint32, procs *procTable) string {
	if th, ok := d.threads[tgid]; ok && th.tgid == tgid {
		if p := procs.get(tgid); p != nil && p.comm != "" {
			return p.comm
		}
		return th.comm
	}
	if p := procs.get(tgid); p != nil && p.comm != "" {
		return p.comm
	}
	return fmt.Sprintf("pid-%d", tgid)
}

// trimKernel drops the frames above __schedule (tracing and BPF glue).
func trimKernel(st []uint64, k *kernelSyms) []uint64 {
	for i, a := range st {
		if n := k.lookup(a); n == "__schedule" || n == "__schedule_loop" {
			return st[i:]
		}
	}
	return st
}

func (b *profBuilder) function(name, file string) *profile.Function {
	key := [2]string{name, file}
	if f, ok := b.funcs[key]; ok {
		return f
	}
	f := &profile.Function{ID: uint64(len(b.p.Function) + 1), Name: name, SystemName: name, Filename: file}
	b.p.Function = append(b.p.Function, f)
	b.funcs[key] = f
	return f
}

func (b *profBuilder) kernelLoc(addr uint64) *profile.Location {
	key := [2]uint64{0, addr}
	if l, ok := b.locs[key]; ok {
		return l
	}
	l := &profile.Location{ID: uint64(len(b.p.Location) + 1), Mapping: b.kmap, Address: addr,
		Line: []profile.Line{{Function: b.function(b.sym.kern.lookup(addr), "")}}}
	b.p.Location = append(b.p.Location, l)
	b.locs[key] = l
	return l
}

// marker is a pseudo-frame that says why a stack is missing.
func (b *profBuilder) marker(text string) *profile.Location {
	if l, ok := b.markers[text]; ok {
		return l
	}
	l := &profile.Location{ID: uint64(len(b.p.Location) + 1), Line: []profile.Line{{Function: b.function(text, "")}}}
	b.p.Location = append(b.p.Location, l)
	b.markers[text] = l
	return l
}

func (b *profBuilder) userLoc(pid uint32, addr uint64) *profile.Location {
	key := [2]uint64{uint64(pid) + 1, addr}
	if l, ok := b.locs[key]; ok {
		return l
	}
	// addr is a return address: look up the call instruction before it.
	fr, m := b.sym.user(pid, addr-1)
	l := &profile.Location{ID: uint64(len(b.p.Location) + 1), Address: addr, Mapping: b.mapping(pid, m),
		Line: []profile.Line{{Function: b.function(fr.fn, fr.file), Line: fr.line}}}
	b.p.Location = append(b.p.Location, l)
	b.locs[key] = l
	return l
}

func (b *profBuilder) mapping(pid uint32, m *mapping) *profile.Mapping {
	if m == nil {
		if pm, ok := b.unknown[pid]; ok {
			return pm
		}
		pm := &profile.Mapping{ID: uint64(len(b.p.Mapping) + 1), File: "[unmapped]", HasFunctions: true}
		b.p.Mapping = append(b.p.Mapping, pm)
		b.unknown[pid] = pm
		return pm
	}
	key := fmt.Sprintf("%d:%x", pid, m.start)
	if pm, ok := b.maps[key]; ok {
		return pm
	}
	pm := &profile.Mapping{ID: uint64(len(b.p.Mapping) + 1), Start: m.start, Limit: m.end, Offset: m.offset,
		File: m.path, HasFunctions: true}
	if pm.File == "" {
		pm.File = "[anon]"
	}
	if m.file != nil {
		m.file.load()
		pm.BuildID = m.file.buildID
	}
	b.p.Mapping = append(b.p.Mapping, pm)
	b.maps[key] = pm
	return pm
}

func durationNs(ns uint64) time.Duration {
	if ns > 1<<63-1 {
		return time.Duration(1<<63 - 1)
	}
	return time.Duration(ns)
}
