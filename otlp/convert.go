// Package otlp turns offcpu's profiles into OpenTelemetry profiles
// (OTLP v1development, built with the Collector's pdata) and sends them
// to a Collector over gRPC or HTTP, with a bounded queue that counts what
// it drops.
package otlp

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"hash/maphash"
	"sort"
	"time"

	"github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/offcpu/offcpu/schema"
)

// Sample types, as the OpenTelemetry eBPF profiler and Pyroscope's OTLP
// ingestion name time and event profiles.
const (
	TypeOffCPU   = "off_cpu"  // blocked: off a CPU, not waiting for one
	TypeRunQueue = "runqueue" // runnable, waiting for a CPU
	TypeWakeups  = "wakeups"  // wake-ups, at the waker's stack
	TypeCPU      = "cpu"      // on a CPU
	// Goroutine waits (offcpu record --goroutines): park to runnable, and
	// runnable to running. Apart from the threads' off-CPU time, which
	// the same waits are part of when the thread blocks too.
	TypeGoroutineBlocked  = "goroutine_blocked"
	TypeGoroutineRunQueue = "goroutine_runqueue"
)

// Attribute keys. Resource attributes follow the semantic conventions;
// offcpu's own are prefixed.
const (
	AttrHostName     = "host.name"
	AttrPID          = "process.pid"
	AttrExecutable   = "process.executable.name"
	AttrContainerID  = "container.id"
	AttrServiceName  = "service.name"
	AttrThreadName   = "thread.name"
	AttrThreadID     = "thread.id"
	AttrBuildID      = "process.executable.build_id.gnu"
	AttrVerdict      = "offcpu.verdict" // idle or blocked
	AttrCategory     = "offcpu.category"
	AttrState        = "offcpu.state"
	AttrWaker        = "offcpu.waker"
	AttrWakerPID     = "offcpu.waker.pid"
	AttrWakeupClass  = "offcpu.wakeup_class"
	AttrTargetThread = "offcpu.target.thread"
	AttrTargetPID    = "offcpu.target.pid"
	// AttrFrameType: a location's kind of code, as the OpenTelemetry
	// eBPF profiler names it (native, kernel, jvm, cpython, v8js).
	AttrFrameType      = "profile.frame.type"
	ScopeName          = "offcpu"
	verdictIdle        = "idle"
	verdictBlocked     = "blocked"
	verdictWaitsForCPU = "runnable"
)

// Process describes a process for its resource attributes.
type Process struct {
	Executable  string // process.executable.name
	ServiceName string // OTEL_SERVICE_NAME from its environment
	ContainerID string // from its cgroup
}

// Categorizer decides an off-CPU stack's categories, the first its own,
// and which are idle (analysis.Rules).
type Categorizer interface {
	Categorize(st *schema.Stack) []string
	IsIdle(category string) bool
}

// loopIndexer is a Categorizer whose verdicts rest on each thread's top
// of loop: every off-CPU stack of a profile is observed, then each is
// marked before it is categorized (analysis.Rules).
type loopIndexer interface {
	LoopIndex() interface {
		Observe(*schema.Stack)
		Mark(*schema.Stack)
	}
}

// loopIndex observes stacks for c's rules' tops of loop; nil when they
// have none.
func (c *Converter) loopIndex(each func(func(*schema.Stack))) interface{ Mark(*schema.Stack) } {
	li, ok := c.Rules.(loopIndexer)
	if !ok {
		return nil
	}
	x := li.LoopIndex()
	each(x.Observe)
	return x
}

// Converter builds OTLP profiles. Processes, when set, names a pid's
// resource; Rules decide each off-CPU stack's category and verdict.
type Converter struct {
	// MaxBytes: above it, an interval is split into several messages
	// (0: never).
	MaxBytes  int
	Host      string
	Rules     Categorizer
	Processes func(pid int64, comm string) Process
	Version   string
	// Resource: attributes every resource gets where offcpu set none of
	// that name (OTEL_RESOURCE_ATTRIBUTES: the cluster, the environment).
	Resource map[string]string

	// Categories already decided, by a 128-bit hash of everything the
	// rules read (the keys themselves, whole stacks, weighed megabytes):
	// most stacks come back interval after interval.
	cache      map[[2]uint64][2]string
	cacheRules Categorizer
	seeds      [2]maphash.Seed
}

