package collector

import (
	"errors"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

func TestVerifierFigures(t *testing.T) {
	log := "verification time 52501 usec\nstack depth 176+0+72\nprocessed 2634 insns (limit 1000000) max_states_per_insn 4 total_states 78 peak_states 78 mark_read 66\n"
	insns, limit, stack := verifierFigures(log)
	if insns != 2634 || limit != 1000000 || stack != "176+0+72" {
		t.Errorf("figures = %d, %d, %q", insns, limit, stack)
	}
	reason := verifierReason([]string{"", "841: (7b) *(u64 *)(r1 +0) = r5", "R1 unbounded memory access, make sure to bounds check any such access",
		"verification time 52501 usec", "stack depth 176+0+72", "processed 2634 insns (limit 1000000)"})
	if reason != "R1 unbounded memory access, make sure to bounds check any such access" {
		t.Errorf("reason = %q", reason)
	}
	spec := &ebpf.CollectionSpec{Programs: map[string]*ebpf.ProgramSpec{"offcpu_switch": {}, "offcpu_switch_tp": {}}}
	if got := failedProgram(errors.New("program offcpu_switch_tp: load program: permission denied"), spec); got != "offcpu_switch_tp" {
		t.Errorf("failed program = %q, want offcpu_switch_tp", got)
	}
	if got := failedProgram(errors.New("map offcpu: creating map: invalid argument"), spec); got != "" {
		t.Errorf("failed program = %q for a map's error", got)
	}
	if m := (ProgramCheck{Insns: 250000, Limit: 1000000}).Margin(); m != 0.75 {
		t.Errorf("margin = %v", m)
	}
}

func TestBTFModePromised(t *testing.T) {
	all := []KernelFeature{{Name: "BTF", Have: true}, {Name: "task storage", Have: true}, {Name: "sched_exit_tp tracepoint", Have: false}, {Name: "VMA iterator kfuncs", Have: false}}
	if !btfModePromised(all) {
		t.Error("optional facilities missing: tp_btf still promised")
	}
	all[1].Have = false
	if btfModePromised(all) {
		t.Error("no task storage: tp_btf promised")
	}
}

// TestCheckKernel: every program of the attach mode the kernel promises
// loads, with the verifier's figures.
func TestCheckKernel(t *testing.T) {
	requireBPF(t)
	r, err := CheckKernel(Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := "tracepoint"
	if btfModePromised(r.Features) {
		want = "tp_btf"
	}
	if r.Attach != want {
		t.Errorf("attach = %s, want %s", r.Attach, want)
	}
	n := 0
	for _, p := range r.Programs {
		if p.Mode != want {
			continue
		}
		n++
		if !p.Loaded || p.Insns == 0 || p.Limit == 0 || p.Stack == "" {
			t.Errorf("%s (%s): %+v", p.Name, p.Mode, p)
		}
		if strings.HasPrefix(p.Name, "offcpu_switch") && p.Margin() < 0.5 {
			t.Errorf("%s uses %d of the verifier's %d instructions: less than half left", p.Name, p.Insns, p.Limit)
		}
	}
	if n < 5 {
		t.Errorf("%d programs checked in %s mode", n, want)
	}
	// The goroutine probe (its labels reader a global function) loads on
	// every kernel of the matrix, with half the verifier's budget left.
	var g *ProgramCheck
	for i := range r.Programs {
		if r.Programs[i].Mode == "goroutines" {
			g = &r.Programs[i]
		}
	}
	if g == nil || !g.Loaded || g.Margin() < 0.5 {
		t.Errorf("the goroutine probe: %+v", g)
	}
}
