package collector

import (
	"debug/elf"
	"testing"

	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/runtimes"
)

func TestLoadBias(t *testing.T) {
	for _, tc := range []struct {
		name  string
		loads []elf.ProgHeader
		m     symbolize.Mapping
		pc    uint64
		va    uint64
	}{
		{"shared library", []elf.ProgHeader{{Flags: elf.PF_R, Off: 0, Vaddr: 0, Filesz: 0x26000},
			{Flags: elf.PF_R | elf.PF_X, Off: 0x26000, Vaddr: 0x26000, Filesz: 0x15a000}},
			symbolize.Mapping{Start: 0x7f0000026000, End: 0x7f0000180000, Offset: 0x26000}, 0x7f0000026010, 0x26010},
		{"non-PIE executable", []elf.ProgHeader{{Flags: elf.PF_R | elf.PF_X, Off: 0x1000, Vaddr: 0x401000, Filesz: 0x2000}},
			symbolize.Mapping{Start: 0x401000, End: 0x403000, Offset: 0x1000}, 0x401234, 0x401234},
		{"segment offset from its page", []elf.ProgHeader{{Flags: elf.PF_R | elf.PF_X, Off: 0x1100, Vaddr: 0x2100, Filesz: 0x3000}},
			symbolize.Mapping{Start: 0x555555556000, End: 0x555555559000, Offset: 0x1000}, 0x555555556200, 0x2200},
	} {
		bias, ok := runtimes.LoadBias(tc.loads, tc.m)
		if !ok {
			t.Errorf("%s: no executable segment found", tc.name)
			continue
		}
		if got := tc.pc - bias; got != tc.va {
			t.Errorf("%s: pc %#x maps to %#x, want %#x", tc.name, tc.pc, got, tc.va)
		}
	}
	if _, ok := runtimes.LoadBias([]elf.ProgHeader{{Flags: elf.PF_R, Off: 0, Filesz: 0x1000}}, symbolize.Mapping{Start: 0x1000, Offset: 0}); ok {
		t.Error("a mapping of a non-executable segment got a bias")
	}
}
