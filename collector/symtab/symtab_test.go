package symtab

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func build(t testing.TB, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// fileSymbols returns an unstripped file's symbol table.
func fileSymbols(t *testing.T, path string) []elf.Symbol {
	t.Helper()
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, err := ef.Symbols()
	if err != nil {
		t.Fatal(err)
	}
	return syms
}

// symbolAddr returns the address of a symbol from an unstripped file.
func symbolAddr(t *testing.T, path, name string) uint64 {
	t.Helper()
	for _, s := range fileSymbols(t, path) {
		if s.Name == name {
			return s.Value
		}
	}
	t.Fatalf("%s has no symbol %s", path, name)
	return 0
}

func TestSymbolizeCxx(t *testing.T) {
	if _, err := exec.LookPath("g++"); err != nil {
		t.Skip("g++ not installed")
	}
	dir := t.TempDir()
	full := filepath.Join(dir, "prog")
	stripped := filepath.Join(dir, "prog.stripped")
	build(t, "g++", "-O1", "-rdynamic", "-fPIE", "-pie", "-o", full, "../testdata/elf/prog.cc")
	build(t, "strip", "-s", "-o", stripped, full)

	for _, tc := range []struct{ sym, want string }{
		{"_ZN4shop6Widget4spinEi", "shop::Widget::spin"},
		{"plain_c_function", "plain_c_function"},
	} {
		addr := symbolAddr(t, full, tc.sym)
		for _, path := range []string{full, stripped} {
			f, err := openSymFile(path)
			if err != nil {
				t.Fatal(err)
			}
			fr, ok := f.Lookup(addr + 2)
			if !ok || fr.Func != tc.want {
				t.Errorf("%s: lookup(%s+2) = %q, %v; want %q", filepath.Base(path), tc.sym, fr.Func, ok, tc.want)
			}
			if f.BuildID == "" {
				t.Errorf("%s: no build id read", filepath.Base(path))
			}
		}
	}
}

func TestSymbolizeGo(t *testing.T) {
	dir := t.TempDir()
	full := filepath.Join(dir, "wl")
	stripped := filepath.Join(dir, "wl.stripped")
	build(t, "go", "build", "-o", full, "../testdata/workload")
	build(t, "strip", "-s", "-o", stripped, full)
	addr := symbolAddr(t, full, "main.napLoop")
	for _, path := range []string{full, stripped} {
		f, err := openSymFile(path)
		if err != nil {
			t.Fatal(err)
		}
		fr, ok := f.Lookup(addr + 4)
		if !ok || fr.Func != "main.napLoop" || !strings.HasSuffix(fr.File, "main.go") || fr.Line == 0 {
			t.Errorf("%s: lookup = %+v, %v; want main.napLoop in main.go with a line", filepath.Base(path), fr, ok)
		}
	}
}

func TestPerfMap(t *testing.T) {
	m := ParsePerfMap(strings.NewReader(
		"7f0000001000 40 LInterpreter;\n" +
			"0x7f0000002000 0x100 Lcom/example/Broker;::dispatch\n" +
			"garbage line\n" +
			"7f0000002080 10 Lcom/example/Broker;::inlined\n"))
	for addr, want := range map[uint64]string{
		0x7f0000001000: "LInterpreter;",
		0x7f000000103f: "LInterpreter;",
		0x7f0000002010: "Lcom/example/Broker;::dispatch",
		0x7f0000002085: "Lcom/example/Broker;::inlined",
		0x7f0000002090: "Lcom/example/Broker;::dispatch",
	} {
		if got, ok := m.Lookup(addr); !ok || got != want {
			t.Errorf("lookup(0x%x) = %q, %v; want %q", addr, got, ok, want)
		}
	}
	if got, ok := m.Lookup(0x7f0000001040); ok {
		t.Errorf("lookup past the end = %q", got)
	}
	// HotSpot's own perf map (jcmd PID Compiler.perfmap).
	for in, want := range map[string]string{
		"void Contend.holdLock()":                          "Contend.holdLock",
		"java.lang.Object[] java.util.ArrayList.toArray()": "java.util.ArrayList.toArray",
		"void java.lang.Object.<init>()":                   "java.lang.Object.<init>",
		"void Contend.lambda$main$0(long)":                 "Contend.lambda$main$0",
		"int java.lang.String.hashCode()":                  "java.lang.String.hashCode",
		"I2C/C2I adapters":                                 "I2C/C2I adapters",
		"StubRoutines (1)":                                 "StubRoutines (1)",
		"_complete_monitor_locking_Java":                   "_complete_monitor_locking_Java",
	} {
		if got := javaMethod(in); got != want {
			t.Errorf("javaMethod(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestKallsyms(t *testing.T) {
	k, err := LoadKallsyms(strings.NewReader(`ffffffff81000000 T _stext
ffffffff81001000 t do_nanosleep
ffffffff81002000 D some_data
ffffffff81003000 T __schedule
0000000000000000 T hidden
ffffffffc0001000 t mod_func	[somemod]
`))
	if err != nil {
		t.Fatal(err)
	}
	for addr, want := range map[uint64]string{
		0xffffffff81001010: "do_nanosleep",
		0xffffffff81002500: "do_nanosleep", // data symbols are skipped
		0xffffffff81003001: "__schedule",
		0xffffffffc0001004: "mod_func",
		0x1000:             "[kernel]+0x1000",
	} {
		if got := k.Lookup(addr); got != want {
			t.Errorf("lookup(0x%x) = %q, want %q", addr, got, want)
		}
	}
}

// A stripped executable's entry point reads _start, so its main thread's
// stacks are seen to be whole.
func TestSymbolizeStrippedEntry(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "m.c")
	os.WriteFile(src, []byte("int main(void) { return 0; }\n"), 0o644)
	bin := filepath.Join(dir, "m")
	build(t, "gcc", "-O2", "-o", bin, src)
	build(t, "strip", bin)
	sf, err := openSymFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	fr, ok := sf.Lookup(ef.Entry + 0x10)
	if !ok || fr.Func != "_start" {
		t.Errorf("entry point + 0x10: %q (%v), want _start", fr.Func, ok)
	}
}

// openSymFile reads symbols from a file on disk (tests).
func openSymFile(path string) (*File, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening %s for symbols: %w", path, err)
	}
	sf := &File{Path: path, Handle: fh}
	sf.Load()
	return sf, sf.Err
}

// The in-place table names every address of every function as debug/gosym
// does: entries, interiors and last instructions, and nothing outside.
// Binaries: the workload, a program built by Go 1.19 (the Go 1.18 layout)
// where /usr/lib/go-1.19 exists, and OFFCPU_GO_BINARY (a real server).
// An externally linked Go program: gcc's start-up code comes before
// runtime.text and the function table's header leaves its start 0. Every
// function of package main resolves to itself, from its entry to its end,
// in the program and in a stripped copy.
func TestSymbolizeGoExternallyLinked(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc: external linking needs it")
	}
	bin := filepath.Join(t.TempDir(), "wl")
	build(t, "go", "build", "-ldflags=-linkmode=external", "-o", bin, "../testdata/workload")
	ef, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	text := ef.Section(".text").Addr
	ef.Close()
	syms := fileSymbols(t, bin)
	if symbolAddr(t, bin, "runtime.text") == text {
		t.Fatalf("runtime.text at .text's start %#x: not the layout this checks", text)
	}
	stripped := bin + ".stripped"
	build(t, "strip", "-s", "-o", stripped, bin)
	for _, path := range []string{bin, stripped} {
		f, err := openSymFile(path)
		if err != nil {
			t.Fatal(err)
		}
		checked := 0
		for _, sym := range syms {
			if elf.ST_TYPE(sym.Info) != elf.STT_FUNC || sym.Size == 0 || !strings.HasPrefix(sym.Name, "main.") {
				continue
			}
			for _, pc := range []uint64{sym.Value, sym.Value + sym.Size - 1} {
				if fr, ok := f.Lookup(pc); !ok || (fr.Func != sym.Name && !strings.HasPrefix(fr.Func, sym.Name+".")) {
					t.Errorf("%s: %#x in %s: %+v, %v", filepath.Base(path), pc, sym.Name, fr, ok)
				}
			}
			checked++
		}
		if checked < 5 {
			t.Errorf("%s: %d functions of package main checked, want 5 or more", filepath.Base(path), checked)
		}
	}
}

func TestGoFuncsMatchGosym(t *testing.T) {
	dir := t.TempDir()
	bins := []string{filepath.Join(dir, "wl")}
	build(t, "go", "build", "-o", bins[0], "../testdata/workload")
	if old := "/usr/lib/go-1.19/bin/go"; fileExists(old) {
		src := filepath.Join(dir, "old")
		os.MkdirAll(src, 0o755)
		os.WriteFile(filepath.Join(src, "go.mod"), []byte("module old\ngo 1.19\n"), 0o644)
		os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"old\") }\n"), 0o644)
		cmd := exec.Command(old, "build", "-o", filepath.Join(dir, "old.bin"), ".")
		cmd.Dir, cmd.Env = src, append(os.Environ(), "GOTOOLCHAIN=local", "GOFLAGS=-mod=mod")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go 1.19 build: %v\n%s", err, out)
		}
		bins = append(bins, filepath.Join(dir, "old.bin"))
	}
	if p := os.Getenv("OFFCPU_GO_BINARY"); p != "" {
		bins = append(bins, p)
	}
	for _, bin := range bins {
		t.Run(filepath.Base(bin), func(t *testing.T) { matchGosym(t, bin) })
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func matchGosym(t *testing.T, bin string) {
	fh, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	ef, err := elf.NewFile(fh)
	if err != nil {
		t.Fatal(err)
	}
	g := openGoFuncs(fh, ef)
	if g == nil {
		t.Fatal("no Go 1.18+ function table found")
	}
	tab := GoTable(ef)
	if len(tab.Funcs) != g.nfunc {
		t.Errorf("%d functions, gosym has %d", g.nfunc, len(tab.Funcs))
	}
	checked, wrappers, inlined := 0, 0, 0
	for i, tfn := range tab.Funcs {
		fn, err := g.readFunc(i)
		if err != nil {
			t.Fatal(err)
		}
		// The closures of go statements (Go 1.22+) are wrappers, as Go's
		// tracebacks see them; generated equality and init functions are not.
		fr, _ := g.lookup(tfn.Entry)
		switch {
		case strings.Contains(tfn.Name, ".gowrap"):
			if !fr.Wrapper {
				t.Errorf("%s is not marked a wrapper", tfn.Name)
			}
			wrappers++
		case strings.Contains(tfn.Name, ".eq.") || strings.HasSuffix(tfn.Name, ".init"):
			if fr.Wrapper {
				t.Errorf("%s is marked a wrapper", tfn.Name)
			}
		}
		for _, pc := range []uint64{tfn.Entry, tfn.Entry + (tfn.End-tfn.Entry)/2, tfn.End - 1} {
			file, line, want := tab.PCToLine(pc)
			line = max(line, 0) // unknown: 0 here, -1 there
			// No table (cgo's C wrappers): gosym decodes whatever offset 0 holds.
			if fn.pcfile == 0 {
				file = ""
			}
			if fn.pcln == 0 {
				line = 0
			}
			// gosym names the function holding pc and the innermost line.
			frames, ok := g.frames(pc)
			if !ok || want == nil || frames[len(frames)-1].Func != want.Name || frames[0].File != file || frames[0].Line != int64(line) {
				t.Fatalf("pc %#x: %+v, %v; gosym: %s %s:%d", pc, frames, ok, want.Name, file, line)
			}
			if len(frames) > 1 {
				inlined++
			}
			checked++
		}
	}
	last := tab.Funcs[len(tab.Funcs)-1]
	for _, pc := range []uint64{tab.Funcs[0].Entry - 1, last.End} {
		if fr, ok := g.lookup(pc); ok {
			t.Errorf("pc %#x outside the table named %+v", pc, fr)
		}
	}
	if g.data == nil {
		t.Error("the function data (moduledata.gofunc) was not found: inlined calls are not named")
	}
	t.Logf("%d addresses of %d functions named alike (%d inside inlined calls), %d go statements' wrappers (named .funcN before Go 1.22)", checked, len(tab.Funcs), inlined, wrappers)
}
