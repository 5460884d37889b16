package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/schema"
)

// writeChainProfile writes a goroutine profile of a two-hop chain: A
// waits on a channel that B fills after B waited on a mutex through
// nearly all of A's wait.
func writeChainProfile(t *testing.T) string {
	t.Helper()
	p := &profile.Profile{SampleType: []*profile.ValueType{{Type: schema.GoroutineBlocked, Unit: schema.Nanoseconds},
		{Type: schema.GoroutineRunQueue, Unit: schema.Nanoseconds}, {Type: schema.GoroutineWaits, Unit: schema.Count},
		{Type: schema.WakerWaiting, Unit: schema.Nanoseconds}}}
	fn := map[string]*profile.Location{}
	loc := func(name string) *profile.Location {
		if l, ok := fn[name]; ok {
			return l
		}
		f := &profile.Function{ID: uint64(len(p.Function) + 1), Name: name}
		l := &profile.Location{ID: uint64(len(p.Location) + 1), Line: []profile.Line{{Function: f}}}
		p.Function, p.Location = append(p.Function, f), append(p.Location, l)
		fn[name] = l
		return l
	}
	stack := func(names ...string) []*profile.Location { // leaf first
		var out []*profile.Location
		for _, n := range names {
			out = append(out, loc(n))
		}
		return out
	}
	bWait := "runtime.goexit;main.chainB;sync.(*Mutex).Lock;runtime.gopark"
	p.Sample = []*profile.Sample{
		{Location: stack("runtime.gopark", "runtime.chanrecv1", "main.chainA", "runtime.goexit"), Value: []int64{100e6, 0, 10, 98e6},
			Label:    map[string][]string{schema.LabelReason: {"chan receive"}, schema.LabelProcess: {"prog"}, schema.LabelWakerStack: {"runtime.goexit;main.chainB;runtime.chansend1"}, schema.LabelWakerWaitStack: {bWait}},
			NumLabel: map[string][]int64{schema.LabelGoid: {1}, schema.LabelPID: {7}, schema.LabelWakerGoid: {2}}},
		{Location: stack("runtime.gopark", "sync.(*Mutex).Lock", "main.chainB", "runtime.goexit"), Value: []int64{99e6, 0, 10, 0},
			Label:    map[string][]string{schema.LabelReason: {"sync.Mutex.Lock"}, schema.LabelProcess: {"prog"}, schema.LabelWakerStack: {"runtime.goexit;main.chainC;sync.(*Mutex).Unlock"}},
			NumLabel: map[string][]int64{schema.LabelGoid: {2}, schema.LabelPID: {7}, schema.LabelWakerGoid: {3}}},
	}
	return writeTempProfile(t, p)
}

