package v8

import (
	"debug/elf"
	"os"
	"strings"
	"testing"
)

// A fixture captured from Node 20.20 (V8 11.3) serving
// collector/testdata/node/server.js (collector's TestNodeServer, its
// reads kept by a Capture): each function is named as its source says, at the
// line its definition starts.
func TestFixtureFunctions(t *testing.T) {
	fx, err := LoadFixture("testdata/node20-server.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("../../collector/testdata/node/server.js") // the server the fixture was captured from
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(src), "\n")
	r := &Reader{Mem: fx, L: &fx.Layout}
	named := 0
	for _, want := range fx.Functions {
		f, err := r.Function(want.SFI)
		if err != nil {
			t.Errorf("sfi %#x: %v", want.SFI, err)
			continue
		}
		if !strings.HasSuffix(f.Script, "/server.js") || f.Line < 1 || f.Line > len(lines) {
			t.Errorf("sfi %#x: %s at %s:%d", want.SFI, f.Name, f.Script, f.Line)
			continue
		}
		at := lines[f.Line-1]
		switch {
		case f.Name != "":
			named++
			if !strings.Contains(at, "function "+f.Name+"(") {
				t.Errorf("%s at line %d: %q", f.Name, f.Line, at)
			}
		case !strings.Contains(at, "=>"):
			t.Errorf("an anonymous function at line %d: %q, want an arrow function's", f.Line, at)
		}
	}
	if named < 4 {
		t.Errorf("%d functions named, want readFifo, runChild, spin, poolRead and more", named)
	}
	// An object that is not a SharedFunctionInfo (a moved or freed one)
	// is refused, not misread.
	for _, f := range fx.Functions {
		if _, err := r.Function(f.SFI + 8); err == nil {
			t.Errorf("sfi %#x + 8 read as a function", f.SFI)
		}
	}
}

// encodePositions writes a source position table as V8's
// SourcePositionTableBuilder does: per entry, the code offset's delta
// (negative and less one when not a statement) and the source position's
// delta, each zig-zag VLQ.
func encodePositions(entries []position, statement []bool) []byte {
	var out []byte
	put := func(v int64) {
		u := uint64(v<<1) ^ uint64(v>>63)
		for {
			b := byte(u & 0x7f)
			u >>= 7
			if u != 0 {
				out = append(out, b|0x80)
				continue
			}
			out = append(out, b)
			return
		}
	}
	var code, pos int64
	for i, e := range entries {
		raw := (e.script + 1) << 1 // SourcePosition: script offset + 1 in bits 1-30
		d := e.code - code
		if !statement[i] {
			d = -d - 1
		}
		put(d)
		put(raw - pos)
		code, pos = e.code, raw
	}
	return out
}

func TestDecodePositions(t *testing.T) {
	want := []position{{0, 10}, {3, 250}, {9, 40}, {200, 100000}, {201, 7}}
	got := decodePositions(encodePositions(want, []bool{true, false, true, false, true}))
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: %v, want %v", i, got[i], want[i])
		}
	}
	// A truncated table decodes what it holds.
	if got := decodePositions([]byte{0x80}); len(got) != 0 {
		t.Errorf("truncated: %v", got)
	}
}

func TestLines(t *testing.T) {
	ends := lineEndsOf([]byte("a\nbc\n\nd"))
	for pos, want := range map[int64]int{0: 1, 1: 1, 2: 2, 4: 2, 5: 3, 6: 4, 7: 4} {
		if got := lineOf(ends, pos); got != want {
			t.Errorf("offset %d: line %d, want %d", pos, got, want)
		}
	}
	f := &Function{Line: 3, lineEnds: ends, positions: []position{{0, 0}, {5, 2}, {9, 6}}}
	l := &Layout{BytecodeData: 54}
	for off, want := range map[int64]int{0: 1, 4: 1, 5: 2, 8: 2, 9: 4, 40: 4} {
		if got := f.LineAt(off+53, l); got != want {
			t.Errorf("bytecode offset %d: line %d, want %d", off, got, want)
		}
	}
	if got := (&Function{Line: 3}).LineAt(60, l); got != 3 {
		t.Errorf("no positions: line %d, want the function's 3", got)
	}
}

// The layout read from a Node binary holds V8's x86-64 frame and object
// constants (skipped where Node is not installed: the fixture test covers
// the naming).
func TestReadLayout(t *testing.T) {
	ef, err := elf.Open("/usr/bin/node")
	if err != nil {
		t.Skipf("no Node binary: %v", err)
	}
	defer ef.Close()
	l, in, err := ReadLayout(ef)
	if err != nil {
		t.Fatal(err)
	}
	if l.SmiShift != 32 || l.FPContext != -8 || l.FPFunction != -16 || l.JSFunctionShared == 0 || l.TypeSFI == 0 {
		t.Errorf("layout %+v", l)
	}
	if in.Hi <= in.Lo {
		t.Errorf("interpreter range %+v", in)
	}
	if _, _, err := ReadLayout(mustOpen(t, "/proc/self/exe")); err != ErrNotV8 {
		t.Errorf("a Go test binary: %v, want ErrNotV8", err)
	}
}

func mustOpen(t *testing.T, path string) *elf.File {
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
