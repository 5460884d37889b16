package symtab

import (
	"debug/elf"
	"strings"

	"golang.org/x/arch/x86/x86asm"
)

// maxWrapper bounds the code read of a wrapper: a go statement's wrapper
// loads its arguments and calls its function in a few dozen bytes.
const maxWrapper = 512

// WrappedCall names the function a Go wrapper at va calls (a go
// statement's wrapper calls the function the goroutine runs): the first
// direct call in its code to a function outside the runtime (whose
// stack-growth and write-barrier calls it may also make). ok is false
// for code that is not a Go wrapper or calls no such function (x86-64).
func (f *File) WrappedCall(va uint64) (Frame, bool) {
	f.Load()
	if f.gofn == nil || f.Handle == nil {
		return Frame{}, false
	}
	if fr, ok := f.gofn.lookup(va); !ok || !fr.Wrapper {
		return Frame{}, false
	}
	entry, end, ok := f.gofn.bounds(va)
	if !ok {
		return Frame{}, false
	}
	off, ok := f.fileOffset(entry)
	if !ok {
		return Frame{}, false
	}
	code := make([]byte, min(end-entry, maxWrapper))
	n, _ := f.Handle.ReadAt(code, int64(off))
	code = code[:n]
	for i := 0; i < len(code); {
		in, err := x86asm.Decode(code[i:], 64)
		if err != nil {
			return Frame{}, false
		}
		i += in.Len
		if in.Op == x86asm.RET {
			break
		}
		rel, isRel := in.Args[0].(x86asm.Rel)
		if in.Op != x86asm.CALL || !isRel {
			continue
		}
		target := entry + uint64(i) + uint64(int64(rel))
		if fr, ok := f.gofn.lookup(target); ok && !strings.HasPrefix(fr.Func, "runtime.") {
			return fr, true
		}
	}
	return Frame{}, false
}

// fileOffset turns an address in an executable segment into its offset
// in the file.
func (f *File) fileOffset(va uint64) (uint64, bool) {
	for _, p := range f.Loads {
		if p.Flags&elf.PF_X != 0 && va >= p.Vaddr && va < p.Vaddr+p.Filesz {
			return va - p.Vaddr + p.Off, true
		}
	}
	return 0, false
}
