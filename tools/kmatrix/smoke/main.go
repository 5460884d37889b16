// Command smoke is a minimal payload for tools/kmatrix/kmatrix.sh: it checks
// that a guest kernel exposes BTF and can load and attach a tp_btf program
// to sched_switch, then prints "SMOKE OK <events>".
//
//	CGO_ENABLED=0 go build -o /tmp/smoke ./tools/kmatrix/smoke
//	KMATRIX_CMD=./smoke tools/kmatrix/kmatrix.sh run 6.1.0-57-cloud-amd64 /tmp/out -- /tmp/smoke
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"golang.org/x/sys/unix"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "SMOKE FAIL:", err)
		os.Exit(1)
	}
}

func run() error {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return fmt.Errorf("uname: %w", err)
	}
	fmt.Printf("uname: %s %s %s %s\n", unix.ByteSliceToString(u.Sysname[:]),
		unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Version[:]),
		unix.ByteSliceToString(u.Machine[:]))

	fi, err := os.Stat("/sys/kernel/btf/vmlinux")
	if err != nil {
		return fmt.Errorf("kernel BTF: %w", err)
	}
	fmt.Printf("btf: /sys/kernel/btf/vmlinux %d bytes\n", fi.Size())

	// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK.
	if err := rlimit.RemoveMemlock(); err != nil {
		return fmt.Errorf("memlock: %w", err)
	}

	counter, err := ebpf.NewMap(&ebpf.MapSpec{
		Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1,
	})
	if err != nil {
		return fmt.Errorf("create map: %w", err)
	}
	defer counter.Close()

	// counter[0] += 1 on every sched_switch.
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:       "smoke_switch",
		Type:       ebpf.Tracing,
		AttachType: ebpf.AttachTraceRawTp,
		AttachTo:   "sched_switch",
		License:    "GPL",
		Instructions: asm.Instructions{
			asm.StoreImm(asm.RFP, -4, 0, asm.Word),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.LoadMapPtr(asm.R1, counter.FD()),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
			asm.Mov.Imm(asm.R1, 1),
			asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
			asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
			asm.Return(),
		},
	})
	if err != nil {
		return fmt.Errorf("load tp_btf program: %w", err)
	}
	defer prog.Close()

	l, err := link.AttachTracing(link.TracingOptions{Program: prog, AttachType: ebpf.AttachTraceRawTp})
	if err != nil {
		return fmt.Errorf("attach sched_switch: %w", err)
	}
	defer l.Close()

	// Sleeping forces switches to and from the idle task.
	var count uint64
	for i := 0; i < 50 && count < 10; i++ {
		time.Sleep(10 * time.Millisecond)
		if err := counter.Lookup(uint32(0), &count); err != nil {
			return fmt.Errorf("read counter: %w", err)
		}
	}
	if count == 0 {
		return fmt.Errorf("no sched_switch events seen")
	}
	fmt.Printf("SMOKE OK %d\n", count)
	return nil
}
