package otlp

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/pdata/pprofile/pprofileotlp"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/schema"
)

func TestContainerID(t *testing.T) {
	id := "3f4e1b0c9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"
	for path, want := range map[string]string{
		"/system.slice/docker-" + id + ".scope":                              id,
		"/kubepods/burstable/pod1234/" + id:                                  id,
		"/kubepods.slice/kubepods-pod.slice/cri-containerd-" + id + ".scope": id,
		"/user.slice/user-0.slice/session-3.scope":                           "",
		"/system.slice/docker-" + id[:63] + ".scope":                         "",
	} {
		if got := ContainerID(path); got != want {
			t.Errorf("ContainerID(%q) = %q, want %q", path, got, want)
		}
	}
}

func TestServiceName(t *testing.T) {
	if got := serviceName([]string{"PATH=/bin", "OTEL_SERVICE_NAME=broker"}); got != "broker" {
		t.Errorf("from OTEL_SERVICE_NAME: %q", got)
	}
	if got := serviceName([]string{"OTEL_RESOURCE_ATTRIBUTES=team=a, service.name=ledger"}); got != "ledger" {
		t.Errorf("from OTEL_RESOURCE_ATTRIBUTES: %q", got)
	}
	if got := serviceName([]string{"HOME=/root"}); got != "" {
		t.Errorf("none declared: %q", got)
	}
}

// offProfile is a small off-CPU profile as the recorder writes it: one
// blocked lock wait with part of it waiting for a CPU, one idle read, one
// preempted interval, one on-CPU sample.
func offProfile() *profile.Profile {
	m := &profile.Mapping{ID: 2, File: "/usr/bin/server", BuildID: "abc123", Start: 0x1000, Limit: 0x9000}
	k := &profile.Mapping{ID: 1, File: schema.KernelMapping}
	fn := func(id uint64, name string) *profile.Function { return &profile.Function{ID: id, Name: name} }
	loc := func(id uint64, mp *profile.Mapping, f *profile.Function) *profile.Location {
		return &profile.Location{ID: id, Mapping: mp, Address: 0x1000 + id, Line: []profile.Line{{Function: f}}}
	}
	lock, read, sched, main := loc(1, m, fn(1, "pthread_mutex_lock")), loc(2, m, fn(2, "epoll_wait")), loc(3, k, fn(3, "schedule")), loc(4, m, fn(4, "main"))
	poll := loc(5, k, fn(5, "ep_poll"))
	types := []*profile.ValueType{{Type: schema.OffCPU, Unit: "nanoseconds"}, {Type: schema.Switches, Unit: "count"}, {Type: schema.CPU, Unit: "nanoseconds"},
		{Type: schema.Blocked, Unit: "nanoseconds"}, {Type: schema.RunQueue, Unit: "nanoseconds"}}
	smp := func(v []int64, state string, tid int64, locs ...*profile.Location) *profile.Sample {
		return &profile.Sample{Location: locs, Value: v,
			Label:    map[string][]string{schema.LabelThread: {"worker"}, schema.LabelState: {state}, schema.LabelProcess: {"server"}},
			NumLabel: map[string][]int64{schema.LabelTID: {tid}, schema.LabelPID: {100}}}
	}
	return &profile.Profile{SampleType: types, Mapping: []*profile.Mapping{k, m},
		Location: []*profile.Location{lock, read, sched, main, poll},
		Function: []*profile.Function{lock.Line[0].Function, read.Line[0].Function, sched.Line[0].Function, main.Line[0].Function, poll.Line[0].Function},
		Sample: []*profile.Sample{
			smp([]int64{5000, 2, 0, 4000, 1000}, "sleeping", 101, sched, lock, main),
			smp([]int64{7000, 1, 0, 7000, 0}, "sleeping", 102, sched, poll, read, main),
			smp([]int64{300, 1, 0, 0, 300}, "preempted", 101, sched, main),
			smp([]int64{0, 0, 900, 0, 0}, "", 101, main),
		}}
}

