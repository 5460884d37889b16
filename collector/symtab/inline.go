package symtab

import (
	"debug/elf"
	"encoding/binary"
	"io"
)

// Go's inline tree: at an address where the compiler inlined calls, the
// function's PCDATA_InlTreeIndex table gives an entry of its
// FUNCDATA_InlTree, which names the inlined function and the address of
// the call in its caller (parentPc), itself perhaps inlined. The runtime's
// symtab.go (runtime.Frames) reads them so; the layouts are those of
// runtime.inlinedCall.
const (
	pcdataInlTreeIndex = 2
	funcdataInlTree    = 3
	maxInlineDepth     = 16
)

// inlineLayout is runtime.inlinedCall's: its size, and where its name
// offset and parentPc are.
type inlineLayout struct{ size, funcID, nameOff, parentPc int64 }

var (
	inline118 = inlineLayout{20, 2, 12, 16} // parent, funcID, file, line, func_, parentPc
	inline120 = inlineLayout{16, 0, 4, 8}   // funcID, nameOff, parentPc, startLine
)

// goFuncData is where a Go binary's function data lies: moduledata.gofunc
// (the go:func.* symbol) and the file's loaded segments to read it.
type goFuncData struct {
	file   io.ReaderAt
	loads  []elf.ProgHeader
	gofunc uint64
	layout inlineLayout
}

// findGoFuncData finds gofunc in runtime.firstmoduledata: the word in
// the data (in Go 1.26, a section of its own) that points at the pclntab,
// checked by its text field, its types ≤ etypes and rodata ≤ gofunc. The
// data is read in chunks up to the match (it comes early), and the symbol
// table is not read: a large binary's is megabytes. nil when not found:
// frames are then named without inlining.
func findGoFuncData(file io.ReaderAt, ef *elf.File, pcln *elf.Section, textStart uint64, newLayout bool) *goFuncData {
	d := &goFuncData{file: file, layout: inline118}
	if newLayout {
		d.layout = inline120
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD {
			d.loads = append(d.loads, p.ProgHeader)
		}
	}
	gofuncAt := uint64(304) // moduledata.gofunc, Go 1.18 and 1.19
	if newLayout {
		gofuncAt = 320 // 1.20+ (covctrs, ecovctrs added)
	}
	const chunk = 64 << 10
	buf := make([]byte, chunk+gofuncAt+8)
	for _, name := range []string{".go.module", ".noptrdata", ".data", ".data.rel.ro"} {
		sec := ef.Section(name)
		if sec == nil || sec.Type == elf.SHT_NOBITS {
			continue
		}
		r := sec.Open()
		for base := int64(0); base < int64(sec.Size); base += chunk {
			n, _ := r.(io.ReaderAt).ReadAt(buf, base)
			for off := 0; off+int(gofuncAt)+8 <= n && off < chunk; off += 8 {
				w := func(at uint64) uint64 { return binary.LittleEndian.Uint64(buf[off+int(at):]) }
				if w(0) != pcln.Addr || w(176) != textStart {
					continue
				}
				types, etypes, rodata, gofunc := w(gofuncAt-24), w(gofuncAt-16), w(gofuncAt-8), w(gofuncAt)
				if types <= etypes && rodata <= gofunc && d.readable(gofunc) {
					d.gofunc = gofunc
					return d
				}
			}
		}
	}
	return nil
}

// readable tells whether va is in a loaded segment of the file.
func (d *goFuncData) readable(va uint64) bool {
	_, ok := d.offset(va)
	return ok
}

func (d *goFuncData) offset(va uint64) (int64, bool) {
	for _, p := range d.loads {
		if va >= p.Vaddr && va < p.Vaddr+p.Filesz {
			return int64(va - p.Vaddr + p.Off), true
		}
	}
	return 0, false
}

// inlinedCall is an entry of an inline tree.
type inlinedCall struct {
	funcID   uint8
	nameOff  int32  // in the function name table
	parentPc uint32 // the call's offset from the enclosing function's entry
}

// inlinedCall reads entry ix of the inline tree at funcdata offset tree.
func (d *goFuncData) inlinedCall(tree uint32, ix int32) (inlinedCall, bool) {
	off, ok := d.offset(d.gofunc + uint64(tree) + uint64(ix)*uint64(d.layout.size))
	if !ok {
		return inlinedCall{}, false
	}
	var b [20]byte
	if _, err := d.file.ReadAt(b[:d.layout.size], off); err != nil {
		return inlinedCall{}, false
	}
	return inlinedCall{b[d.layout.funcID], int32(binary.LittleEndian.Uint32(b[d.layout.nameOff:])),
		binary.LittleEndian.Uint32(b[d.layout.parentPc:])}, true
}