// categorize returns st's category and verdict.
func (c *Converter) categorize(st *schema.Stack) (string, string) {
	if c.cacheRules != c.Rules || len(c.cache) > 1<<16 {
		c.cache, c.cacheRules = map[[2]uint64][2]string{}, c.Rules
		c.seeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}
	}
	key := [2]uint64{stackHash(c.seeds[0], st), stackHash(c.seeds[1], st)}
	if v, ok := c.cache[key]; ok {
		return v[0], v[1]
	}
	cat := c.Rules.Categorize(st)[0]
	verdict := verdictBlocked
	if c.Rules.IsIdle(cat) {
		verdict = verdictIdle
	}
	c.cache[key] = [2]string{cat, verdict}
	return cat, verdict
}

// stackHash hashes what the rules read of a stack (analysis.Rules): of
// the waker's identity, only its relation to the waiter, so that threads
// of processes that come and go share entries.
func stackHash(seed maphash.Seed, st *schema.Stack) uint64 {
	var h maphash.Hash
	h.SetSeed(seed)
	for _, s := range []string{st.Kind, st.Thread, st.State, st.Class, st.Reason, st.WakerRelation()} {
		h.WriteString(s)
		h.WriteByte(0)
	}
	var flags byte
	if st.InRequest {
		flags |= 1
	}
	if st.WakerDispatching {
		flags |= 2
	}
	if st.InTrace() {
		flags |= 4
	}
	h.WriteByte(flags)
	h.WriteString(st.InRequestWhy)
	h.WriteString(st.Loop)
	for _, frames := range [][]schema.Frame{st.Frames, st.WakerFrames} {
		for _, f := range frames {
			h.WriteString(f.Name)
			h.WriteByte(0)
			h.WriteString(f.Module)
			h.WriteString(f.Runtime)
			if f.Kernel {
				h.WriteByte(1)
			} else {
				h.WriteByte(0)
			}
		}
		h.WriteByte(2)
	}
	return h.Sum64()
}

// Counts is what one conversion holds, per sample type: the sum of its
// values and its samples.
type Counts struct {
	Values  map[string]int64
	Samples int
}

// Convert builds the Profiles messages of an interval's off-CPU profile
// (with on-CPU samples) and its wake-up profile (may be nil): per process
// a resource, per sample type a profile, one sample per stack and state.
// One message, or with MaxBytes set and exceeded, several, each with the
// dictionary of its own samples (a process may span two). The profiles
// are read a sample at a time: what an interval holds at once is the
// pprof profiles, the messages and a few words per sample.
func (c *Converter) Convert(start time.Time, dur time.Duration, off, wake *profile.Profile, gor ...*profile.Profile) ([]pprofile.Profiles, Counts, error) {
	es, err := c.entries(off, wake)
	if err == nil {
		for _, gp := range gor {
			es, err = c.goroutineEntries(es, gp)
		}
	}
	if err != nil {
		return nil, Counts{}, err
	}
	build := func(es []entry) *builder {
		b := newBuilder(c, start, dur)
		for i := range es {
			b.add(&es[i])
		}
		return b
	}
	whole := build(es)
	var m pprofile.ProtoMarshaler
	size := m.ProfilesSize(whole.out)
	if c.MaxBytes <= 0 || size <= c.MaxBytes {
		return []pprofile.Profiles{whole.out}, whole.counts, nil
	}
	counts := whole.counts
	whole = nil // not kept while the parts are built
	// Samples of a process together, cut into k runs of equal length.
	sort.SliceStable(es, func(i, j int) bool { return es[i].pid < es[j].pid })
	for k := size/c.MaxBytes + 1; ; k *= 2 {
		k = min(k, len(es))
		parts, fits := make([]pprofile.Profiles, 0, k), true
		for i := range k {
			p := build(es[i*len(es)/k : (i+1)*len(es)/k]).out
			fits = fits && m.ProfilesSize(p) <= c.MaxBytes
			parts = append(parts, p)
		}
		if fits || k == len(es) {
			return parts, counts, nil
		}
	}
}

