package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/offcpu/offcpu/agent"
	"github.com/offcpu/offcpu/collector"
	"github.com/offcpu/offcpu/internal/testenv"
	"github.com/offcpu/offcpu/kernel"
	"github.com/offcpu/offcpu/otlp"
	"github.com/offcpu/offcpu/schema"
)

func TestContinuousBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("otlp:\n  endpoint: x:1\n  colour: red\n"), 0o644)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"record", "--interval", "1s", "-d", "1s"}, "--interval needs --continuous"},
		{[]string{"record", "--continuous", "-d", "1s"}, "--output-dir DIR and/or --otlp-endpoint"},
		{[]string{"record", "--continuous", "--otlp-endpoint", "x:1", "--otlp-protocol", "carrier-pigeon"}, `protocol "carrier-pigeon"`},
		{[]string{"record", "--continuous", "--otlp-endpoint", "x:1", "--otlp-header", "token"}, "write KEY=VALUE"},
		{[]string{"record", "--continuous", "--output-dir", dir, "-o", "x.pb.gz"}, "give --output-dir"},
		{[]string{"record", "--continuous", "--output-dir", dir, "--interval", "1ms"}, "too short"},
		{[]string{"record", "--continuous", "--config", bad}, "colour"},
		{[]string{"record", "--continuous", "--output-dir", dir, "--goroutines", "--goroutines-output", "g.pb.gz", "-p", "1"}, "with --continuous each interval's goroutine waits go to --output-dir"},
		{[]string{"record", "--continuous", "--output-dir", dir, "--memory-limit", "lots"}, "give a size such as 160MiB"},
		{[]string{"record", "--continuous", "--output-dir", dir, "--otlp-queue-bytes", "-3"}, "--otlp-queue-bytes"},
		{[]string{"record", "--memory-limit", "200MiB", "-d", "1s"}, "--memory-limit needs --continuous"},
	} {
		_, err := run(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want it to mention %q", tc.args, err, tc.want)
		}
	}
}

// collectorBinary builds the test collector (tools/otelcol, a module of
// its own) once.
var collectorBinary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "offcpu-otelcol")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "offcpu-otelcol")
	if err := testenv.BuildIn(filepath.Join("..", "..", "tools", "otelcol"), "go", "build", "-o", bin, "."); err != nil {
		return "", fmt.Errorf("building the test collector: %v", err)
	}
	return bin, nil
})

type testCollector struct {
	bin, config, received string
	grpc, http            string
	cmd                   *exec.Cmd
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func newTestCollector(t *testing.T) *testCollector {
	bin, err := collectorBinary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := &testCollector{bin: bin, config: filepath.Join(dir, "collector.yaml"), received: filepath.Join(dir, "received"),
		grpc: freePort(t), http: freePort(t)}
	cfg := fmt.Sprintf(`receivers:
  otlp:
    protocols:
      grpc:
        endpoint: %s
      http:
        endpoint: %s
exporters:
  debug:
    verbosity: basic
  capture:
    directory: %s
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    profiles:
      receivers: [otlp]
      exporters: [capture, debug]
`, c.grpc, c.http, c.received)
	if err := os.WriteFile(c.config, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	c.start(t)
	t.Cleanup(func() { c.stop(t) })
	return c
}

// start runs the collector and waits until it says it is ready.
func (c *testCollector) start(t *testing.T) {
	t.Helper()
	c.cmd = exec.Command(c.bin, "--config", c.config, "--feature-gates=service.profilesSupport")
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		said := false
		for sc.Scan() {
			if !said && strings.Contains(sc.Text(), "Everything is ready") {
				said = true
				ready <- true
			}
		}
		if !said {
			ready <- false
		}
	}()
	select {
	case ok := <-ready:
		if !ok {
			t.Fatal("the collector exited before it was ready")
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the collector did not start within 60s")
	}
}

// stop ends the collector as an operator would (SIGTERM: it flushes).
func (c *testCollector) stop(t *testing.T) {
	if c.cmd == nil || c.cmd.Process == nil {
		return
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		c.cmd.Process.Kill()
		<-done
	}
	c.cmd = nil
}

// messages reads what the collector received, one Profiles per message.
func (c *testCollector) messages(t *testing.T) []pprofile.Profiles {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(c.received, "*.pb"))
	sort.Strings(names)
	var out []pprofile.Profiles
	var u pprofile.ProtoUnmarshaler
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			t.Fatal(err)
		}
		p, err := u.UnmarshalProfiles(b)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		out = append(out, p)
	}
	return out
}

