package symtab

import (
	"debug/elf"
	"debug/gosym"
	"encoding/binary"
	"encoding/hex"
	"io"
	"path/filepath"
	"sort"
	"strings"
)

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

// GoTable is the Go runtime's function table of an executable (.gopclntab),
// present even when it is stripped; nil when there is none.
func GoTable(ef *elf.File) *gosym.Table {
	pcln := ef.Section(".gopclntab")
	text := ef.Section(".text")
	if pcln == nil || text == nil {
		return nil
	}
	data, err := pcln.Data()
	if err != nil {
		return nil
	}
	tab, err := gosym.NewTable(nil, gosym.NewLineTable(data, goTextStart(ef, data, text.Addr)))
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

// goTextStart is where the Go function table's addresses count from: the
// table's own header says so since Go 1.18 (the first Go function, after
// the C code of a cgo binary), except where the external linker left it
// 0; then runtime.firstmoduledata's text (256 bytes past .text's start in
// a test program linked by gcc; found without the symbol table, which a
// stripped binary lacks), else the .text section's start.
func goTextStart(ef *elf.File, pcln []byte, text uint64) uint64 {
	if len(pcln) >= 32 && pcln[7] == 8 {
		switch binary.LittleEndian.Uint32(pcln) {
		case 0xfffffff0, 0xfffffff1: // Go 1.18, Go 1.20 and later
			if v := binary.LittleEndian.Uint64(pcln[24:]); v >= text {
				return v
			}
		}
	}
	if v, ok := goModuleText(ef); ok {
		return v
	}
	return text
}

// goModuleText reads moduledata.text: the word after the one that points
// at the pclntab (pcHeader, at 0) and its slices, minpc and maxpc (at 176,
// etext at 184), inside .text.
func goModuleText(ef *elf.File) (uint64, bool) {
	pcln, text := ef.Section(".gopclntab"), ef.Section(".text")
	if pcln == nil || text == nil {
		return 0, false
	}
	const chunk = 64 << 10
	buf := make([]byte, chunk+192)
	for _, name := range []string{".go.module", ".noptrdata", ".data", ".data.rel.ro"} {
		sec := ef.Section(name)
		if sec == nil || sec.Type == elf.SHT_NOBITS {
			continue
		}
		r := sec.Open().(io.ReaderAt)
		for base := int64(0); base < int64(sec.Size); base += chunk {
			n, _ := r.ReadAt(buf, base)
			for off := 0; off+192 <= n && off < chunk; off += 8 {
				w := func(at int) uint64 { return binary.LittleEndian.Uint64(buf[off+at:]) }
				if w(0) == pcln.Addr && w(176) >= text.Addr && w(176) < w(184) && w(184) <= text.Addr+text.Size {
					return w(176), true
				}
			}
		}
	}
	return 0, false
}
