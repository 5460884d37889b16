// Package golang reads what offcpu needs from a Go executable: the
// runtime's g and m layouts (DWARF, or a table by release), where to probe
// runtime.casgstatus, the GC cycle counter and the wait reasons. The
// goroutine recorder (collector) and the thread context reader use it.
package golang

import (
	"debug/buildinfo"
	"debug/dwarf"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/prometheus/procfs"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/symtab"
)

// Runtime is what the goroutine probe needs from a Go executable: where
// runtime.casgstatus is, the offsets of the runtime.g and runtime.m fields
// it reads, and the names of the wait reasons.
type Runtime struct {
	Version     string // "go1.26.8"
	Casgstatus  uint64 // file offset of the probe on runtime.casgstatus (site.go)
	PreemptPark uint64 // and on runtime.preemptPark; 0: not found
	GCCycles    uint64 // runtime.memstats.numgc's address in the file; 0: not found
	PIE         bool   // position-independent: loaded at a bias
	Load        uint64 // where a mapping at file offset 0 starts in the file
	Offsets     bpf.GoroutinesGoOffsets
	FromDWARF   bool
	Reasons     []string // waitReason -> its name, as the runtime prints it
}

// ErrNotGo: the executable has no Go build information.
var ErrNotGo = errors.New("not a Go executable")

// OffsetTable holds the offsets of Go releases, for executables built
// without DWARF (-ldflags=-w, or stripped). runtime.g and runtime.m
// changed twice since 1.19 (src/runtime/runtime2.go): 1.23 added
// g.syscallbp before goid, 1.25 removed gobuf.ret (in g.sched and in
// m.morebuf, before m.curg). Checked against DWARF by TestGoOffsetsTable:
// 1.19 (Debian's golang-1.19-go) and the building toolchain; 1.27.3 by
// hand (same as 1.26). The rows between follow from the source alone.
// g.gopc (who created the goroutine), g.startpc (what it runs) and
// g.labels (pprof labels) only where DWARF of that release was read (1.19:
// 296, 312 and 360; 1.26: 288, 304 and 352); elsewhere 0: unknown, and
// goroutines are grouped by their frames, without labels.
var OffsetTable = map[string]bpf.GoroutinesGoOffsets{
	"go1.19": go119, "go1.20": go120, "go1.21": go120, "go1.22": go120,
	"go1.23": go123, "go1.24": go123,
	"go1.25": go125, "go1.26": go126, "go1.27": go125,
}

var (
	go119 = bpf.GoroutinesGoOffsets{Goid: 152, Waitreason: 176, M: 48, SchedSp: 56, SchedPc: 64, SchedBp: 104, M_curg: 192, Gopc: 296, Startpc: 312, Labels: 360}
	go120 = bpf.GoroutinesGoOffsets{Goid: 152, Waitreason: 176, M: 48, SchedSp: 56, SchedPc: 64, SchedBp: 104, M_curg: 192}
	go123 = bpf.GoroutinesGoOffsets{Goid: 160, Waitreason: 184, M: 48, SchedSp: 56, SchedPc: 64, SchedBp: 104, M_curg: 192}
	go125 = bpf.GoroutinesGoOffsets{Goid: 152, Waitreason: 176, M: 48, SchedSp: 56, SchedPc: 64, SchedBp: 96, M_curg: 184}
	go126 = bpf.GoroutinesGoOffsets{Goid: 152, Waitreason: 176, M: 48, SchedSp: 56, SchedPc: 64, SchedBp: 96, M_curg: 184, Gopc: 288, Startpc: 304, Labels: 352}
)

