package symtab

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"io"
	"sort"
	"strings"
)

// goFuncs reads a Go 1.18+ executable's function table (.gopclntab) from
// the file: the entry table is held (8 bytes a function), the name, file
// and line of a function are read when an address in it is looked up.
// debug/gosym decodes every function up front (about 15 MB for a large
// binary, held for the whole profile build); mapping the section instead
// put every page a lookup touched in the recorder's RSS. The layout is
// the one debug/gosym and the runtime's symtab.go read.
type goFuncs struct {
	r         io.ReaderAt // the section
	quantum   uint64
	nfunc     int
	funcIDAt  int         // byte offset of _func.funcID: 36 before Go 1.20 (no startLine), 40 after
	data      *goFuncData // nil: inlined calls are not named
	textStart uint64
	// Offsets in the section.
	funcnames, cutab, filetab, pctab, functab int64
	entries                                   []uint32 // {entry offset, _func offset} × nfunc+1
}

// openGoFuncs reads f's .gopclntab header and entry table; nil when the
// file has none, or one of a layout older than Go 1.18 (debug/gosym reads
// those).
func openGoFuncs(file io.ReaderAt, ef *elf.File) *goFuncs {
	sec, text := ef.Section(".gopclntab"), ef.Section(".text")
	if sec == nil || text == nil || sec.Type == elf.SHT_NOBITS || sec.Size < 64 || ef.ByteOrder != binary.LittleEndian {
		return nil
	}
	g := &goFuncs{r: io.NewSectionReader(file, int64(sec.Offset), int64(sec.Size))}
	hdr := make([]byte, 72)
	if _, err := g.r.ReadAt(hdr, 0); err != nil || !g.parse(hdr, goTextStart(ef, hdr, text.Addr), int64(sec.Size)) {
		return nil
	}
	raw := make([]byte, (g.nfunc+1)*8)
	if _, err := g.r.ReadAt(raw, g.functab); err != nil {
		return nil
	}
	g.entries = make([]uint32, 2*(g.nfunc+1))
	for i := range g.entries {
		g.entries[i] = binary.LittleEndian.Uint32(raw[4*i:])
	}
	g.data = findGoFuncData(file, ef, sec, g.textStart, g.funcIDAt == 40)
	return g
}

// parse reads the header (runtime.pcHeader): magic, two pad bytes, the
// instruction quantum, the pointer size, then eight pointer-sized words.
func (g *goFuncs) parse(d []byte, textStart uint64, size int64) bool {
	if m := binary.LittleEndian.Uint32(d); (m != 0xfffffff0 && m != 0xfffffff1) || d[4] != 0 || d[5] != 0 || d[7] != 8 {
		return false
	}
	word := func(i int) uint64 { return binary.LittleEndian.Uint64(d[8+8*i:]) }
	g.quantum, g.nfunc = uint64(d[6]), int(word(0))
	g.funcIDAt = 40
	if binary.LittleEndian.Uint32(d) == 0xfffffff0 {
		g.funcIDAt = 36
	}
	g.textStart = textStart
	off := func(i int) int64 {
		if o := word(i); o < uint64(size) {
			return int64(o)
		}
		return -1
	}
	g.funcnames, g.cutab, g.filetab, g.pctab, g.functab = off(3), off(4), off(5), off(6), off(7)
	return g.quantum > 0 && g.nfunc > 0 && g.nfunc < 1<<24 && g.funcnames >= 0 && g.cutab >= 0 && g.filetab >= 0 &&
		g.pctab >= 0 && g.functab >= 0 && g.functab+int64(g.nfunc+1)*8 <= size
}

// textRange is the addresses the table covers.
func (g *goFuncs) textRange() (lo, hi uint64) {
	return g.textStart, g.textStart + uint64(g.entries[2*g.nfunc])
}

