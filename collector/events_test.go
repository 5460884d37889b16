package collector

import (
	"encoding/binary"
	"testing"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/symbolize"
)

// The event reader keeps the names of threads that exited and, in
// continuous mode, the processes that did, until a cut forgets them.
func TestEventReaderExits(t *testing.T) {
	e := &eventReader{procs: symbolize.NewProcs(), exited: map[[2]uint32]thread{}, deadProcs: map[uint32]bool{}}
	send := func(ev bpf.OffcpuProcEvent) {
		raw, err := binary.Append(nil, binary.NativeEndian, &ev)
		if err != nil {
			t.Fatal(err)
		}
		e.handle(raw)
	}
	ev := bpf.OffcpuProcEvent{Kind: evThreadExit, Tgid: 10, Tid: 11, Gen: 2}
	for i, c := range "worker" {
		ev.Comm[i] = int8(c)
	}
	send(ev)
	send(bpf.OffcpuProcEvent{Kind: evExit, Tgid: 10})
	e.handle([]byte{1}) // too short: ignored
	x := e.exits()
	if th, ok := x.threads[[2]uint32{11, 2}]; !ok || th.comm != "worker" || th.tgid != 10 || !th.exited {
		t.Errorf("exited threads %v, want tid 11 gen 2 named worker", x.threads)
	}
	if !x.procs[10] {
		t.Errorf("dead processes %v, want 10", x.procs)
	}
	e.forget(x.threads, x.procs)
	if x = e.exits(); len(x.threads) != 0 || len(x.procs) != 0 {
		t.Errorf("after forget: %v %v, want nothing", x.threads, x.procs)
	}
}
