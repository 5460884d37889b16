package unwind

import (
	"bufio"
	"bytes"
	"debug/elf"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// readelfRows checks every row readelf's own CFI interpreter prints for a
// file against the table built here.
func checkAgainstReadelf(t *testing.T, path string) {
	t.Helper()
	if _, err := exec.LookPath("readelf"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("readelf not found: apt-get install binutils")
		}
		t.Skip("readelf not found: apt-get install binutils")
	}
	ef, err := elf.Open(path)
	if err != nil {
		t.Skipf("%s: %v", path, err)
	}
	defer ef.Close()
	tab, err := FromELF(ef)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	// readelf exits 1 over unrelated warnings (a missing debug link).
	out, err := exec.Command("readelf", "--debug-dump=frames-interp", path).Output()
	if len(out) == 0 {
		t.Fatalf("readelf: %v", err)
	}
	expect := expectRow
	if tab.Arm64 {
		expect = expectRowARM64
	}
	var cols []string
	inFDE := false
	checked, mismatches, ends := 0, 0, 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 4 && f[3] == "FDE":
			inFDE = true
			cols = nil
		case len(f) >= 4 && f[3] == "CIE":
			inFDE = false
		case len(f) > 0 && f[0] == "LOC":
			cols = f
		case inFDE && cols != nil && len(f) == len(cols):
			loc, err := strconv.ParseUint(f[0], 16, 64)
			if err != nil {
				continue
			}
			want, exact := expect(cols, f)
			got := tab.Lookup(loc)
			checked++
			ok := got.Kind == want.Kind && got.CFAOffset == want.CFAOffset && got.RBPOffset == want.RBPOffset
			// readelf prints "u" for a return address not saved and for
			// one undefined (the outermost frame's): on arm64 the first
			// is the rule of every entry, the second of a thread's start.
			if tab.Arm64 && !ok && got.Kind == KindEnd && want.Kind&KindRALR != 0 {
				ok = true
				ends++
			}
			if !exact {
				ok = got.Kind == KindPLT || got.Kind == KindNone
			}
			if !ok {
				mismatches++
				if mismatches <= 5 {
					t.Errorf("%s at %#x: readelf %v, table %v/%d/%d", path, loc, f[1:], got.Kind, got.CFAOffset, got.RBPOffset)
				}
			}
		}
	}
	if checked < 10 {
		t.Fatalf("%s: only %d rows compared", path, checked)
	}
	if mismatches > 0 {
		t.Fatalf("%s: %d of %d rows differ from readelf", path, mismatches, checked)
	}
	if ends > 4 {
		t.Fatalf("%s: %d rows read as a thread's start where readelf has the return address unsaved", path, ends)
	}
	t.Logf("%s: %d rows agree with readelf (%d FDEs, %d with rbp frames)", path, checked, tab.FDEs, tab.FramePointerFDEs)
}

// cfaOffset sets r's CFA offset from readelf's (a frame of over 32 KiB:
// in units of 8 where it is one); false if a row cannot hold it.
func cfaOffset(r *Row, v string) bool {
	off, err := strconv.Atoi(v)
	if err != nil {
		return false
	}
	if off > 32767 {
		if off%8 != 0 || off/8 > 32767 {
			return false
		}
		r.Kind |= KindCFAx8
		off /= 8
	}
	r.CFAOffset = int16(off)
	return true
}

// expectRow converts one readelf row to the row this package should hold;
// exact is false for CFA expressions (PLT or none).
func expectRow(cols, f []string) (Row, bool) {
	val := map[string]string{}
	for i, c := range cols {
		val[c] = f[i]
	}
	none := Row{Kind: KindNone}
	switch ra := val["ra"]; {
	case ra == "u":
		return Row{Kind: KindEnd}, true
	case ra != "c-8":
		return none, true
	}
	cfa := val["CFA"]
	if cfa == "exp" {
		return none, false
	}
	var r Row
	switch {
	case strings.HasPrefix(cfa, "rsp+"):
		r.Kind = KindRSP
	case strings.HasPrefix(cfa, "rbp+"):
		r.Kind = KindRBP
	default:
		return none, true
	}
	if !cfaOffset(&r, cfa[4:]) {
		return none, true
	}
	switch rbp, ok := val["rbp"]; {
	case !ok || rbp == "u" || rbp == "s":
	case strings.HasPrefix(rbp, "c-"):
		n, err := strconv.Atoi(rbp[2:])
		if err != nil || n%8 != 0 || n/8 > 128 {
			return none, true
		}
		r.RBPOffset = int8(-n / 8)
	default:
		return none, true
	}
	return r, true
}