// samplePID is the process a sample's resource is: the waker's for a
// wake-up.
func samplePID(typ string, st *schema.Stack) int64 {
	if typ == TypeWakeups && st.Sample != nil {
		return first(st.Sample.NumLabel[schema.LabelPID])
	}
	return st.PID
}

// entry is one sample to add: its type, pprof sample, value and state
// (an off-CPU sample's wait for a CPU is a sample of its own), category
// and verdict; the rest is read from the pprof sample's labels.
type entry struct {
	typ               string
	s                 *profile.Sample
	value             int64
	state             string
	category, verdict string
	pid               int64
}

// entries reads the profiles into the samples to add, one pprof sample
// at a time (the off-CPU profile twice: which waits are inside a request
// depends on the thread's other waits).
func (c *Converter) entries(off, wake *profile.Profile) ([]entry, error) {
	var es []entry
	var buf []schema.Stack
	if off != nil {
		r, err := schema.NewSampleReader(off)
		if err != nil {
			return nil, fmt.Errorf("reading the off-CPU profile: %w", err)
		}
		r.Reuse()
		x := r.RequestIndex(off.Sample)
		var loops interface{ Mark(*schema.Stack) }
		if c.Rules != nil {
			loops = c.loopIndex(func(observe func(*schema.Stack)) {
				for _, s := range off.Sample {
					buf = r.Stacks(buf[:0], s)
					for i := range buf {
						observe(&buf[i])
					}
				}
			})
		}
		for _, s := range off.Sample {
			buf = r.Stacks(buf[:0], s)
			for i := range buf {
				st := &buf[i]
				e := entry{s: s, value: st.Value, state: st.State, pid: st.PID}
				switch {
				case st.Kind == schema.KindCPU:
					e.typ, e.state = TypeCPU, ""
				case st.Kind == schema.KindOffCPU && st.WaitsForCPU():
					e.typ, e.verdict = TypeRunQueue, verdictWaitsForCPU
				case st.Kind == schema.KindOffCPU:
					e.typ = TypeOffCPU
					if c.Rules != nil {
						x.Mark(st)
						if loops != nil {
							loops.Mark(st)
						}
						e.category, e.verdict = c.categorize(st)
					}
				default:
					continue
				}
				es = append(es, e)
			}
		}
	}
	if wake != nil {
		r, err := schema.NewSampleReader(wake)
		if err != nil {
			return nil, fmt.Errorf("reading the wake-up profile: %w", err)
		}
		r.Reuse()
		for _, s := range wake.Sample {
			buf = r.Stacks(buf[:0], s)
			for i := range buf {
				st := &buf[i]
				es = append(es, entry{typ: TypeWakeups, s: s, value: st.Value, pid: samplePID(TypeWakeups, st)})
			}
		}
	}
	return es, nil
}

// goroutineEntries appends a goroutine profile's waits: blocked, and
// waiting for a CPU after, each blocked one with its category.
func (c *Converter) goroutineEntries(es []entry, gp *profile.Profile) ([]entry, error) {
	if gp == nil {
		return es, nil
	}
	d, err := schema.FromProfile(gp)
	if err != nil {
		return es, fmt.Errorf("reading the goroutine profile: %w", err)
	}
	var loops interface{ Mark(*schema.Stack) }
	if c.Rules != nil {
		loops = c.loopIndex(func(observe func(*schema.Stack)) {
			for i := range d.Stacks {
				observe(&d.Stacks[i])
			}
		})
	}
	for i := range d.Stacks {
		st := &d.Stacks[i]
		if st.Kind != schema.KindOffCPU || st.Sample == nil {
			continue
		}
		if loops != nil {
			loops.Mark(st)
		}
		e := entry{typ: TypeGoroutineBlocked, s: st.Sample, value: st.Value, pid: st.PID}
		if st.WaitsForCPU() {
			e.typ, e.verdict = TypeGoroutineRunQueue, verdictWaitsForCPU
		} else if c.Rules != nil {
			e.category, e.verdict = c.categorize(st)
		}
		es = append(es, e)
	}
	return es, nil
}

