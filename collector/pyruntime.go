package collector

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/offcpu/offcpu/bpf"
)

// pyLayout is where CPython keeps what the walker and the namer read, for
// one version on x86-64: offsets from CPython's own headers
// (Include/cpython/pystate.h, Include/internal/pycore_runtime.h,
// pycore_interp.h, pycore_frame.h, pycore_gil.h, Include/cpython/code.h
// and unicodeobject.h), measured with offsetof against the headers of
// the version (see docs/python.md).
type pyLayout struct {
	interpHead            uint64 // _PyRuntimeState.interpreters.head
	gil, gilSize          uint64 // _PyRuntimeState.ceval.gil, sizeof(struct _gil_runtime_state)
	gilHolder             uint16 // _gil_runtime_state.last_holder
	threadsHead           uint16 // PyInterpreterState.threads.head
	tstateNext, threadID  uint16 // PyThreadState.next, .thread_id
	nativeID, tstateFrame uint16 // .native_thread_id, .cframe
	cframeFrame           uint16 // _PyCFrame.current_frame
	frameCode, frameBack  uint16 // _PyInterpreterFrame.f_code, .previous
	frameInstr            uint16 // .prev_instr
	frameEntry            uint16 // .is_entry
	entryVal, flags       uint8
	codeFirstInstr        uint16 // PyCodeObject.co_code_adaptive
	// PyCodeObject's names and lines: co_filename, co_name, co_qualname,
	// co_firstlineno, co_linetable.
	codeFile, codeName, codeQualname, codeFirstLine, codeLines uint64
	// PyASCIIObject's size (a compact ASCII string's data follows it),
	// PyCompactUnicodeObject's; PyBytesObject's ob_size and ob_sval.
	asciiData, compactData, bytesSize, bytesData uint64
	lineFormat                                   int // 311: the 3.11+ location table
}

// pyLayouts: the versions whose layout is known, measured with offsetof
// on each version's own headers (Include/internal, Py_BUILD_CORE): 3.11
// on Debian 12's python3.11-dev (3.11.2) and 3.11.7, the others on
// 3.8.18, 3.9.18, 3.10.13, 3.12.1 and 3.13.0 (docs/python.md has the
// program). Up to 3.10 a frame is a PyFrameObject, each interpreter
// activation runs one, f_lasti is an int (bytes up to 3.9, instructions
// in 3.10) and a thread state has no native thread id; 3.12 adds shim
// frames at C entries and keeps the main interpreter's GIL in it; 3.13
// drops _PyCFrame.
var pyLayouts = map[[2]int]pyLayout{
	{3, 8}: {
		interpHead: 32, gil: 1152, gilSize: 208, gilHolder: 8,
		threadsHead: 8, tstateNext: 8, threadID: 176, tstateFrame: 24,
		frameCode: 32, frameBack: 24, frameInstr: 104, entryVal: 0xff,
		flags:    bpf.PyOnePerEval,
		codeFile: 104, codeName: 112, codeFirstLine: 40, codeLines: 120,
		asciiData: 48, compactData: 72, bytesSize: 16, bytesData: 32,
		lineFormat: 38,
	},
	{3, 9}: {
		interpHead: 32, gil: 352, gilSize: 208, gilHolder: 8,
		threadsHead: 8, tstateNext: 8, threadID: 176, tstateFrame: 24,
		frameCode: 32, frameBack: 24, frameInstr: 104, entryVal: 0xff,
		flags:    bpf.PyOnePerEval,
		codeFile: 104, codeName: 112, codeFirstLine: 40, codeLines: 120,
		asciiData: 48, compactData: 72, bytesSize: 16, bytesData: 32,
		lineFormat: 38,
	},
	{3, 10}: {
		interpHead: 32, gil: 352, gilSize: 208, gilHolder: 8,
		threadsHead: 8, tstateNext: 8, threadID: 176, tstateFrame: 24,
		frameCode: 32, frameBack: 24, frameInstr: 96, entryVal: 0xff,
		flags:    bpf.PyOnePerEval,
		codeFile: 104, codeName: 112, codeFirstLine: 40, codeLines: 120,
		asciiData: 48, compactData: 72, bytesSize: 16, bytesData: 32,
		lineFormat: 310,
	},
	{3, 12}: {
		interpHead: 40, gil: 77432, gilSize: 208, gilHolder: 8,
		threadsHead: 72, tstateNext: 8, threadID: 136, nativeID: 144, tstateFrame: 56, cframeFrame: 0,
		frameCode: 0, frameBack: 8, frameInstr: 56, frameEntry: 70, entryVal: 3,
		flags:          bpf.PyInstrPtr | bpf.PyCframe | bpf.PyEntryShim,
		codeFirstInstr: 192,
		codeFile:       112, codeName: 120, codeQualname: 128, codeFirstLine: 68, codeLines: 136,
		asciiData: 40, compactData: 56, bytesSize: 16, bytesData: 32,
		lineFormat: 311,
	},
	{3, 13}: {
		interpHead: 632, gil: 96104, gilSize: 208, gilHolder: 8,
		threadsHead: 7344, tstateNext: 8, threadID: 152, nativeID: 160, tstateFrame: 72,
		frameCode: 0, frameBack: 8, frameInstr: 56, frameEntry: 70, entryVal: 3,
		flags:          bpf.PyInstrPtr | bpf.PyEntryShim,
		codeFirstInstr: 200,
		codeFile:       112, codeName: 120, codeQualname: 128, codeFirstLine: 68, codeLines: 136,
		asciiData: 40, compactData: 56, bytesSize: 16, bytesData: 32,
		lineFormat: 311,
	},
	{3, 11}: {
		interpHead: 40, gil: 360, gilSize: 208, gilHolder: 8,
		threadsHead: 16, tstateNext: 8, threadID: 152, nativeID: 160, tstateFrame: 56, cframeFrame: 8,
		frameCode: 32, frameBack: 48, frameInstr: 56, frameEntry: 68, entryVal: 1,
		flags:          bpf.PyInstrPtr | bpf.PyCframe,
		codeFirstInstr: 184,
		codeFile:       112, codeName: 120, codeQualname: 128, codeFirstLine: 72, codeLines: 136,
		asciiData: 48, compactData: 72, bytesSize: 16, bytesData: 32,
		lineFormat: 311,
	},
}

