package ruby

import (
	"debug/elf"
	"encoding/binary"
	"os"
	"testing"
)

// succTable builds a succinct index the way iseq.c's
// succ_index_table_create does, for sorted positions data.
func succTable(data []int, max int) []byte {
	const imm = 54
	blocks := (max - imm + 511) / 512
	t := make([]byte, 48+blocks*80)
	j := 0
	for i := 0; i < imm; i++ {
		for j < len(data) && data[j] <= i {
			j++
		}
		w := binary.LittleEndian.Uint64(t[i/9*8:])
		w |= uint64(j) << (i % 9 * 7)
		binary.LittleEndian.PutUint64(t[i/9*8:], w)
	}
	r, ptr := j, j
	for k := 0; k < blocks; k++ {
		b := t[48+k*80:]
		binary.LittleEndian.PutUint32(b, uint32(r))
		small := 0
		var ranks uint64
		for s := 0; s < 8; s++ {
			if s > 0 {
				ranks |= uint64(small) << ((s - 1) * 9)
			}
			var bits uint64
			for i := 0; i < 64; i++ {
				if ptr < len(data) && data[ptr] == k*512+s*64+i+imm {
					bits |= 1 << i
					ptr++
					r++
					small++
				}
			}
			binary.LittleEndian.PutUint64(b[16+s*8:], bits)
		}
		binary.LittleEndian.PutUint64(b[8:], ranks)
	}
	return t
}

// succIndex agrees with counting: the entries starting at or before each
// instruction, in the immediate part and across blocks.
func TestSuccIndex(t *testing.T) {
	var data []int
	for p := 0; p < 1500; p += 1 + p%7 {
		data = append(data, p)
	}
	tab := succTable(data, 1500)
	for x := 0; x < 1500; x++ {
		want := 0
		for _, d := range data {
			if d <= x {
				want++
			}
		}
		got, ok := succIndex(tab, uint64(x))
		if !ok || got != uint64(want) {
			t.Fatalf("position %d: %d (%v), want %d", x, got, ok, want)
		}
	}
}

// Debian's libruby 3.1 is recognised: its version, rb_vm_exec, and the
// GOT slot of ruby_current_ec's module id, as readelf shows them.
func TestReadLibDebian(t *testing.T) {
	const path = "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1"
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s: %v (.ci/deps installs ruby)", path, err)
		}
		t.Skip("Debian's libruby 3.1 is not installed")
	}
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	l, err := ReadLib(ef)
	if err != nil {
		t.Fatal(err)
	}
	if l.Unsupported != "" || l.Version[:4] != "3.1." || l.ExecHi <= l.ExecLo || l.TLSOffset != 8 || l.TLSGot == 0 {
		t.Fatalf("libruby read as %+v", l)
	}
	syms, _ := ef.DynamicSymbols()
	for _, s := range syms {
		if s.Name == "rb_vm_exec" && (s.Value != l.ExecLo || s.Value+s.Size != l.ExecHi) {
			t.Errorf("rb_vm_exec at %#x+%d, read %#x..%#x", s.Value, s.Size, l.ExecLo, l.ExecHi)
		}
	}
	t.Logf("Ruby %s: rb_vm_exec %#x..%#x, ruby_current_ec's module id at %#x", l.Version, l.ExecLo, l.ExecHi, l.TLSGot)
}