// workload is a shell loop that sleeps (a new process each time) and
// spins a little, declaring a service name.
var workload = []string{"sh", "-c", "while :; do sleep 0.02; i=0; while [ $i -lt 300 ]; do i=$((i+1)); done; done"}

func TestContinuousOTLP(t *testing.T) {
	requireRoot(t)
	col := newTestCollector(t)
	outDir := t.TempDir()
	t.Setenv("OTEL_SERVICE_NAME", "offcpu-test-workload")
	dur := time.Duration(testenv.Scale()) * 4500 * time.Millisecond
	args := append([]string{"record", "--continuous", "--interval", "1s", "-d", dur.String(), "--output-dir", outDir,
		"--otlp-endpoint", col.grpc, "--otlp-insecure", "--otlp-header", "x-tenant=test", "--"}, workload...)
	summary, err := run(t, args...)
	if err != nil {
		t.Fatalf("record: %v\n%s", err, summary)
	}
	t.Log(summary)
	if !strings.Contains(summary, "(tp_btf)") {
		t.Errorf("recorded without tp_btf:\n%s", summary)
	}
	// The agent's default walks at the switch-in; a kernel that cannot
	// says so from the start.
	for _, f := range kernel.Features() {
		warned := strings.Contains(summary, "warning: --walk-threshold and --budget not used")
		if f.Name == "sched_exit_tp tracepoint" && f.Have == warned {
			t.Errorf("sched_exit_tp present: %v, warned of walks at the switch-out: %v:\n%s", f.Have, warned, summary)
		}
	}
	col.stop(t) // flushes its exporter
	files := intervalFiles(t, outDir)
	// 4 whole seconds and the rest, where a cut takes less than the
	// interval; a slower machine (a kernel under qemu) cuts fewer.
	want := int(dur/time.Second) + 1
	if slowestInterval(summary) > 1500*time.Millisecond {
		want = 3
	}
	if len(files) < want || (want > 3 && len(files) != want) {
		t.Fatalf("%d interval files in --output-dir, want %d:\n%s", len(files), want, summary)
	}
	if !strings.Contains(summary, fmt.Sprintf("%d intervals exported", len(files))) || !strings.Contains(summary, "0 dropped (0 samples)") {
		t.Errorf("summary does not report %d intervals exported and none dropped:\n%s", len(files), summary)
	}
	msgs := col.messages(t)
	if len(msgs) != len(files) {
		t.Fatalf("the collector received %d messages for %d intervals", len(msgs), len(files))
	}
	byStart := map[int64]pprofile.Profiles{}
	for _, m := range msgs {
		byStart[messageStart(m)] = m
	}
	host, _ := os.Hostname()
	for _, f := range files {
		p := readProfile(t, f)
		m, ok := byStart[p.TimeNanos]
		if !ok {
			t.Fatalf("%s: no message with its start time", filepath.Base(f))
		}
		want := pprofTotals(t, p, readWakeups(t, f))
		got := otlpTotals(m)
		if len(want) == 0 {
			t.Fatalf("%s: no samples", filepath.Base(f))
		}
		for k, w := range want {
			if g := got[k]; math.Abs(float64(g-w)) > 0.001*float64(w) {
				t.Errorf("%s: %s of tid %d: OTLP %d, pprof %d", filepath.Base(f), k.typ, k.tid, g, w)
			}
		}
		for k, g := range got {
			if _, ok := want[k]; !ok && g != 0 {
				t.Errorf("%s: %s of tid %d: OTLP %d, not in the pprof", filepath.Base(f), k.typ, k.tid, g)
			}
		}
		checkAttributes(t, filepath.Base(f), m, host)
	}
}

var intervalLine = regexp.MustCompile(`interval \d+: ([0-9.]+[a-zµ]+) from`)

