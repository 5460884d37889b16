package collector

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unique"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/symbolize"
)

// eventReader reads the programs' event ring beside the process table:
// processes seen, forked, exec'd and exited, threads that exited (named
// here once out of the threads map) and code mapped, as they happen.
type eventReader struct {
	rd    *ringbuf.Reader
	done  chan struct{}
	procs *symbolize.Procs
	parts parts // told of each process's life
	// kernelMaps: mappings come from the kernel, /proc is read only for
	// processes not known yet.
	kernelMaps bool
	// every: how often what is queued is handed to the reader.
	every time.Duration
	// settled: closed for each settle waiting when the reader has handled
	// all that the ring held (ringbuf.ErrFlushed).
	settleMu sync.Mutex
	settled  []chan struct{}
	handled  atomic.Uint64 // records read

	mu sync.Mutex
	// exited: names of threads that exited during the recording, moved
	// out of the threads map at their last switch-out, by tid and
	// incarnation.
	exited map[[2]uint32]thread
	// deadProcs: processes that exited since the last cut (continuous
	// mode; nil otherwise).
	deadProcs map[uint32]bool
}

// Process event kinds (enum proc_event_kind).
const (
	evSeen       = bpf.EvSeen
	evExec       = bpf.EvExec
	evFork       = bpf.EvFork
	evExit       = bpf.EvExit
	evThreadExit = bpf.EvThreadExit
	evMap        = bpf.EvMap
	evReread     = bpf.EvReread
)

// continuousEvery is how often a continuous recording hands the reader
// what is queued: an agent's wake-ups count more than its latency, the
// events the unwinder needs at once wake it, and so does a record that
// takes the ring past a quarter full (procs.bpf.h).
var continuousEvery = time.Second

func newEventReader(coll *ebpf.Collection, procs *symbolize.Procs, continuous bool) (*eventReader, error) {
	rd, err := ringbuf.NewReader(coll.Maps[bpf.OffcpuMapProcEvents])
	if err != nil {
		return nil, fmt.Errorf("opening the process event ring buffer: %w", err)
	}
	e := &eventReader{rd: rd, done: make(chan struct{}), procs: procs, exited: map[[2]uint32]thread{}, every: 50 * time.Millisecond}
	if continuous {
		e.every = continuousEvery
		e.deadProcs = map[uint32]bool{}
	}
	return e, nil
}

// close hands the reader the last events, waits for it and closes the ring.
func (e *eventReader) close() {
	e.rd.Flush()
	for i := 0; i < 100 && e.rd.AvailableBytes() > 0; i++ {
		time.Sleep(2 * time.Millisecond)
	}
	e.rd.Close()
	<-e.done
}

// exits returns the threads and processes known to have exited so far.
func (e *eventReader) exits() exits {
	e.mu.Lock()
	defer e.mu.Unlock()
	return exits{maps.Clone(e.exited), maps.Clone(e.deadProcs)}
}

// forget drops the names of threads named at an earlier cut (kept: those
// just evicted, until the next cut) and the processes evicted.
func (e *eventReader) forget(names map[[2]uint32]thread, procs map[uint32]bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for k := range names {
		delete(e.exited, k)
	}
	for pid := range procs {
		delete(e.deadProcs, pid)
	}
}

// flushEvery hands the reader what is queued every e.every (50 ms): most
// events do not wake it (the ones the unwinder needs at once do).
func (e *eventReader) flushEvery(stop <-chan struct{}) {
	tick := time.NewTicker(e.every)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			if e.rd.AvailableBytes() > 0 {
				e.rd.Flush()
			}
		}
	}
}

// run handles the events until the ring is closed.
func (e *eventReader) run() {
	defer close(e.done)
	var rec ringbuf.Record // its buffer reused: handle keeps nothing of it
	for {
		err := e.rd.ReadInto(&rec)
		if errors.Is(err, ringbuf.ErrFlushed) {
			// The ring was empty and every record before handled.
			e.settleMu.Lock()
			for _, c := range e.settled {
				close(c)
			}
			e.settled = nil
			e.settleMu.Unlock()
			continue
		}
		if err != nil {
			return // closed
		}
		e.handled.Add(1)
		e.handle(rec.RawSample)
	}
}