// ReadRuntime reads a Go executable's runtime description.
func ReadRuntime(path string) (*Runtime, error) {
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return nil, ErrNotGo
	}
	ef, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer ef.Close()
	if ef.Machine != elf.EM_X86_64 {
		return nil, fmt.Errorf("%s: goroutine waits are read on x86-64 only", path)
	}
	rt := &Runtime{Version: bi.GoVersion, PIE: ef.Type == elf.ET_DYN, Load: FirstLoad(ef)}
	off, numgc, ok := OffsetsDWARF(ef)
	rt.GCCycles = GCCycles(ef, bi.GoVersion, numgc)
	if ok {
		rt.Offsets, rt.FromDWARF = off, true
	} else if off, ok := OffsetTable[Minor(bi.GoVersion)]; ok {
		rt.Offsets = off
	} else {
		return nil, fmt.Errorf("%s: built with %s and without DWARF: its runtime's layout is not known (known: go1.19 to go1.27, or any release built with DWARF)", path, bi.GoVersion)
	}
	rt.Offsets.LabelLayout = LabelLayout(bi.GoVersion)
	if err := checkGoOffsets(rt.Offsets); err != nil {
		return nil, fmt.Errorf("%s (%s): %w", path, bi.GoVersion, err)
	}
	addr, ok := goFuncAddr(ef, "runtime.casgstatus")
	if !ok {
		return nil, fmt.Errorf("%s: runtime.casgstatus not found", path)
	}
	site, framed := ProbeSite(funcCode(ef, addr, siteScan))
	if framed {
		rt.Offsets.Framed = 1
	}
	if rt.Casgstatus, ok = fileOffset(ef, addr+site); !ok {
		return nil, fmt.Errorf("%s: runtime.casgstatus at %#x is in no loaded segment", path, addr)
	}
	// Its program reads gp (AX) and the saved state alone: any site does.
	if addr, ok := goFuncAddr(ef, "runtime.preemptPark"); ok {
		site, _ := ProbeSite(funcCode(ef, addr, siteScan))
		rt.PreemptPark, _ = fileOffset(ef, addr+site)
	}
	rt.Reasons = goWaitReasons(ef)
	return rt, nil
}

// gcCyclesIn: runtime.memstats.numgc's address in process pid; 0 where
// not known.
func (rt *Runtime) GCCyclesIn(pid uint32) uint64 {
	if rt.GCCycles == 0 || !rt.PIE {
		return rt.GCCycles
	}
	p, err := procfs.NewProc(int(pid))
	if err != nil {
		return 0
	}
	exe, err := p.Executable()
	if err != nil {
		return 0
	}
	maps, err := p.ProcMaps()
	if err != nil {
		return 0
	}
	for _, m := range maps {
		if m.Offset == 0 && m.Pathname == exe {
			return uint64(m.StartAddr) - rt.Load + rt.GCCycles
		}
	}
	return 0
}

// gWords is how much of runtime.g the probe reads in one go.
const gWords = bpf.GBaseWords

// checkGoOffsets: the probe finds m, goid, waitreason and sched's pc and
// bp among the first gWords words of runtime.g, the words at a multiple
// of 8.
func checkGoOffsets(o bpf.GoroutinesGoOffsets) error {
	for _, f := range []struct {
		name string
		off  uint32
		word bool
	}{{"m", o.M, true}, {"goid", o.Goid, true}, {"waitreason", o.Waitreason, false}, {"sched.pc", o.SchedPc, true},
		{"sched.bp", o.SchedBp, true}} {
		if f.off >= gWords*8 || (f.word && f.off%8 != 0) {
			return fmt.Errorf("runtime.g.%s at offset %d is not where the probe reads it (the first %d words)", f.name, f.off, gWords)
		}
	}
	return nil
}

// LabelLayout: how runtime/pprof keeps a goroutine's labels, a map
// before go1.24 and a sorted slice from it (runtime/pprof/label.go).
func LabelLayout(version string) uint32 {
	var minor int
	if _, err := fmt.Sscanf(Minor(version), "go1.%d", &minor); err != nil || minor < 19 {
		return bpf.GoLabelsNone
	}
	if minor < 24 {
		return bpf.GoLabelsMap
	}
	return bpf.GoLabelsSlice
}

