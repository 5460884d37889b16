// Package kernel says what the running kernel offers the recorder: its
// release, its BTF and what the BTF declares, its configuration, the BPF
// facilities the programs use, and the verifier's judgement of a set of
// programs (the report `offcpu kernel` prints). It loads nothing of its
// own: collector builds the programs' specs.
package kernel

import (
	"compress/gzip"
	"io"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

// BTFPath is where the kernel publishes its BTF.
const BTFPath = "/sys/kernel/btf/vmlinux"

// Release is the running kernel's release (uname -r).
func Release() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
}

// HasRawTracepoint says whether the kernel's BTF declares the
// tracepoint's typedef (btf_trace_NAME), which tp_btf programs attach by.
func HasRawTracepoint(name string) bool {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return false
	}
	var td *btf.Typedef
	return spec.TypeByName("btf_trace_"+name, &td) == nil
}

// HasFunc says whether the kernel's BTF has the function (a kfunc).
func HasFunc(name string) bool {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return false
	}
	var fn *btf.Func
	return spec.TypeByName(name, &fn) == nil
}

// ThreadSize is THREAD_SIZE: 16 KiB on x86-64, 32 KiB with KASAN.
func ThreadSize() uint64 {
	for _, path := range []string{"/proc/config.gz", "/boot/config-" + Release()} {
		if kasanEnabled(path) {
			return 32768
		}
	}
	return 16384
}

func kasanEnabled(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		gz, err := gzip.NewReader(f)
		if err != nil {
			return false
		}
		r = gz
	}
	b, err := io.ReadAll(r)
	return err == nil && strings.Contains(string(b), "\nCONFIG_KASAN=y")
}

// Feature is one BPF facility the recorder uses, probed on the running
// kernel.
type Feature struct {
	Name  string `json:"name"`
	Since string `json:"since"` // the Linux release that brought it
	Have  bool   `json:"have"`
	For   string `json:"for"` // what needs it
}

// Features probes the facilities the recorder uses; BTF first.
func Features() []Feature {
	helper := func(pt ebpf.ProgramType, fn asm.BuiltinFunc) bool {
		return features.HaveProgramHelper(pt, fn) == nil
	}
	_, btfErr := os.Stat(BTFPath)
	return []Feature{
		{"BTF", "5.4", btfErr == nil, "everything (CO-RE)"},
		{"ring buffer", "5.8", features.HaveMapType(ebpf.RingBuf) == nil, "process and mapping events"},
		{"tp_btf programs", "5.5", HasRawTracepoint("sched_switch"), "the main attach mode"},
		{"task storage", "5.11", features.HaveMapType(ebpf.TaskStorage) == nil, "per-thread records (tp_btf mode)"},
		{"bpf_task_pt_regs", "5.15", helper(ebpf.TracePoint, asm.FnTaskPtRegs), "stack reuse, interrupt wakers"},
		{"bpf_loop", "5.17", helper(ebpf.TracePoint, asm.FnLoop), "stack walks without frame pointers, Python, paths"},
		{"bpf_find_vma", "5.17", helper(ebpf.TracePoint, asm.FnFindVma), "libraries mapped while recording"},
		{"bpf_copy_from_user_task", "5.18", HasFunc("bpf_copy_from_user_task"), "stacks of threads blocked at the start"},
		{"VMA iterator kfuncs", "6.7", HasFunc("bpf_iter_task_vma_new"), "a new program's mappings at exec"},
		{"sched_exit_tp tracepoint", "6.16", HasRawTracepoint("sched_exit_tp"), "--walk-threshold and --budget (walks at the switch-in)"},
	}
}

// BTFModePromised says whether the probed facilities are those the tp_btf
// programs need (find_vma and the VMA iterator have fallbacks,
// sched_exit_tp serves deferred walks only, copy_from_user_task the
// sleepable iterator only).
func BTFModePromised(fs []Feature) bool {
	optional := map[string]bool{"bpf_find_vma": true, "bpf_copy_from_user_task": true, "VMA iterator kfuncs": true, "sched_exit_tp tracepoint": true}
	for _, f := range fs {
		if !f.Have && !optional[f.Name] {
			return false
		}
	}
	return true
}
