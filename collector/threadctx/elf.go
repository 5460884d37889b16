package threadctx

import (
	"debug/buildinfo"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/runtimes/golang"
)

// OpenTelemetry thread context (OTEP 4947): how a file that defines
// otel_thread_ctx_v1 lets a thread reach it, from the relocations that
// name it (or its module). The loader fills the slots they point to; a
// process's values are read from its memory once it has run (tctxProcess).
// Modelled on the specification's reading protocol and its access models
// (global-dynamic in both dialects, initial-exec, local-exec).

const (
	tctxSymbol = "otel_thread_ctx_v1"

	rX8664DTPMOD64 = 16 // R_X86_64_DTPMOD64: a tls_index's module id
	rX8664TPOFF64  = 18 // R_X86_64_TPOFF64: initial-exec, the offset from the thread pointer
	rX8664TLSDESC  = 36 // R_X86_64_TLSDESC: a descriptor {resolver, argument}
)

// tlsAccess: where a process's address for the variable comes from.
type tlsAccess uint8

const (
	tlsLocalExec     tlsAccess = iota // the executable's static block: offset known from the file
	tlsInitialExec                    // a GOT slot holds the offset from the thread pointer
	tlsDesc                           // a descriptor's argument: an offset (static) or a tls_index
	tlsGlobalDynamic                  // a GOT tls_index {module, offset}
	tlsLocalDynamic                   // a GOT module id; the offset is the symbol's value
	tlsGo                             // a Go executable: g's slot from the thread pointer, known from the file
)

func (a tlsAccess) String() string {
	return [...]string{"local-exec", "initial-exec", "tlsdesc", "global-dynamic", "local-dynamic", "go"}[a]
}

// ctxFile is how a file's threads reach otel_thread_ctx_v1.
type ctxFile struct {
	access tlsAccess
	slot   uint64 // the GOT slot or descriptor's address in the file (not local-exec)
	offset int64  // local-exec: from the thread pointer; local-dynamic: in the module's block
	load   uint64 // the page of the first loadable segment: where a mapping at offset 0 starts

	// A Go executable (tlsGo): g.labels' offset and layout (GO_LABELS_*),
	// runtime.memstats.numgc's address in the file (0: not found), g.m's
	// and m.curg's offsets.
	goLabels    uint16
	goLayout    uint8
	goGC        uint64
	goM, goCurg uint16
}

// errNoTctx: the file does not define otel_thread_ctx_v1.
var errNoTctx = errors.New("no " + tctxSymbol)

// readTctxFile finds otel_thread_ctx_v1 in ef's dynamic symbols and how
// it is reached. glibc on x86-64 only (the variant II TLS layout).
func readTctxFile(ef *elf.File) (*ctxFile, error) {
	if ef.Machine != elf.EM_X86_64 {
		return nil, errNoTctx
	}
	syms, err := ef.DynamicSymbols()
	if err != nil {
		return nil, errNoTctx
	}
	idx := -1
	for i, s := range syms {
		if s.Name == tctxSymbol && s.Section != elf.SHN_UNDEF {
			idx = i + 1 // DynamicSymbols leaves out symbol 0
			break
		}
	}
	if idx < 0 {
		return nil, errNoTctx
	}
	f, err := tctxAccess(ef, syms, idx)
	if err != nil {
		return nil, err
	}
	f.load = golang.FirstLoad(ef)
	return f, nil
}

// tctxAccess: how symbol idx (otel_thread_ctx_v1) of ef is reached.
func tctxAccess(ef *elf.File, syms []elf.Symbol, idx int) (*ctxFile, error) {
	sym := syms[idx-1]
	if elf.ST_TYPE(sym.Info) != elf.STT_TLS || sym.Size != 8 {
		return nil, fmt.Errorf("%s is not an 8-byte TLS variable (type %v, size %d)", tctxSymbol, elf.ST_TYPE(sym.Info), sym.Size)
	}
	found := map[uint32]uint64{}  // relocation type → slot, for the symbol
	module := map[uint32]uint64{} // for the module itself (symbol 0)
	err := eachRela(ef, func(off uint64, symIdx, typ uint32) {
		m := found
		switch {
		case symIdx == uint32(idx):
		case symIdx == 0:
			m = module
		default:
			return
		}
		if _, ok := m[typ]; !ok {
			m[typ] = off
		}
	})
	if err != nil {
		return nil, err
	}
	switch {
	case has(found, rX8664TLSDESC):
		return &ctxFile{access: tlsDesc, slot: found[rX8664TLSDESC]}, nil
	case has(found, rX8664DTPMOD64):
		return &ctxFile{access: tlsGlobalDynamic, slot: found[rX8664DTPMOD64]}, nil
	case has(found, rX8664TPOFF64):
		return &ctxFile{access: tlsInitialExec, slot: found[rX8664TPOFF64]}, nil
	case isExecutable(ef):
		// The executable's block sits just below the thread pointer, its
		// size rounded up to its alignment (what the linker's local-exec
		// offsets assume).
		if tls := tlsSegment(ef); tls != nil {
			return &ctxFile{access: tlsLocalExec, offset: int64(sym.Value) - int64(tlsBlockSize(tls))}, nil
		}
		return nil, fmt.Errorf("%s: no TLS segment", tctxSymbol)
	case has(module, rX8664TLSDESC):
		return &ctxFile{access: tlsDesc, slot: module[rX8664TLSDESC], offset: int64(sym.Value)}, nil
	case has(module, rX8664DTPMOD64):
		return &ctxFile{access: tlsLocalDynamic, slot: module[rX8664DTPMOD64], offset: int64(sym.Value)}, nil
	}
	return nil, fmt.Errorf("%s: no relocation tells how it is reached", tctxSymbol)
}

