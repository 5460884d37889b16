// Package symtab names addresses in the files a recording saw: ELF
// symbols (with detached debug files by build id, C++ and Rust names
// demangled), Go's pclntab, the kernel's kallsyms and JIT perf maps.
package symtab

import (
	"debug/elf"
	"debug/gosym"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/ianlancetaylor/demangle"
	"golang.org/x/sys/unix"
)

// Frame is one symbolized instruction address.
type Frame struct {
	Func string
	File string // source file, where known (Go binaries)
	Line int64
	// Wrapper: code the Go compiler generated around a call (a method
	// forwarded to an embedded field, a go statement's closure), which
	// Go's own tracebacks leave out.
	Wrapper bool
}

// Cache holds each mapped executable open once, keyed by device and
// inode, so symbols stay readable after the process exits or the file is
// replaced on disk.
type Cache struct {
	mu    sync.Mutex
	files map[string]*File
	// DebugDir holds detached debug files by build id (empty: none read).
	DebugDir string
}

// DefaultDebugDir is where distributions install detached debug files
// (Debian's *-dbg and *-dbgsym packages).
const DefaultDebugDir = "/usr/lib/debug"

// NewCache returns an empty cache that reads debug files from
// DefaultDebugDir.
func NewCache() *Cache {
	return &Cache{files: map[string]*File{}, DebugDir: DefaultDebugDir}
}

// Open returns the file with the given identity (device in userspace
// encoding, inode), opening the first of paths that still names it (a
// file replaced on disk since it was mapped is not the one to read);
// display names it in profiles. A file none of the paths opens gets an
// entry without a handle: its frames are named by file and offset.
func (c *Cache) Open(dev, ino uint64, display string, paths ...string) *File {
	key := fmt.Sprintf("%d:%d", dev, ino)
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.files[key]; ok && f.Handle != nil {
		return f
	}
	sf := &File{Path: display, Dev: dev, Ino: ino, debugDir: c.DebugDir}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(int(f.Fd()), &st) == nil && st.Dev == dev && st.Ino == ino {
			sf.Handle = f
			break
		}
		f.Close()
	}
	if old, ok := c.files[key]; ok && sf.Handle == nil {
		return old // tried again, still unreadable
	}
	c.files[key] = sf
	return sf
}

// Close closes every file the cache holds open.
func (c *Cache) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.files {
		if f.Handle != nil {
			f.Handle.Close()
		}
	}
}

type elfSym struct {
	addr, size uint64
	name       string
}

// File is an ELF file's symbol information, loaded on first use.
type File struct {
	Path     string   // as profiles name it
	Handle   *os.File // nil: could not be opened
	Dev, Ino uint64   // identity (device in userspace encoding); 0: unknown

	once    sync.Once
	Loads   []elf.ProgHeader // after Load
	BuildID string           // after Load
	Err     error            // after Load: why it has no symbols
	syms    []elfSym
	gofn    *goFuncs     // Go 1.18+: read on lookup
	gotab   *gosym.Table // older Go
	// debugDir: where a stripped file's debug file is looked up by build id.
	debugDir string
}

// Load reads the file's segments, build id and symbols once.
func (f *File) Load() {
	f.once.Do(func() {
		if f.Handle == nil {
			f.Err = fmt.Errorf("%s could not be opened", f.Path)
			return
		}
		ef, err := elf.NewFile(f.Handle)
		if err != nil {
			f.Err = fmt.Errorf("reading %s as ELF: %w", f.Path, err)
			return
		}
		for _, p := range ef.Progs {
			if p.Type == elf.PT_LOAD {
				f.Loads = append(f.Loads, p.ProgHeader)
			}
		}
		f.BuildID = buildID(ef)
		f.syms = elfSymbols(ef)
		if len(f.syms) == 0 || !hasSection(ef, ".symtab") {
			// Stripped: a separate debug file may exist, found by build id.
			if dbg := debugFileFor(f.debugDir, f.BuildID); dbg != nil {
				f.syms = append(f.syms, elfSymbols(dbg)...)
				sortSyms(f.syms)
			}
		}
		if f.gofn = openGoFuncs(f.Handle, ef); f.gofn != nil {
			// Go's own functions are named by its table: keep the ELF
			// symbols of the rest (a cgo binary's C code) only.
			lo, hi := f.gofn.textRange()
			f.syms = slices.Clone(slices.DeleteFunc(f.syms, func(s elfSym) bool { return s.addr >= lo && s.addr < hi }))
		} else {
			f.gotab = GoTable(ef)
		}
		// A stripped executable still says where _start is: its entry
		// point, the outermost frame of the main thread.
		if ef.Type == elf.ET_EXEC || ef.Type == elf.ET_DYN && ef.Section(".interp") != nil {
			if _, ok := f.Lookup(ef.Entry); !ok && ef.Entry != 0 {
				f.syms = append(f.syms, elfSym{addr: ef.Entry, size: 64, name: "_start"})
				sortSyms(f.syms)
			}
		}
	})
}

// VAddr turns a file offset into the ELF virtual address it is loaded at.
func (f *File) VAddr(off uint64) (uint64, bool) {
	for _, p := range f.Loads {
		if p.Flags&elf.PF_X != 0 && off >= p.Off && off < p.Off+p.Filesz {
			return off - p.Off + p.Vaddr, true
		}
	}
	for _, p := range f.Loads {
		if off >= p.Off && off < p.Off+p.Filesz {
			return off - p.Off + p.Vaddr, true
		}
	}
	return 0, false
}

// LookupFrames symbolizes va with the Go calls inlined there, innermost
// first, the function holding va last; elsewhere as Lookup.
func (f *File) LookupFrames(va uint64) ([]Frame, bool) {
	if f.gofn != nil {
		if frames, ok := f.gofn.frames(va); ok {
			return frames, true
		}
	}
	fr, ok := f.Lookup(va)
	return []Frame{fr}, ok
}

// Lookup symbolizes an ELF virtual address: the function holding it.
func (f *File) Lookup(va uint64) (Frame, bool) {
	if f.gofn != nil {
		if fr, ok := f.gofn.lookup(va); ok {
			return fr, true
		}
	}
	if f.gotab != nil {
		if file, line, fn := f.gotab.PCToLine(va); fn != nil {
			return Frame{Func: fn.Name, File: file, Line: int64(line)}, true
		}
	}
	i := sort.Search(len(f.syms), func(i int) bool { return f.syms[i].addr > va }) - 1
	for ; i >= 0; i-- {
		s := f.syms[i]
		if s.size == 0 || va < s.addr+s.size {
			return Frame{Func: demangleName(s.name)}, true
		}
		// A sized symbol that ends before va may be shadowed by a larger
		// one that starts earlier; look back a few entries only.
		if i > 0 && f.syms[i-1].addr+f.syms[i-1].size <= va && s.addr-f.syms[i-1].addr > 1<<20 {
			break
		}
		if len(f.syms)-i > 64 {
			break
		}
	}
	return Frame{}, false
}

func demangleName(n string) string {
	if strings.HasPrefix(n, "_Z") || strings.HasPrefix(n, "_R") {
		return demangle.Filter(n, demangle.NoParams, demangle.NoTemplateParams)
	}
	return n
}
