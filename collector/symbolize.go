package collector

import (
	"bufio"
	"bytes"
	"debug/elf"
	"debug/gosym"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/ianlancetaylor/demangle"
	"golang.org/x/sys/unix"
)

// frame is one symbolized instruction address.
type frame struct {
	fn   string
	file string
	line int64
}

// fileCache holds each mapped executable open once, keyed by device and
// inode, so symbols stay readable after the process exits or the file is
// replaced on disk.
type fileCache struct {
	mu    sync.Mutex
	files map[string]*symFile
	// debugDir holds detached debug files by build id (empty: none read).
	debugDir string
}

// defaultDebugDir is where distributions install detached debug files
// (Debian's *-dbg and *-dbgsym packages).
const defaultDebugDir = "/usr/lib/debug"

func newFileCache() *fileCache {
	return &fileCache{files: map[string]*symFile{}, debugDir: defaultDebugDir}
}

// open returns the file with the given identity (device in userspace
// encoding, inode), opening the first of paths that still names it (a
// file replaced on disk since it was mapped is not the one to read);
// display names it in profiles. A file none of the paths opens gets an
// entry without a handle: its frames are named by file and offset.
func (c *fileCache) open(dev, ino uint64, display string, paths ...string) *symFile {
	key := fmt.Sprintf("%d:%d", dev, ino)
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.files[key]; ok && f.fh != nil {
		return f
	}
	sf := &symFile{path: display, dev: dev, ino: ino, debugDir: c.debugDir}
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(int(f.Fd()), &st) == nil && st.Dev == dev && st.Ino == ino {
			sf.fh = f
			break
		}
		f.Close()
	}
	if old, ok := c.files[key]; ok && sf.fh == nil {
		return old // tried again, still unreadable
	}
	c.files[key] = sf
	return sf
}

func (c *fileCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.files {
		if f.fh != nil {
			f.fh.Close()
		}
	}
}

type elfSym struct {
	addr, size uint64
	name       string
}

// symFile is an ELF file's symbol information, loaded on first use.
type symFile struct {
	path     string
	fh       *os.File
	dev, ino uint64 // identity (device in userspace encoding); 0: unknown

	once    sync.Once
	loads   []elf.ProgHeader
	syms    []elfSym
	gotab   *gosym.Table
	buildID string
	err     error
	// debugDir: where a stripped file's debug file is looked up by build id.
	debugDir string
}

func (f *symFile) load() {
	f.once.Do(func() {
		if f.fh == nil {
			f.err = fmt.Errorf("%s could not be opened", f.path)
			return
		}
		ef, err := elf.NewFile(f.fh)
		if err != nil {
			f.err = fmt.Errorf("reading %s as ELF: %w", f.path, err)
			return
		}
		for _, p := range ef.Progs {
			if p.Type == elf.PT_LOAD {
				f.loads = append(f.loads, p.ProgHeader)
			}
		}
		f.buildID = buildID(ef)
		f.syms = elfSymbols(ef)
		if len(f.syms) == 0 || !hasSection(ef, ".symtab") {
			// Stripped: a separate debug file may exist, found by build id.
			if dbg := debugFileFor(f.debugDir, f.buildID); dbg != nil {
				f.syms = append(f.syms, elfSymbols(dbg)...)
				sortSyms(f.syms)
			}
		}
		f.gotab = goTable(ef)
		// A stripped executable still says where _start is: its entry
		// point, the outermost frame of the main thread.
		if ef.Type == elf.ET_EXEC || ef.Type == elf.ET_DYN && ef.Section(".interp") != nil {
			if _, ok := f.lookup(ef.Entry); !ok && ef.Entry != 0 {
				f.syms = append(f.syms, elfSym{addr: ef.Entry, size: 64, name: "_start"})
				sortSyms(f.syms)
			}
		}
	})
}

func hasSection(ef *elf.File, name string) bool { return ef.Section(name) != nil }

func elfSymbols(ef *elf.File) []elfSym {
	var out []elfSym
	var labels []elfSym
	add := func(syms []elf.Symbol) {
		for _, s := range syms {
			t := elf.ST_TYPE(s.Info)
			if t == elf.STT_NOTYPE && s.Size == 0 && s.Value != 0 && isCode(ef, s.Section) && !strings.HasPrefix(s.Name, ".") {
				// An assembly entry point (the loader's _start): code
				// up to the next symbol, unless inside a function.
				labels = append(labels, elfSym{addr: s.Value, name: s.Name})
				continue
			}
			if (t != elf.STT_FUNC && t != elf.STT_GNU_IFUNC) || s.Value == 0 || s.Section == elf.SHN_UNDEF {
				continue
			}
			name := s.Name
			// Versioned names (pthread_cond_wait@@GLIBC_2.3.2) read as the call site spells them.
			if i := strings.IndexByte(name, '@'); i > 0 {
				name = name[:i]
			}
			out = append(out, elfSym{addr: s.Value, size: s.Size, name: name})
		}
	}
	if syms, err := ef.Symbols(); err == nil {
		add(syms)
	}
	if syms, err := ef.DynamicSymbols(); err == nil {
		add(syms)
	}
	sortSyms(out)
	if len(labels) == 0 {
		return out
	}
	var keep []elfSym
	for _, l := range labels {
		i := sort.Search(len(out), func(i int) bool { return out[i].addr > l.addr }) - 1
		inside := false
		for j := i; j >= 0 && j > i-64; j-- {
			if out[j].size > 0 && l.addr < out[j].addr+out[j].size {
				inside = true
				break
			}
		}
		if !inside {
			keep = append(keep, l)
		}
	}
	out = append(out, keep...)
	sortSyms(out)
	return out
}