func has(m map[uint32]uint64, k uint32) bool { _, ok := m[k]; return ok }

// isExecutable: an executable, PIE or not (a shared object is not).
func isExecutable(ef *elf.File) bool {
	if ef.Type == elf.ET_EXEC {
		return true
	}
	if ds, err := ef.DynValue(elf.DT_FLAGS_1); err == nil {
		for _, v := range ds {
			if v&uint64(elf.DF_1_PIE) != 0 {
				return true
			}
		}
	}
	return false
}

// eachRela calls f for each dynamic relocation with addend (.rela.dyn):
// its offset, symbol index and type.
func eachRela(ef *elf.File, f func(off uint64, sym, typ uint32)) error {
	for _, s := range ef.Sections {
		if s.Type != elf.SHT_RELA || s.Entsize != 24 {
			continue
		}
		if int(s.Link) >= len(ef.Sections) || ef.Sections[s.Link].Type != elf.SHT_DYNSYM {
			continue
		}
		r := s.Open()
		var e [24]byte
		for {
			if _, err := io.ReadFull(r, e[:]); err != nil {
				if err == io.EOF {
					break
				}
				return fmt.Errorf("reading %s: %w", s.Name, err)
			}
			info := binary.LittleEndian.Uint64(e[8:])
			f(binary.LittleEndian.Uint64(e[:8]), uint32(info>>32), uint32(info))
		}
	}
	return nil
}

// goTctxFile: how a Go executable's threads reach their goroutine's pprof
// labels: g is kept in TLS (runtime.tlsg), g.labels at an offset of its
// release. errNoTctx for a file that is not Go; an error for a Go one
// whose labels cannot be found.
func goTctxFile(r io.ReaderAt, ef *elf.File) (*ctxFile, error) {
	bi, err := buildinfo.Read(r)
	if err != nil || ef.Machine != elf.EM_X86_64 {
		return nil, errNoTctx
	}
	// The table first: a machine-wide recording looks at every Go program,
	// and DWARF's sections are read whole (tens of MB for a large one).
	layout := golang.LabelLayout(bi.GoVersion)
	off, ok := golang.OffsetTable[golang.Minor(bi.GoVersion)]
	var numgc uint64
	if !ok || off.Labels == 0 {
		off, numgc, ok = golang.OffsetsDWARF(ef)
	}
	if !ok || off.Labels == 0 || off.Labels > 0xffff || layout == bpf.GoLabelsNone {
		return nil, fmt.Errorf("pprof labels: g.labels' offset not known for %s without DWARF (known: go1.19, go1.26, or any release built with DWARF)", bi.GoVersion)
	}
	g, err := goTLSOffset(ef)
	if err != nil {
		return nil, err
	}
	return &ctxFile{access: tlsGo, offset: g, load: golang.FirstLoad(ef), goLabels: uint16(off.Labels), goLayout: uint8(layout),
		goGC: golang.GCCycles(ef, bi.GoVersion, numgc), goM: uint16(off.M), goCurg: uint16(off.M_curg)}, nil
}

// goTLSOffset: where a Go thread's current g is, from the thread pointer
// (src/runtime/sys_linux_amd64.s, settls; cmd/link's TLS relocations).
// Linked internally the executable has no TLS segment and Go points the
// thread pointer just past m.tls[0]: -8. Linked externally runtime.tlsg
// lies in the executable's static block, which ends at the thread pointer.
func goTLSOffset(ef *elf.File) (int64, error) {
	tls := tlsSegment(ef)
	if tls == nil {
		return -8, nil
	}
	size := tlsBlockSize(tls)
	if syms, err := ef.Symbols(); err == nil {
		for _, s := range syms {
			if s.Name == "runtime.tlsg" && elf.ST_TYPE(s.Info) == elf.STT_TLS {
				return int64(s.Value) - int64(size), nil
			}
		}
	}
	if size == 8 { // runtime.tlsg alone
		return -8, nil
	}
	return 0, fmt.Errorf("pprof labels: runtime.tlsg not found (stripped) in a TLS block of %d bytes", tls.Memsz)
}

func tlsSegment(ef *elf.File) *elf.Prog {
	for _, p := range ef.Progs {
		if p.Type == elf.PT_TLS {
			return p
		}
	}
	return nil
}

// tlsBlockSize: the executable's static TLS block, which ends at the
// thread pointer: its size rounded up to its alignment (what the linker's
// local-exec offsets assume).
func tlsBlockSize(p *elf.Prog) uint64 {
	align := max(p.Align, 1)
	return (p.Memsz + align - 1) &^ (align - 1)
}