func TestConvert(t *testing.T) {
	rules, err := analysis.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	c := &Converter{Host: "node-1", Rules: rules, Processes: func(pid int64, comm string) Process {
		return Process{Executable: comm, ServiceName: "svc", ContainerID: "cid"}
	}}
	start := time.Unix(1700000000, 0)
	parts, counts, err := c.Convert(start, 10*time.Second, offProfile(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) != 1 {
		t.Fatalf("%d messages, want 1", len(parts))
	}
	p := parts[0]
	want := map[string]int64{TypeOffCPU: 11000, TypeRunQueue: 1300, TypeCPU: 900}
	for typ, v := range want {
		if counts.Values[typ] != v {
			t.Errorf("%s: %d, want %d", typ, counts.Values[typ], v)
		}
	}
	// What goes over the wire decodes to the same.
	b, err := pprofileotlp.NewExportRequestFromProfiles(p).MarshalProto()
	if err != nil {
		t.Fatal(err)
	}
	req := pprofileotlp.NewExportRequest()
	if err := req.UnmarshalProto(b); err != nil {
		t.Fatal(err)
	}
	got := req.Profiles()
	if got.ResourceProfiles().Len() != 1 {
		t.Fatalf("%d resources, want 1 (one process)", got.ResourceProfiles().Len())
	}
	rp := got.ResourceProfiles().At(0)
	for k, v := range map[string]string{AttrHostName: "node-1", AttrServiceName: "svc", AttrContainerID: "cid", AttrExecutable: "server"} {
		if a, ok := rp.Resource().Attributes().Get(k); !ok || a.Str() != v {
			t.Errorf("resource %s = %q, want %q", k, a.Str(), v)
		}
	}
	dict := got.Dictionary()
	profs := rp.ScopeProfiles().At(0).Profiles()
	sums := map[string]int64{}
	verdicts := map[string]bool{}
	for i := 0; i < profs.Len(); i++ {
		pr := profs.At(i)
		typ := dict.StringTable().At(int(pr.SampleType().TypeStrindex()))
		if !pr.Time().AsTime().Equal(start) || pr.DurationNano() != uint64(10*time.Second) {
			t.Errorf("%s: time %v duration %d", typ, pr.Time().AsTime(), pr.DurationNano())
		}
		for j := 0; j < pr.Samples().Len(); j++ {
			s := pr.Samples().At(j)
			sums[typ] += s.Values().At(0)
			attrs, err := pprofile.FromAttributeIndices(dict.AttributeTable(), s, dict)
			if err != nil {
				t.Fatal(err)
			}
			if v, ok := attrs.Get(AttrVerdict); ok && typ == TypeOffCPU {
				verdicts[v.Str()] = true
			}
			st := dict.StackTable().At(int(s.StackIndex()))
			if st.LocationIndices().Len() == 0 {
				t.Errorf("%s sample without a stack", typ)
			}
		}
	}
	for typ, v := range want {
		if sums[typ] != v {
			t.Errorf("decoded %s: %d, want %d", typ, sums[typ], v)
		}
	}
	if !verdicts["blocked"] || !verdicts["idle"] {
		t.Errorf("verdicts %v: want the lock wait blocked and the read idle", verdicts)
	}
	// Each location says its kind of code, as OpenTelemetry's profiler does.
	types := map[string]int{}
	for i := 1; i < dict.LocationTable().Len(); i++ { // 0: the zero value
		l := dict.LocationTable().At(i)
		attrs, err := pprofile.FromAttributeIndices(dict.AttributeTable(), l, dict)
		if err != nil {
			t.Fatal(err)
		}
		v, _ := attrs.Get(AttrFrameType)
		types[v.Str()]++
	}
	if len(types) != 2 || types["kernel"] == 0 || types["native"] == 0 {
		t.Errorf("frame types %v, want kernel and native locations only", types)
	}
}

// An HTTP collector that refuses the first attempts: the exporter retries
// and delivers; with no retry time left it drops and counts.
func TestExporterRetryAndDrop(t *testing.T) {
	var calls, ok atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path != HTTPPath || r.Header.Get("X-Tenant") != "t1" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		if calls.Add(1) <= 2 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		ok.Add(1)
	}))
	defer srv.Close()
	e, err := NewExporter(Config{Endpoint: srv.URL, Protocol: "http", Insecure: true, Headers: map[string]string{"X-Tenant": "t1"}, QueueSize: 4, RetryFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	e.Enqueue([]pprofile.Profiles{pprofile.NewProfiles()}, 3)
	st := e.Close(context.Background())
	if st.Sent != 1 || st.Dropped != 0 || st.Retries != 2 || ok.Load() != 1 {
		t.Errorf("after two refusals: %+v, %d delivered", st, ok.Load())
	}

	e, err = NewExporter(Config{Endpoint: srv.URL + "/nowhere", Protocol: "http", Insecure: true, QueueSize: 1, RetryFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		e.Enqueue([]pprofile.Profiles{pprofile.NewProfiles()}, 5)
	}
	st = e.Close(context.Background())
	if st.Sent+st.Dropped != 3 || st.Dropped == 0 || st.DroppedSample != 5*st.Dropped {
		t.Errorf("a permanent error and a full queue: %+v, want every interval sent or counted dropped", st)
	}
}

// The queue holds encoded messages and is bounded in bytes: with the
// collector not answering, an interval that would pass QueueBytes is
// dropped and counted, whatever QueueSize allows.
func TestExporterQueueBytes(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		<-release
	}))
	defer srv.Close()
	p := pprofile.NewProfiles()
	p.Dictionary().StringTable().Append(strings.Repeat("x", 40_000))
	e, err := NewExporter(Config{Endpoint: srv.URL, Protocol: "http", Insecure: true, QueueSize: 60, QueueBytes: 100_000, RetryFor: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var queued int
	for range 5 {
		if e.Enqueue([]pprofile.Profiles{p}, 1) {
			queued++
		}
	}
	st := e.Stats()
	if queued != 2 || st.Dropped != 3 || !strings.Contains(st.LastError, "queue full") || st.PendingBytes > 100_000 {
		t.Errorf("40 kB messages in a 100 kB queue: %d queued, %+v", queued, st)
	}
	close(release)
	if st = e.Close(context.Background()); st.Sent != 2 || st.Dropped != 3 || st.PendingBytes != 0 {
		t.Errorf("after the collector answers: %+v", st)
	}
}

func TestConfigCheck(t *testing.T) {
	for _, c := range []Config{{}, {Endpoint: "x:1", Protocol: "udp"}, {Endpoint: "x:1", CAFile: "/nonexistent.pem"}} {
		if err := c.Check(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

// The category cache gives what the rules give, for stacks that differ
// only in what a waker-side rule reads.
func TestCategorizeCache(t *testing.T) {
	rules, err := analysis.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	d, err := schema.FromProfile(offProfile())
	if err != nil {
		t.Fatal(err)
	}
	var stacks []schema.Stack
	for _, st := range d.Stacks {
		if st.Kind != schema.KindOffCPU || st.WaitsForCPU() {
			continue
		}
		for _, w := range []struct {
			name, process string
			pid, tid      int64
			frames        []schema.Frame
		}{
			{},
			{"worker", "server", st.PID, 7, []schema.Frame{{Name: "main"}, {Name: "pthread_mutex_unlock"}}},
			{"client", "client", 999, 999, []schema.Frame{{Name: "main"}, {Name: "write"}, {Name: "ksys_write", Kernel: true}}},
			{"worker", "server", st.PID, 7, []schema.Frame{{Name: "main"}, {Name: "write"}, {Name: "ksys_write", Kernel: true}}},
			{"[irq]", "", 0, 0, nil},
		} {
			v := st
			v.Waker, v.WakerProcess, v.WakerPID, v.WakerTID, v.WakerFrames = w.name, w.process, w.pid, w.tid, w.frames
			stacks = append(stacks, v)
		}
	}
	c := &Converter{Rules: rules}
	seen := map[string]bool{}
	for round := range 2 {
		for i := range stacks {
			st := &stacks[len(stacks)-1-i]
			if round == 0 {
				st = &stacks[i]
			}
			cat, verdict := c.categorize(st)
			want := rules.Categorize(st)[0]
			if cat != want || (verdict == verdictIdle) != rules.IsIdle(want) {
				t.Errorf("round %d, %s woken by %q: cached %s/%s, rules say %s", round, st.Folded(), st.Waker, cat, verdict, want)
			}
			seen[cat+"/"+verdict] = true
		}
	}
	if len(seen) < 3 {
		t.Errorf("categories %v: want the waker variants to differ", seen)
	}
}

// An interval larger than the message limit goes in several messages,
// each within the limit, that together hold every sample and process.
func TestConvertSplit(t *testing.T) {
	m := &profile.Mapping{ID: 1, File: "/usr/bin/server", Start: 0x1000, Limit: 0x90000}
	p := &profile.Profile{SampleType: offProfile().SampleType, Mapping: []*profile.Mapping{m}}
	var want int64
	for pid := int64(1); pid <= 300; pid++ {
		for i := range 10 {
			id := uint64(len(p.Location) + 1)
			f := &profile.Function{ID: id, Name: fmt.Sprintf("handler_%d_%d_with_a_long_name", pid, i)}
			l := &profile.Location{ID: id, Mapping: m, Address: 0x1000 + id, Line: []profile.Line{{Function: f}}}
			p.Function, p.Location = append(p.Function, f), append(p.Location, l)
			p.Sample = append(p.Sample, &profile.Sample{Location: []*profile.Location{l}, Value: []int64{pid, 1, 0, pid, 0},
				Label:    map[string][]string{schema.LabelThread: {"worker"}, schema.LabelState: {"sleeping"}, schema.LabelProcess: {"server"}},
				NumLabel: map[string][]int64{schema.LabelTID: {pid}, schema.LabelPID: {pid}}})
			want += pid
		}
	}
	c := &Converter{MaxBytes: 64 << 10}
	parts, counts, err := c.Convert(time.Unix(1700000000, 0), time.Second, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) < 2 || counts.Values[TypeOffCPU] != want {
		t.Fatalf("%d messages, off-CPU %d: want several, %d", len(parts), counts.Values[TypeOffCPU], want)
	}
	var m2 pprofile.ProtoMarshaler
	var got int64
	pids := map[int64]bool{}
	for i, part := range parts {
		if n := m2.ProfilesSize(part); n > c.MaxBytes {
			t.Errorf("message %d: %d bytes, over the limit %d", i, n, c.MaxBytes)
		}
		for r := 0; r < part.ResourceProfiles().Len(); r++ {
			rp := part.ResourceProfiles().At(r)
			pid, _ := rp.Resource().Attributes().Get(AttrPID)
			pids[pid.Int()] = true
			profs := rp.ScopeProfiles().At(0).Profiles()
			for j := 0; j < profs.Len(); j++ {
				for k := 0; k < profs.At(j).Samples().Len(); k++ {
					got += profs.At(j).Samples().At(k).Values().At(0)
				}
			}
		}
	}
	if got != want || len(pids) != 300 {
		t.Errorf("the messages hold %d ns of %d processes, want %d of 300", got, len(pids), want)
	}
}

// The export judges a profile's waits as analyze does: a wait beneath its
// thread's top of loop (a Node.js handler's synchronous FIFO read, a Go
// goroutine's downstream call, both woken by another program or the
// network)
// is blocked in both, to the nanosecond.
func TestConvertLoops(t *testing.T) {
	rules, err := analysis.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"node", "gunicorn", "goloop.goroutines"} {
		path := filepath.Join("..", "analysis", "testdata", "corpus", name+".pb.gz")
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		p, err := profile.Parse(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		c := &Converter{Rules: rules}
		typ := TypeOffCPU
		var es []entry
		if strings.HasSuffix(name, ".goroutines") {
			typ = TypeGoroutineBlocked
			es, err = c.goroutineEntries(nil, p)
		} else {
			es, err = c.entries(p, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		var got int64
		for _, e := range es {
			if e.typ == typ && e.verdict == verdictBlocked {
				got += e.value
			}
		}
		d, err := analysis.Load(schema.FoldedNanoseconds, path)
		if err != nil {
			t.Fatal(err)
		}
		analysis.Judge(d.Stacks, rules)
		var want, beneath int64
		for i := range d.Stacks {
			s := &d.Stacks[i]
			if s.Kind == schema.KindOffCPU && !s.WaitsForCPU() && !rules.IsIdle(rules.Categorize(s)[0]) {
				want += s.Value
				if s.Loop == schema.LoopBeneath {
					beneath += s.Value
				}
			}
		}
		t.Logf("%s: blocked %d ns exported, %d ns analyzed (%d ns beneath a top of loop)", name, got, want, beneath)
		if got != want || beneath == 0 {
			t.Errorf("%s: blocked %d ns exported, %d ns analyzed (%d beneath a top of loop): want equal, some beneath", name, got, want, beneath)
		}
	}
}
