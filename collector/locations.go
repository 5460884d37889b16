package collector

import (
	"fmt"
	"time"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/symtab"
	"github.com/offcpu/offcpu/runtimes"
	"github.com/offcpu/offcpu/schema"
)

// profBuilder turns addresses into a pprof profile's locations, functions
// and mappings, each made once.
type profBuilder struct {
	p    *profile.Profile
	sym  *symbolize.Symbolizer
	kmap *profile.Mapping
	maps map[string]*profile.Mapping
	// Per file segment and offset (see fileLoc).
	fileMaps map[fileSeg]*profile.Mapping
	fileLocs map[fileOff]*profile.Location
	locs     map[[2]uint64]*profile.Location
	funcs    map[[2]string]*profile.Function
	unknown  map[uint32]*profile.Mapping
	markers  map[string]*profile.Location
	// wrappers: locations of compiler-generated Go wrappers, left out of
	// stacks as Go's tracebacks leave them out.
	wrappers map[*profile.Location]bool
	merger   *sampleMerger
}

// add appends a sample, merged with its twin where fold (exited.go).
func (b *profBuilder) add(smp *profile.Sample, fold bool) {
	if b.merger == nil {
		b.merger = newSampleMerger(b.p)
	}
	b.merger.add(smp, fold)
}

func newProfBuilder(sym *symbolize.Symbolizer, types ...*profile.ValueType) *profBuilder {
	b := &profBuilder{
		sym:      sym,
		maps:     map[string]*profile.Mapping{},
		fileMaps: map[fileSeg]*profile.Mapping{},
		fileLocs: map[fileOff]*profile.Location{},
		locs:     map[[2]uint64]*profile.Location{},
		funcs:    map[[2]string]*profile.Function{},
		unknown:  map[uint32]*profile.Mapping{},
		markers:  map[string]*profile.Location{},
		wrappers: map[*profile.Location]bool{},
	}
	b.p = &profile.Profile{SampleType: types, DefaultSampleType: types[0].Type,
		PeriodType: &profile.ValueType{Type: types[0].Type, Unit: types[0].Unit}, Period: 1}
	b.kmap = &profile.Mapping{ID: 1, File: schema.KernelMapping, HasFunctions: true}
	b.p.Mapping = append(b.p.Mapping, b.kmap)
	return b
}

// stack returns locations leaf first: kernel frames, then user frames.
func (b *profBuilder) stack(pid uint32, kernel, user []uint64, userErr int64, kthread bool) []*profile.Location {
	var locs []*profile.Location
	for _, a := range kernel {
		locs = append(locs, b.kernelLoc(a))
	}
	for i, a := range user {
		if l := b.userLoc(pid, a, i == 0); !b.wrappers[l] {
			locs = append(locs, l)
		}
	}
	if len(user) == 0 && userErr == errNotWalked {
		locs = append(locs, b.marker(schema.OffCPUNotWalked))
	} else if len(user) == 0 && userErr < 0 && !kthread {
		locs = append(locs, b.marker(fmt.Sprintf("[user stack: %s]", errnoName(userErr))))
	}
	return locs
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
		Line: []profile.Line{{Function: b.function(b.sym.Kern.Lookup(addr), "")}}}
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

// userLoc is the location of a user frame. leaf: addr is where the thread
// stopped (the registers' instruction pointer); otherwise it is a return
// address, and the call instruction before it is looked up.
func (b *profBuilder) userLoc(pid uint32, addr uint64, leaf bool) *profile.Location {
	key := [2]uint64{uint64(pid) + 1, addr}
	look := addr - 1
	if leaf || runtimes.KindOf(addr) != bpf.FrameNative { // a Method* or code object, not a return address
		look = addr
	}
	if leaf {
		key[0] |= 1 << 40
		look = addr
	}
	if l, ok := b.locs[key]; ok {
		return l
	}
	p := b.sym.Proc(pid)
	var m *symbolize.Mapping
	if p != nil {
		m = p.Find(look)
	}
	if m != nil && m.File != nil {
		// Code from a file: one location per file offset, shared by every
		// process that maps the file (each has its own addresses), so that
		// many short-lived processes do not each add their own.
		l := b.fileLoc(pid, m, addr, look, leaf)
		b.locs[key] = l
		return l
	}
	if b.sym.JIT != nil {
		// Java code: an interpreter frame, or a pc in compiled code with the
		// methods inlined there, innermost first.
		if frames, ok := b.sym.JIT.Frames(pid, addr); ok && len(frames) > 0 {
			pm := b.mapping(pid, m)
			if rt, ok := b.sym.JIT.(interface{ MappingOf(addr uint64) string }); ok {
				pm = b.runtimeMapping(rt.MappingOf(addr))
			}
			l := &profile.Location{ID: uint64(len(b.p.Location) + 1), Address: addr, Mapping: pm}
			b.setLines(l, frames)
			b.p.Location = append(b.p.Location, l)
			b.locs[key] = l
			return l
		}
	}
	frames, m := b.sym.UserFrames(pid, look)
	l := &profile.Location{ID: uint64(len(b.p.Location) + 1), Address: addr, Mapping: b.mapping(pid, m)}
	b.setLines(l, frames)
	b.p.Location = append(b.p.Location, l)
	b.locs[key] = l
	return l
}

