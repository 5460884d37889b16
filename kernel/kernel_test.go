package kernel

import (
	"errors"
	"os"
	"testing"

	"github.com/cilium/ebpf"
)

func TestVerifierFigures(t *testing.T) {
	log := "verification time 52501 usec\nstack depth 176+0+72\nprocessed 2634 insns (limit 1000000) max_states_per_insn 4 total_states 78 peak_states 78 mark_read 66\n"
	insns, limit, stack := verifierFigures(log)
	if insns != 2634 || limit != 1000000 || stack != "176+0+72" {
		t.Errorf("figures = %d, %d, %q", insns, limit, stack)
	}
	reason := VerifierReason([]string{"", "841: (7b) *(u64 *)(r1 +0) = r5", "R1 unbounded memory access, make sure to bounds check any such access",
		"verification time 52501 usec", "stack depth 176+0+72", "processed 2634 insns (limit 1000000)"})
	if reason != "R1 unbounded memory access, make sure to bounds check any such access" {
		t.Errorf("reason = %q", reason)
	}
	spec := &ebpf.CollectionSpec{Programs: map[string]*ebpf.ProgramSpec{"offcpu_switch": {}, "offcpu_switch_tp": {}}}
	if got := FailedProgram(errors.New("program offcpu_switch_tp: load program: permission denied"), spec); got != "offcpu_switch_tp" {
		t.Errorf("failed program = %q, want offcpu_switch_tp", got)
	}
	if got := FailedProgram(errors.New("map offcpu: creating map: invalid argument"), spec); got != "" {
		t.Errorf("failed program = %q for a map's error", got)
	}
	if m := (ProgramCheck{Insns: 250000, Limit: 1000000}).Margin(); m != 0.75 {
		t.Errorf("margin = %v", m)
	}
}

func TestBTFModePromised(t *testing.T) {
	all := []Feature{{Name: "BTF", Have: true}, {Name: "task storage", Have: true}, {Name: "sched_exit_tp tracepoint", Have: false}, {Name: "VMA iterator kfuncs", Have: false}}
	if !BTFModePromised(all) {
		t.Error("optional facilities missing: tp_btf still promised")
	}
	all[1].Have = false
	if BTFModePromised(all) {
		t.Error("no task storage: tp_btf promised")
	}
}

// The exec program's mappings are used only where the kernel has the VMA
// iterator; a kfunc that does not exist reads as absent.
func TestHasFunc(t *testing.T) {
	if _, err := os.Stat(BTFPath); err != nil {
		t.Skip("no kernel BTF")
	}
	if !HasFunc("bpf_find_vma") && !HasFunc("bpf_iter_task_vma_new") {
		t.Errorf("neither bpf_find_vma nor bpf_iter_task_vma_new found in the kernel's BTF")
	}
	if HasFunc("bpf_iter_task_vma_nope") {
		t.Errorf("a function that does not exist was found")
	}
}
