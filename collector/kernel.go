package collector

import (
	"fmt"

	"github.com/cilium/ebpf/rlimit"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/kernel"
)

// CheckKernel loads every program of each attach mode with the options'
// settings and reports the verifier's figures; nothing is attached.
func CheckKernel(o Options) (*kernel.Report, error) {
	if err := checkPrivileges(); err != nil {
		return nil, err
	}
	_ = rlimit.RemoveMemlock()
	r := &kernel.Report{Release: kernel.Release(), Features: kernel.Features()}
	r.BTF = r.Features[0].Have
	if !r.BTF {
		return r, fmt.Errorf("kernel BTF not found at %s: use a kernel built with CONFIG_DEBUG_INFO_BTF=y", kernel.BTFPath)
	}
	check := func(mode string, o Options, btfMode bool) bool {
		spec, err := (&probes{opts: o}).spec(0, btfMode)
		return r.Check(mode, spec, err)
	}
	opts := o.withDefaults()
	btfOK := check("tp_btf", opts, true)
	deferOK := false
	if kernel.HasRawTracepoint("sched_exit_tp") {
		d := opts
		d.WalkThreshold = DefaultContinuousWalkThreshold
		deferOK = check("tp_btf deferred", d, true)
	}
	check("tracepoint", opts, false)
	// The goroutine probes (--goroutines), labels reader and all, one
	// program at a time.
	r.CheckEach("goroutines", []string{bpf.GoroutinesProgGoCasgstatus, bpf.GoroutinesProgGoPreemptPark}, bpf.LoadGoroutines)
	r.Attach = "tracepoint"
	if btfOK {
		r.Attach = "tp_btf"
	}
	r.Deferred = deferOK
	return r, nil
}
