package timeline

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/google/pprof/profile"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/offcpu/offcpu/schema"
)

// sample is 3 threads in 2 processes and 2 goroutines of the first:
// waits with and without a waker, a preempted one, an open one, labels
// with a span, kernel and Java frames, goroutines woken by a goroutine
// and by a thread, running on threads.
func sample() *schema.Timeline {
	k := func(n string) schema.Frame { return schema.Frame{Name: n, Kernel: true, Module: "vmlinux"} }
	srv := func(n string) schema.Frame { return schema.Frame{Name: n, Module: "server"} }
	java := func(n string) schema.Frame { return schema.Frame{Name: n, Module: "[java]", Runtime: "jvm"} }
	span := map[string]string{"trace_id": "t1", "span_id": "s1", "span_name": "GET /x"}
	return &schema.Timeline{
		Start: 0, End: 5000, Lost: 3,
		Threads: []schema.TimelineThread{
			{PID: 100, TID: 100, Process: "server", Name: "main"},
			{PID: 100, TID: 101, Process: "server", Name: "worker-1"},
			{PID: 200, TID: 200, Process: "java", Name: "GC Thread"},
			{PID: 100, GoID: 7, Process: "server", Name: "main.handle"},
			{PID: 100, GoID: 9, Process: "server"},
		},
		Stacks: [][]schema.Frame{
			nil,
			{srv("main"), srv("handle"), k("do_syscall_64"), k("futex_wait")},
			{java("java.lang.Thread.run"), java("Foo.bar"), {Name: "JVM_Sleep", Module: "libjvm.so"}, k("schedule")},
			{srv("main"), k("futex_wake")},
		},
		Waits: []schema.Wait{
			{Thread: 1, Out: 1000, Wake: 1500, In: 1600, State: "sleeping", Stack: 1, Waker: 0,
				WakerStack: 3, Class: "futex", Labels: span, Category: "lock"},
			{Thread: 2, Out: 1200, Wake: 1200, In: 1400, State: "preempted", Stack: 2, Waker: -1},
			{Thread: 1, Out: 2000, Wake: 2600, In: 2700, State: "sleeping", Stack: 1, Waker: -1,
				IRQ: true, Class: "timer", Labels: map[string]string{"trace_id": "t1", "span_id": "s1"},
				Verdict: "slow timer"},
			{Thread: 2, Out: 3000, Wake: 3500, In: 3500, State: "sleeping", Stack: 2, Waker: 1,
				WakerStack: 1, Class: "pipe"},
			{Thread: 0, Out: 4000, Wake: 5000, In: 5000, State: "uninterruptible", Stack: 1,
				Waker: -1, Open: true},
			{Thread: 3, Out: 1100, Wake: 1300, In: 1350, State: "chan receive", Class: "chan", Stack: 1, Waker: 4,
				WakerStack: 3, OutThread: 1, InThread: 0, Labels: span},
			{Thread: 4, Out: 1000, Wake: 1250, In: 1260, State: "IO wait", Class: "network", Stack: 3, Waker: 0,
				OutThread: -1, InThread: 1},
		},
	}
}

func roundTrip(t *testing.T, tl *schema.Timeline) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WritePerfetto(&buf, tl, Options{Name: "test"}); err != nil {
		t.Fatal(err)
	}
	got, err := ReadPerfetto(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, tl) {
		t.Errorf("read back\n%+v\nwant\n%+v", got, tl)
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	b := roundTrip(t, sample())
	var again bytes.Buffer
	if err := WritePerfetto(&again, sample(), Options{Name: "test"}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, again.Bytes()) {
		t.Error("two writes of one timeline differ")
	}
}

// FuzzReadPerfetto: whatever the input, an error or a timeline, no panic;
// and a timeline read writes and reads back the same.
func FuzzReadPerfetto(f *testing.F) {
	var buf bytes.Buffer
	WritePerfetto(&buf, sample(), Options{})
	f.Add(buf.Bytes())
	f.Add([]byte{0x0a, 0x02, 0x50, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		tl, err := ReadPerfetto(bytes.NewReader(b))
		if err != nil {
			return
		}
		var out bytes.Buffer
		if err := WritePerfetto(&out, tl, Options{}); err != nil {
			t.Fatalf("a timeline read does not write: %v", err)
		}
		back, err := ReadPerfetto(&out)
		if err != nil || !reflect.DeepEqual(back, tl) {
			t.Fatalf("a timeline read does not read back: %v", err)
		}
	})
}

