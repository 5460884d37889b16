package collector

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/internal/testenv"
	"github.com/offcpu/offcpu/schema"
)

// fixtureProfile is a small recorder-shaped profile.
func fixtureProfile() *profile.Profile {
	kmap := &profile.Mapping{ID: 1, File: schema.KernelMapping}
	umap := &profile.Mapping{ID: 2, File: "/usr/bin/server", Start: 0x400000, Limit: 0x500000}
	fn := func(id uint64, name string) *profile.Function { return &profile.Function{ID: id, Name: name} }
	fns := []*profile.Function{fn(1, "__schedule"), fn(2, "schedule"), fn(3, "do_epoll_wait"), fn(4, "main"), fn(5, "loop;run"), fn(6, "wait")}
	loc := func(id uint64, m *profile.Mapping, f *profile.Function) *profile.Location {
		return &profile.Location{ID: id, Mapping: m, Address: id * 16, Line: []profile.Line{{Function: f}}}
	}
	locs := []*profile.Location{loc(1, kmap, fns[0]), loc(2, kmap, fns[1]), loc(3, kmap, fns[2]), loc(4, umap, fns[3]), loc(5, umap, fns[4]), loc(6, umap, fns[5])}
	// An inlined frame: wait inlined into loop;run at one address.
	locs[4].Line = []profile.Line{{Function: fns[5]}, {Function: fns[4]}}
	sample := func(thread string, ns int64, l ...*profile.Location) *profile.Sample {
		return &profile.Sample{Location: l, Value: []int64{ns, 1}, Label: map[string][]string{schema.LabelThread: {thread}}}
	}
	return &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "off_cpu", Unit: "nanoseconds"}, {Type: "switches", Unit: "count"}},
		Mapping:    []*profile.Mapping{kmap, umap},
		Function:   fns,
		Location:   locs,
		Sample: []*profile.Sample{
			sample("io-1", 2_500_000, locs[0], locs[1], locs[2], locs[4], locs[3]),
			sample("io-1", 500_000, locs[0], locs[1], locs[2], locs[4], locs[3]),
			sample("worker", 400, locs[0], locs[3]),
			sample("kthread", 7_000_000, locs[0], locs[1]),
			sample("", 1_000, locs[3]),
		},
	}
}

func TestWriteFoldedGolden(t *testing.T) {
	var buf bytes.Buffer
	if err := schema.WriteFolded(&buf, fixtureProfile(), schema.OffCPU, 1000); err != nil {
		t.Fatal(err)
	}
	testenv.Golden(t, "testdata/folded.golden", buf.Bytes())
	if err := schema.WriteFolded(&buf, fixtureProfile(), "no-such-type", 1); err == nil {
		t.Error("a sample type the profile lacks accepted")
	}
}

func TestParseStates(t *testing.T) {
	m, err := ParseStates([]string{"sleeping,preempted", "D"})
	if err != nil || m != 1<<StateSleeping|1<<StatePreempted|1<<StateUninterruptible {
		t.Errorf("mask = %b, %v", m, err)
	}
	if _, err := ParseStates([]string{"snoozing"}); err == nil || !strings.Contains(err.Error(), "snoozing") {
		t.Errorf("bad state accepted: %v", err)
	}
}
