package collector

import (
	"errors"
	"fmt"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/schema"
)

// DefaultStreamKeepBytes bounds a flight recorder's waits in memory:
// packed by chunk (waitCodec), about 30 to 40 bytes each, some 1.8
// million of them: 20 s of a node switching 90,000 times a second.
const DefaultStreamKeepBytes = 64 << 20

// FlightTimeline builds the flight recorder's waits that overlap [from,
// to] (CLOCK_MONOTONIC ns; 0, 0: all it keeps) into a timeline, with
// the stacks and names the session holds now. It needs a continuous
// session with Options.StreamKeep.
func (s *Session) FlightTimeline(from, to uint64) (*schema.Timeline, error) {
	if s.cont == nil || s.stream == nil || s.opts.StreamKeep == 0 {
		return nil, errors.New("no flight recorder: start a continuous session with Options.Stream and StreamKeep")
	}
	if to == 0 {
		to = monotonicNow()
	}
	if from == 0 {
		from = to - min(to, uint64(s.opts.StreamKeep))
	}
	// One cut or dump at a time: a cut deletes the stacks that exited
	// threads alone used (kept a cut longer in the graveyard).
	s.cont.mu.Lock()
	defer s.cont.mu.Unlock()
	if s.cont.stopped {
		return nil, ErrStopped
	}
	waits, overflow := s.stream.Kept()
	cache := map[int64][]uint64{}
	get := s.drainer().stackReader(cache)
	waits.Each(func(w *bpf.OffcpuWaitEvent) {
		if w.InNs >= from && w.OutNs <= to {
			get(w.Ustack)
			get(w.Kstack)
			decodeWaker(w.Waker, get)
		}
	})
	d := &recording{threads: map[uint32]thread{}, exited: map[[2]uint32]thread{}, stacks: cache, waits: waits, streamed: true}
	for k, th := range s.events.exits().threads {
		d.threads[k[0]] = th
	}
	d.o = buildOptions{window: [2]uint64{from, to}}
	if s.tctx != nil {
		d.o.links = s.tctx.Labels()
	}
	if s.gor != nil {
		d.goroutines = s.gor.Timeline(false, s.gor.ReadStacks())
	}
	t := d.timeline(s.withJIT(symbolize.NewSymbolizer(s.procs)), &threadNames{d: d, procs: s.procs})
	// Lost: what the kernel's ring and the recorder's bound dropped.
	lost, _ := statSum(s.p.coll.Maps[bpf.OffcpuMapStats], bpf.OffcpuOffcpuStatSTAT_STREAM_LOST)
	t.Lost = int64(lost + overflow)
	if len(t.Waits) == 0 {
		return t, fmt.Errorf("the flight recorder holds no wait in that range")
	}
	return t, nil
}

// FlightKept is what the flight recorder keeps now (threads' and
// goroutines' waits) and what it lost since the start: waits the
// kernel's ring had no room for (the reader fell behind), and waits
// dropped before their time beyond StreamKeepBytes.
func (s *Session) FlightKept() (waits int, ring, overflow uint64) {
	if s.stream == nil {
		return 0, 0, 0
	}
	ring, _ = statSum(s.p.coll.Maps[bpf.OffcpuMapStats], bpf.OffcpuOffcpuStatSTAT_STREAM_LOST)
	v, overflow := s.stream.Kept()
	waits = v.Len()
	if s.gor != nil {
		waits += s.gor.Kept()
	}
	return waits, ring, overflow
}

// FlightRequest is a request the flight recorder holds waits of: the
// labels its thread context gave them, and their extent.
type FlightRequest struct {
	Labels     map[string]string
	Start, End uint64 // the first one's switch-out, the last one's switch-in
	Waits      int
}

// FlightRequests are the requests whose waits the flight recorder holds,
// those with a wait that ended after since.
func (s *Session) FlightRequests(since uint64) []FlightRequest {
	if s.stream == nil || s.tctx == nil {
		return nil
	}
	var out []FlightRequest
	for k, r := range streamRequests(s.stream, since) {
		if r.Labels = linkLabels(s.tctx.Labels(), uint32(k[0]), k[1]); r.Labels != nil {
			out = append(out, *r)
		}
	}
	return out
}
