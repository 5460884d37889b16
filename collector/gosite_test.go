package collector

import (
	"encoding/hex"
	"os"
	"testing"

	"github.com/offcpu/offcpu/runtimes/golang"
)

func TestCasgstatusSite(t *testing.T) {
	for _, c := range []struct {
		name, code string
		off        uint64
		framed     bool
	}{
		// go1.19: SUBQ $0x40, SP; MOVQ BP, 0x38(SP); LEAQ 0x38(SP), BP;
		// the arguments stored; BTL $0xc, BX; NOP; JB.
		{"go1.19", "4883ec40" + "48896c2438" + "488d6c2438" + "4889442448" + "895c2450" + "894c2454" + "0fbae30c" + "90" + "720a", 0x1f, true},
		// go1.26: PUSHQ BP; MOVQ SP, BP; SUBQ $0x58, SP; stores; BTL; JB.
		{"go1.26", "55" + "4889e5" + "4883ec58" + "4889442468" + "895c2470" + "894c2474" + "0fbae30c" + "720b", 0x19, true},
		// An argument register written first: the entry.
		{"writes ax", "48c7c001000000" + "720b", 0, false},
		// The stack pointer moved, no frame pointer: the return address
		// is at neither place the probe reads it from.
		{"no frame", "4883ec40" + "720a", 0, false},
		{"call first", "e800000000" + "720a", 0, false},
		// BP written from another register: not a frame.
		{"bp from ax", "4889c5" + "720a", 0, false},
		{"near jcc", "55" + "4889e5" + "0f8400010000", 4, true},
	} {
		code, err := hex.DecodeString(c.code)
		if err != nil {
			t.Fatal(err)
		}
		off, framed := golang.ProbeSite(code)
		if off != c.off || framed != c.framed {
			t.Errorf("%s: site %#x framed %v, want %#x %v", c.name, off, framed, c.off, c.framed)
		}
	}
}

// checkProbeSite: the probe on exe's casgstatus is on an instruction the
// kernel emulates, past the frame's set-up, for the Go releases tested.
func checkProbeSite(t *testing.T, exe string, rt *golang.Runtime) {
	t.Helper()
	f, err := os.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 2)
	if _, err := f.ReadAt(b, int64(rt.Casgstatus)); err != nil {
		t.Fatal(err)
	}
	if !golang.EmulatedByUprobes(b) || rt.Offsets.Framed != 1 {
		t.Errorf("%s (%s): the probe is on % x, framed %d: a single-stepped instruction", exe, rt.Version, b, rt.Offsets.Framed)
	}
}
