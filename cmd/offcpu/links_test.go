package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/pprofile"

	"github.com/offcpu/offcpu/otlp"
	"github.com/offcpu/offcpu/schema"
)

// The labelled Go server (collector/testdata/golabels) recorded in
// continuous mode with --goroutines: each interval's goroutine waits go
// to --output-dir and to the collector, every labelled sample with its
// trace and span as its OTLP link and its labels as attributes, and the
// time per route over the intervals is the requests' own.
func TestContinuousGoroutineLinks(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	bin, report := filepath.Join(dir, "golabels"), filepath.Join(dir, "report.json")
	if out, err := exec.Command("go", "build", "-o", bin, "../../collector/testdata/golabels").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	col := newTestCollector(t)
	outDir := t.TempDir()
	summary, err := run(t, "record", "--continuous", "--goroutines", "--interval", "1s", "--output-dir", outDir,
		"--otlp-endpoint", col.grpc, "--otlp-insecure", "--", bin, report, "3s")
	if err != nil {
		t.Fatalf("record: %v\n%s", err, summary)
	}
	col.stop(t)
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var reqs []struct {
		Trace string `json:"trace_id"`
		Span  string `json:"span_id"`
		Route string `json:"route"`
		Wait  int64  `json:"wait_ns"`
	}
	if err := json.Unmarshal(b, &reqs); err != nil {
		t.Fatal(err)
	}
	spans, own := map[string]string{}, map[string]int64{}
	for _, r := range reqs {
		spans[r.Span] = r.Trace
		own[r.Route] += r.Wait
	}

	// The intervals' goroutine profiles, per route.
	files, _ := filepath.Glob(filepath.Join(outDir, "offcpu-*.goroutines.pb.gz"))
	// One per interval: 3 s of load cut every second, or, where a cut
	// takes longer than the interval (-race on a loaded machine: 2.5 s and
	// 5.1 s), as few as two.
	if n := strings.Count(summary, ": interval "); len(files) < 2 || len(files) != n {
		t.Fatalf("%d goroutine profiles in --output-dir for %d intervals, want one per interval (2 or more):\n%s", len(files), n, summary)
	}
	byRoute := map[string]int64{}
	for _, f := range files {
		for _, s := range readProfile(t, f).Sample {
			if r := schema.ProgramLabels(s)["http.route"]; r != "" {
				byRoute[r] += s.Value[0] + s.Value[1]
			}
		}
	}
	checkRoutes(t, byRoute, own)

	// OTLP: labelled goroutine samples link to their request's span.
	checkOTLPLinks(t, col, otlp.TypeGoroutineBlocked, spans)
}

// checkOTLPLinks: every sample of type typ with an http.route attribute
// links to its request's span and trace (spans: span → trace, hex).
func checkOTLPLinks(t *testing.T, col *testCollector, typ string, spans map[string]string) {
	t.Helper()
	var linked, labelled, wrong int
	for _, m := range col.messages(t) {
		dict := m.Dictionary()
		strs := dict.StringTable()
		eachProfile(m, func(_ pcommon.Resource, p pprofile.Profile) {
			if strs.At(int(p.SampleType().TypeStrindex())) != typ {
				return
			}
			for i := 0; i < p.Samples().Len(); i++ {
				s := p.Samples().At(i)
				attrs, _ := pprofile.FromAttributeIndices(dict.AttributeTable(), s, dict)
				route, ok := attrs.Get("http.route")
				if !ok {
					continue
				}
				labelled++
				if s.LinkIndex() == 0 {
					continue
				}
				l := dict.LinkTable().At(int(s.LinkIndex()))
				span, trace := l.SpanID(), l.TraceID()
				sid, tid := hex.EncodeToString(span[:]), hex.EncodeToString(trace[:])
				if spans[sid] != tid || !strings.HasPrefix(route.Str(), "/") {
					wrong++
					continue
				}
				linked++
			}
		})
	}
	t.Logf("OTLP: %d labelled %s samples, %d linked to their request's span, %d wrong", labelled, typ, linked, wrong)
	if labelled == 0 || linked != labelled || wrong != 0 {
		t.Errorf("OTLP: %d labelled %s samples, %d linked to their span, %d to another", labelled, typ, linked, wrong)
	}
}

// checkRoutes compares the time per route over the intervals with the
// requests' own, within 2%.
func checkRoutes(t *testing.T, byRoute, own map[string]int64) {
	t.Helper()
	for route, w := range own {
		d := float64(byRoute[route]-w) / float64(w)
		t.Logf("route %-11s intervals %8.1f ms, the requests' own %8.1f ms: %+.2f%%", route, float64(byRoute[route])/1e6, float64(w)/1e6, 100*d)
		if math.Abs(d) > 0.02 {
			t.Errorf("route %s: %.1f ms over the intervals, the requests' own %.1f ms", route, float64(byRoute[route])/1e6, float64(w)/1e6)
		}
	}
}

// The C server that publishes OpenTelemetry thread context
// (collector/testdata/tctx) recorded in continuous mode: its thread waits
// carry their request's span over the intervals (time per route the
// requests' own) and in OTLP (each labelled off-CPU sample linked).
func TestContinuousThreadContextLinks(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	bin, report := filepath.Join(dir, "server"), filepath.Join(dir, "report")
	if out, err := exec.Command("gcc", "-O2", "-pthread", "-rdynamic", "-o", bin, "../../collector/testdata/tctx/server.c").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	col := newTestCollector(t)
	outDir := t.TempDir()
	summary, err := run(t, "record", "--continuous", "--interval", "1s", "--output-dir", outDir,
		"--otlp-endpoint", col.grpc, "--otlp-insecure", "--", bin, "3", report)
	if err != nil {
		t.Fatalf("record: %v\n%s", err, summary)
	}
	col.stop(t)
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	// span route off-CPU ns; the server's trace id: 0xab, then the span's
	// bytes.
	spans, own := map[string]string{}, map[string]int64{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var span, route string
		var ns int64
		if _, err := fmt.Sscan(line, &span, &route, &ns); err != nil {
			t.Fatalf("report line %q: %v", line, err)
		}
		spans[span] = "ab00000000000000" + span
		own[route] += ns
	}
	files, _ := filepath.Glob(filepath.Join(outDir, "offcpu-*.pb.gz"))
	byRoute, n := map[string]int64{}, 0
	for _, f := range files {
		if strings.Contains(f, ".goroutines.") || strings.Contains(f, ".wakeups.") {
			continue
		}
		n++
		for _, s := range readProfile(t, f).Sample {
			if r := schema.ProgramLabels(s)["http.route"]; r != "" {
				byRoute[r] += s.Value[0]
			}
		}
	}
	if n < 2 {
		t.Fatalf("%d interval profiles:\n%s", n, summary)
	}
	checkRoutes(t, byRoute, own)
	checkOTLPLinks(t, col, otlp.TypeOffCPU, spans)
}
