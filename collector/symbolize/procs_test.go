package symbolize

import (
	"testing"

	"github.com/offcpu/offcpu/collector/symtab"
)

// Mappings reported by the kernel build each process's list without
// /proc: an exec starts a new list, mmaps add to it (replacing what they
// overlap), and a forked child sees its parent's until it execs.
func TestProcTableKernelMappings(t *testing.T) {
	pt := NewProcs()
	libc := &symtab.File{Path: "/lib/libc.so.6"}
	exe := &symtab.File{Path: "/bin/prog"}
	var changes int
	pt.OnChange = func(uint32, []Mapping) { changes++ }

	pt.Exec(10)
	pt.AddMapping(10, Mapping{Start: 0x1000, End: 0x2000, Path: exe.Path, File: exe})
	pt.AddMapping(10, Mapping{Start: 0x7000, End: 0x9000, Offset: 0x1000, Path: libc.Path, File: libc})
	if m := pt.Get(10).Find(0x7100); m == nil || m.File != libc {
		t.Fatalf("0x7100 in %v, want libc", m)
	}
	// A mapping over part of another replaces that part only.
	pt.AddMapping(10, Mapping{Start: 0x8000, End: 0x8800, Path: "/lib/other.so"})
	if m := pt.Get(10).Find(0x8100); m == nil || m.Path != "/lib/other.so" {
		t.Errorf("0x8100 in %v, want /lib/other.so", m)
	}
	if m := pt.Get(10).Find(0x8900); m == nil || m.File != libc || m.Start != 0x8800 || m.Offset != 0x2800 {
		t.Errorf("0x8900 in %+v, want libc's tail from 0x8800 at offset 0x2800", m)
	}

	// The child runs the parent's code until it execs; afterwards its
	// own mappings come first, the parent's stay for older stacks.
	pt.Fork(11, 10)
	if m := pt.Get(11).Find(0x1100); m == nil || m.File != exe {
		t.Fatalf("forked child: 0x1100 in %v, want the parent's /bin/prog", m)
	}
	pt.Exec(11)
	pt.AddMapping(11, Mapping{Start: 0x1000, End: 0x3000, Path: "/bin/true"})
	if m := pt.Get(11).Find(0x1100); m == nil || m.Path != "/bin/true" {
		t.Errorf("after exec: 0x1100 in %v, want /bin/true", m)
	}
	if m := pt.Get(11).Find(0x7100); m == nil || m.File != libc {
		t.Errorf("after exec: 0x7100 in %v, want the parent's libc (its pre-exec frames)", m)
	}
	// The parent's list is not changed by the child's.
	if m := pt.Get(10).Find(0x1100); m == nil || m.File != exe {
		t.Errorf("parent: 0x1100 in %v after the child exec'd, want /bin/prog", m)
	}
	if changes != 4 {
		t.Errorf("%d change notifications, want one per mapping added (not for the fork)", changes)
	}
}

func TestSymbolizeUnresolved(t *testing.T) {
	procs := NewProcs()
	procs.procs[42] = &Proc{pid: 42, snaps: [][]Mapping{{
		{Start: 0x1000, End: 0x2000, Offset: 0x3000, Path: "/opt/lib/libgone.so", File: &symtab.File{Path: "/opt/lib/libgone.so"}},
		{Start: 0x5000, End: 0x6000},
	}}}
	s := &Symbolizer{Procs: procs, Kern: &symtab.Kernel{}, PerfMaps: map[uint32]*symtab.PerfMap{}}
	for addr, want := range map[uint64]string{
		0x1010: "libgone.so+0x3010",
		0x5020: "[anon]+0x20",
		0x9000: "[unmapped]+0x9000",
	} {
		fr, _ := s.User(42, addr)
		if fr.Func != want {
			t.Errorf("user(0x%x) = %q, want %q", addr, fr.Func, want)
		}
	}
}
