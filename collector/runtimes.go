package collector

import (
	"strings"

	"github.com/cilium/ebpf"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/symtab"
	"github.com/offcpu/offcpu/runtimes"
	"github.com/offcpu/offcpu/runtimes/registry"
)

// runtimeHandle is a runtime's handle on the recorder: the maps and
// variables named with its prefix, and the unwinder's rows for code it
// generates.
type runtimeHandle struct {
	prefix string
	coll   *ebpf.Collection
	u      *unwinder
}

func (h runtimeHandle) Map(name string) *ebpf.Map {
	if !strings.HasPrefix(name, h.prefix) {
		return nil
	}
	return h.coll.Maps[name]
}

func (h runtimeHandle) Variable(name string) *ebpf.Variable {
	if !strings.HasPrefix(name, h.prefix) {
		return nil
	}
	return h.coll.Variables[name]
}

func (h runtimeHandle) SetGenerated(pid uint32, start, end uint64, rows []bpf.OffcpuUnwindRow) error {
	return h.u.setGenerated(pid, start, end, rows)
}

// newRuntimes: every runtime of the registry, each with its handle.
func newRuntimes(u *unwinder, coll *ebpf.Collection) []runtimes.Reader {
	var out []runtimes.Reader
	for _, rt := range registry.All {
		out = append(out, rt.New(runtimeHandle{prefix: rt.Prefix, coll: coll, u: u}))
	}
	return out
}

// runtimeNames names the frames of every runtime read (symtab.JIT).
type runtimeNames []runtimes.Reader

// Frames: a tagged entry by the runtime of its kind; a native pc by each
// runtime that generates code (a JVM's code cache).
func (r runtimeNames) Frames(pid uint32, addr uint64) ([]symtab.Frame, bool) {
	k := runtimes.KindOf(addr)
	for i, rt := range r {
		if k == bpf.FrameNative || registry.All[i].Kind == k {
			if fr, ok := rt.Frames(pid, addr); ok || k != bpf.FrameNative {
				return fr, ok
			}
		}
	}
	return nil, false
}

// Name names what Frames could not: a tagged entry by its runtime's
// placeholder, generated code by the runtime that names it.
func (r runtimeNames) Name(pid uint32, addr uint64) (string, bool) {
	k := runtimes.KindOf(addr)
	for i, rt := range r {
		if k != bpf.FrameNative && registry.All[i].Kind != k {
			continue
		}
		if n, ok := rt.(runtimes.Namer); ok {
			if name, ok := n.Name(pid, addr); ok {
				return name, true
			}
		}
		if k != bpf.FrameNative {
			return registry.All[i].Unread, true
		}
	}
	return "", false
}

// MappingOf is the pprof mapping file of a frame a runtime named: its
// kind's, or the code generator's (a JVM's) for a native pc.
func (r runtimeNames) MappingOf(addr uint64) string {
	if rt, ok := registry.ByKind(runtimes.KindOf(addr)); ok {
		return rt.Mapping
	}
	for i, rt := range r {
		if _, ok := rt.(runtimes.Namer); ok {
			return registry.All[i].Mapping
		}
	}
	return ""
}
