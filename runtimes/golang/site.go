package golang

import (
	"debug/elf"

	"golang.org/x/arch/x86/x86asm"
)

// Where on runtime.casgstatus (and preemptPark) the goroutine probes go.
// A uprobe on an instruction the kernel does not emulate is single-stepped out of line,
// a debug trap of its own: go1.19's casgstatus starts with SUBQ, and each
// system call of a go1.19 program (two status changes) took 17 µs instead
// of 0.3 µs on this machine's VM. arch/x86/kernel/uprobes.c emulates a
// one-byte nop and the jumps (branch_setup_xol_ops; a push in recent
// kernels only), so the probe goes on the first of them in the function's
// straight-line start, provided nothing before it writes a register the
// probe reads (the arguments in AX, BX and CX, the g in R14). framed: the
// frame pointer is set up there (the return address is at bp+8).
const siteScan = 64 // bytes of the function's start looked at

// ProbeSite returns the probe's offset from the function's start
// (0: its entry) and whether the frame is set up there.
func ProbeSite(code []byte) (off uint64, framed bool) {
	spMoved := false
	for pc := 0; pc < len(code) && pc < siteScan; {
		if EmulatedByUprobes(code[pc:]) {
			if spMoved && !framed {
				return 0, false // the return address is neither at sp nor at bp+8
			}
			return uint64(pc), framed
		}
		inst, err := x86asm.Decode(code[pc:], 64)
		if err != nil {
			return 0, false
		}
		switch writes := destReg(inst); {
		case writes == 0:
		case writes == x86asm.RSP:
			spMoved = true
		case writes == x86asm.RBP && fromSP(inst):
			framed = true
		default:
			return 0, false
		}
		pc += inst.Len
	}
	return 0, false
}

// EmulatedByUprobes: a one-byte nop, a short or near jump or conditional
// jump, which a uprobe runs without a single step.
func EmulatedByUprobes(b []byte) bool {
	switch {
	case len(b) == 0:
		return false
	case b[0] == 0x90, b[0] == 0xeb, b[0] == 0xe9, b[0] >= 0x70 && b[0] <= 0x7f:
		return true
	case b[0] == 0x0f && len(b) > 1:
		return b[1] >= 0x80 && b[1] <= 0x8f
	}
	return false
}

// destReg is the register an instruction of a function's prologue
// writes: 0 for none (a store, a compare, a bit test), RSP for a push or
// a change of the stack pointer, RBP, or otherReg for any other and for
// an instruction the scan does not know.
func destReg(inst x86asm.Inst) x86asm.Reg {
	switch inst.Op {
	case x86asm.CMP, x86asm.TEST, x86asm.BT:
		return 0
	case x86asm.PUSH:
		return x86asm.RSP
	case x86asm.MOV, x86asm.MOVUPS, x86asm.LEA, x86asm.SUB, x86asm.ADD:
		switch a := inst.Args[0].(type) {
		case x86asm.Mem:
			if inst.Op != x86asm.LEA {
				return 0
			}
		case x86asm.Reg:
			if a == x86asm.RSP || a == x86asm.RBP {
				return a
			}
		}
	}
	return otherReg
}

const otherReg = x86asm.Reg(0xff)

// fromSP: MOV RBP, RSP or LEA RBP, [RSP+d], the frame pointer's set-up.
func fromSP(inst x86asm.Inst) bool {
	switch a := inst.Args[1].(type) {
	case x86asm.Reg:
		return inst.Op == x86asm.MOV && a == x86asm.RSP
	case x86asm.Mem:
		return inst.Op == x86asm.LEA && a.Base == x86asm.RSP
	}
	return false
}

// funcCode is up to n bytes of the code at addr.
func funcCode(ef *elf.File, addr uint64, n int) []byte {
	for _, p := range ef.Progs {
		if p.Type != elf.PT_LOAD || p.Flags&elf.PF_X == 0 || addr < p.Vaddr || addr >= p.Vaddr+p.Filesz {
			continue
		}
		if left := p.Vaddr + p.Filesz - addr; uint64(n) > left {
			n = int(left)
		}
		b := make([]byte, n)
		if _, err := p.ReadAt(b, int64(addr-p.Vaddr)); err != nil {
			return nil
		}
		return b
	}
	return nil
}
