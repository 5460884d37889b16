package collector

import (
	"strings"
	"testing"

	"github.com/offcpu/offcpu/kernel"
)

// TestCheckKernel: every program of the attach mode the kernel promises
// loads, with the verifier's figures.
func TestCheckKernel(t *testing.T) {
	requireBPF(t)
	r, err := CheckKernel(Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := "tracepoint"
	if kernel.BTFModePromised(r.Features) {
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
	var g *kernel.ProgramCheck
	for i := range r.Programs {
		if r.Programs[i].Mode == "goroutines" {
			g = &r.Programs[i]
		}
	}
	if g == nil || !g.Loaded || g.Margin() < 0.5 {
		t.Errorf("the goroutine probe: %+v", g)
	}
}
