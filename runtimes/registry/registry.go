// Package registry lists the runtimes whose frames offcpu reads. Every
// table that names a runtime (frame kinds, pprof mappings, OpenTelemetry
// frame types, titles in messages) is derived from All; adding a runtime
// is its package under runtimes/, its BPF header, and a line here.
package registry

import (
	"github.com/offcpu/offcpu/runtimes"
	"github.com/offcpu/offcpu/runtimes/cpython"
	"github.com/offcpu/offcpu/runtimes/hotspot"
	"github.com/offcpu/offcpu/runtimes/ruby"
	v8 "github.com/offcpu/offcpu/runtimes/v8"
)

// All: every runtime read, in the order their files are recognised.
var All = []runtimes.Runtime{
	{Info: hotspot.Info, New: hotspot.New},
	{Info: cpython.Info, New: cpython.New},
	{Info: v8.Info, New: v8.New},
	{Info: ruby.Info, New: ruby.New},
}

// ByKind is the runtime whose stack entries carry tag k (bpf.Frame*).
func ByKind(k uint64) (runtimes.Info, bool) {
	return find(func(i runtimes.Info) bool { return i.Kind == k })
}

// ByMapping is the runtime whose frames a profile puts in mapping file.
func ByMapping(file string) (runtimes.Info, bool) {
	return find(func(i runtimes.Info) bool { return i.Mapping == file })
}

// ByFrameType is the runtime of OpenTelemetry frame type t (Frame.Runtime).
func ByFrameType(t string) (runtimes.Info, bool) {
	return find(func(i runtimes.Info) bool { return i.FrameType == t })
}

// ByName is the runtime called name (hotspot, cpython...).
func ByName(name string) (runtimes.Info, bool) {
	return find(func(i runtimes.Info) bool { return i.Name == name })
}

func find(match func(runtimes.Info) bool) (runtimes.Info, bool) {
	for _, r := range All {
		if match(r.Info) {
			return r.Info, true
		}
	}
	return runtimes.Info{}, false
}
