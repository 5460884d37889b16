// Package cpython reads CPython interpreters: their layout by version
// (what the walker follows) and their code objects (names, files, lines)
// through an io.ReaderAt on a process's memory.
package cpython

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/offcpu/offcpu/bpf"
)

// Layout is where CPython keeps what the walker and the namer read, for
// one version on x86-64: offsets from CPython's own headers
// (Include/cpython/pystate.h, Include/internal/pycore_runtime.h,
// pycore_interp.h, pycore_frame.h, pycore_gil.h, Include/cpython/code.h
// and unicodeobject.h), measured with offsetof against the headers of
// the version (see docs/python.md).
type Layout struct {
	InterpHead            uint64 // _PyRuntimeState.interpreters.head
	Gil, GilSize          uint64 // _PyRuntimeState.ceval.gil, sizeof(struct _gil_runtime_state)
	GilHolder             uint16 // _gil_runtime_state.last_holder
	ThreadsHead           uint16 // PyInterpreterState.threads.head
	TstateNext, ThreadID  uint16 // PyThreadState.next, .thread_id
	NativeID, TstateFrame uint16 // .native_thread_id, .cframe
	CframeFrame           uint16 // _PyCFrame.current_frame
	FrameCode, FrameBack  uint16 // _PyInterpreterFrame.f_code, .previous
	FrameInstr            uint16 // .prev_instr
	FrameEntry            uint16 // .is_entry
	EntryVal, Flags       uint8
	CodeFirstInstr        uint16 // PyCodeObject.co_code_adaptive
	// PyCodeObject's names and lines: co_filename, co_name, co_qualname,
	// co_firstlineno, co_linetable.
	CodeFile, CodeName, CodeQualname, CodeFirstLine, CodeLines uint64
	// PyASCIIObject's size (a compact ASCII string's data follows it),
	// PyCompactUnicodeObject's; PyBytesObject's ob_size and ob_sval.
	AsciiData, CompactData, BytesSize, BytesData uint64
	LineFormat                                   int // 311: the 3.11+ location table
}

