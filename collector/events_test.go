package collector

import (
	"context"
	"encoding/binary"
	"os/exec"
	"testing"
	"time"

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

// A burst of processes wakes the event reader once the ring is a quarter
// full, long before its timer (here an hour): a continuous recording's
// reader, handed the ring once a second, let a slow reader's ring
// overflow under churn and the processes' frames went unnamed.
func TestEventRingWakesReader(t *testing.T) {
	requireBPF(t)
	old := continuousEvery
	continuousEvery = time.Hour
	defer func() { continuousEvery = old }()
	s, err := Start(context.Background(), Options{Continuous: true})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { s.Stop() })
	// Each exec sends its code mappings (1 KiB each): ~3 MiB in all, the
	// ring is 4 MiB.
	before := s.events.handled.Load()
	for range 1000 {
		if err := exec.Command("/bin/true").Run(); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.events.handled.Load()-before < 500 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	got := s.events.handled.Load() - before
	if _, err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	t.Logf("%d events read during the burst, %d lost", got, st.EventsLost)
	if got < 500 {
		t.Errorf("%d events read after 1000 processes with the reader's timer an hour away: want the ring to wake it", got)
	}
	if st.EventsLost > 0 {
		t.Errorf("%d events lost", st.EventsLost)
	}
}

// A map event read by offsets gives what binary.Decode gave, and its
// path is joined root first from the leaf-first components.
func TestDecodeMapEvent(t *testing.T) {
	want := bpf.OffcpuMapEvent{Kind: evMap, Tgid: 7, Start: 0x1000, End: 0x5000, Offset: 0x2000, Ino: 42, Dev: 8<<20 | 1, Depth: 3}
	for i, name := range []string{"libc.so.6", "lib", "usr"} {
		for j, c := range name {
			want.Names[i][j] = int8(c)
		}
	}
	raw, err := binary.Append(nil, binary.NativeEndian, &want)
	if err != nil {
		t.Fatal(err)
	}
	var viaDecode bpf.OffcpuMapEvent
	if _, err := binary.Decode(raw, binary.NativeEndian, &viaDecode); err != nil {
		t.Fatal(err)
	}
	got, ok := decodeMapEvent(raw)
	if !ok || got != viaDecode {
		t.Fatalf("decoded %+v, want %+v", got, viaDecode)
	}
	m := kernelMapping(&got, symbolize.NewProcs())
	if m.Path != "/usr/lib/libc.so.6" || m.Start != 0x1000 || m.End != 0x5000 || m.Offset != 0x2000 {
		t.Errorf("mapping %+v, want /usr/lib/libc.so.6 at 0x1000-0x5000 offset 0x2000", m)
	}
	if _, ok := decodeMapEvent(raw[:len(raw)-1]); ok {
		t.Errorf("a short event decoded")
	}
}