// Minor is "go1.26" of "go1.26.8" (or of "go1.26rc1").
func Minor(v string) string {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return v
	}
	minor := parts[1]
	if i := strings.IndexFunc(minor, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		minor = minor[:i]
	}
	return parts[0] + "." + minor
}

// goNumgcTable: runtime.mstats.numgc's offset, read from DWARF of each
// release (TestGoOffsetsTable), for executables built without it.
var goNumgcTable = map[string]uint64{"go1.19": 7704, "go1.26": 7680}

// GCCycles: the address in ef of runtime.memstats.numgc (the GC cycles
// completed), numgc its offset (0: from the table); 0 where the symbol
// is stripped or the offset not known.
func GCCycles(ef *elf.File, version string, numgc uint64) uint64 {
	if numgc == 0 {
		numgc = goNumgcTable[Minor(version)]
	}
	if numgc == 0 {
		return 0
	}
	syms, err := ef.Symbols()
	if err != nil {
		return 0
	}
	for _, s := range syms {
		if s.Name == "runtime.memstats" && s.Size >= numgc+4 {
			return s.Value + numgc
		}
	}
	return 0
}

// OffsetsDWARF reads the offsets from the executable's DWARF, and
// runtime.mstats.numgc's (0: not found).
func OffsetsDWARF(ef *elf.File) (bpf.GoroutinesGoOffsets, uint64, bool) {
	d, err := ef.DWARF()
	if err != nil {
		return bpf.GoroutinesGoOffsets{}, 0, false
	}
	want := map[string][]string{
		"runtime.g":      {"goid", "waitreason", "m", "sched", "gopc", "startpc", "labels"},
		"runtime.gobuf":  {"sp", "pc", "bp"},
		"runtime.m":      {"curg"},
		"runtime.mstats": {"numgc"},
	}
	got := map[string]uint64{}
	r := d.Reader()
	for {
		e, err := r.Next()
		if err != nil || e == nil {
			break
		}
		name, _ := e.Val(dwarf.AttrName).(string)
		fields, ok := want[name]
		if e.Tag != dwarf.TagStructType || !ok {
			if e.Children && e.Tag != dwarf.TagCompileUnit {
				r.SkipChildren()
			}
			continue
		}
		for {
			c, err := r.Next()
			if err != nil || c == nil || c.Tag == 0 {
				break
			}
			field, _ := c.Val(dwarf.AttrName).(string)
			loc, isInt := c.Val(dwarf.AttrDataMemberLoc).(int64)
			for _, f := range fields {
				if f == field && isInt {
					got[name+"."+f] = uint64(loc)
				}
			}
			if c.Children {
				r.SkipChildren()
			}
		}
		delete(want, name)
		if len(want) == 0 {
			break
		}
	}
	numgc := got["runtime.mstats.numgc"]
	delete(got, "runtime.mstats.numgc")
	if len(got) != 11 {
		return bpf.GoroutinesGoOffsets{}, numgc, false
	}
	sched := got["runtime.g.sched"]
	return bpf.GoroutinesGoOffsets{
		Goid: uint32(got["runtime.g.goid"]), Waitreason: uint32(got["runtime.g.waitreason"]), M: uint32(got["runtime.g.m"]),
		SchedSp: uint32(sched + got["runtime.gobuf.sp"]), SchedPc: uint32(sched + got["runtime.gobuf.pc"]),
		SchedBp: uint32(sched + got["runtime.gobuf.bp"]), M_curg: uint32(got["runtime.m.curg"]), Gopc: uint32(got["runtime.g.gopc"]),
		Startpc: uint32(got["runtime.g.startpc"]), Labels: uint32(got["runtime.g.labels"]),
	}, numgc, true
}