// TestRoundTripOdd: a thread whose process name is not its pid's, a
// repeated pid/tid, empty non-nil labels, labels and strings of any bytes,
// a wait back in time, frames a runtime names in the kernel or by a
// kind_str prefix, overlapping waits, an empty timeline.
func TestRoundTripOdd(t *testing.T) {
	tl := sample()
	tl.Threads = append(tl.Threads, schema.TimelineThread{PID: 100, TID: 102, Process: "server2"},
		schema.TimelineThread{PID: 100, TID: 101, Process: "server", Name: "worker-1"})
	tl.Stacks = append(tl.Stacks, []schema.Frame{{Name: "bpf_prog", Kernel: true, Runtime: "ebpf"},
		{Name: "x", Runtime: "kernel/odd"}, {Name: "y", Runtime: "user/odd"}, {}}, []schema.Frame{})
	tl.Waits = append(tl.Waits,
		schema.Wait{Thread: 3, Out: 100, Wake: 200, In: 300, Stack: 4, Waker: 4, WakerStack: 4, Labels: map[string]string{}},
		schema.Wait{Thread: 3, Out: 250, Wake: 260, In: 400, Stack: 0, Waker: -1},
		schema.Wait{Thread: 4, Out: 50, Wake: 40, In: 30, Stack: 0, Waker: 3, State: "x\xff", Class: "",
			Labels: map[string]string{"": "", "k=\" y": "v\xff \"=\"", "span_id": "s\x00"}})
	tl.Stacks[5] = nil // empty stacks read back as nil
	roundTrip(t, tl)
	roundTrip(t, &schema.Timeline{Start: 7, End: 9})
}

