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