// expectRowARM64 is expectRow for AArch64: CFA from sp or x29, the
// return address unsaved (in x30), saved alone, or just above x29.
func expectRowARM64(cols, f []string) (Row, bool) {
	val := map[string]string{}
	for i, c := range cols {
		val[c] = f[i]
	}
	none := Row{Kind: KindNone}
	cfa := val["CFA"]
	var r Row
	switch {
	case strings.HasPrefix(cfa, "sp+"):
		r.Kind = KindRSP
	case strings.HasPrefix(cfa, "x29+"):
		r.Kind = KindRBP
	default:
		return none, cfa != "exp"
	}
	if !cfaOffset(&r, cfa[strings.Index(cfa, "+")+1:]) {
		return none, true
	}
	slot := func(v string) (int8, bool) {
		n, err := strconv.Atoi(strings.TrimPrefix(v, "c-"))
		if !strings.HasPrefix(v, "c-") || err != nil || n == 0 || n%8 != 0 || n/8 > 128 {
			return 0, false
		}
		return int8(-n / 8), true
	}
	ra, fp := val["ra"], val["x29"]
	unsaved := func(v string) bool { return v == "" || v == "u" || v == "s" }
	switch {
	case unsaved(ra) && unsaved(fp):
		r.Kind |= KindRALR
	case unsaved(fp):
		w, ok := slot(ra)
		if !ok {
			return none, true
		}
		r.Kind |= KindRANoFP
		r.RBPOffset = w
	default:
		w, ok := slot(fp)
		if wr, okr := slot(ra); !ok || !okr || wr != w+1 {
			return none, true
		}
		r.RBPOffset = w
	}
	return r, true
}

// Debian's arm64 libc (libc6-arm64-cross, as the matrix's arm64 guests
// get it): AArch64 rows, read on any machine.
func TestTableMatchesReadelfLibcArm64(t *testing.T) {
	const libc = "/usr/aarch64-linux-gnu/lib/libc.so.6"
	if _, err := os.Stat(libc); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s not found: apt-get install libc6-arm64-cross", libc)
		}
		t.Skipf("%s not found", libc)
	}
	checkAgainstReadelf(t, libc)
}

func TestTableMatchesReadelfLibc(t *testing.T) {
	checkAgainstReadelf(t, "/lib/x86_64-linux-gnu/libc.so.6")
}

// CPython's binary has frames of over 32 KiB (select() keeps three
// fd_sets on its stack): their rows hold the offset in units of 8.
func TestTableMatchesReadelfPython(t *testing.T) {
	const python = "/usr/bin/python3.11"
	if _, err := os.Stat(python); err != nil {
		if os.Getenv("OFFCPU_REQUIRE_BPF") != "" {
			t.Fatalf("%s not found: apt-get install python3", python)
		}
		t.Skipf("%s not found", python)
	}
	checkAgainstReadelf(t, python)
}

func TestTableMatchesReadelfLoader(t *testing.T) {
	checkAgainstReadelf(t, "/lib64/ld-linux-x86-64.so.2")
}

func TestTableMatchesReadelfCompiled(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not found")
	}
	dir := t.TempDir()
	src := dir + "/p.c"
	os.WriteFile(src, []byte(`
#include <stdio.h>
#include <string.h>
__attribute__((noinline)) int deep(char *b, int n) { char buf[70000]; memset(buf, n, sizeof buf); return buf[n] + b[0]; }
__attribute__((noinline)) int mid(int n) { char b[64]; snprintf(b, sizeof b, "%d", n); return deep(b, n) + 1; }
int main(int argc, char **argv) { (void)argv; return mid(argc); }
`), 0o644)
	// Debian's cross compiler (the matrix's arm64 guests' programs) too.
	compilers := []string{"gcc"}
	if _, err := exec.LookPath("aarch64-linux-gnu-gcc"); err == nil {
		compilers = append(compilers, "aarch64-linux-gnu-gcc")
	} else if os.Getenv("CI") != "" {
		t.Fatal("aarch64-linux-gnu-gcc not found: apt-get install gcc-aarch64-linux-gnu")
	}
	for _, cc := range compilers {
		for _, flags := range [][]string{{"-O2", "-fomit-frame-pointer"}, {"-O0", "-fno-omit-frame-pointer"}} {
			bin := dir + "/p-" + cc + flags[0]
			args := append(append([]string{}, flags...), "-o", bin, src)
			if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
				t.Fatalf("%s: %v\n%s", cc, err, out)
			}
			checkAgainstReadelf(t, bin)
		}
	}
}