// walk calls fn on every message field of a Perfetto trace below the
// packet's, with its path of field numbers.
func walk(t *testing.T, b []byte, path []protowire.Number, fn func(path []protowire.Number, f field)) {
	t.Helper()
	err := fields(b, func(f field) error {
		p := append(append([]protowire.Number(nil), path...), f.num)
		fn(p, f)
		if f.typ == protowire.BytesType && len(p) < 5 && isMessage(p) {
			walk(t, f.b, p, fn)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v: %v", path, err)
	}
}

// isMessage says which paths hold messages (rather than strings).
func isMessage(p []protowire.Number) bool {
	last := p[len(p)-1]
	switch len(p) {
	case 1:
		return last == fTracePacket
	case 2:
		return last == fPacketTrackDesc || last == fPacketTrackEvent || last == fPacketInternedData ||
			last == fPacketDefaults || last == fPacketClockSnapshot
	case 3:
		return last == fTrackThread || last == fTrackProcess || last == fInternedFrames || last == fInternedCallstacks ||
			p[1] == fPacketClockSnapshot && last == fSnapshotClocks
	}
	return false
}

func same(p []protowire.Number, q ...protowire.Number) bool { return reflect.DeepEqual(p, q) }

// TestPerfettoFields decodes the trace generically and checks upstream's
// field numbers where they matter.
func TestPerfettoFields(t *testing.T) {
	b := roundTrip(t, sample())
	tids := map[uint64]bool{}
	flowOut, flowIn := map[uint64]int{}, map[uint64]int{}
	var clock, firstFlags, callstacks, kernelFrames, callstackRefs, primary, incremental int
	var clocks []uint64
	packet := 0
	walk(t, b, nil, func(p []protowire.Number, f field) {
		switch {
		case same(p, 1):
			packet++
		case same(p, 1, 13) && packet == 1: // TracePacket.sequence_flags
			firstFlags = int(f.u)
		case same(p, 1, 59, 58): // trace_packet_defaults.timestamp_clock_id
			clock = int(f.u)
		case same(p, 1, 6, 2): // clock_snapshot.primary_trace_clock
			primary = int(f.u)
		case same(p, 1, 6, 1, 1): // clock_snapshot.clocks[].clock_id
			clocks = append(clocks, f.u)
		case same(p, 1, 6, 1, 3) && f.u == 1: // clocks[].is_incremental
			incremental++
		case same(p, 1, 60, 4, 2): // track_descriptor.thread.tid
			tids[f.u] = true
		case same(p, 1, 11, 47) && f.typ == protowire.Fixed64Type: // track_event.flow_ids
			flowOut[f.u]++
		case same(p, 1, 11, 48) && f.typ == protowire.Fixed64Type: // terminating_flow_ids
			flowIn[f.u]++
		case same(p, 1, 11, 56): // callstack_iid
			callstackRefs++
		case same(p, 1, 12, 7): // interned_data.callstacks
			callstacks++
		case same(p, 1, 12, 6, 7) && f.u == 2: // frames[].kind == KIND_KERNEL
			kernelFrames++
		}
	})
	if firstFlags != 1 || clock != 64 {
		t.Errorf("first packet's sequence_flags %d, clock %d; want 1 (cleared), 64 (the sequence's)", firstFlags, clock)
	}
	if primary != 3 || !reflect.DeepEqual(clocks, []uint64{3, 64}) || incremental != 1 {
		t.Errorf("clock snapshot: primary %d, clocks %v, %d incremental; want 3 (MONOTONIC), [3 64], 1", primary, clocks, incremental)
	}
	if !tids[100] || !tids[101] || !tids[200] || len(tids) != 3 {
		t.Errorf("thread tids %v", tids)
	}
	// Waits 0, 3, 5 and 6 have wakers: flows 1, 4, 6 and 7, each begun
	// and ended once.
	want := map[uint64]int{1: 1, 4: 1, 6: 1, 7: 1}
	if !reflect.DeepEqual(flowOut, want) || !reflect.DeepEqual(flowIn, want) {
		t.Errorf("flow ids out %v, in %v; want %v both", flowOut, flowIn, want)
	}
	if callstacks != 4 || kernelFrames != 4 || callstackRefs == 0 {
		t.Errorf("%d callstacks, %d kernel frames, %d references", callstacks, kernelFrames, callstackRefs)
	}
}

func TestBadInput(t *testing.T) {
	var buf bytes.Buffer
	if err := WritePerfetto(&buf, sample(), Options{}); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	check := func(name string, b []byte, mayParse bool) {
		t.Helper()
		tl, err := ReadPerfetto(bytes.NewReader(b))
		switch {
		case err == nil && !mayParse:
			t.Errorf("%s: no error", name)
		case err == nil && !reflect.DeepEqual(tl, sample()):
			t.Errorf("%s: read without error, but wrong", name)
		case err != nil && !strings.HasPrefix(err.Error(), "not an offcpu timeline: "):
			t.Errorf("%s: error %q", name, err)
		}
	}
	check("empty", nil, false)
	check("cut in a packet", good[:len(good)-1], false)
	check("header only", good[:40], false)
	// Cut between packets, a cut loses a record or leaves the header's
	// counts unmet, or only loses slice ends: an error or the whole timeline.
	for n := 0; n < len(good); n += 1 + len(good)/300 {
		check("cut", good[:n], true)
	}
	r := rand.New(rand.NewSource(1))
	for i := 0; i < 300; i++ {
		b := bytes.Clone(good)
		for j := 0; j < 1+i%4; j++ {
			b[r.Intn(len(b))] = byte(r.Intn(256))
		}
		ReadPerfetto(bytes.NewReader(b)) // must not panic; may read anything
	}
	p := &profile.Profile{SampleType: []*profile.ValueType{{Type: "offcpu", Unit: "nanoseconds"}},
		Sample: []*profile.Sample{{Value: []int64{1}}}}
	var pp bytes.Buffer
	if err := p.Write(&pp); err != nil {
		t.Fatal(err)
	}
	check("pprof", pp.Bytes(), false)
	pp.Reset()
	if err := p.WriteUncompressed(&pp); err != nil {
		t.Fatal(err)
	}
	check("uncompressed pprof", pp.Bytes(), false)
	check("json", []byte(`{"traceEvents":[]}`), false)
	// A Perfetto trace of someone else's: a track and a slice.
	var other pb
	other = other.bytes(fTracePacket, pb(nil).varint(fPacketSequenceID, 7).
		bytes(fPacketTrackDesc, pb(nil).varint(fTrackUUID, 5).str(fTrackName, "x")))
	other = other.bytes(fTracePacket, pb(nil).varint(fPacketTimestamp, 10).varint(fPacketSequenceID, 7).
		bytes(fPacketTrackEvent, pb(nil).varint(fEventType, typeInstant).varint(fEventTrackUUID, 5).str(23, "hi")))
	check("foreign perfetto", other, false)
}

func TestWriteInvalid(t *testing.T) {
	for _, bad := range []func(*schema.Timeline){
		func(tl *schema.Timeline) { tl.Waits[0].Thread = 5 },
		func(tl *schema.Timeline) { tl.Waits[0].Waker = -2 },
		func(tl *schema.Timeline) { tl.Waits[0].Stack = 4 },
		func(tl *schema.Timeline) { tl.Waits[0].WakerStack = -1 },
	} {
		tl := sample()
		bad(tl)
		if err := WritePerfetto(new(bytes.Buffer), tl, Options{}); err == nil {
			t.Errorf("%+v: no error", tl.Waits[0])
		}
		if err := WriteJSON(new(bytes.Buffer), tl); err == nil {
			t.Errorf("%+v: no error from WriteJSON", tl.Waits[0])
		}
	}
}

func TestWriteJSON(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteJSON(&buf, sample()); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(buf.Bytes(), []byte(`{"traceEvents":[`)) {
		t.Errorf("starts %q", buf.Bytes()[:20])
	}
	var doc struct {
		Events []struct {
			Name, Cat, Ph, BP string
			TS                float64
			Dur               *float64
			PID, TID          int64
			ID                any
			SF                int
			Args              map[string]any
		} `json:"traceEvents"`
		Unit   string                    `json:"displayTimeUnit"`
		Frames map[string]map[string]any `json:"stackFrames"`
		Other  map[string]int64          `json:"otherData"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	flows := map[string]map[float64]bool{"s": {}, "f": {}}
	goroutine := 0
	for _, e := range doc.Events {
		count[e.Ph+" "+e.Cat]++
		switch {
		case e.Ph == "X" && e.Dur == nil:
			t.Errorf("X without dur: %+v", e)
		case e.Ph == "X" && e.Name == "slow timer" && (e.TS != 2 || *e.Dur != 0.6 || e.SF == 0 || e.TID != 101):
			t.Errorf("slow timer slice %+v", e)
		case e.Ph == "s" || e.Ph == "f":
			flows[e.Ph][e.ID.(float64)] = true
			if e.Ph == "f" && e.BP != "e" {
				t.Errorf("flow end without bp e: %+v", e)
			}
		case e.Ph == "X" && e.Cat == catBlocked && e.Args["stack"] == nil:
			t.Errorf("blocked slice without a stack: %+v", e)
		case e.Ph == "M" && e.Args["name"] == "goroutine 7 main.handle" || e.Ph == "X" && e.Name == "blocked (chan receive)":
			goroutine++
			if e.TID != 1<<32+7 {
				t.Errorf("goroutine 7's %s on tid %d", e.Name, e.TID)
			}
		}
	}
	want := map[string]int{"M ": 7, "X blocked": 6, "X runnable": 7, "X running": 2, "X wakeup": 4,
		"s wakeup": 4, "f wakeup": 4, "b request": 2, "e request": 2}
	if !reflect.DeepEqual(count, want) {
		t.Errorf("events %v\nwant %v", count, want)
	}
	if goroutine != 2 {
		t.Errorf("goroutine 7's name and wait: %d events", goroutine)
	}
	if !reflect.DeepEqual(flows["s"], flows["f"]) || len(flows["s"]) != 4 {
		t.Errorf("flows %v", flows)
	}
	if doc.Unit != "ns" || len(doc.Frames) == 0 || doc.Other["offcpu.lost"] != 3 {
		t.Errorf("unit %q, %d frames, other %v", doc.Unit, len(doc.Frames), doc.Other)
	}
	// Strings of any bytes are written as valid JSON, as json.Marshal would.
	odd := sample()
	odd.Threads[0].Name = "a\"b\\c\x00\n\xff é"
	odd.Waits[0].Labels = map[string]string{"k\t": "v\xfe\x01"}
	buf.Reset()
	if err := WriteJSON(&buf, odd); err != nil || !json.Valid(buf.Bytes()) {
		t.Fatalf("odd strings: %v, valid %v", err, json.Valid(buf.Bytes()))
	}
	name, _ := json.Marshal(odd.Threads[0].Name)
	if !bytes.Contains(buf.Bytes(), name) {
		t.Errorf("thread name not written as %s", name)
	}
}

// TestTraceProcessor loads the trace into trace_processor_shell, where one
// is installed (OFFCPU_TRACE_PROCESSOR or on PATH).
func TestTraceProcessor(t *testing.T) {
	tp := os.Getenv("OFFCPU_TRACE_PROCESSOR")
	if tp == "" {
		var err error
		if tp, err = exec.LookPath("trace_processor_shell"); err != nil {
			t.Skip("no trace_processor_shell")
		}
	}
	dir := t.TempDir()
	var buf bytes.Buffer
	if err := WritePerfetto(&buf, sample(), Options{}); err != nil {
		t.Fatal(err)
	}
	trace, query := filepath.Join(dir, "t.pftrace"), filepath.Join(dir, "q.sql")
	os.WriteFile(trace, buf.Bytes(), 0o644)
	os.WriteFile(query, []byte(`select
  (select count(*) from slice where name = 'slow timer') as timer,
  (select count(*) from flow) as flows,
  (select count(*) from thread where tid in (100, 101, 200)) as threads,
  (select count(*) from __intrinsic_track_event_callstacks) as stacks;
`), 0o644)
	out, err := exec.Command(tp, "--query-file", query, trace).CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !strings.Contains(string(out), `1,2,3,`) && !strings.Contains(string(out), "1 2 3") {
		t.Errorf("trace_processor says\n%s", out)
	}
}