// isCode says whether section index i holds instructions.
func isCode(ef *elf.File, i elf.SectionIndex) bool {
	return int(i) > 0 && int(i) < len(ef.Sections) && ef.Sections[i].Flags&elf.SHF_EXECINSTR != 0
}

func sortSyms(s []elfSym) {
	sort.Slice(s, func(i, j int) bool {
		if s[i].addr != s[j].addr {
			return s[i].addr < s[j].addr
		}
		return s[i].size > s[j].size
	})
}

func debugFileFor(dir, id string) *elf.File {
	if dir == "" || len(id) < 3 {
		return nil
	}
	p := filepath.Join(dir, ".build-id", id[:2], id[2:]+".debug")
	f, err := elf.Open(p)
	if err != nil {
		return nil
	}
	return f
}

func goTable(ef *elf.File) *gosym.Table {
	pcln := ef.Section(".gopclntab")
	text := ef.Section(".text")
	if pcln == nil || text == nil {
		return nil
	}
	data, err := pcln.Data()
	if err != nil {
		return nil
	}
	tab, err := gosym.NewTable(nil, gosym.NewLineTable(data, text.Addr))
	if err != nil {
		return nil
	}
	return tab
}

func buildID(ef *elf.File) string {
	for _, name := range []string{".note.gnu.build-id", ".note.go.buildid"} {
		s := ef.Section(name)
		if s == nil {
			continue
		}
		data, err := s.Data()
		if err != nil || len(data) < 16 {
			continue
		}
		order := ef.ByteOrder
		namesz := order.Uint32(data[0:4])
		descsz := order.Uint32(data[4:8])
		off := 12 + (namesz+3)&^3
		if uint32(len(data)) < off+descsz {
			continue
		}
		desc := data[off : off+descsz]
		if name == ".note.go.buildid" {
			return string(desc)
		}
		return hex.EncodeToString(desc)
	}
	return ""
}

// vaddr turns a file offset into the ELF virtual address it is loaded at.
func (f *symFile) vaddr(off uint64) (uint64, bool) {
	for _, p := range f.loads {
		if p.Flags&elf.PF_X != 0 && off >= p.Off && off < p.Off+p.Filesz {
			return off - p.Off + p.Vaddr, true
		}
	}
	for _, p := range f.loads {
		if off >= p.Off && off < p.Off+p.Filesz {
			return off - p.Off + p.Vaddr, true
		}
	}
	return 0, false
}

// lookup symbolizes an ELF virtual address.
func (f *symFile) lookup(va uint64) (frame, bool) {
	if f.gotab != nil {
		if file, line, fn := f.gotab.PCToLine(va); fn != nil {
			return frame{fn: fn.Name, file: file, line: int64(line)}, true
		}
	}
	i := sort.Search(len(f.syms), func(i int) bool { return f.syms[i].addr > va }) - 1
	for ; i >= 0; i-- {
		s := f.syms[i]
		if s.size == 0 || va < s.addr+s.size {
			return frame{fn: demangleName(s.name)}, true
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
	return frame{}, false
}

func demangleName(n string) string {
	if strings.HasPrefix(n, "_Z") || strings.HasPrefix(n, "_R") {
		return demangle.Filter(n, demangle.NoParams, demangle.NoTemplateParams)
	}
	return n
}

// kernelSyms is /proc/kallsyms, text symbols sorted by address.
type kernelSyms struct {
	addrs []uint64
	names []string
}

func loadKallsyms(r io.Reader) (*kernelSyms, error) {
	k := &kernelSyms{}
	type ent struct {
		a uint64
		n string
	}
	var es []ent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			continue
		}
		switch f[1] {
		case "T", "t", "W", "w":
		default:
			continue
		}
		a, err := strconv.ParseUint(f[0], 16, 64)
		if err != nil || a == 0 {
			continue
		}
		es = append(es, ent{a, f[2]})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading kallsyms: %w", err)
	}
	sort.Slice(es, func(i, j int) bool { return es[i].a < es[j].a })
	for _, e := range es {
		k.addrs = append(k.addrs, e.a)
		k.names = append(k.names, e.n)
	}
	return k, nil
}