// builder fills one Profiles message and its shared dictionary.
type builder struct {
	c          *Converter
	out        pprofile.Profiles
	dict       pprofile.ProfilesDictionary
	start      time.Time
	dur        time.Duration
	strs       map[string]int32
	attrs      map[attrKey]int32
	funcs      map[*profile.Function]int32
	mappings   map[*profile.Mapping]int32
	locs       map[*profile.Location]int32
	stacks     map[string]int32
	links      map[[24]byte]int32
	resources  map[int64]*resource
	counts     Counts
	stackBuf   []byte
	locIndices []int32
}

type attrKey struct {
	k string
	v any // string or int64
}

type resource struct {
	scope    pprofile.ScopeProfiles
	profiles map[string]pprofile.Profile
}

func newBuilder(c *Converter, start time.Time, dur time.Duration) *builder {
	b := &builder{c: c, out: pprofile.NewProfiles(), start: start, dur: dur,
		strs: map[string]int32{}, attrs: map[attrKey]int32{},
		funcs: map[*profile.Function]int32{}, mappings: map[*profile.Mapping]int32{}, locs: map[*profile.Location]int32{},
		stacks: map[string]int32{}, links: map[[24]byte]int32{}, resources: map[int64]*resource{}, counts: Counts{Values: map[string]int64{}}}
	b.dict = b.out.Dictionary()
	// Index 0 of every table is the zero value, as the format asks.
	b.str("")
	b.dict.MappingTable().AppendEmpty()
	b.dict.LocationTable().AppendEmpty()
	b.dict.FunctionTable().AppendEmpty()
	b.dict.AttributeTable().AppendEmpty()
	b.dict.StackTable().AppendEmpty()
	b.dict.LinkTable().AppendEmpty()
	return b
}

func (b *builder) str(s string) int32 {
	if i, ok := b.strs[s]; ok {
		return i
	}
	i := int32(b.dict.StringTable().Len())
	b.dict.StringTable().Append(s)
	b.strs[s] = i
	return i
}

func (b *builder) attr(k, v string) int32 { return b.attrOf(attrKey{k, v}) }

func (b *builder) intAttr(k string, v int64) int32 { return b.attrOf(attrKey{k, v}) }

// attrOf returns the attribute table index of a key and a string or
// int64 value, adding it on first use.
func (b *builder) attrOf(key attrKey) int32 {
	if i, ok := b.attrs[key]; ok {
		return i
	}
	i := int32(b.dict.AttributeTable().Len())
	a := b.dict.AttributeTable().AppendEmpty()
	a.SetKeyStrindex(b.str(key.k))
	switch v := key.v.(type) {
	case string:
		a.Value().SetStr(v)
	case int64:
		a.Value().SetInt(v)
	}
	b.attrs[key] = i
	return i
}

// resource returns pid's resource, made with its attributes on first use.
func (b *builder) resource(pid int64, comm string) *resource {
	if r, ok := b.resources[pid]; ok {
		return r
	}
	rp := b.out.ResourceProfiles().AppendEmpty()
	attrs := rp.Resource().Attributes()
	if b.c.Host != "" {
		attrs.PutStr(AttrHostName, b.c.Host)
	}
	attrs.PutInt(AttrPID, pid)
	p := Process{Executable: comm}
	if b.c.Processes != nil {
		p = b.c.Processes(pid, comm)
	}
	if p.Executable != "" {
		attrs.PutStr(AttrExecutable, p.Executable)
	}
	if p.ServiceName != "" {
		attrs.PutStr(AttrServiceName, p.ServiceName)
	}
	if p.ContainerID != "" {
		attrs.PutStr(AttrContainerID, p.ContainerID)
	}
	for k, v := range b.c.Resource {
		if _, set := attrs.Get(k); !set {
			attrs.PutStr(k, v)
		}
	}
	sp := rp.ScopeProfiles().AppendEmpty()
	sp.Scope().SetName(ScopeName)
	sp.Scope().SetVersion(b.c.Version)
	r := &resource{scope: sp, profiles: map[string]pprofile.Profile{}}
	b.resources[pid] = r
	return r
}

