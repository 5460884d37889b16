package timeline

import (
	"bytes"
	"reflect"
	"testing"
)

// A critical path appended as a track: upstream's Trace reads it with no
// unknown field, its slices nest and pair up in time order by field name,
// and ReadPerfetto reads the timeline as before.
func TestAppendPathTrack(t *testing.T) {
	tl := viewerTimeline()
	var buf bytes.Buffer
	if err := WritePerfetto(&buf, tl, Options{Name: "test"}); err != nil {
		t.Fatal(err)
	}
	segs := []PathSlice{
		{Start: 900, End: 1000, Depth: 0, Name: "running: main"},
		{Start: 1000, End: 1500, Depth: 0, Name: "followed: worker-1"},
		{Start: 1000, End: 1200, Depth: 1, Name: "running: worker-1"},
		{Start: 1200, End: 1500, Depth: 1, Name: "blocked: nanosleep"},
		{Start: 1500, End: 1500, Depth: 0, Name: "zero"},
		{Start: 1500, End: 1600, Depth: 0, Name: "runnable: main"},
	}
	if err := AppendPathTrack(&buf, "critical path of main", segs); err != nil {
		t.Fatal(err)
	}
	md := upstreamTrace(t)
	trace := parseUpstream(t, md, buf.Bytes())
	n := 0
	for _, b := range unknowns(trace, "trace", &n) {
		t.Error(b)
	}
	var open []string
	var got []string
	last := int64(-1)
	for _, p := range (pmsg{t, trace}).list("packet") {
		if p.uint("trusted_packet_sequence_id") != pathSeq || !p.has("track_event") {
			continue
		}
		if p.uint("timestamp_clock_id") != clockMonotonic {
			t.Errorf("path event without the monotonic clock")
		}
		ts, ev := int64(p.uint("timestamp")), p.msg("track_event")
		if ts < last {
			t.Errorf("path events out of order at %d", ts)
		}
		last = ts
		switch ev.enum("type") {
		case "TYPE_SLICE_BEGIN":
			open = append(open, ev.str("name"))
			got = append(got, ev.str("name"))
		case "TYPE_SLICE_END":
			if len(open) == 0 {
				t.Fatalf("an end at %d with no slice open", ts)
			}
			open = open[:len(open)-1]
		}
	}
	want := []string{"running: main", "followed: worker-1", "running: worker-1", "blocked: nanosleep", "runnable: main"}
	if !reflect.DeepEqual(got, want) || len(open) != 0 {
		t.Errorf("path slices %q (open %q), want %q", got, open, want)
	}
	back, err := ReadPerfetto(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Waits, tl.Waits) || !reflect.DeepEqual(back.Threads, tl.Threads) {
		t.Error("the timeline reads back differently with a path track")
	}
}
