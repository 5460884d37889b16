package unwind

import (
	"bytes"
	"debug/elf"
	"fmt"
	"math"
	"sort"

	"github.com/offcpu/offcpu/bpf"
)

// Kind says how the BPF unwinder finds the caller's frame at a pc.
type Kind uint8

// The BPF unwinder's kinds (enum unwind_kind in bpf/offcpu_shared.h).
const (
	KindRSP          Kind = bpf.UnwindRsp          // CFA = rsp + CFAOffset
	KindRBP          Kind = bpf.UnwindRbp          // CFA = rbp + CFAOffset
	KindEnd          Kind = bpf.UnwindEnd          // return address undefined: the outermost frame (thread start)
	KindNone         Kind = bpf.UnwindNone         // no usable rule: fall back to frame pointers
	KindPLT          Kind = bpf.UnwindPlt          // PLT stub: CFA = rsp + 8, + 8 more when (pc & 15) >= RBPOffset
	KindJavaInterp   Kind = bpf.UnwindJavaInterp   // HotSpot interpreter frame: rbp frame, its Method* recorded
	KindJavaCompiled Kind = bpf.UnwindJavaCompiled // HotSpot compiled method: as KindRSP, its pc recorded
	KindJavaGap      Kind = bpf.UnwindJavaGap      // HotSpot code cache where no blob was known: frame pointer, pc recorded
	// KindInterpLoop, a flag or'ed into another kind: the process's
	// interpreter loop (CPython's), whose runtime frames are recorded in
	// its place.
	KindInterpLoop Kind = bpf.UnwindInterpLoop
	// KindCFAx8, or'ed into KindRSP or KindRBP: CFAOffset is in units of
	// 8 bytes (a frame of over 32 KiB).
	KindCFAx8 Kind = bpf.UnwindCfaX8
	// KindRALR, or'ed into an arm64 row: the return address is still in
	// x30 and x29 unchanged (an entry, a leaf, an epilogue's end).
	KindRALR Kind = bpf.UnwindRaLr
	// KindRANoFP, or'ed into an arm64 row: the return address is at
	// CFA + 8*RBPOffset and x29 unchanged. With neither flag an arm64
	// row's x29 is at CFA + 8*RBPOffset and the return address 8 above.
	KindRANoFP Kind = bpf.UnwindRaNoFp
	// KindMask: the kind without its flags.
	KindMask Kind = bpf.UnwindKindMask
)