// lookup names pc (a link-time virtual address): the function holding it,
// with the line of the call its innermost inlined call is made from.
func (g *goFuncs) lookup(pc uint64) (Frame, bool) {
	frames, ok := g.frames(pc)
	if !ok {
		return Frame{}, false
	}
	return frames[len(frames)-1], true
}

// goFunc is a function's runtime._func: its fields, funcID and the
// offsets of its pc-value tables (pcdata) and function data (funcdata).
type goFunc struct {
	entry             uint64
	funcID            uint8
	pcdata, funcdata  []uint32
	nameOff, cu, pcln uint32
	pcfile            uint32
}

// frames names pc, innermost first: the functions inlined there (from
// the inline tree, as runtime.Frames expands them), then the function
// holding it. Each frame's line is at the call into the frame before it.
// ok is false outside the table or where it is unreadable.
func (g *goFuncs) frames(pc uint64) ([]Frame, bool) {
	lo, hi := g.textRange()
	if pc < lo || pc >= hi {
		return nil, false
	}
	off := uint32(pc - g.textStart)
	i := sort.Search(g.nfunc, func(i int) bool { return g.entries[2*i] > off }) - 1
	if i < 0 {
		return nil, false
	}
	fn, err := g.readFunc(i)
	if err != nil {
		return nil, false
	}
	var out []Frame
	for depth := 0; ; depth++ {
		var fr Frame
		if line := g.pcvalue(fn.pcln, fn.entry, pc); line >= 0 {
			fr.Line = int64(line)
		}
		fr.File = g.fileAt(fn, pc)
		call, inlined := g.inlinedAt(fn, pc)
		if !inlined || depth == maxInlineDepth {
			if fr.Func, err = g.cstring(g.funcnames + int64(fn.nameOff)); err != nil {
				return nil, false
			}
			// Every special funcID but the wrappers' marks one top-level
			// runtime function (goexit, mcall, ...); the wrappers' value
			// differs between releases (21 in 1.19, 23 in 1.26).
			fr.Wrapper = fn.funcID != 0 && !topRuntime(fr.Func)
			return append(out, fr), true
		}
		if fr.Func, err = g.cstring(g.funcnames + int64(call.nameOff)); err != nil {
			return nil, false
		}
		fr.Wrapper = call.funcID != 0 && !topRuntime(fr.Func)
		out = append(out, fr)
		pc = fn.entry + uint64(call.parentPc)
	}
}

func topRuntime(name string) bool {
	return strings.HasPrefix(name, "runtime.") && !strings.ContainsAny(name[len("runtime."):], ".()")
}

// inlinedAt is the inlined call pc is in, if any.
func (g *goFuncs) inlinedAt(fn *goFunc, pc uint64) (inlinedCall, bool) {
	if g.data == nil || len(fn.pcdata) <= pcdataInlTreeIndex || len(fn.funcdata) <= funcdataInlTree ||
		fn.funcdata[funcdataInlTree] == ^uint32(0) {
		return inlinedCall{}, false
	}
	ix := g.pcvalue(fn.pcdata[pcdataInlTreeIndex], fn.entry, pc)
	if ix < 0 {
		return inlinedCall{}, false
	}
	return g.data.inlinedCall(fn.funcdata[funcdataInlTree], ix)
}

// fileAt is the source file of pc in fn ("" where unknown).
func (g *goFuncs) fileAt(fn *goFunc, pc uint64) string {
	fno := g.pcvalue(fn.pcfile, fn.entry, pc)
	if fno < 0 {
		return ""
	}
	var b [4]byte
	if _, err := g.r.ReadAt(b[:], g.cutab+(int64(fn.cu)+int64(fno))*4); err != nil {
		return ""
	}
	fnoff := binary.LittleEndian.Uint32(b[:])
	if fnoff == ^uint32(0) {
		return ""
	}
	file, _ := g.cstring(g.filetab + int64(fnoff))
	return file
}

