package collector

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/internal/testenv"
	"github.com/offcpu/offcpu/schema"
)

func build(t testing.TB, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

// symbolAddr returns the address of a symbol from an unstripped file.
func symbolAddr(t *testing.T, path, name string) uint64 {
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
	for _, s := range syms {
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
	build(t, "g++", "-O1", "-rdynamic", "-fPIE", "-pie", "-o", full, "testdata/elf/prog.cc")
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
			fr, ok := f.lookup(addr + 2)
			if !ok || fr.fn != tc.want {
				t.Errorf("%s: lookup(%s+2) = %q, %v; want %q", filepath.Base(path), tc.sym, fr.fn, ok, tc.want)
			}
			if f.buildID == "" {
				t.Errorf("%s: no build id read", filepath.Base(path))
			}
		}
	}
}

func TestSymbolizeGo(t *testing.T) {
	dir := t.TempDir()
	full := filepath.Join(dir, "wl")
	stripped := filepath.Join(dir, "wl.stripped")
	build(t, "go", "build", "-o", full, "./testdata/workload")
	build(t, "strip", "-s", "-o", stripped, full)
	addr := symbolAddr(t, full, "main.napLoop")
	for _, path := range []string{full, stripped} {
		f, err := openSymFile(path)
		if err != nil {
			t.Fatal(err)
		}
		fr, ok := f.lookup(addr + 4)
		if !ok || fr.fn != "main.napLoop" || !strings.HasSuffix(fr.file, "main.go") || fr.line == 0 {
			t.Errorf("%s: lookup = %+v, %v; want main.napLoop in main.go with a line", filepath.Base(path), fr, ok)
		}
	}
}

func TestSymbolizeUnresolved(t *testing.T) {
	procs := newProcTable()
	procs.procs[42] = &procInfo{pid: 42, snaps: [][]mapping{{
		{start: 0x1000, end: 0x2000, offset: 0x3000, path: "/opt/lib/libgone.so", file: &symFile{path: "/opt/lib/libgone.so"}},
		{start: 0x5000, end: 0x6000},
	}}}
	s := &symbolizer{procs: procs, kern: &kernelSyms{}, perfMaps: map[uint32]*perfMap{}}
	for addr, want := range map[uint64]string{
		0x1010: "libgone.so+0x3010",
		0x5020: "[anon]+0x20",
		0x9000: "[unmapped]+0x9000",
	} {
		fr, _ := s.user(42, addr)
		if fr.fn != want {
			t.Errorf("user(0x%x) = %q, want %q", addr, fr.fn, want)
		}
	}
}

func TestPerfMap(t *testing.T) {
	m := parsePerfMap(strings.NewReader(
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
		if got, ok := m.lookup(addr); !ok || got != want {
			t.Errorf("lookup(0x%x) = %q, %v; want %q", addr, got, ok, want)
		}
	}
	if got, ok := m.lookup(0x7f0000001040); ok {
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
	k, err := loadKallsyms(strings.NewReader(`ffffffff81000000 T _stext
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
		if got := k.lookup(addr); got != want {
			t.Errorf("lookup(0x%x) = %q, want %q", addr, got, want)
		}
	}
}

// fixtureProfile is a small recorder-shaped profile.
func fixtureProfile() *profile.Profile {
	kmap := &profile.Mapping{ID: 1, File: schema.KernelMapping}
	umap := &profile.Mapping{ID: 2, File: "/usr/bin/server", Start: 0x400000, Limit: 0x500000}
	fn := func(id uint64, name string) *profile.Function { return &profile.Function{ID: id, Name: name} }
	fns := []*profile.Function{fn(1, "__schedule"), fn(2, "schedule"), fn(3, "do_epoll_wait"), fn(4, "main"), fn(5, "loop;run"), fn(6, "wait")}
	loc := func(id uint64, m *profile.Mapping, f *profile.Function) *profile.Location {
		return &profile.Location{ID: id, Mapping: m, Address: id * 16, Line: []profile.Line{{Function: f}}}
	}
	locs := []*profile.Location{loc(1, kmap, fns[0]), loc(2, kmap, fns[1]), loc(3, kmap, fns[2]), loc(4, umap, fns[3]), loc(5, umap, fns[4]), loc(6, umap, fns[5])}
	// An inlined frame: wait inlined into loop;run at one address.
	locs[4].Line = []profile.Line{{Function: fns[5]}, {Function: fns[4]}}
	sample := func(thread string, ns int64, l ...*profile.Location) *profile.Sample {
		return &profile.Sample{Location: l, Value: []int64{ns, 1}, Label: map[string][]string{schema.LabelThread: {thread}}}
	}
	return &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "off_cpu", Unit: "nanoseconds"}, {Type: "switches", Unit: "count"}},
		Mapping:    []*profile.Mapping{kmap, umap},
		Function:   fns,
		Location:   locs,
		Sample: []*profile.Sample{
			sample("io-1", 2_500_000, locs[0], locs[1], locs[2], locs[4], locs[3]),
			sample("io-1", 500_000, locs[0], locs[1], locs[2], locs[4], locs[3]),
			sample("worker", 400, locs[0], locs[3]),
			sample("kthread", 7_000_000, locs[0], locs[1]),
			sample("", 1_000, locs[3]),
		},
	}
}

func TestWriteFoldedGolden(t *testing.T) {
	var buf bytes.Buffer
	if err := schema.WriteFolded(&buf, fixtureProfile(), schema.OffCPU, 1000); err != nil {
		t.Fatal(err)
	}
	testenv.Golden(t, "testdata/folded.golden", buf.Bytes())
	if err := schema.WriteFolded(&buf, fixtureProfile(), "no-such-type", 1); err == nil {
		t.Error("a sample type the profile lacks accepted")
	}
}

func TestParseStates(t *testing.T) {
	m, err := ParseStates([]string{"sleeping,preempted", "D"})
	if err != nil || m != 1<<StateSleeping|1<<StatePreempted|1<<StateUninterruptible {
		t.Errorf("mask = %b, %v", m, err)
	}
	if _, err := ParseStates([]string{"snoozing"}); err == nil || !strings.Contains(err.Error(), "snoozing") {
		t.Errorf("bad state accepted: %v", err)
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
	fr, ok := sf.lookup(ef.Entry + 0x10)
	if !ok || fr.fn != "_start" {
		t.Errorf("entry point + 0x10: %q (%v), want _start", fr.fn, ok)
	}
}

// openSymFile reads symbols from a file on disk (tests).
func openSymFile(path string) (*symFile, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening %s for symbols: %w", path, err)
	}
	sf := &symFile{path: path, fh: fh}
	sf.load()
	return sf, sf.err
}