func (e *eventReader) handle(raw []byte) {
	if len(raw) < 4 {
		return
	}
	switch binary.NativeEndian.Uint32(raw) {
	case evMap:
		ev, ok := decodeMapEvent(raw)
		if !ok {
			return
		}
		e.procs.AddMapping(ev.Tgid, kernelMapping(&ev, e.procs))
		return
	}
	var ev bpf.OffcpuProcEvent
	if _, err := binary.Decode(raw, binary.NativeEndian, &ev); err != nil {
		return
	}
	switch ev.Kind {
	case evSeen:
		if !e.kernelMaps || !e.procs.Known(ev.Tgid) {
			e.procs.Snapshot(ev.Tgid)
		}
		e.parts.processSeen(ev.Tgid)
	case evReread:
		e.procs.Snapshot(ev.Tgid)
		e.parts.processSeen(ev.Tgid)
	case evExec:
		e.parts.processExec(ev.Tgid)
		e.procs.Exec(ev.Tgid)
		if !e.kernelMaps {
			e.procs.Snapshot(ev.Tgid)
		}
	case evFork:
		e.procs.Fork(ev.Tgid, ev.Parent)
	case evExit:
		e.parts.processExit(ev.Tgid)
		if e.deadProcs != nil {
			e.mu.Lock()
			e.deadProcs[ev.Tgid] = true
			e.mu.Unlock()
		}
	case evThreadExit:
		e.mu.Lock()
		e.exited[[2]uint32{ev.Tid, ev.Gen}] = thread{tgid: ev.Tgid, gen: ev.Gen, comm: cString(ev.Comm[:]), exited: true}
		e.mu.Unlock()
	}
}

// decodeMapEvent reads a map_event by its fields' offsets, its names as
// bytes: binary.Decode's reflection over the 1 KiB of names was most of
// the reader's time under churn, and under the race detector the ring
// overflowed.
func decodeMapEvent(raw []byte) (ev bpf.OffcpuMapEvent, ok bool) {
	if len(raw) < int(unsafe.Sizeof(ev)) {
		return ev, false
	}
	u32 := func(off uintptr) uint32 { return binary.NativeEndian.Uint32(raw[off:]) }
	u64 := func(off uintptr) uint64 { return binary.NativeEndian.Uint64(raw[off:]) }
	ev.Kind, ev.Tgid = u32(unsafe.Offsetof(ev.Kind)), u32(unsafe.Offsetof(ev.Tgid))
	ev.Start, ev.End = u64(unsafe.Offsetof(ev.Start)), u64(unsafe.Offsetof(ev.End))
	ev.Offset, ev.Ino = u64(unsafe.Offsetof(ev.Offset)), u64(unsafe.Offsetof(ev.Ino))
	ev.Dev, ev.Depth = u32(unsafe.Offsetof(ev.Dev)), u32(unsafe.Offsetof(ev.Depth))
	names := unsafe.Slice((*byte)(unsafe.Pointer(&ev.Names)), unsafe.Sizeof(ev.Names))
	copy(names, raw[unsafe.Offsetof(ev.Names):])
	return ev, true
}

// kernelMapping turns a map event into a mapping, opening its file.
func kernelMapping(ev *bpf.OffcpuMapEvent, procs *symbolize.Procs) symbolize.Mapping {
	names := make([]string, 0, ev.Depth)
	for i := int(min(ev.Depth, uint32(len(ev.Names)))) - 1; i >= 0; i-- {
		names = append(names, cString(ev.Names[i][:]))
	}
	// One copy of each path however many processes map it (a churn of
	// short-lived processes maps the same few files thousands of times).
	path := unique.Make("/" + strings.Join(names, "/")).Value()
	dev := unix.Mkdev(ev.Dev>>20, ev.Dev&0xfffff)
	m := symbolize.Mapping{Start: ev.Start, End: ev.End, Offset: ev.Offset, Path: path}
	m.File = procs.KernelFile(ev.Tgid, dev, ev.Ino, path)
	return m
}

// settle hands the reader what the ring buffer holds and waits
// until it has handled it (a second at most: a reader that far behind
// costs a cut some names rather than its interval). Polling the ring for
// 50 ms, as before, let a cut under load miss the names of hundreds of
// short-lived processes.
func (e *eventReader) settle() {
	done := make(chan struct{})
	e.settleMu.Lock()
	e.settled = append(e.settled, done)
	e.settleMu.Unlock()
	e.rd.Flush()
	select {
	case <-done:
	case <-time.After(time.Second):
	}
}