// slowestInterval is the longest interval the summary lists.
func slowestInterval(summary string) time.Duration {
	var d time.Duration
	for _, m := range intervalLine.FindAllStringSubmatch(summary, -1) {
		if v, err := time.ParseDuration(m[1]); err == nil && v > d {
			d = v
		}
	}
	return d
}

// Only OTEL_EXPORTER_OTLP_ENDPOINT (http/protobuf, the specification's
// default) points the agent at the collector; OTEL_RESOURCE_ATTRIBUTES
// reach every resource.
func TestContinuousOTLPFromEnv(t *testing.T) {
	requireRoot(t)
	col := newTestCollector(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+col.http)
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci-env,k8s.cluster.name=lab%201")
	args := append([]string{"record", "--continuous", "--interval", "1s", "-d", "2500ms", "--"}, workload...)
	summary, err := run(t, args...)
	if err != nil {
		t.Fatalf("record: %v\n%s", err, summary)
	}
	col.stop(t)
	if !strings.Contains(summary, "3 intervals exported") {
		t.Errorf("summary does not report 3 intervals exported:\n%s", summary)
	}
	msgs := col.messages(t)
	if len(msgs) != 3 {
		t.Fatalf("the collector received %d messages, want 3:\n%s", len(msgs), summary)
	}
	resources := 0
	for _, m := range msgs {
		eachProfile(m, func(r pcommon.Resource, _ pprofile.Profile) {
			resources++
			env, _ := r.Attributes().Get("deployment.environment")
			cluster, _ := r.Attributes().Get("k8s.cluster.name")
			if env.Str() != "ci-env" || cluster.Str() != "lab 1" {
				t.Errorf("resource without OTEL_RESOURCE_ATTRIBUTES: deployment.environment %q, k8s.cluster.name %q", env.Str(), cluster.Str())
			}
		})
	}
	if resources == 0 {
		t.Fatal("no resource received")
	}
}

// TestContinuousCollectorRestart stops the collector for a while: the
// recording goes on, the exporter retries, and what it says it dropped is
// exactly what the collector did not receive.
func TestContinuousCollectorRestart(t *testing.T) {
	requireRoot(t)
	col := newTestCollector(t)
	outDir := t.TempDir()
	args := append([]string{"record", "--continuous", "--interval", "1s", "-d", "8500ms", "--output-dir", outDir,
		"--otlp-endpoint", col.http, "--otlp-protocol", "http", "--otlp-insecure", "--otlp-queue", "2", "--otlp-retry", "2s", "--shutdown-timeout", "5s", "--"}, workload...)
	var summary string
	var err error
	done := make(chan struct{})
	go func() { summary, err = run(t, args...); close(done) }()
	time.Sleep(2500 * time.Millisecond)
	col.stop(t)
	time.Sleep(4 * time.Second)
	col.start(t)
	<-done
	if err != nil {
		t.Fatalf("record: %v\n%s", err, summary)
	}
	t.Log(summary)
	col.stop(t)
	files := intervalFiles(t, outDir)
	if len(files) != 9 {
		t.Errorf("%d interval files, want 9: the recording must go on while the collector is down", len(files))
	}
	m := regexp.MustCompile(`OTLP: (\d+) intervals exported \(\d+ samples, \d+ messages\), (\d+) dropped \(\d+ samples\), (\d+) retries`).FindStringSubmatch(summary)
	if m == nil {
		t.Fatalf("no export summary:\n%s", summary)
	}
	exported, _ := strconv.Atoi(m[1])
	dropped, _ := strconv.Atoi(m[2])
	retries, _ := strconv.Atoi(m[3])
	starts := map[int64]bool{}
	for _, msg := range col.messages(t) {
		starts[messageStart(msg)] = true
	}
	if exported+dropped != len(files) {
		t.Errorf("exported %d + dropped %d != %d intervals", exported, dropped, len(files))
	}
	if len(starts) != exported {
		t.Errorf("the collector holds %d distinct intervals, offcpu says it exported %d", len(starts), exported)
	}
	if dropped == 0 || retries == 0 {
		t.Errorf("with the collector down for 4s, a queue of 2 and 2s of retries, some intervals must be retried and dropped: %d dropped, %d retries", dropped, retries)
	}
	for _, f := range files {
		if p := readProfile(t, f); !starts[p.TimeNanos] {
			dropped--
		}
	}
	if dropped != 0 {
		t.Errorf("intervals missing at the collector differ from those reported dropped by %d", dropped)
	}
}