func TestFramePointerDetection(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("gcc not found")
	}
	dir := t.TempDir()
	src := dir + "/f.c"
	var b strings.Builder
	b.WriteString("__attribute__((noinline)) int g(volatile int *a, int x) { return a[x & 7]; }\n")
	b.WriteString("#ifdef MIXED\n#define ODD __attribute__((optimize(\"omit-frame-pointer\")))\n#else\n#define ODD\n#endif\n")
	for i := 0; i < 20; i++ {
		attr := ""
		if i == 7 {
			attr = "ODD "
		}
		b.WriteString(attr + "__attribute__((noinline)) int f" + strconv.Itoa(i) + "(int x) { volatile int a[8] = {0}; a[x&7] = x; return g(a, x + 1) + " + strconv.Itoa(i) + "; }\n")
	}
	b.WriteString("int main(int c, char **v) { (void)v; return f0(c) + f7(c) + f19(c); }\n")
	os.WriteFile(src, []byte(b.String()), 0o644)
	for _, tc := range []struct {
		name  string
		flags []string
		fp    bool
		rows  string // what Needed returns: none, all, some
	}{
		{"frame pointers", []string{"-fno-omit-frame-pointer"}, true, "none"},
		{"no frame pointers", []string{"-fomit-frame-pointer"}, false, "all"},
		{"one function without", []string{"-fno-omit-frame-pointer", "-DMIXED"}, true, "some"},
	} {
		bin := dir + "/f" + strings.ReplaceAll(tc.name, " ", "-")
		args := append(append([]string{"-O2"}, tc.flags...), "-o", bin, src)
		if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v\n%s", err, out)
		}
		ef, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		tab, err := FromELF(ef)
		var f7 uint64
		if syms, err := ef.Symbols(); err == nil {
			for _, s := range syms {
				if s.Name == "f7" {
					f7 = s.Value
				}
			}
		}
		ef.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := tab.FramePointers(); got != tc.fp {
			t.Errorf("%s: FramePointers() = %v (%d of %d framed FDEs with rbp frames), want %v", tc.name, got, tab.FramePointerFDEs, tab.FramedFDEs, tc.fp)
		}
		need := tab.Needed()
		switch tc.rows {
		case "none":
			if len(need) != 0 {
				t.Errorf("%s: %d rows needed, want none", tc.name, len(need))
			}
		case "all":
			if len(need) != len(tab.Rows) {
				t.Errorf("%s: %d of %d rows needed, want all", tc.name, len(need), len(tab.Rows))
			}
		case "some":
			// Only f7's rows: inside it they match the full table, and
			// outside it the unwinder follows frame pointers.
			sparse := &Table{Rows: need}
			if len(need) == 0 || len(need) >= len(tab.Rows) {
				t.Fatalf("%s: %d of %d rows needed, want only f7's", tc.name, len(need), len(tab.Rows))
			}
			for pc := f7; pc < f7+16; pc++ {
				if got, want := sparse.Lookup(pc), tab.Lookup(pc); got.Kind != want.Kind || got.CFAOffset != want.CFAOffset {
					t.Errorf("%s: f7+%d: sparse %v, full %v", tc.name, pc-f7, got, want)
				}
			}
			if r := sparse.Lookup(need[len(need)-1].PC + 1); r.Kind != KindNone {
				t.Errorf("%s: after f7: %v, want none", tc.name, r)
			}
		}
	}
}

func TestCorruptEhFrame(t *testing.T) {
	for _, data := range [][]byte{
		{0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0},          // length past the end
		{8, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0},          // CIE version 9
		{8, 0, 0, 0, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0}, // FDE pointing before the section
	} {
		if _, err := parseEhFrame(data, 0); err == nil {
			t.Errorf("%x: no error", data)
		}
	}
}

// Building libc's table: done once per file when a process maps it.
func BenchmarkFromELFLibc(b *testing.B) {
	ef, err := elf.Open("/lib/x86_64-linux-gnu/libc.so.6")
	if err != nil {
		b.Skip(err)
	}
	defer ef.Close()
	b.ReportAllocs()
	var rows int
	for b.Loop() {
		t, err := FromELF(ef)
		if err != nil {
			b.Fatal(err)
		}
		rows = len(t.Rows)
	}
	b.ReportMetric(float64(rows), "rows")
}