func (k *kernelSyms) lookup(addr uint64) string {
	i := sort.Search(len(k.addrs), func(i int) bool { return k.addrs[i] > addr }) - 1
	if i < 0 {
		return fmt.Sprintf("[kernel]+0x%x", addr)
	}
	return k.names[i]
}

// perfMap is a JIT's /tmp/perf-PID.map: "START SIZE name" in hex.
type perfMap struct {
	starts, ends []uint64
	names        []string
}

func parsePerfMap(r io.Reader) *perfMap {
	type ent struct {
		s, e uint64
		n    string
	}
	var es []ent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.SplitN(line, " ", 3)
		if len(f) < 3 {
			continue
		}
		s, err1 := strconv.ParseUint(strings.TrimPrefix(f[0], "0x"), 16, 64)
		n, err2 := strconv.ParseUint(strings.TrimPrefix(f[1], "0x"), 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		es = append(es, ent{s, s + n, javaMethod(f[2])})
	}
	// Later entries win: a JIT may reuse an address range.
	sort.SliceStable(es, func(i, j int) bool { return es[i].s < es[j].s })
	m := &perfMap{}
	for _, e := range es {
		m.starts = append(m.starts, e.s)
		m.ends = append(m.ends, e.e)
		m.names = append(m.names, e.n)
	}
	return m
}

// hotspotMethod matches a JIT-compiled method as HotSpot's
// Compiler.perfmap writes it: "void pkg.Class.method(int, long)".
var hotspotMethod = regexp.MustCompile(`^\S+ ([\w$.]+\.(?:[\w$]+|<init>|<clinit>))\(.*\)$`)

// javaMethod shortens a HotSpot perf-map name to pkg.Class.method, the
// form other Java profilers print and the analysis rules match; other
// names pass unchanged.
func javaMethod(name string) string {
	if m := hotspotMethod.FindStringSubmatch(name); m != nil {
		return m[1]
	}
	return name
}

func (m *perfMap) lookup(addr uint64) (string, bool) {
	if m == nil {
		return "", false
	}
	i := sort.Search(len(m.starts), func(i int) bool { return m.starts[i] > addr }) - 1
	// Entries may overlap when code is re-JITed: check a few back.
	for j := i; j >= 0 && j > i-8; j-- {
		if addr < m.ends[j] {
			return m.names[j], true
		}
	}
	return "", false
}

// symbolizer resolves the addresses of one recording.
type symbolizer struct {
	procs    *procTable
	kern     *kernelSyms
	perfMaps map[uint32]*perfMap
	jvms     *jvmTracker // nil: no JVM named through its structures
}

func newSymbolizer(procs *procTable) *symbolizer {
	s := &symbolizer{procs: procs, perfMaps: map[uint32]*perfMap{}}
	if f, err := os.Open("/proc/kallsyms"); err == nil {
		s.kern, _ = loadKallsyms(f)
		f.Close()
	}
	if s.kern == nil {
		s.kern = &kernelSyms{}
	}
	return s
}

// perfMapFor reads the JIT map now, at the end, since it grows while the
// process runs; a container's map is read through its root.
func (s *symbolizer) perfMapFor(pid uint32, p *procInfo) *perfMap {
	if m, ok := s.perfMaps[pid]; ok {
		return m
	}
	var m *perfMap
	var paths []string
	if p != nil && p.root != nil {
		paths = append(paths, fmt.Sprintf("/proc/self/fd/%d/tmp/perf-%d.map", p.root.Fd(), p.nspid))
	}
	paths = append(paths, fmt.Sprintf("/tmp/perf-%d.map", pid))
	for _, path := range paths {
		if b, err := os.ReadFile(path); err == nil {
			m = parsePerfMap(bytes.NewReader(b))
			break
		}
	}
	s.perfMaps[pid] = m
	return m
}

// user symbolizes a user address of process pid. The returned mapping is
// nil when the address is in no known mapping.
func (s *symbolizer) user(pid uint32, addr uint64) (frame, *mapping) {
	p := s.procs.get(pid)
	var m *mapping
	if p != nil {
		m = p.find(addr)
	}
	if m == nil || m.file == nil {
		if s.jvms != nil {
			if name, ok := s.jvms.name(pid, addr); ok {
				return frame{fn: name}, m
			}
		}
		if name, ok := s.perfMapFor(pid, p).lookup(addr); ok {
			return frame{fn: name}, m
		}
		if m != nil {
			label := m.path
			if label == "" {
				label = "[anon]"
			}
			return frame{fn: fmt.Sprintf("%s+0x%x", label, addr-m.start)}, m
		}
		return frame{fn: fmt.Sprintf("[unmapped]+0x%x", addr)}, nil
	}
	off := addr - m.start + m.offset
	m.file.load()
	if m.file.err == nil {
		if va, ok := m.file.vaddr(off); ok {
			if fr, ok := m.file.lookup(va); ok {
				return fr, m
			}
		}
	}
	return frame{fn: fmt.Sprintf("%s+0x%x", filepath.Base(m.path), off)}, m
}