func intervalFiles(t *testing.T, dir string) []string {
	t.Helper()
	names, _ := filepath.Glob(filepath.Join(dir, "offcpu-*.pb.gz"))
	var out []string
	for _, n := range names {
		if !strings.HasSuffix(n, ".wakeups.pb.gz") {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

func readProfile(t *testing.T, path string) *profile.Profile {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	p, err := profile.Parse(fh)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return p
}

func readWakeups(t *testing.T, path string) *profile.Profile {
	return readProfile(t, strings.TrimSuffix(path, ".pb.gz")+".wakeups.pb.gz")
}

type typeTID struct {
	typ string
	tid int64
}

// pprofTotals sums the pprof's own values per thread: blocked, waiting for
// a CPU, on-CPU; wake-ups per waker thread.
func pprofTotals(t *testing.T, p, wake *profile.Profile) map[typeTID]int64 {
	t.Helper()
	idx := func(p *profile.Profile, typ string) int {
		i, err := schema.SampleIndex(p, typ)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	off, runq, cpu := idx(p, schema.OffCPU), idx(p, schema.RunQueue), idx(p, schema.CPU)
	out := map[typeTID]int64{}
	for _, s := range p.Sample {
		tid := numLabel0(s, schema.LabelTID)
		if len(s.Label[schema.LabelState]) > 0 && s.Label[schema.LabelState][0] == "preempted" {
			out[typeTID{otlp.TypeRunQueue, tid}] += s.Value[off]
		} else {
			out[typeTID{otlp.TypeOffCPU, tid}] += s.Value[off] - s.Value[runq]
			out[typeTID{otlp.TypeRunQueue, tid}] += s.Value[runq]
		}
		out[typeTID{otlp.TypeCPU, tid}] += s.Value[cpu]
	}
	w := idx(wake, schema.Wakeups)
	for _, s := range wake.Sample {
		out[typeTID{otlp.TypeWakeups, numLabel0(s, schema.LabelTID)}] += s.Value[w]
	}
	for k, v := range out {
		if v == 0 {
			delete(out, k)
		}
	}
	return out
}

func numLabel0(s *profile.Sample, k string) int64 {
	if v := s.NumLabel[k]; len(v) > 0 {
		return v[0]
	}
	return 0
}

func otlpTotals(m pprofile.Profiles) map[typeTID]int64 {
	dict := m.Dictionary()
	strs := dict.StringTable()
	out := map[typeTID]int64{}
	eachProfile(m, func(_ pcommon.Resource, p pprofile.Profile) {
		typ := strs.At(int(p.SampleType().TypeStrindex()))
		for i := 0; i < p.Samples().Len(); i++ {
			s := p.Samples().At(i)
			attrs, _ := pprofile.FromAttributeIndices(dict.AttributeTable(), s, dict)
			tid, _ := attrs.Get(otlp.AttrThreadID)
			for j := 0; j < s.Values().Len(); j++ {
				out[typeTID{typ, tid.Int()}] += s.Values().At(j)
			}
		}
	})
	return out
}

func eachProfile(m pprofile.Profiles, fn func(pcommon.Resource, pprofile.Profile)) {
	for i := 0; i < m.ResourceProfiles().Len(); i++ {
		rp := m.ResourceProfiles().At(i)
		for j := 0; j < rp.ScopeProfiles().Len(); j++ {
			ps := rp.ScopeProfiles().At(j).Profiles()
			for k := 0; k < ps.Len(); k++ {
				fn(rp.Resource(), ps.At(k))
			}
		}
	}
}

func messageStart(m pprofile.Profiles) int64 {
	var start int64
	eachProfile(m, func(_ pcommon.Resource, p pprofile.Profile) { start = int64(p.Time()) })
	return start
}

// checkAttributes checks the resource, sample and mapping attributes.
func checkAttributes(t *testing.T, name string, m pprofile.Profiles, host string) {
	t.Helper()
	dict := m.Dictionary()
	strs := dict.StringTable()
	service, verdicts, buildIDs := false, map[string]bool{}, 0
	eachProfile(m, func(r pcommon.Resource, p pprofile.Profile) {
		ra := r.Attributes()
		if h, _ := ra.Get(otlp.AttrHostName); h.Str() != host {
			t.Errorf("%s: host.name %q, want %q", name, h.Str(), host)
		}
		if pid, ok := ra.Get(otlp.AttrPID); !ok || pid.Int() < 0 {
			t.Errorf("%s: no process.pid", name)
		}
		if exe, ok := ra.Get(otlp.AttrExecutable); !ok || exe.Str() == "" {
			t.Errorf("%s: no process.executable.name", name)
		}
		if s, ok := ra.Get(otlp.AttrServiceName); ok && s.Str() == "offcpu-test-workload" {
			service = true
		}
		typ := strs.At(int(p.SampleType().TypeStrindex()))
		unit := strs.At(int(p.SampleType().UnitStrindex()))
		if (typ == otlp.TypeWakeups) != (unit == "count") || (unit != "count" && unit != "nanoseconds") {
			t.Errorf("%s: sample type %s/%s", name, typ, unit)
		}
		for i := 0; i < p.Samples().Len(); i++ {
			attrs, err := pprofile.FromAttributeIndices(dict.AttributeTable(), p.Samples().At(i), dict)
			if err != nil {
				t.Fatal(err)
			}
			if th, ok := attrs.Get(otlp.AttrThreadName); !ok || th.Str() == "" {
				t.Errorf("%s: a %s sample without thread.name", name, typ)
			}
			if typ == otlp.TypeOffCPU {
				v, _ := attrs.Get(otlp.AttrVerdict)
				c, _ := attrs.Get(otlp.AttrCategory)
				if c.Str() == "" || (v.Str() != "idle" && v.Str() != "blocked") {
					t.Errorf("%s: off_cpu sample with verdict %q, category %q", name, v.Str(), c.Str())
				}
				verdicts[v.Str()] = true
			}
		}
	})
	for i := 0; i < dict.MappingTable().Len(); i++ {
		mp := dict.MappingTable().At(i)
		attrs, _ := pprofile.FromAttributeIndices(dict.AttributeTable(), mp, dict)
		if b, ok := attrs.Get(otlp.AttrBuildID); ok && b.Str() != "" {
			buildIDs++
		}
	}
	if !service {
		t.Errorf("%s: no resource with service.name from the workload's OTEL_SERVICE_NAME", name)
	}
	if len(verdicts) == 0 {
		t.Errorf("%s: no off_cpu sample", name)
	}
	if buildIDs == 0 {
		t.Errorf("%s: no mapping with a build id", name)
	}
}

// The output directory keeps the newest --keep intervals, each with its
// wake-up profile, and a reader never sees a half-written file.
func TestOutputDirRotation(t *testing.T) {
	dir := t.TempDir()
	ag, err := agent.New(io.Discard, true, &agent.Settings{OutputDir: dir, Keep: 2}, "test", 0)
	if err != nil {
		t.Fatal(err)
	}
	p := &profile.Profile{SampleType: []*profile.ValueType{{Type: "off_cpu", Unit: "nanoseconds"}}}
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	for i := 1; i <= 4; i++ {
		iv := &collector.Interval{Seq: i, Start: start.Add(time.Duration(i) * 10 * time.Second), Duration: 10 * time.Second, Profile: p, Wakeups: p}
		if err := ag.WriteInterval(iv); err != nil {
			t.Fatal(err)
		}
	}
	names, _ := filepath.Glob(filepath.Join(dir, "*"))
	var base []string
	for _, n := range names {
		base = append(base, filepath.Base(n))
	}
	want := []string{"offcpu-20261201T100030.000Z-000003.pb.gz", "offcpu-20261201T100030.000Z-000003.wakeups.pb.gz",
		"offcpu-20261201T100040.000Z-000004.pb.gz", "offcpu-20261201T100040.000Z-000004.wakeups.pb.gz"}
	if strings.Join(base, " ") != strings.Join(want, " ") {
		t.Errorf("files kept: %v, want %v", base, want)
	}
}
