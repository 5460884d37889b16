package collector

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/cilium/ebpf/rlimit"

	"github.com/offcpu/offcpu/bpf"
)

// KernelFeature is one BPF facility the recorder uses, probed on the
// running kernel.
type KernelFeature struct {
	Name  string `json:"name"`
	Since string `json:"since"` // the Linux release that brought it
	Have  bool   `json:"have"`
	For   string `json:"for"` // what needs it
}

// ProgramCheck is one program as the kernel's verifier judged it.
type ProgramCheck struct {
	Mode   string `json:"mode"` // "tp_btf", "tp_btf deferred" or "tracepoint"
	Name   string `json:"name"`
	Loaded bool   `json:"loaded"`
	Insns  int    `json:"insns"` // instructions the verifier processed
	Limit  int    `json:"limit"`
	Stack  string `json:"stack,omitempty"` // stack depth per function
	Error  string `json:"error,omitempty"`
}

// Margin is the share of the verifier's budget left.
func (c ProgramCheck) Margin() float64 {
	if c.Limit == 0 {
		return 0
	}
	return 1 - float64(c.Insns)/float64(c.Limit)
}

// KernelReport is what offcpu can use on the running kernel.
type KernelReport struct {
	Release  string          `json:"release"`
	BTF      bool            `json:"btf"`
	Features []KernelFeature `json:"features"`
	// Attach: what a recording with the defaults would use.
	Attach   string         `json:"attach"`
	Deferred bool           `json:"deferred"` // --walk-threshold and --budget walk at the switch-in
	Programs []ProgramCheck `json:"programs"`
}

// KernelFeatures probes the facilities the recorder uses.
func KernelFeatures() []KernelFeature {
	helper := func(pt ebpf.ProgramType, fn asm.BuiltinFunc) bool {
		return features.HaveProgramHelper(pt, fn) == nil
	}
	_, btfErr := os.Stat(vmlinuxBTF)
	return []KernelFeature{
		{"BTF", "5.4", btfErr == nil, "everything (CO-RE)"},
		{"ring buffer", "5.8", features.HaveMapType(ebpf.RingBuf) == nil, "process and mapping events"},
		{"tp_btf programs", "5.5", kernelHasRawTracepoint("sched_switch"), "the main attach mode"},
		{"task storage", "5.11", features.HaveMapType(ebpf.TaskStorage) == nil, "per-thread records (tp_btf mode)"},
		{"bpf_task_pt_regs", "5.15", helper(ebpf.TracePoint, asm.FnTaskPtRegs), "stack reuse, interrupt wakers"},
		{"bpf_loop", "5.17", helper(ebpf.TracePoint, asm.FnLoop), "stack walks without frame pointers, Python, paths"},
		{"bpf_find_vma", "5.17", helper(ebpf.TracePoint, asm.FnFindVma), "libraries mapped while recording"},
		{"bpf_copy_from_user_task", "5.18", kernelHasFunc("bpf_copy_from_user_task"), "stacks of threads blocked at the start"},
		{"VMA iterator kfuncs", "6.7", kernelHasFunc("bpf_iter_task_vma_new"), "a new program's mappings at exec"},
		{"sched_exit_tp tracepoint", "6.16", kernelHasRawTracepoint("sched_exit_tp"), "--walk-threshold and --budget (walks at the switch-in)"},
	}
}

// CheckKernel loads every program of each attach mode with the options'
// settings and reports the verifier's figures; nothing is attached.
func CheckKernel(o Options) (*KernelReport, error) {
	if err := checkPrivileges(); err != nil {
		return nil, err
	}
	_ = rlimit.RemoveMemlock()
	r := &KernelReport{Release: kernelRelease(), Features: KernelFeatures()}
	r.BTF = r.Features[0].Have
	if !r.BTF {
		return r, fmt.Errorf("kernel BTF not found at %s: use a kernel built with CONFIG_DEBUG_INFO_BTF=y", vmlinuxBTF)
	}
	opts := o.withDefaults()
	btfOK := checkMode(r, opts, "tp_btf", true)
	deferOK := false
	if kernelHasRawTracepoint("sched_exit_tp") {
		d := opts
		d.WalkThreshold = DefaultContinuousWalkThreshold
		deferOK = checkMode(r, d, "tp_btf deferred", true)
	}
	checkMode(r, opts, "tracepoint", false)
	checkGoroutines(r)
	r.Attach = "tracepoint"
	if btfOK {
		r.Attach = "tp_btf"
	}
	r.Deferred = deferOK
	return r, nil
}