// Layouts: the versions whose layout is known, measured with offsetof
// on each version's own headers (Include/internal, Py_BUILD_CORE): 3.11
// on Debian 12's python3.11-dev (3.11.2) and 3.11.7, the others on
// 3.8.18, 3.9.18, 3.10.13, 3.12.1 and 3.13.0 (docs/python.md has the
// program). Up to 3.10 a frame is a PyFrameObject, each interpreter
// activation runs one, f_lasti is an int (bytes up to 3.9, instructions
// in 3.10) and a thread state has no native thread id; 3.12 adds shim
// frames at C entries and keeps the main interpreter's GIL in it; 3.13
// drops _PyCFrame.
var Layouts = map[[2]int]Layout{
	{3, 8}: {
		InterpHead: 32, Gil: 1152, GilSize: 208, GilHolder: 8,
		ThreadsHead: 8, TstateNext: 8, ThreadID: 176, TstateFrame: 24,
		FrameCode: 32, FrameBack: 24, FrameInstr: 104, EntryVal: 0xff,
		Flags:    bpf.PyOnePerEval,
		CodeFile: 104, CodeName: 112, CodeFirstLine: 40, CodeLines: 120,
		AsciiData: 48, CompactData: 72, BytesSize: 16, BytesData: 32,
		LineFormat: 38,
	},
	{3, 9}: {
		InterpHead: 32, Gil: 352, GilSize: 208, GilHolder: 8,
		ThreadsHead: 8, TstateNext: 8, ThreadID: 176, TstateFrame: 24,
		FrameCode: 32, FrameBack: 24, FrameInstr: 104, EntryVal: 0xff,
		Flags:    bpf.PyOnePerEval,
		CodeFile: 104, CodeName: 112, CodeFirstLine: 40, CodeLines: 120,
		AsciiData: 48, CompactData: 72, BytesSize: 16, BytesData: 32,
		LineFormat: 38,
	},
	{3, 10}: {
		InterpHead: 32, Gil: 352, GilSize: 208, GilHolder: 8,
		ThreadsHead: 8, TstateNext: 8, ThreadID: 176, TstateFrame: 24,
		FrameCode: 32, FrameBack: 24, FrameInstr: 96, EntryVal: 0xff,
		Flags:    bpf.PyOnePerEval,
		CodeFile: 104, CodeName: 112, CodeFirstLine: 40, CodeLines: 120,
		AsciiData: 48, CompactData: 72, BytesSize: 16, BytesData: 32,
		LineFormat: 310,
	},
	{3, 12}: {
		InterpHead: 40, Gil: 77432, GilSize: 208, GilHolder: 8,
		ThreadsHead: 72, TstateNext: 8, ThreadID: 136, NativeID: 144, TstateFrame: 56, CframeFrame: 0,
		FrameCode: 0, FrameBack: 8, FrameInstr: 56, FrameEntry: 70, EntryVal: 3,
		Flags:          bpf.PyInstrPtr | bpf.PyCframe | bpf.PyEntryShim,
		CodeFirstInstr: 192,
		CodeFile:       112, CodeName: 120, CodeQualname: 128, CodeFirstLine: 68, CodeLines: 136,
		AsciiData: 40, CompactData: 56, BytesSize: 16, BytesData: 32,
		LineFormat: 311,
	},
	{3, 13}: {
		InterpHead: 632, Gil: 96104, GilSize: 208, GilHolder: 8,
		ThreadsHead: 7344, TstateNext: 8, ThreadID: 152, NativeID: 160, TstateFrame: 72,
		FrameCode: 0, FrameBack: 8, FrameInstr: 56, FrameEntry: 70, EntryVal: 3,
		Flags:          bpf.PyInstrPtr | bpf.PyEntryShim,
		CodeFirstInstr: 200,
		CodeFile:       112, CodeName: 120, CodeQualname: 128, CodeFirstLine: 68, CodeLines: 136,
		AsciiData: 40, CompactData: 56, BytesSize: 16, BytesData: 32,
		LineFormat: 311,
	},
	{3, 11}: {
		InterpHead: 40, Gil: 360, GilSize: 208, GilHolder: 8,
		ThreadsHead: 16, TstateNext: 8, ThreadID: 152, NativeID: 160, TstateFrame: 56, CframeFrame: 8,
		FrameCode: 32, FrameBack: 48, FrameInstr: 56, FrameEntry: 68, EntryVal: 1,
		Flags:          bpf.PyInstrPtr | bpf.PyCframe,
		CodeFirstInstr: 184,
		CodeFile:       112, CodeName: 120, CodeQualname: 128, CodeFirstLine: 72, CodeLines: 136,
		AsciiData: 48, CompactData: 72, BytesSize: 16, BytesData: 32,
		LineFormat: 311,
	},
}

// Runtime is a CPython interpreter's binary (python3.X, or the
// libpython3.X.so it links): its version and the virtual addresses of
// what the walker needs.
type Runtime struct {
	Version    [2]int
	Layout     Layout
	Runtime    uint64 // _PyRuntime
	EvalLo     uint64 // _PyEval_EvalFrameDefault
	EvalHi     uint64
	Supported  bool   // a layout is known for its version
	UnsupError string // why not
}

var fileVersion = regexp.MustCompile(`python(\d)\.(\d+)`)

// ErrNotPython: the file is not a CPython interpreter.
var ErrNotPython = errors.New("not a CPython interpreter")

