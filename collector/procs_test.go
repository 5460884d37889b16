package collector

import (
	"os"
	"testing"

	"github.com/offcpu/offcpu/collector/symtab"
)

// Mappings reported by the kernel build each process's list without
// /proc: an exec starts a new list, mmaps add to it (replacing what they
// overlap), and a forked child sees its parent's until it execs.
func TestProcTableKernelMappings(t *testing.T) {
	pt := newProcTable()
	libc := &symtab.File{Path: "/lib/libc.so.6"}
	exe := &symtab.File{Path: "/bin/prog"}
	var changes int
	pt.onChange = func(uint32, []mapping) { changes++ }

	pt.exec(10)
	pt.addMapping(10, mapping{start: 0x1000, end: 0x2000, path: exe.Path, file: exe})
	pt.addMapping(10, mapping{start: 0x7000, end: 0x9000, offset: 0x1000, path: libc.Path, file: libc})
	if m := pt.get(10).find(0x7100); m == nil || m.file != libc {
		t.Fatalf("0x7100 in %v, want libc", m)
	}
	// A mapping over part of another replaces that part only.
	pt.addMapping(10, mapping{start: 0x8000, end: 0x8800, path: "/lib/other.so"})
	if m := pt.get(10).find(0x8100); m == nil || m.path != "/lib/other.so" {
		t.Errorf("0x8100 in %v, want /lib/other.so", m)
	}
	if m := pt.get(10).find(0x8900); m == nil || m.file != libc || m.start != 0x8800 || m.offset != 0x2800 {
		t.Errorf("0x8900 in %+v, want libc's tail from 0x8800 at offset 0x2800", m)
	}

	// The child runs the parent's code until it execs; afterwards its
	// own mappings come first, the parent's stay for older stacks.
	pt.fork(11, 10)
	if m := pt.get(11).find(0x1100); m == nil || m.file != exe {
		t.Fatalf("forked child: 0x1100 in %v, want the parent's /bin/prog", m)
	}
	pt.exec(11)
	pt.addMapping(11, mapping{start: 0x1000, end: 0x3000, path: "/bin/true"})
	if m := pt.get(11).find(0x1100); m == nil || m.path != "/bin/true" {
		t.Errorf("after exec: 0x1100 in %v, want /bin/true", m)
	}
	if m := pt.get(11).find(0x7100); m == nil || m.file != libc {
		t.Errorf("after exec: 0x7100 in %v, want the parent's libc (its pre-exec frames)", m)
	}
	// The parent's list is not changed by the child's.
	if m := pt.get(10).find(0x1100); m == nil || m.file != exe {
		t.Errorf("parent: 0x1100 in %v after the child exec'd, want /bin/prog", m)
	}
	if changes != 4 {
		t.Errorf("%d change notifications, want one per mapping added (not for the fork)", changes)
	}
}

// The exec program's mappings are used only where the kernel has the VMA
// iterator; a kfunc that does not exist reads as absent.
func TestKernelHasFunc(t *testing.T) {
	if _, err := os.Stat(vmlinuxBTF); err != nil {
		t.Skip("no kernel BTF")
	}
	if !kernelHasFunc("bpf_find_vma") && !kernelHasFunc("bpf_iter_task_vma_new") {
		t.Errorf("neither bpf_find_vma nor bpf_iter_task_vma_new found in the kernel's BTF")
	}
	if kernelHasFunc("bpf_iter_task_vma_nope") {
		t.Errorf("a function that does not exist was found")
	}
}

// A tid used by two threads while recording names each one's samples and
// wake-ups by the incarnation that made them.
func TestReusedTIDNames(t *testing.T) {
	d := &recording{
		threads: map[uint32]thread{7: {tgid: 7, gen: 200, comm: "kworker/0:1"}},
		exited:  map[[2]uint32]thread{{7, 100}: {tgid: 7, gen: 100, comm: "nap", exited: true}},
	}
	n := &threadNames{d: d, procs: newProcTable()}
	if got := n.threadGen(7, 7, 100); got != "nap" {
		t.Errorf("incarnation 100: %q, want nap", got)
	}
	if got := n.threadGen(7, 7, 200); got != "kworker/0:1" {
		t.Errorf("incarnation 200: %q, want kworker/0:1", got)
	}
	if got := d.threadOf(&record{tid: 7, gen: 100}).comm; got != "nap" {
		t.Errorf("record of incarnation 100: %q, want nap", got)
	}
	if got := n.threadGen(7, 7, 0); got != "kworker/0:1" {
		t.Errorf("unknown incarnation: %q, want the live thread", got)
	}
}