// readFunc reads function i's runtime._func (fields 0 entry offset, 1
// name offset, 5 pcfile, 6 pcln, 7 npcdata, 8 compilation unit; its
// funcID) and the pcdata and funcdata offsets that follow it.
func (g *goFuncs) readFunc(i int) (*goFunc, error) {
	var b [160]byte
	base := g.functab + int64(g.entries[2*i+1])
	n, err := g.r.ReadAt(b[:], base)
	if n < 44 {
		return nil, err
	}
	field := func(n int) uint32 { return binary.LittleEndian.Uint32(b[4*n:]) }
	fn := &goFunc{entry: g.textStart + uint64(field(0)), funcID: b[g.funcIDAt],
		nameOff: field(1), pcfile: field(5), pcln: field(6), cu: field(8)}
	npcdata, nfuncdata := int(field(7)), int(b[g.funcIDAt+3])
	fixed := g.funcIDAt + 4
	if npcdata > 64 || fixed+4*(npcdata+nfuncdata) > n {
		return fn, nil // more than read: no pcdata, no inlining
	}
	for k := 0; k < npcdata; k++ {
		fn.pcdata = append(fn.pcdata, binary.LittleEndian.Uint32(b[fixed+4*k:]))
	}
	for k := 0; k < nfuncdata; k++ {
		fn.funcdata = append(fn.funcdata, binary.LittleEndian.Uint32(b[fixed+4*(npcdata+k):]))
	}
	return fn, nil
}

// pcvalue decodes a pc-value table from entry up to pc: pairs of varints,
// a zig-zag value delta and a pc delta in quanta, ended by a zero delta.
// Offset 0 is no table (the runtime's rule; debug/gosym decodes whatever
// is there).
func (g *goFuncs) pcvalue(off uint32, entry, pc uint64) int32 {
	if off == 0 {
		return -1
	}
	r := &chunkReader{r: g.r, off: g.pctab + int64(off)}
	val, at := int32(-1), entry
	for first := true; ; first = false {
		uv, err := binary.ReadUvarint(r)
		if err != nil || uv == 0 && !first {
			return -1
		}
		if uv&1 != 0 {
			uv = ^(uv >> 1)
		} else {
			uv >>= 1
		}
		val += int32(uv)
		d, err := binary.ReadUvarint(r)
		if err != nil {
			return -1
		}
		at += d * g.quantum
		if pc < at {
			return val
		}
	}
}

// cstring reads a NUL-terminated string at off.
func (g *goFuncs) cstring(off int64) (string, error) {
	var out []byte
	buf := make([]byte, 128)
	for len(out) < 1<<16 {
		n, err := g.r.ReadAt(buf, off)
		if i := bytes.IndexByte(buf[:n], 0); i >= 0 {
			return string(append(out, buf[:i]...)), nil
		}
		if err != nil {
			return "", err
		}
		out = append(out, buf[:n]...)
		off += int64(n)
	}
	return "", io.ErrUnexpectedEOF
}

// chunkReader reads bytes from r at off onwards, 64 at a time.
type chunkReader struct {
	r    io.ReaderAt
	off  int64
	buf  [64]byte
	i, n int
}

func (c *chunkReader) ReadByte() (byte, error) {
	if c.i == c.n {
		n, err := c.r.ReadAt(c.buf[:], c.off)
		if n == 0 {
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return 0, err
		}
		c.off += int64(n)
		c.i, c.n = 0, n
	}
	b := c.buf[c.i]
	c.i++
	return b, nil
}

// bounds is the function holding pc: its entry and end.
func (g *goFuncs) bounds(pc uint64) (entry, end uint64, ok bool) {
	lo, hi := g.textRange()
	if pc < lo || pc >= hi {
		return 0, 0, false
	}
	off := uint32(pc - g.textStart)
	i := sort.Search(g.nfunc, func(i int) bool { return g.entries[2*i] > off }) - 1
	if i < 0 {
		return 0, 0, false
	}
	return g.textStart + uint64(g.entries[2*i]), g.textStart + uint64(g.entries[2*i+2]), true
}