func (k Kind) String() string {
	switch k {
	case KindRSP:
		return "rsp"
	case KindRBP:
		return "rbp"
	case KindEnd:
		return "end"
	case KindNone:
		return "none"
	case KindPLT:
		return "plt"
	case KindJavaInterp:
		return "java-interp"
	case KindJavaCompiled:
		return "java-compiled"
	case KindJavaGap:
		return "java-gap"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Row holds from PC up to the next row's PC. On x86-64 the return address
// is always at CFA-8; the caller's rbp is at CFA + 8*RBPOffset, or
// unchanged when RBPOffset is 0. On arm64 (sp and x29 for rsp and rbp)
// the flags KindRALR and KindRANoFP say where the return address is.
type Row struct {
	PC        uint64 // ELF virtual address
	Kind      Kind
	CFAOffset int16
	RBPOffset int8
}

// Table is a file's unwind rows, sorted by PC.
type Table struct {
	Rows []Row
	// FDEs counts the functions described; FramedFDEs those that ever
	// move the stack pointer (the others are leaves: they make no call, so
	// they are never an outer frame); FramePointerFDEs those that set up a
	// classic rbp frame (CFA = rbp+16, rbp saved at CFA-16).
	FDEs, FramedFDEs, FramePointerFDEs int
	// Arm64: the rows are AArch64's.
	Arm64 bool

	noFP [][2]uint64 // framed functions without an rbp frame: [begin, end)
}

// FramePointers reports whether frame pointers alone walk this file's
// code: no unwind information at all (nothing better is possible), or
// nearly every function that has a frame keeps rbp in it. Startup code
// and assembly helpers without one are tolerated. Never on arm64 when a
// function has a frame: a frame pointer walk there loses the caller of a
// function that has not saved its return address (still in x30), which
// is where a thread blocked in a system call's wrapper often is.
func (t *Table) FramePointers() bool {
	if t.Arm64 {
		return t.FramedFDEs == 0
	}
	return t.FramedFDEs == 0 || float64(t.FramePointerFDEs) >= 0.9*float64(t.FramedFDEs)
}

// Needed returns the rows the BPF unwinder needs for this file: none when
// every function with a frame keeps rbp in it (frame pointers walk it
// whole); only the rows of the functions that do not, when frame
// pointers suffice for nearly all (the rest of the file reads KindNone:
// follow the frame pointer); all rows otherwise.
func (t *Table) Needed() []Row {
	if t.Arm64 && !t.FramePointers() {
		return t.Rows
	}
	if len(t.noFP) == 0 {
		return nil
	}
	if !t.FramePointers() {
		return t.Rows
	}
	var out []Row
	for _, r := range t.noFP {
		i := sort.Search(len(t.Rows), func(i int) bool { return t.Rows[i].PC > r[0] })
		if i > 0 {
			i--
		}
		first := t.Rows[i]
		first.PC = r[0]
		if n := len(out); n > 0 && out[n-1].PC == first.PC {
			out = out[:n-1]
		}
		out = append(out, first)
		for i++; i < len(t.Rows) && t.Rows[i].PC < r[1]; i++ {
			out = append(out, t.Rows[i])
		}
		out = append(out, Row{PC: r[1], Kind: KindNone})
	}
	return out
}

// Lookup returns the row covering pc, or a KindNone row.
func (t *Table) Lookup(pc uint64) Row {
	i := sort.Search(len(t.Rows), func(i int) bool { return t.Rows[i].PC > pc })
	if i == 0 {
		return Row{PC: pc, Kind: KindNone}
	}
	return t.Rows[i-1]
}

// FromELF builds the table of an ELF file from its .eh_frame. A file
// without one gives an empty table.
func FromELF(ef *elf.File) (*Table, error) {
	var a *arch
	switch ef.Machine {
	case elf.EM_X86_64:
		a = &archX86
	case elf.EM_AARCH64:
		a = &archARM64
	default:
		return nil, fmt.Errorf("unwind tables are built for x86-64 and arm64 only, not %v", ef.Machine)
	}
	sec := ef.Section(".eh_frame")
	if sec == nil || sec.Type == elf.SHT_NOBITS {
		return &Table{Arm64: a.arm64}, nil
	}
	data, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("reading .eh_frame: %w", err)
	}
	fdes, err := parseEhFrame(data, sec.Addr)
	if err != nil {
		return nil, fmt.Errorf(".eh_frame: %w", err)
	}
	return build(fdes, a)
}

// arch is what a machine's rows are made of: the DWARF numbers of its
// frame and stack pointers.
type arch struct {
	fp, sp uint64
	arm64  bool
}

var (
	archX86   = arch{fp: regRBP, sp: regRSP}
	archARM64 = arch{fp: 29, sp: 31, arm64: true}
)

type ruleKind uint8

const (
	ruleSame ruleKind = iota
	ruleOffset
	ruleUndefined
	ruleOther // register, expression: not followed
)

type rule struct {
	kind ruleKind
	off  int64
}

type cfaState struct {
	reg     uint64
	off     int64
	expr    []byte // non-nil: DW_CFA_def_cfa_expression
	rbp, ra rule
}

// pltExpr is the CFA expression of glibc/binutils PLT stubs:
// rsp + 8 + ((rip & 15) >= N) << 3, with N at index 6 (DW_OP_lit10/11).
var pltExpr = []byte{0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a, 0x00, 0x2a, 0x33, 0x24, 0x22}

func isPLT(e []byte) (int8, bool) {
	if len(e) != len(pltExpr) || e[6] < 0x30 || e[6] > 0x4f {
		return 0, false
	}
	for i := range e {
		if i != 6 && e[i] != pltExpr[i] {
			return 0, false
		}
	}
	return int8(e[6] - 0x30), true
}

func (s *cfaState) row(pc uint64, a *arch) Row {
	if a.arm64 {
		return s.rowARM64(pc)
	}
	r := Row{PC: pc, Kind: KindNone}
	if s.ra.kind == ruleUndefined {
		r.Kind = KindEnd
		return r
	}
	if s.ra.kind != ruleOffset || s.ra.off != -8 {
		return r
	}
	if s.expr != nil {
		if n, ok := isPLT(s.expr); ok {
			r.Kind, r.CFAOffset, r.RBPOffset = KindPLT, 8, n
		}
		return r
	}
	off, scaled, ok := s.cfaOffset()
	if !ok {
		return r
	}
	switch s.rbp.kind {
	case ruleSame:
	case ruleOffset:
		w, ok := words(s.rbp.off)
		if !ok {
			return r
		}
		r.RBPOffset = w
	default:
		return r
	}
	switch s.reg {
	case regRSP:
		r.Kind = KindRSP
	case regRBP:
		r.Kind = KindRBP
	default:
		return r
	}
	r.CFAOffset = off
	r.Kind |= scaled
	return r
}

// cfaOffset is the CFA's offset as a row holds it, with KindCFAx8 when
// it is in units of 8 (a frame of over 32 KiB).
func (s *cfaState) cfaOffset() (int16, Kind, bool) {
	off := s.off
	if off >= math.MinInt16 && off <= math.MaxInt16 {
		return int16(off), 0, true
	}
	if off%8 != 0 || off/8 < math.MinInt16 || off/8 > math.MaxInt16 {
		return 0, 0, false
	}
	return int16(off / 8), KindCFAx8, true
}

// words is a register's save slot from the CFA in 8-byte words.
func words(off int64) (int8, bool) {
	if off%8 != 0 || off/8 < math.MinInt8 || off/8 > math.MaxInt8 || off == 0 {
		return 0, false
	}
	return int8(off / 8), true
}

// rowARM64 is the row of an AArch64 state: CFA from sp or x29, the
// return address (x30) still in its register, or saved alone, or saved
// just above x29 (a frame record, as AAPCS64 lays them out).
func (s *cfaState) rowARM64(pc uint64) Row {
	r := Row{PC: pc, Kind: KindNone}
	if s.ra.kind == ruleUndefined {
		r.Kind = KindEnd
		return r
	}
	off, scaled, ok := s.cfaOffset()
	if s.expr != nil || !ok {
		return r
	}
	var k Kind
	switch s.reg {
	case archARM64.sp:
		k = KindRSP
	case archARM64.fp:
		k = KindRBP
	default:
		return r
	}
	switch {
	case s.ra.kind == ruleSame && s.rbp.kind == ruleSame:
		k |= KindRALR
	case s.ra.kind == ruleOffset && s.rbp.kind == ruleSame:
		w, ok := words(s.ra.off)
		if !ok {
			return r
		}
		k |= KindRANoFP
		r.RBPOffset = w
	case s.ra.kind == ruleOffset && s.rbp.kind == ruleOffset && s.rbp.off == s.ra.off-8:
		w, ok := words(s.rbp.off)
		if !ok {
			return r
		}
		r.RBPOffset = w
	default:
		return r
	}
	r.Kind, r.CFAOffset = k|scaled, off
	return r
}

// run executes a CFI program from state s, calling emit before each
// advance of the location. initial is the CIE's state (for restore).
func run(c *cie, a *arch, prog []byte, loc uint64, s *cfaState, initial *cfaState, emit func(uint64, *cfaState)) (uint64, error) {
	m := &cfiRun{c: c, a: a, r: &reader{b: prog}, loc: loc, s: s, initial: initial, emit: emit}
	for m.r.off < len(prog) && m.r.err == nil {
		op := m.r.u8()
		switch op >> 6 {
		case 1: // DW_CFA_advance_loc
			m.advance(uint64(op & 0x3f))
			continue
		case 2: // DW_CFA_offset
			m.setReg(uint64(op&0x3f), rule{ruleOffset, int64(m.r.uleb()) * c.dataAlign})
			continue
		case 3: // DW_CFA_restore
			m.restore(uint64(op & 0x3f))
			continue
		}
		if err := m.op(op); err != nil {
			return m.loc, err
		}
	}
	return m.loc, m.r.err
}

// cfiRun is the state of one CFI program's execution.
type cfiRun struct {
	c          *cie
	a          *arch
	r          *reader
	loc        uint64
	s, initial *cfaState
	stack      []cfaState // remember_state
	emit       func(uint64, *cfaState)
}

func (m *cfiRun) setReg(reg uint64, ru rule) {
	switch reg {
	case m.a.fp:
		m.s.rbp = ru
	case m.c.raReg:
		m.s.ra = ru
	}
}

func (m *cfiRun) restore(reg uint64) {
	if m.initial == nil {
		m.setReg(reg, rule{})
		return
	}
	switch reg {
	case m.a.fp:
		m.s.rbp = m.initial.rbp
	case m.c.raReg:
		m.s.ra = m.initial.ra
	}
}

func (m *cfiRun) advance(delta uint64) {
	if m.emit != nil {
		m.emit(m.loc, m.s)
	}
	m.loc += delta * m.c.codeAlign
}

// op executes an instruction with its operands after the opcode byte:
// locations and remembered states here, the CFA and register rules in
// cfaOp and regOp.
func (m *cfiRun) op(op byte) error {
	r, s := m.r, m.s
	switch op {
	case 0x00: // nop
	case 0x01: // set_loc
		nl := r.pointer(m.c.fdeEnc, 0)
		if m.emit != nil {
			m.emit(m.loc, s)
		}
		m.loc = nl
	case 0x02:
		m.advance(uint64(r.u8()))
	case 0x03:
		m.advance(uint64(r.u16()))
	case 0x04:
		m.advance(uint64(r.u32()))
	case 0x0a: // remember_state
		m.stack = append(m.stack, *s)
	case 0x0b: // restore_state
		if len(m.stack) == 0 {
			return fmt.Errorf("restore_state with nothing remembered")
		}
		*s = m.stack[len(m.stack)-1]
		m.stack = m.stack[:len(m.stack)-1]
	case 0x0c, 0x0d, 0x0e, 0x0f, 0x12, 0x13:
		m.cfaOp(op)
	default:
		return m.regOp(op)
	}
	return nil
}

// cfaOp executes an instruction that defines the CFA.
func (m *cfiRun) cfaOp(op byte) {
	r, s, c := m.r, m.s, m.c
	switch op {
	case 0x0c: // def_cfa
		s.reg = r.uleb()
		s.off = int64(r.uleb())
		s.expr = nil
	case 0x0d: // def_cfa_register
		s.reg = r.uleb()
		s.expr = nil
	case 0x0e: // def_cfa_offset
		s.off = int64(r.uleb())
	case 0x0f: // def_cfa_expression
		s.expr = bytes.Clone(r.bytes(int(r.uleb())))
	case 0x12: // def_cfa_sf
		s.reg = r.uleb()
		s.off = r.sleb() * c.dataAlign
		s.expr = nil
	case 0x13: // def_cfa_offset_sf
		s.off = r.sleb() * c.dataAlign
	}
}

// regOp executes an instruction that sets a register's rule.
func (m *cfiRun) regOp(op byte) error {
	r, c := m.r, m.c
	switch op {
	case 0x05: // offset_extended
		reg := r.uleb()
		m.setReg(reg, rule{ruleOffset, int64(r.uleb()) * c.dataAlign})
	case 0x06: // restore_extended
		m.restore(r.uleb())
	case 0x07: // undefined
		m.setReg(r.uleb(), rule{kind: ruleUndefined})
	case 0x08: // same_value
		m.setReg(r.uleb(), rule{kind: ruleSame})
	case 0x09: // register
		reg := r.uleb()
		r.uleb()
		m.setReg(reg, rule{kind: ruleOther})
	case 0x10: // expression
		reg := r.uleb()
		r.bytes(int(r.uleb()))
		m.setReg(reg, rule{kind: ruleOther})
	case 0x11: // offset_extended_sf
		reg := r.uleb()
		m.setReg(reg, rule{ruleOffset, r.sleb() * c.dataAlign})
	case 0x14: // val_offset
		reg := r.uleb()
		r.uleb()
		m.setReg(reg, rule{kind: ruleOther})
	case 0x15: // val_offset_sf
		reg := r.uleb()
		r.sleb()
		m.setReg(reg, rule{kind: ruleOther})
	case 0x16: // val_expression
		reg := r.uleb()
		r.bytes(int(r.uleb()))
		m.setReg(reg, rule{kind: ruleOther})
	case 0x2d: // AARCH64_negate_ra_state: return addresses signed or not
		if !m.a.arm64 {
			return fmt.Errorf("unknown CFA instruction %#x", op)
		}
	case 0x2e: // GNU_args_size
		r.uleb()
	case 0x2f: // GNU_negative_offset_extended
		reg := r.uleb()
		m.setReg(reg, rule{ruleOffset, -int64(r.uleb()) * c.dataAlign})
	default:
		return fmt.Errorf("unknown CFA instruction %#x", op)
	}
	return nil
}

func build(fdes []fde, a *arch) (*Table, error) {
	sort.Slice(fdes, func(i, j int) bool { return fdes[i].begin < fdes[j].begin })
	t := &Table{Arm64: a.arm64}
	var bad int
	var firstErr error
	for i := range fdes {
		if err := t.addFDE(&fdes[i], a); err != nil {
			bad++
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	if bad > 0 && t.FDEs == 0 {
		return nil, fmt.Errorf("no usable FDE (%d bad, first: %v)", bad, firstErr)
	}
	return t, nil
}

// add appends a row, dropping the rows it overlaps and a row that
// repeats the previous one.
func (t *Table) add(r Row) {
	n := len(t.Rows)
	if n > 0 && t.Rows[n-1].PC >= r.PC {
		// A later FDE (or row) starting here wins; overlaps keep the newer.
		for n > 0 && t.Rows[n-1].PC >= r.PC {
			n--
		}
		t.Rows = t.Rows[:n]
	}
	if n > 0 {
		p := t.Rows[n-1]
		if p.Kind == r.Kind && p.CFAOffset == r.CFAOffset && p.RBPOffset == r.RBPOffset {
			return
		}
	}
	t.Rows = append(t.Rows, r)
}

// addFDE adds an FDE's rows and counts it; a bad program leaves its range
// without rules.
func (t *Table) addFDE(f *fde, a *arch) error {
	c := f.cie
	var init cfaState
	if _, err := run(c, a, c.initial, 0, &init, nil, nil); err != nil {
		return err
	}
	s := init
	fp, framed, plt := false, false, false
	end := f.begin + f.size
	emit := func(loc uint64, st *cfaState) {
		if loc >= end {
			return
		}
		r := st.row(loc, a)
		if r.Kind == KindRBP && r.CFAOffset == 16 && r.RBPOffset == -2 {
			fp = true
		}
		if r.Kind == KindPLT {
			plt = true
		}
		// A leaf's row: its caller's frame as it was at the call.
		leaf := r.Kind == KindRSP && r.CFAOffset == 8
		if a.arm64 {
			leaf = r.Kind == KindRSP|KindRALR && r.CFAOffset == 0
		}
		if r.Kind != KindEnd && !leaf {
			framed = true
		}
		t.add(r)
	}
	loc, err := run(c, a, f.program, f.begin, &s, &init, emit)
	if err != nil {
		t.add(Row{PC: f.begin, Kind: KindNone})
		t.add(Row{PC: end, Kind: KindNone})
		return err
	}
	emit(loc, &s)
	t.add(Row{PC: end, Kind: KindNone})
	if _, ok := isPLT(s.expr); ok {
		plt = true // PLT0 alone ends before the stubs' expression row
	}
	t.FDEs++
	// PLT stubs (PLT0 pushes, then every stub jumps) are never an
	// outer frame: they do not count as frames without rbp.
	if framed && !plt {
		t.FramedFDEs++
		if !fp {
			t.noFP = append(t.noFP, [2]uint64{f.begin, end})
		}
	}
	if fp {
		t.FramePointerFDEs++
	}
	return nil
}