// --explain with a profile explains the recorded stacks: a channel
// receive is idle by its reason, blocked here because its waker was
// blocked through it, and the output says so.
func TestAnalyzeExplainRecorded(t *testing.T) {
	path := writeChainProfile(t)
	out, err := run(t, "analyze", "--explain", "main.chainA", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"main.chainA", "waker: main.chainB", "a wait chain", "first match: peer-wait; counts as blocked"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	if _, err := run(t, "analyze", "--explain", "main.nowhere", path); err == nil || !strings.Contains(err.Error(), "no recorded off-CPU stack contains") {
		t.Errorf("a stack in no profile: err %v", err)
	}
}

// writeLabelledProfile writes a goroutine profile of two routes' requests
// whose waits carry their pprof labels: /a waits on a mutex (30 ms) and
// sleeps (10 ms), /b waits on a channel (5 ms); one unlabelled loop waits
// 1 s for work.
func writeLabelledProfile(t *testing.T) string {
	t.Helper()
	p := &profile.Profile{SampleType: []*profile.ValueType{{Type: schema.GoroutineBlocked, Unit: schema.Nanoseconds},
		{Type: schema.GoroutineRunQueue, Unit: schema.Nanoseconds}, {Type: schema.GoroutineWaits, Unit: schema.Count}}}
	var id uint64
	stack := func(names ...string) []*profile.Location { // leaf first
		var out []*profile.Location
		for _, n := range names {
			id++
			f := &profile.Function{ID: id, Name: n}
			l := &profile.Location{ID: id, Line: []profile.Line{{Function: f}}}
			p.Function, p.Location = append(p.Function, f), append(p.Location, l)
			out = append(out, l)
		}
		return out
	}
	smp := func(v int64, reason, waker string, labels ...string) *profile.Sample {
		s := &profile.Sample{Location: stack("runtime.gopark", "main.handler", "runtime.goexit"), Value: []int64{v, 0, 1},
			Label:    map[string][]string{schema.LabelReason: {reason}, schema.LabelProcess: {"srv"}, schema.LabelWakerStack: {waker}},
			NumLabel: map[string][]int64{schema.LabelGoid: {int64(len(p.Sample) + 1)}, schema.LabelPID: {7}, schema.LabelWakerGoid: {99}}}
		for i := 0; i+1 < len(labels); i += 2 {
			s.Label[labels[i]] = []string{labels[i+1]}
		}
		return s
	}
	a := []string{"trace_id", "4bf92f3577b34da6a3ce929d0e0e4736", "span_id", "00f067aa0ba902b7", "http.route", "/a"}
	b := []string{"trace_id", "4bf92f3577b34da6a3ce929d0e0e4736", "span_id", "1111111111111111", "http.route", "/b"}
	p.Sample = []*profile.Sample{
		smp(30e6, "sync.Mutex.Lock", "runtime.goexit;main.holder;sync.(*Mutex).Unlock", a...),
		smp(10e6, "sleep", "runtime.schedule;runtime.findRunnable;runtime.(*timers).check", a...),
		smp(5e6, "chan receive", "runtime.goexit;main.worker;runtime.chansend1", b...),
		smp(1e9, "chan receive", "runtime.goexit;main.producer;runtime.chansend1"),
	}
	return writeTempProfile(t, p)
}

// --by LABEL sums blocked time per value of a program's label with its
// causes; --span and --trace keep one request's waits; a label or span no
// wait carries is a clear error.
func TestAnalyzeByLabel(t *testing.T) {
	path := writeLabelledProfile(t)
	out, err := run(t, "analyze", "--by", "http.route", path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "/a ") || !strings.HasPrefix(lines[2], "/b ") ||
		!strings.Contains(lines[1], "40.0 ms") || !strings.Contains(lines[1], "monitor-wait 75%, request-timer 25%") ||
		!strings.Contains(lines[2], "5.0 ms") || !strings.Contains(lines[2], "peer-wait 100%") {
		t.Errorf("--by http.route:\n%s", out)
	}
	out, err = run(t, "analyze", "--span", "00f067aa0ba902b7", "--format", "json", path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"name": "monitor-wait"`) || !strings.Contains(out, `"app_blocked_ns": 40000000`) {
		t.Errorf("--span: want the span's 40 ms, monitor-wait first:\n%s", out)
	}
	if out, err = run(t, "analyze", "--trace", "4bf92f3577b34da6a3ce929d0e0e4736", "--format", "json", path); err != nil || !strings.Contains(out, `"app_blocked_ns": 45000000`) {
		t.Errorf("--trace: %v\n%s", err, out)
	}
	for _, c := range [][]string{{"--span", "2222222222222222"}, {"--by", "tenant"}} {
		if _, err := run(t, append([]string{"analyze"}, append(c, path)...)...); err == nil || !strings.Contains(err.Error(), "no wait carries") {
			t.Errorf("%v: err %v", c, err)
		}
	}
}

// writeTempProfile writes p to a file of the test's and returns its path.
func writeTempProfile(t *testing.T, p *profile.Profile) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "g.pb.gz")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := p.Write(f); err != nil {
		t.Fatal(err)
	}
	return path
}