var (
	insnsRe = regexp.MustCompile(`processed (\d+) insns \(limit (\d+)\)`)
	stackRe = regexp.MustCompile(`stack depth ([0-9+]+)`)
)

// checkMode loads one attach mode's programs, each failing one reported
// and left out of the next try; true when all loaded.
func checkMode(r *KernelReport, o Options, mode string, btfMode bool) bool {
	p := &probes{opts: o}
	first := len(r.Programs)
	defer func() {
		mine := r.Programs[first:]
		sort.Slice(mine, func(i, j int) bool { return mine[i].Name < mine[j].Name })
	}()
	spec, err := p.spec(0, btfMode)
	if err != nil {
		r.Programs = append(r.Programs, ProgramCheck{Mode: mode, Error: err.Error()})
		return false
	}
	all := true
	for len(spec.Programs) > 0 {
		coll, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}})
		if err == nil {
			for name, prog := range coll.Programs {
				c := ProgramCheck{Mode: mode, Name: name, Loaded: true}
				c.Insns, c.Limit, c.Stack = verifierFigures(prog.VerifierLog)
				r.Programs = append(r.Programs, c)
			}
			coll.Close()
			break
		}
		all = false
		name := failedProgram(err, spec)
		c := ProgramCheck{Mode: mode, Name: name, Error: err.Error()}
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			c.Insns, c.Limit, c.Stack = verifierFigures(fmt.Sprintf("%+v", ve))
			c.Error = verifierReason(ve.Log)
		}
		r.Programs = append(r.Programs, c)
		if name == "" {
			break // not a program's failure: a map's
		}
		delete(spec.Programs, name)
	}
	return all
}

// checkGoroutines loads the goroutine probes (--goroutines), labels
// reader and all, one program at a time: each one's figures and error.
func checkGoroutines(r *KernelReport) {
	for _, name := range []string{bpf.GoroutinesProgGoCasgstatus, bpf.GoroutinesProgGoPreemptPark} {
		c := ProgramCheck{Mode: "goroutines", Name: name}
		spec, err := bpf.LoadGoroutines()
		if err == nil {
			for other := range spec.Programs {
				if other != name {
					delete(spec.Programs, other)
				}
			}
			var coll *ebpf.Collection
			coll, err = ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}})
			if err == nil {
				c.Loaded = true
				c.Insns, c.Limit, c.Stack = verifierFigures(coll.Programs[name].VerifierLog)
				coll.Close()
			}
		}
		if err != nil {
			c.Error = err.Error()
			var ve *ebpf.VerifierError
			if errors.As(err, &ve) {
				c.Insns, c.Limit, c.Stack = verifierFigures(fmt.Sprintf("%+v", ve))
				c.Error = verifierReason(ve.Log)
			}
		}
		r.Programs = append(r.Programs, c)
	}
}

func verifierFigures(log string) (insns, limit int, stack string) {
	if m := insnsRe.FindStringSubmatch(log); m != nil {
		insns, _ = strconv.Atoi(m[1])
		limit, _ = strconv.Atoi(m[2])
	}
	if m := stackRe.FindStringSubmatch(log); m != nil {
		stack = m[1]
	}
	return insns, limit, stack
}

// failedProgram names the program a collection's error is about
// (cilium/ebpf says "program NAME: ...").
func failedProgram(err error, spec *ebpf.CollectionSpec) string {
	msg := err.Error()
	for name := range spec.Programs {
		if strings.Contains(msg, "program "+name+":") {
			return name
		}
	}
	return ""
}

// verifierReason is the verifier's last word before its statistics.
func verifierReason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "verification time") || strings.HasPrefix(l, "stack depth") || strings.HasPrefix(l, "processed ") {
			continue
		}
		return l
	}
	return ""
}

// btfModePromised says whether the probed facilities are those the tp_btf
// programs need (find_vma and the VMA iterator have fallbacks,
// sched_exit_tp serves deferred walks only, copy_from_user_task the
// sleepable iterator only).
func btfModePromised(fs []KernelFeature) bool {
	optional := map[string]bool{"bpf_find_vma": true, "bpf_copy_from_user_task": true, "VMA iterator kfuncs": true, "sched_exit_tp tracepoint": true}
	for _, f := range fs {
		if !f.Have && !optional[f.Name] {
			return false
		}
	}
	return true
}