// goFuncAddr finds a function by its symbol, or in a stripped executable
// by the runtime's own function table (.gopclntab).
func goFuncAddr(ef *elf.File, name string) (uint64, bool) {
	if syms, err := ef.Symbols(); err == nil {
		for _, s := range syms {
			if s.Name == name && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
				return s.Value, true
			}
		}
	}
	if tab := symtab.GoTable(ef); tab != nil {
		if f := tab.LookupFunc(name); f != nil {
			return f.Entry, true
		}
	}
	return 0, false
}

// fileOffset turns a virtual address into its offset in the file.
func fileOffset(ef *elf.File, addr uint64) (uint64, bool) {
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && addr >= p.Vaddr && addr < p.Vaddr+p.Filesz {
			return addr - p.Vaddr + p.Off, true
		}
	}
	return 0, false
}

// goWaitReasons finds the runtime's table of wait reason names: an array
// of Go strings whose second and third are "GC assist marking" and "IO
// wait" (so since Go 1.11), found by content, symbols or none.
func goWaitReasons(ef *elf.File) []string {
	read := func(addr, n uint64) []byte {
		for _, p := range ef.Progs {
			if p.Type == elf.PT_LOAD && addr >= p.Vaddr && addr+n <= p.Vaddr+p.Filesz {
				b := make([]byte, n)
				if _, err := p.ReadAt(b, int64(addr-p.Vaddr)); err == nil {
					return b
				}
			}
		}
		return nil
	}
	str := func(hdr []byte) (string, bool) {
		ptr, n := binary.LittleEndian.Uint64(hdr), binary.LittleEndian.Uint64(hdr[8:])
		if n == 0 {
			return "", true
		}
		if n > 64 {
			return "", false
		}
		b := read(ptr, n)
		return string(b), b != nil
	}
	for _, name := range []string{".data", ".noptrdata", ".data.rel.ro"} {
		s := ef.Section(name)
		if s == nil || s.Type == elf.SHT_NOBITS {
			continue
		}
		data, err := s.Data()
		if err != nil {
			continue
		}
		for i := 0; i+48 <= len(data); i += 8 {
			// The first entry is "" (nil pointer, length 0), the second
			// "GC assist marking" (17 bytes), the third "IO wait" (7).
			if binary.LittleEndian.Uint64(data[i+8:]) != 0 || binary.LittleEndian.Uint64(data[i+24:]) != 17 ||
				binary.LittleEndian.Uint64(data[i+40:]) != 7 {
				continue
			}
			if a, ok := str(data[i+16:]); !ok || a != "GC assist marking" {
				continue
			}
			if b, ok := str(data[i+32:]); !ok || b != "IO wait" {
				continue
			}
			var out []string
			for j := i; j+16 <= len(data) && len(out) < 256; j += 16 {
				s, ok := str(data[j:])
				if !ok || (len(out) > 0 && s == "") || !printable(s) {
					break
				}
				out = append(out, s)
			}
			return out
		}
	}
	return nil
}

func printable(s string) bool {
	for _, r := range s {
		if r < ' ' || r > '~' {
			return false
		}
	}
	return true
}

// ReasonRunnable is the reason of a goroutine's wait for a P alone:
// put back on a run queue while running (preempted, runtime.Gosched) or
// back from a system call whose P was taken.
const ReasonRunnable = "runnable (preempted, yielded or back from a system call without a P)"

// reason names wait reason r.
func (rt *Runtime) Reason(r uint16) string {
	if r == bpf.GoReasonRunnable {
		return ReasonRunnable
	}
	if rt != nil && int(r) < len(rt.Reasons) && rt.Reasons[r] != "" {
		return rt.Reasons[r]
	}
	return "wait reason " + strconv.Itoa(int(r))
}

// FirstLoad: the page of ef's first loadable segment, where a mapping at
// file offset 0 starts.
func FirstLoad(ef *elf.File) uint64 {
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD {
			return p.Vaddr &^ 0xfff
		}
	}
	return 0
}