// ReadRuntime recognises a CPython interpreter by its symbols: the
// runtime state and the interpreter loop, both exported.
func ReadRuntime(ef *elf.File, path string) (*Runtime, error) {
	syms, err := ef.DynamicSymbols()
	if err != nil {
		return nil, ErrNotPython
	}
	r := &Runtime{}
	var version uint64
	for _, s := range syms {
		switch s.Name {
		case "_PyRuntime":
			r.Runtime = s.Value
		case "_PyEval_EvalFrameDefault":
			r.EvalLo, r.EvalHi = s.Value, s.Value+s.Size
		case "Py_Version":
			version = s.Value
		}
	}
	if r.Runtime == 0 || r.EvalLo == 0 || r.EvalHi <= r.EvalLo {
		return nil, ErrNotPython
	}
	if version != 0 {
		// Py_Version (3.11+): PY_VERSION_HEX, major in the top byte.
		if b, ok := readELFAt(ef, version, 4); ok {
			hex := binary.LittleEndian.Uint32(b)
			r.Version = [2]int{int(hex >> 24), int(hex >> 16 & 0xff)}
		}
	}
	if r.Version[0] == 0 {
		if m := fileVersion.FindStringSubmatch(filepath.Base(path)); m != nil {
			a, _ := strconv.Atoi(m[1])
			b, _ := strconv.Atoi(m[2])
			r.Version = [2]int{a, b}
		}
	}
	l, ok := Layouts[r.Version]
	r.Layout, r.Supported = l, ok
	if !ok {
		r.UnsupError = fmt.Sprintf("CPython %d.%d: no layout known (supported: 3.8 to 3.13)", r.Version[0], r.Version[1])
	}
	return r, nil
}

// readELFAt reads n bytes at virtual address va from the file's loaded
// segments.
func readELFAt(ef *elf.File, va uint64, n int) ([]byte, bool) {
	for _, p := range ef.Progs {
		if p.Type != elf.PT_LOAD || va < p.Vaddr || va+uint64(n) > p.Vaddr+p.Filesz {
			continue
		}
		b := make([]byte, n)
		if _, err := p.ReadAt(b, int64(va-p.Vaddr)); err != nil {
			return nil, false
		}
		return b, true
	}
	return nil, false
}

// Module names a source file as Python names its module: the path
// below the interpreter's library or a site's packages, else the file's
// base name; "<frozen importlib._bootstrap>" is importlib._bootstrap.
func Module(file string) string {
	if strings.HasPrefix(file, "<frozen ") {
		return strings.TrimSuffix(strings.TrimPrefix(file, "<frozen "), ">")
	}
	if strings.HasPrefix(file, "<") {
		return file
	}
	rel := filepath.Base(file)
	for _, marker := range []string{"/site-packages/", "/dist-packages/"} {
		if i := strings.LastIndex(file, marker); i >= 0 {
			rel = file[i+len(marker):]
		}
	}
	if rel == filepath.Base(file) {
		if m := libDir.FindStringIndex(file); m != nil {
			rel = file[m[1]:]
		}
	}
	rel = strings.TrimSuffix(strings.TrimSuffix(rel, ".py"), "/__init__")
	return strings.ReplaceAll(rel, "/", ".")
}

var libDir = regexp.MustCompile(`/lib/python\d\.\d+/(lib-dynload/)?`)

// Line is the source line of the instruction at index idx (in code
// units) of a code object whose first line is first, from its location
// table (co_linetable, CPython 3.11+: Objects/locations.md); 0 if not
// found.
func Line(table []byte, first int64, idx uint64) int64 {
	line := first
	var at uint64 // code units covered so far
	i := 0
	varint := func() uint64 {
		var v uint64
		for shift := 0; i < len(table); shift += 6 {
			b := table[i]
			i++
			v |= uint64(b&63) << shift
			if b&64 == 0 {
				break
			}
		}
		return v
	}
	svarint := func() int64 {
		v := varint()
		if v&1 != 0 {
			return -int64(v >> 1)
		}
		return int64(v >> 1)
	}
	for i < len(table) {
		b := table[i]
		i++
		if b&0x80 == 0 {
			return 0 // not the start of an entry: a table this code does not know
		}
		code := b >> 3 & 15
		length := uint64(b&7) + 1
		none := false
		switch {
		case code == 15:
			none = true
		case code == 14:
			line += svarint()
			varint() // end line
			varint() // column
			varint() // end column
		case code == 13:
			line += svarint()
		case code >= 10:
			line += int64(code - 10)
			i += 2
		default:
			i++
		}
		if idx < at+length {
			if none {
				return 0
			}
			return line
		}
		at += length
	}
	return 0
}