// profile returns the resource's profile of one sample type.
func (b *builder) profile(r *resource, typ string) pprofile.Profile {
	if p, ok := r.profiles[typ]; ok {
		return p
	}
	p := r.scope.Profiles().AppendEmpty()
	unit := "nanoseconds"
	if typ == TypeWakeups {
		unit = "count"
	}
	p.SampleType().SetTypeStrindex(b.str(typ))
	p.SampleType().SetUnitStrindex(b.str(unit))
	p.PeriodType().SetTypeStrindex(b.str(typ))
	p.PeriodType().SetUnitStrindex(b.str(unit))
	p.SetPeriod(1)
	p.SetTime(pcommon.NewTimestampFromTime(b.start))
	p.SetDurationNano(uint64(b.dur))
	var id pprofile.ProfileID
	_, _ = rand.Read(id[:])
	p.SetProfileID(id)
	p.SetOriginalPayloadFormat("")
	r.profiles[typ] = p
	return p
}

// add appends one entry's sample to the profile of its type of its
// process. The pid and thread of a wake-up are the waker's: the pprof
// sample's own labels, as for the other types.
func (b *builder) add(e *entry) {
	if e.value == 0 || e.s == nil {
		return
	}
	s, typ := e.s, e.typ
	proc, thread, tid := label(s, schema.LabelProcess), label(s, schema.LabelThread), first(s.NumLabel[schema.LabelTID])
	if proc == "" {
		proc = thread
	}
	r := b.resource(e.pid, proc)
	p := b.profile(r, typ)
	smp := p.Samples().AppendEmpty()
	smp.Values().Append(e.value)
	smp.SetStackIndex(b.stack(s.Location))
	ai := smp.AttributeIndices()
	if thread != "" {
		ai.Append(b.attr(AttrThreadName, thread))
	}
	if tid != 0 {
		ai.Append(b.intAttr(AttrThreadID, tid))
	}
	if e.state != "" && typ != TypeCPU {
		ai.Append(b.attr(AttrState, e.state))
	}
	if e.category != "" {
		ai.Append(b.attr(AttrCategory, e.category))
	}
	if e.verdict != "" {
		ai.Append(b.attr(AttrVerdict, e.verdict))
	}
	class := label(s, schema.LabelWakeupClass)
	switch typ {
	case TypeOffCPU, TypeRunQueue:
		if w := label(s, schema.LabelWaker); w != "" {
			ai.Append(b.attr(AttrWaker, w))
		}
		if pid := first(s.NumLabel[schema.LabelWakerPID]); pid != 0 {
			ai.Append(b.intAttr(AttrWakerPID, pid))
		}
		if class != "" {
			ai.Append(b.attr(AttrWakeupClass, class))
		}
	case TypeWakeups:
		if t := label(s, schema.LabelTarget); t != "" {
			ai.Append(b.attr(AttrTargetThread, t))
		}
		if pid := first(s.NumLabel[schema.LabelTargetPID]); pid != 0 {
			ai.Append(b.intAttr(AttrTargetPID, pid))
		}
		if class != "" {
			ai.Append(b.attr(AttrWakeupClass, class))
		}
	}
	for k, v := range schema.ProgramLabels(s) {
		ai.Append(b.attr(k, v))
	}
	if li := b.link(label(s, schema.LabelTraceID), label(s, schema.LabelSpanID)); li != 0 {
		smp.SetLinkIndex(li)
	}
	b.counts.Values[typ] += e.value
	b.counts.Samples++
}

