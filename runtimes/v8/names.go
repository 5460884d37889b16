package v8

import (
	"encoding/binary"
	"errors"
	"io"
	"sort"
	"unicode/utf16"
)

// Function is a JavaScript function as read from a SharedFunctionInfo.
type Function struct {
	Name   string
	Script string
	// Line is the function's first line (1-based; 0: not known), and
	// lines turns a bytecode offset into a line where V8 kept the
	// function's source positions.
	Line      int
	positions []position
	lineEnds  []int64
}

type position struct{ code, script int64 }

// Reader reads V8 objects from a process's memory.
type Reader struct {
	Mem    io.ReaderAt
	L      *Layout
	script map[uint64]*script // by Script address
}

type script struct {
	name     string
	lineEnds []int64
}

// errType: an object of another type than expected (moved or freed).
var errType = errors.New("not the object expected")

const maxString = 4096

func (r *Reader) word(addr uint64) (uint64, error) {
	var b [8]byte
	if _, err := r.Mem.ReadAt(b[:], int64(addr)); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// field reads a tagged object's field.
func (r *Reader) field(obj, off uint64) (uint64, error) { return r.word(obj - 1 + off) }

func isHeap(v uint64) bool { return v&3 == 1 }

func (r *Reader) smi(v uint64) (int64, bool) {
	if v&1 != 0 {
		return 0, false
	}
	return int64(v) >> r.L.SmiShift, true
}

// typeOf reads a heap object's instance type.
func (r *Reader) typeOf(obj uint64) (uint16, error) {
	if !isHeap(obj) {
		return 0, errType
	}
	m, err := r.field(obj, r.L.HeapObjectMap)
	if err != nil {
		return 0, err
	}
	if !isHeap(m) {
		return 0, errType
	}
	var b [2]byte
	if _, err := r.Mem.ReadAt(b[:], int64(m-1+r.L.MapInstanceType)); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint16(b[:]), nil
}

// String reads a V8 string (sequential, cons, thin or sliced; external
// strings are not read); "" when obj is not one.
func (r *Reader) String(obj uint64) string {
	return r.str(obj, 0)
}

func (r *Reader) str(obj uint64, depth int) string {
	t, err := r.typeOf(obj)
	if err != nil || t >= r.L.FirstNonString || depth > 8 {
		return ""
	}
	var lb [4]byte
	if _, err := r.Mem.ReadAt(lb[:], int64(obj-1+r.L.StringLength)); err != nil {
		return ""
	}
	n := int(int32(binary.LittleEndian.Uint32(lb[:])))
	if n <= 0 {
		return ""
	}
	n = min(n, maxString)
	switch t & r.L.StringRepMask {
	case r.L.SeqTag:
		if t&r.L.StringEncMask == r.L.OneByteTag {
			b := make([]byte, n)
			if _, err := r.Mem.ReadAt(b, int64(obj-1+r.L.SeqOneByteChars)); err != nil {
				return ""
			}
			return latin1(b)
		}
		b := make([]byte, 2*n)
		if _, err := r.Mem.ReadAt(b, int64(obj-1+r.L.SeqTwoByteChars)); err != nil {
			return ""
		}
		u := make([]uint16, n)
		for i := range u {
			u[i] = binary.LittleEndian.Uint16(b[2*i:])
		}
		return string(utf16.Decode(u))
	case r.L.ExtTag:
		if t&r.L.StringEncMask != r.L.OneByteTag || r.L.ExternalData == 0 {
			return ""
		}
		return latin1(r.external(obj, n))
	case r.L.ConsTag:
		a, err1 := r.field(obj, r.L.ConsFirst)
		b, err2 := r.field(obj, r.L.ConsSecond)
		if err1 != nil || err2 != nil {
			return ""
		}
		s := r.str(a, depth+1) + r.str(b, depth+1)
		if len(s) > maxString {
			s = s[:maxString]
		}
		return s
	case r.L.ThinTag:
		a, err := r.field(obj, r.L.ThinActual)
		if err != nil {
			return ""
		}
		return r.str(a, depth+1)
	case r.L.SlicedTag:
		p, err1 := r.field(obj, r.L.SlicedParent)
		o, err2 := r.field(obj, r.L.SlicedOffset)
		off, ok := r.smi(o)
		if err1 != nil || err2 != nil || !ok {
			return ""
		}
		s := []rune(r.str(p, depth+1))
		if off < 0 || int(off) > len(s) {
			return ""
		}
		return string(s[off:min(len(s), int(off)+n)])
	}
	return ""
}

func latin1(b []byte) string {
	ascii := true
	for _, c := range b {
		if c >= 0x80 {
			ascii = false
			break
		}
	}
	if ascii {
		return string(b)
	}
	rs := make([]rune, len(b))
	for i, c := range b {
		rs[i] = rune(c)
	}
	return string(rs)
}

// Function reads a SharedFunctionInfo (a tagged pointer): its name, its
// script's name and the lines of its source positions.
func (r *Reader) Function(sfi uint64) (*Function, error) {
	t, err := r.typeOf(sfi)
	if err != nil {
		return nil, err
	}
	if t != r.L.TypeSFI {
		return nil, errType
	}
	f := &Function{}
	nameOrScope, err := r.field(sfi, r.L.SFINameOrScopeInfo)
	if err != nil {
		return nil, err
	}
	data, _ := r.field(sfi, r.L.SFIFunctionData)
	dataType, _ := r.typeOf(data)
	start := int64(-1)
	if nt, err := r.typeOf(nameOrScope); err == nil {
		switch {
		case nt < r.L.FirstNonString:
			f.Name = r.String(nameOrScope)
		case nt == r.L.TypeScopeInfo:
			f.Name, start = r.scopeInfo(nameOrScope)
		}
	}
	if r.isUncompiled(dataType) {
		if f.Name == "" {
			if n, err := r.field(data, r.L.UncompiledInferredName); err == nil {
				f.Name = r.String(n)
			}
		}
		var b [4]byte
		if _, err := r.Mem.ReadAt(b[:], int64(data-1+r.L.UncompiledStart)); err == nil {
			start = int64(int32(binary.LittleEndian.Uint32(b[:])))
		}
	}
	if so, err := r.field(sfi, r.L.SFIScript); err == nil {
		if s := r.readScript(so); s != nil {
			f.Script = s.name
			f.lineEnds = s.lineEnds
		}
	}
	if start >= 0 {
		f.Line = lineOf(f.lineEnds, start)
	}
	if bc := r.bytecode(data, dataType); bc != 0 {
		f.positions = r.positions(bc)
	}
	return f, nil
}

func (r *Reader) isUncompiled(t uint16) bool {
	for _, u := range r.L.TypeUncompiled {
		if u != 0 && t == u {
			return true
		}
	}
	return false
}

// LineAt is the line of a bytecode offset of the frame's slot (relative
// to the BytecodeArray's tagged pointer), or the function's first line.
func (f *Function) LineAt(slot int64, l *Layout) int {
	off := slot - int64(l.BytecodeData) + 1
	if len(f.positions) == 0 || off < 0 {
		return f.Line
	}
	i := sort.Search(len(f.positions), func(i int) bool { return f.positions[i].code > off }) - 1
	if i < 0 {
		return f.Line
	}
	if n := lineOf(f.lineEnds, f.positions[i].script); n > 0 {
		return n
	}
	return f.Line
}

// lineOf: the 1-based line holding a script offset (lineEnds: the offset
// of each line's end), 0 when not known.
func lineOf(lineEnds []int64, pos int64) int {
	if len(lineEnds) == 0 || pos < 0 {
		return 0
	}
	return sort.Search(len(lineEnds), func(i int) bool { return lineEnds[i] >= pos }) + 1
}

// readScript reads a Script: its name and its line ends (V8's own when
// it computed them, else from its source).
func (r *Reader) readScript(obj uint64) *script {
	if s, ok := r.script[obj]; ok {
		return s
	}
	t, err := r.typeOf(obj)
	if err != nil || t != r.L.TypeScript {
		return nil
	}
	s := &script{}
	if n, err := r.field(obj, r.L.ScriptName); err == nil {
		s.name = r.String(n)
	}
	if le, err := r.field(obj, r.L.ScriptLineEnds); err == nil {
		s.lineEnds = r.smis(le)
	}
	if len(s.lineEnds) == 0 {
		if src, err := r.field(obj, r.L.ScriptSource); err == nil {
			s.lineEnds = lineEndsOf(r.source(src))
		}
	}
	if r.script == nil {
		r.script = map[uint64]*script{}
	}
	r.script[obj] = s
	return s
}

// smis reads a FixedArray of Smis.
func (r *Reader) smis(obj uint64) []int64 {
	t, err := r.typeOf(obj)
	if err != nil || t != r.L.TypeFixedArray {
		return nil
	}
	lw, err := r.field(obj, r.L.FixedArrayLength)
	n, ok := r.smi(lw)
	if err != nil || !ok || n <= 0 || n > 1<<22 {
		return nil
	}
	b := make([]byte, 8*n)
	if _, err := r.Mem.ReadAt(b, int64(obj-1+r.L.FixedArrayData)); err != nil {
		return nil
	}
	out := make([]int64, n)
	for i := range out {
		v, ok := r.smi(binary.LittleEndian.Uint64(b[8*i:]))
		if !ok {
			return nil
		}
		out[i] = v
	}
	return out
}

// maxSource bounds a script's source read to find its lines.
const maxSource = 16 << 20

// source reads a script's source as bytes of one per character (two-byte
// characters kept as one byte each: only newlines matter).
func (r *Reader) source(obj uint64) []byte {
	t, err := r.typeOf(obj)
	if err != nil || t >= r.L.FirstNonString {
		return nil
	}
	rep := t & r.L.StringRepMask
	if rep == r.L.ExtTag && t&r.L.StringEncMask == r.L.OneByteTag && r.L.ExternalData != 0 {
		var lb [4]byte
		if _, err := r.Mem.ReadAt(lb[:], int64(obj-1+r.L.StringLength)); err != nil {
			return nil
		}
		n := int(int32(binary.LittleEndian.Uint32(lb[:])))
		if n <= 0 || n > maxSource {
			return nil
		}
		return r.external(obj, n)
	}
	if rep != r.L.SeqTag {
		return nil
	}
	var lb [4]byte
	if _, err := r.Mem.ReadAt(lb[:], int64(obj-1+r.L.StringLength)); err != nil {
		return nil
	}
	n := int64(int32(binary.LittleEndian.Uint32(lb[:])))
	if n <= 0 || n > maxSource {
		return nil
	}
	if t&r.L.StringEncMask == r.L.OneByteTag {
		b := make([]byte, n)
		if _, err := r.Mem.ReadAt(b, int64(obj-1+r.L.SeqOneByteChars)); err != nil {
			return nil
		}
		return b
	}
	b := make([]byte, 2*n)
	if _, err := r.Mem.ReadAt(b, int64(obj-1+r.L.SeqTwoByteChars)); err != nil {
		return nil
	}
	out := make([]byte, n)
	for i := range out {
		if binary.LittleEndian.Uint16(b[2*i:]) == '\n' {
			out[i] = '\n'
		}
	}
	return out
}

// lineEndsOf: the offset of each line's end, as V8's Script::line_ends
// (the last line ends at the source's end).
func lineEndsOf(src []byte) []int64 {
	if src == nil {
		return nil
	}
	var ends []int64
	for i, c := range src {
		if c == '\n' {
			ends = append(ends, int64(i))
		}
	}
	return append(ends, int64(len(src)))
}

// external reads n one-byte characters of an external string through the
// pointer to them it caches (nil if it has none).
func (r *Reader) external(obj uint64, n int) []byte {
	p, err := r.field(obj, r.L.ExternalData)
	if err != nil || p == 0 {
		return nil
	}
	b := make([]byte, n)
	if _, err := r.Mem.ReadAt(b, int64(p)); err != nil {
		return nil
	}
	return b
}
