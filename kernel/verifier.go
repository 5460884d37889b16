package kernel

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
)

// ProgramCheck is one program as the kernel's verifier judged it.
type ProgramCheck struct {
	Mode   string `json:"mode"` // "tp_btf", "tp_btf deferred", "tracepoint" or "goroutines"
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

// Report is what the recorder can use on the running kernel.
type Report struct {
	Release  string    `json:"release"`
	BTF      bool      `json:"btf"`
	Features []Feature `json:"features"`
	// Attach: what a recording with the defaults would use.
	Attach   string         `json:"attach"`
	Deferred bool           `json:"deferred"` // --walk-threshold and --budget walk at the switch-in
	Programs []ProgramCheck `json:"programs"`
}

var (
	insnsRe = regexp.MustCompile(`processed (\d+) insns \(limit (\d+)\)`)
	stackRe = regexp.MustCompile(`stack depth ([0-9+]+)`)
)

// Check loads the spec's programs under mode's name (spec: nil with
// specErr, why it could not be built), each failing one reported and
// left out of the next try; true when all loaded. Nothing is attached.
func (r *Report) Check(mode string, spec *ebpf.CollectionSpec, specErr error) bool {
	first := len(r.Programs)
	defer func() {
		mine := r.Programs[first:]
		sort.Slice(mine, func(i, j int) bool { return mine[i].Name < mine[j].Name })
	}()
	if specErr != nil {
		r.Programs = append(r.Programs, ProgramCheck{Mode: mode, Error: specErr.Error()})
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
		name := FailedProgram(err, spec)
		c := ProgramCheck{Mode: mode, Name: name}
		c.explain(err)
		r.Programs = append(r.Programs, c)
		if name == "" {
			break // not a program's failure: a map's
		}
		delete(spec.Programs, name)
	}
	return all
}

// CheckEach loads each named program of the spec alone (load: a fresh
// spec each time) under mode's name.
func (r *Report) CheckEach(mode string, names []string, load func() (*ebpf.CollectionSpec, error)) {
	for _, name := range names {
		c := ProgramCheck{Mode: mode, Name: name}
		spec, err := load()
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
			c.explain(err)
		}
		r.Programs = append(r.Programs, c)
	}
}

// explain keeps a load's error: the verifier's figures and last word.
func (c *ProgramCheck) explain(err error) {
	c.Error = err.Error()
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		c.Insns, c.Limit, c.Stack = verifierFigures(fmt.Sprintf("%+v", ve))
		c.Error = VerifierReason(ve.Log)
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

// FailedProgram names the program a collection's error is about
// (cilium/ebpf says "program NAME: ...").
func FailedProgram(err error, spec *ebpf.CollectionSpec) string {
	msg := err.Error()
	for name := range spec.Programs {
		if strings.Contains(msg, "program "+name+":") {
			return name
		}
	}
	return ""
}

// VerifierReason is the verifier's last word before its statistics.
func VerifierReason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "verification time") || strings.HasPrefix(l, "stack depth") || strings.HasPrefix(l, "processed ") {
			continue
		}
		return l
	}
	return ""
}