// link returns the link table index of a trace and span id (W3C, hex):
// 0, the table's zero entry, when the trace id is not one.
func (b *builder) link(trace, span string) int32 {
	var k [24]byte
	if n, err := hex.Decode(k[:16], []byte(trace)); err != nil || n != 16 || len(trace) != 32 {
		return 0
	}
	if n, err := hex.Decode(k[16:], []byte(span)); err != nil || n != 8 || len(span) != 16 {
		clear(k[16:]) // a trace without a span: the link names the trace
	}
	if i, ok := b.links[k]; ok {
		return i
	}
	i := int32(b.dict.LinkTable().Len())
	l := b.dict.LinkTable().AppendEmpty()
	l.SetTraceID(pcommon.TraceID(k[:16]))
	l.SetSpanID(pcommon.SpanID(k[16:]))
	b.links[k] = i
	return i
}

// stack returns the stack table index of locs (leaf first, as in pprof
// and OTLP alike).
func (b *builder) stack(locs []*profile.Location) int32 {
	b.locIndices = b.locIndices[:0]
	b.stackBuf = b.stackBuf[:0]
	for _, l := range locs {
		i := b.location(l)
		b.locIndices = append(b.locIndices, i)
		b.stackBuf = fmt.Appendf(b.stackBuf, "%d,", i)
	}
	if i, ok := b.stacks[string(b.stackBuf)]; ok {
		return i
	}
	i := int32(b.dict.StackTable().Len())
	b.dict.StackTable().AppendEmpty().LocationIndices().Append(b.locIndices...)
	b.stacks[string(b.stackBuf)] = i
	return i
}

func (b *builder) location(l *profile.Location) int32 {
	if i, ok := b.locs[l]; ok {
		return i
	}
	i := int32(b.dict.LocationTable().Len())
	loc := b.dict.LocationTable().AppendEmpty()
	loc.SetAddress(l.Address)
	typ := "native"
	if l.Mapping != nil {
		loc.SetMappingIndex(b.mapping(l.Mapping))
		if l.Mapping.File == schema.KernelMapping {
			typ = "kernel"
		} else if rt := schema.RuntimeOfMapping(l.Mapping.File); rt != "" {
			typ = rt
		}
	}
	loc.AttributeIndices().Append(b.attr(AttrFrameType, typ))
	for _, ln := range l.Line {
		line := loc.Lines().AppendEmpty()
		line.SetLine(ln.Line)
		if ln.Function != nil {
			line.SetFunctionIndex(b.function(ln.Function))
		}
	}
	b.locs[l] = i
	return i
}

func (b *builder) mapping(m *profile.Mapping) int32 {
	if i, ok := b.mappings[m]; ok {
		return i
	}
	i := int32(b.dict.MappingTable().Len())
	mp := b.dict.MappingTable().AppendEmpty()
	mp.SetMemoryStart(m.Start)
	mp.SetMemoryLimit(m.Limit)
	mp.SetFileOffset(m.Offset)
	mp.SetFilenameStrindex(b.str(m.File))
	if m.BuildID != "" {
		mp.AttributeIndices().Append(b.attr(AttrBuildID, m.BuildID))
	}
	b.mappings[m] = i
	return i
}

func (b *builder) function(f *profile.Function) int32 {
	if i, ok := b.funcs[f]; ok {
		return i
	}
	i := int32(b.dict.FunctionTable().Len())
	fn := b.dict.FunctionTable().AppendEmpty()
	fn.SetNameStrindex(b.str(f.Name))
	fn.SetSystemNameStrindex(b.str(f.SystemName))
	fn.SetFilenameStrindex(b.str(f.Filename))
	fn.SetStartLine(f.StartLine)
	b.funcs[f] = i
	return i
}

func label(s *profile.Sample, k string) string {
	if v := s.Label[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func first(v []int64) int64 {
	if len(v) > 0 {
		return v[0]
	}
	return 0
}