// fileLoc is the location of addr in file mapping m, keyed by file and
// offset. Its address is in the first mapping of that file segment seen,
// so that pprof still finds the file offset from it.
func (b *profBuilder) fileLoc(pid uint32, m *symbolize.Mapping, addr, look uint64, leaf bool) *profile.Location {
	seg := fileSeg{m.File, m.Offset}
	pm, ok := b.fileMaps[seg]
	if !ok {
		pm = b.mapping(pid, m)
		b.fileMaps[seg] = pm
	}
	key := fileOff{seg, addr - m.Start, leaf}
	if l, ok := b.fileLocs[key]; ok {
		return l
	}
	frames, _ := b.sym.UserFrames(pid, look)
	l := &profile.Location{ID: uint64(len(b.p.Location) + 1), Address: pm.Start + (addr - m.Start), Mapping: pm}
	b.setLines(l, frames)
	b.p.Location = append(b.p.Location, l)
	b.fileLocs[key] = l
	return l
}

// setLines gives l a line for each frame (innermost first, as pprof has
// inlined calls), leaving out Go's wrappers as its tracebacks do; a
// location of wrappers alone is left out of stacks.
func (b *profBuilder) setLines(l *profile.Location, frames []symtab.Frame) {
	for _, fr := range frames {
		if !fr.Wrapper {
			l.Line = append(l.Line, profile.Line{Function: b.function(fr.Func, fr.File), Line: fr.Line})
		}
	}
	if len(l.Line) == 0 {
		fr := frames[len(frames)-1]
		l.Line = []profile.Line{{Function: b.function(fr.Func, fr.File), Line: fr.Line}}
		b.wrappers[l] = true
	}
}

type fileSeg struct {
	file   *symtab.File
	offset uint64
}

type fileOff struct {
	seg  fileSeg
	off  uint64 // from the segment's start
	leaf bool
}

// runtimeMapping is the mapping of the frames a language runtime names
// (schema.RuntimeMappings), one per runtime.
func (b *profBuilder) runtimeMapping(file string) *profile.Mapping {
	for _, pm := range b.p.Mapping {
		if pm.File == file {
			return pm
		}
	}
	pm := &profile.Mapping{ID: uint64(len(b.p.Mapping) + 1), File: file, HasFunctions: true}
	b.p.Mapping = append(b.p.Mapping, pm)
	return pm
}

func (b *profBuilder) mapping(pid uint32, m *symbolize.Mapping) *profile.Mapping {
	if m == nil {
		if pm, ok := b.unknown[pid]; ok {
			return pm
		}
		pm := &profile.Mapping{ID: uint64(len(b.p.Mapping) + 1), File: "[unmapped]", HasFunctions: true}
		b.p.Mapping = append(b.p.Mapping, pm)
		b.unknown[pid] = pm
		return pm
	}
	key := fmt.Sprintf("%d:%x", pid, m.Start)
	if pm, ok := b.maps[key]; ok {
		return pm
	}
	pm := &profile.Mapping{ID: uint64(len(b.p.Mapping) + 1), Start: m.Start, Limit: m.End, Offset: m.Offset,
		File: m.Path, HasFunctions: true}
	if pm.File == "" {
		pm.File = "[anon]"
	}
	if m.File != nil {
		m.File.Load()
		pm.BuildID = m.File.BuildID
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