// pyRuntime is a CPython interpreter's binary (python3.X, or the
// libpython3.X.so it links): its version and the virtual addresses of
// what the walker needs.
type pyRuntime struct {
	version    [2]int
	layout     pyLayout
	runtime    uint64 // _PyRuntime
	evalLo     uint64 // _PyEval_EvalFrameDefault
	evalHi     uint64
	supported  bool   // a layout is known for its version
	unsupError string // why not
}

var pyFileVersion = regexp.MustCompile(`python(\d)\.(\d+)`)

// errNotPython: the file is not a CPython interpreter.
var errNotPython = errors.New("not a CPython interpreter")

// readPyRuntime recognises a CPython interpreter by its symbols: the
// runtime state and the interpreter loop, both exported.
func readPyRuntime(ef *elf.File, path string) (*pyRuntime, error) {
	syms, err := ef.DynamicSymbols()
	if err != nil {
		return nil, errNotPython
	}
	r := &pyRuntime{}
	var version uint64
	for _, s := range syms {
		switch s.Name {
		case "_PyRuntime":
			r.runtime = s.Value
		case "_PyEval_EvalFrameDefault":
			r.evalLo, r.evalHi = s.Value, s.Value+s.Size
		case "Py_Version":
			version = s.Value
		}
	}
	if r.runtime == 0 || r.evalLo == 0 || r.evalHi <= r.evalLo {
		return nil, errNotPython
	}
	if version != 0 {
		// Py_Version (3.11+): PY_VERSION_HEX, major in the top byte.
		if b, ok := readELFAt(ef, version, 4); ok {
			hex := binary.LittleEndian.Uint32(b)
			r.version = [2]int{int(hex >> 24), int(hex >> 16 & 0xff)}
		}
	}
	if r.version[0] == 0 {
		if m := pyFileVersion.FindStringSubmatch(filepath.Base(path)); m != nil {
			a, _ := strconv.Atoi(m[1])
			b, _ := strconv.Atoi(m[2])
			r.version = [2]int{a, b}
		}
	}
	l, ok := pyLayouts[r.version]
	r.layout, r.supported = l, ok
	if !ok {
		r.unsupError = fmt.Sprintf("CPython %d.%d: no layout known (supported: 3.8 to 3.13)", r.version[0], r.version[1])
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

// pyModule names a source file as Python names its module: the path
// below the interpreter's library or a site's packages, else the file's
// base name; "<frozen importlib._bootstrap>" is importlib._bootstrap.
func pyModule(file string) string {
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
		if m := pyLibDir.FindStringIndex(file); m != nil {
			rel = file[m[1]:]
		}
	}
	rel = strings.TrimSuffix(strings.TrimSuffix(rel, ".py"), "/__init__")
	return strings.ReplaceAll(rel, "/", ".")
}

var pyLibDir = regexp.MustCompile(`/lib/python\d\.\d+/(lib-dynload/)?`)

// pyLine is the source line of the instruction at index idx (in code
// units) of a code object whose first line is first, from its location
// table (co_linetable, CPython 3.11+: Objects/locations.md); 0 if not
// found.
func pyLine(table []byte, first int64, idx uint64) int64 {
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

// pyLineOld is the source line of the instruction at idx in a code object
// of CPython 3.10 (co_linetable: pairs of a byte offset's delta and a
// signed line delta, -128 for none) or up to 3.9 (co_lnotab: pairs of
// byte offset and line increments); idx is f_lasti as the frame holds it
// (instructions in 3.10, bytes before).
func pyLineOld(table []byte, first int64, idx uint64, format int) int64 {
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