// LineOld is the source line of the instruction at idx in a code object
// of CPython 3.10 (co_linetable: pairs of a byte offset's delta and a
// signed line delta, -128 for none) or up to 3.9 (co_lnotab: pairs of
// byte offset and line increments); idx is f_lasti as the frame holds it
// (instructions in 3.10, bytes before).
func LineOld(table []byte, first int64, idx uint64, format int) int64 {
	line := first
	var addr uint64
	if format == 310 {
		off := 2 * idx
		for i := 0; i+1 < len(table); i += 2 {
			end := addr + uint64(table[i])
			delta := int8(table[i+1])
			valid := delta != -128
			if valid {
				line += int64(delta)
			}
			if off >= addr && off < end {
				if !valid {
					return 0
				}
				return line
			}
			addr = end
		}
		return 0
	}
	for i := 0; i+1 < len(table); i += 2 {
		addr += uint64(table[i])
		if addr > idx {
			break
		}
		line += int64(int8(table[i+1]))
	}
	return line
}

// Code is a code object as read: its function, file and line table.
type Code struct {
	Name, File string
	First      int64
	Lines      []byte
}

// ReadCode reads a code object's names and line table.
func ReadCode(mem io.ReaderAt, l Layout, addr uint64) *Code {
	b := make([]byte, max(l.CodeFile, l.CodeName, l.CodeQualname, l.CodeFirstLine, l.CodeLines)+8)
	if _, err := mem.ReadAt(b, int64(addr)); err != nil {
		return nil
	}
	ptr := func(off uint64) uint64 { return binary.LittleEndian.Uint64(b[off:]) }
	var name string
	if l.CodeQualname != 0 {
		name = ReadString(mem, l, ptr(l.CodeQualname))
	}
	if name == "" {
		name = ReadString(mem, l, ptr(l.CodeName))
	}
	file := ReadString(mem, l, ptr(l.CodeFile))
	if name == "" {
		return nil
	}
	c := &Code{Name: name, File: file, First: int64(int32(binary.LittleEndian.Uint32(b[l.CodeFirstLine:])))}
	if tbl := ptr(l.CodeLines); tbl != 0 {
		var hdr [8]byte
		if _, err := mem.ReadAt(hdr[:], int64(tbl+l.BytesSize)); err == nil {
			if n := binary.LittleEndian.Uint64(hdr[:]); n < 1<<16 {
				c.Lines = make([]byte, n)
				if _, err := mem.ReadAt(c.Lines, int64(tbl+l.BytesData)); err != nil {
					c.Lines = nil
				}
			}
		}
	}
	return c
}

// ReadString reads a str object: compact, of 1, 2 or 4 bytes a
// character (PEP 393); "" if it is not one.
func ReadString(mem io.ReaderAt, l Layout, addr uint64) string {
	if addr == 0 {
		return ""
	}
	var hdr [40]byte
	if _, err := mem.ReadAt(hdr[:], int64(addr)); err != nil {
		return ""
	}
	n := binary.LittleEndian.Uint64(hdr[16:])
	state := binary.LittleEndian.Uint32(hdr[32:])
	kind, compact, ascii := state>>2&7, state>>5&1, state>>6&1
	if compact == 0 || n > 4096 || kind == 0 || kind == 3 || kind > 4 {
		return ""
	}
	data := l.CompactData
	if ascii == 1 {
		data = l.AsciiData
	}
	raw := make([]byte, n*uint64(kind))
	if _, err := mem.ReadAt(raw, int64(addr+data)); err != nil {
		return ""
	}
	if kind == 1 {
		if ascii == 1 {
			return string(raw)
		}
		rs := make([]rune, n)
		for i, c := range raw {
			rs[i] = rune(c)
		}
		return string(rs)
	}
	rs := make([]rune, n)
	for i := range rs {
		if kind == 2 {
			rs[i] = rune(binary.LittleEndian.Uint16(raw[2*i:]))
		} else {
			rs[i] = rune(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	}
	return string(rs)
}
