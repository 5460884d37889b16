package goroutines

import (
	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/stream"
	"github.com/offcpu/offcpu/schema"
)

// OpenFlag marks a streamed goroutine wait still open at the window's end
// (drain's, not the probe's: above GO_BEFORE_START).
const OpenFlag = 0x8000

// Timeline is what a recording's timeline needs of the goroutine
// stream: its waits, the stacks they name (go_stacks ids), their label
// sets and the wait reasons' names.
type Timeline struct {
	Waits  stream.View[bpf.GoroutinesGoWaitEvent]
	Stacks map[uint64][]uint64
	Labels func(tgid uint32, link uint64) map[string]string
	Reason func(tgid uint32, reason uint16) string
	Lost   uint64 // the ring had no room for them, or the recorder's bound
}

// openWait is a goroutine wait still open at end, from park on.
func openWait(tgid uint32, p *bpf.GoroutinesGoPark, park, end uint64) bpf.GoroutinesGoWaitEvent {
	e := bpf.GoroutinesGoWaitEvent{Goid: p.Goid, ParkNs: park, ReadyNs: end, RunNs: end, Stack: p.Stack,
		Startpc: p.Startpc, Link: p.Link, Tgid: tgid, Tid: p.Tid, Reason: uint16(p.Reason), Flags: uint16(p.Flags) | OpenFlag}
	if p.ReadyNs != 0 && p.ReadyNs <= end {
		e.ReadyNs = max(p.ReadyNs, park)
		e.WakerStack, e.WakerGoid, e.WakerTid = p.WakerStack, p.WakerGoid, p.WakerTid
	}
	return e
}

// closeStream reads what the goroutine stream still holds and stops it.
func (r *Recorder) closeStream() {
	if r.stream != nil && !r.closed {
		r.closed = true
		r.stream.Close()
	}
}

// Timeline is the goroutine stream for a timeline: the waits sent
// (all, or a flight recorder's kept ones) and those drain found open,
// with stacks read by drain or readStacks.
func (r *Recorder) Timeline(final bool, stacks map[uint64][]uint64) *Timeline {
	if r.stream == nil {
		return nil
	}
	var v stream.View[bpf.GoroutinesGoWaitEvent]
	var overflow uint64
	if final {
		r.closeStream()
		for _, e := range r.open {
			r.stream.Add(e)
		}
		r.open = nil
		v = r.stream.Take()
	} else {
		v, overflow = r.stream.Kept()
	}
	return &Timeline{Waits: v, Stacks: stacks, Labels: r.labelMap, Lost: r.Stats().StreamLost + overflow, Reason: r.Reason}
}

// Reason is the name of a process's wait reason.
func (r *Recorder) Reason(pid uint32, reason uint16) string {
	r.mu.Lock()
	rt := r.procs[pid]
	r.mu.Unlock()
	return rt.Reason(reason)
}

// Kept is how many streamed waits are kept now (a flight recorder's).
func (r *Recorder) Kept() int {
	if r.stream == nil {
		return 0
	}
	v, _ := r.stream.Kept()
	return v.Len()
}

// labelMap is a label set by the program's keys (nil: not read).
func (r *Recorder) labelMap(tgid uint32, link uint64) map[string]string {
	pairs, ok := r.Labels(tgid, link)
	if !ok {
		return nil
	}
	m := make(map[string]string, len(pairs))
	for _, kv := range pairs {
		m[schema.ProgramLabelKey(kv[0])] = kv[1]
	}
	return m
}
