package collector

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/collector/threadctx"
	"github.com/offcpu/offcpu/internal/testenv"
	"github.com/offcpu/offcpu/runtimes/golang"
	"github.com/offcpu/offcpu/schema"
)

// A Go HTTP server whose requests run under pprof.Do with trace_id,
// span_id and http.route labels, each measuring its own waits (a mutex, a
// channel a worker answers, a downstream service over loopback, a sleep):
// the goroutine waits recorded carry the labels, and their time per span
// and per route is the requests' own. Built with the building toolchain
// (labels in a sorted slice) and Debian's Go 1.19 (in a map).
func TestGoLabels(t *testing.T) {
	requireBPF(t)
	tools := map[string]string{"current": "go"}
	if haveGo119(t) {
		tools["go1.19"] = go119Bin
	}
	// A collection after every request: a request's label set is often
	// allocated where the last one's was freed, and must not take its id.
	tools["gc-each-request"] = "go"
	for name, gobin := range tools {
		t.Run(name, func(t *testing.T) {
			if name == "gc-each-request" {
				t.Setenv("GOLABELS_GC", "1")
			}
			checkGoLabels(t, gobin)
		})
	}
}

type labelledRequest struct {
	Trace string `json:"trace_id"`
	Span  string `json:"span_id"`
	Route string `json:"route"`
	Wait  int64  `json:"wait_ns"`
}

// buildGoLabels builds testdata/golabels with gobin (and go build's
// extra flags): the executable and where it writes its report.
func buildGoLabels(t *testing.T, gobin string, flags ...string) (bin, report string) {
	t.Helper()
	return buildGoTestdata(t, "golabels", gobin, flags...), filepath.Join(t.TempDir(), "report.json")
}

// buildGoTestdata builds the program in testdata/prog as a module of Go
// 1.19 with gobin (and go build's extra flags). The build directory is
// named by the program, toolchain and flags, so that the kernel matrix's
// guests find the host's build (testenv's prebuilt).
func buildGoTestdata(t *testing.T, prog, gobin string, flags ...string) string {
	t.Helper()
	name := strings.NewReplacer("/", "_", "=", "_").Replace(strings.Join(append([]string{gobin}, flags...), ""))
	dir := filepath.Join(os.TempDir(), "offcpu-"+prog, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	srcs, err := filepath.Glob(filepath.Join("testdata", prog, "*.go"))
	if (err != nil || len(srcs) == 0) && os.Getenv(testenv.EnvPrebuilt) == "" {
		t.Fatalf("testdata/%s: no Go files (%v)", prog, err)
	}
	for _, f := range srcs {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, filepath.Base(f)), src, 0o644)
	}
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module "+prog+"\n\ngo 1.19\n"), 0o644)
	bin := filepath.Join(dir, prog)
	t.Setenv("GOFLAGS", "")
	t.Setenv("GOTOOLCHAIN", "local")
	if err := testenv.BuildIn(dir, gobin, append(append([]string{"build"}, flags...), "-o", bin, ".")...); err != nil {
		t.Fatal(err)
	}
	return bin
}

func readLabelledRequests(t *testing.T, report string) []labelledRequest {
	t.Helper()
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var reqs []labelledRequest
	if err := json.Unmarshal(b, &reqs); err != nil {
		t.Fatal(err)
	}
	return reqs
}

func checkGoLabels(t *testing.T, gobin string) {
	bin, report := buildGoLabels(t, gobin)
	s := recordGoCommand(t, bin, report, "2s")
	reqs := readLabelledRequests(t, report)
	gp := s.Profiles().Goroutines
	st := s.Stats().Goroutines
	t.Logf("%d requests; goroutine stats %+v", len(reqs), *st)
	if st.LostLabelSets+st.ShedLabelSets+st.TruncatedLabel != 0 || st.LabelSets == 0 {
		t.Errorf("label sets: %d read for %d requests, %d lost, %d shed, %d cut short", st.LabelSets, len(reqs), st.LostLabelSets, st.ShedLabelSets, st.TruncatedLabel)
	}

	// offcpu's time per span (blocked and waiting for a CPU after it: the
	// request's clock runs through both) and per route.
	bySpan, byRoute, routeOf := spanTimes(gp, 0, 1)
	reqs = withoutPreempted(t, reqs, bySpan, s.Profiles().OffCPU)
	// Emulated (one vCPU) the probe's traps and the system calls inside a
	// request's clock run slowly, on the CPU: routes read up to -3.2% in
	// Debian's guests (-6.3% with three CPU burners on the host), up to
	// -0.4% on this machine.
	tol := 0.02
	if testenv.Scale() > 1 {
		tol = 0.05
	}
	checkSpanTimes(t, reqs, bySpan, byRoute, routeOf, 5, "/mutex", tol, 0, false)
	checkLabelledVerdicts(t, gp, "monitor-wait", "peer-wait", "downstream-wait", "request-timer")
}

// spanSum: a span's blocked time, waiting for a CPU, and the part of
// its blocked time spent in the runtime's collection (an assist, a stop
// of the world: a request's labels, not always inside its own clock).
type spanSum struct {
	blocked, runq, gc, threadless int64
	samples                       []*profile.Sample // for a failure's log
	bi                            int               // their blocked value's index
}

// gcWait: a goroutine wait reason of Go's collector (runtime2.go's
// waitReasonStrings; "preempted": suspended for a stack scan).
func gcWait(reason string) bool {
	if reason == "preempted" {
		return true
	}
	for _, p := range []string{"GC ", "garbage collection", "stopping the world", "flushing proc caches", "wait for GC cycle"} {
		if strings.HasPrefix(reason, p) {
			return true
		}
	}
	return false
}

// withoutPreempted sets aside a request with no goroutine wait whose
// thread was off-CPU for at least half of its wait, labelled with its
// span through the thread's g (threads: the thread profile): preempted
// between its write and its read, its reply came meanwhile and it never
// parked (1 of 606 in Debian 6.12's guest).
func withoutPreempted(t *testing.T, reqs []labelledRequest, bySpan map[string]*spanSum, threads *profile.Profile) []labelledRequest {
	t.Helper()
	th, _, _ := spanTimes(threads, 3, 4)
	kept := make([]labelledRequest, 0, len(reqs))
	for _, r := range reqs {
		if v := th[r.Span]; r.Wait > int64(time.Millisecond) && bySpan[r.Span] == nil && v != nil && 2*(v.blocked+v.runq) >= r.Wait {
			t.Logf("request %+v: no goroutine wait; its thread off-CPU %v (%v waiting for a CPU)", r, time.Duration(v.blocked+v.runq), time.Duration(v.runq))
			continue
		}
		kept = append(kept, r)
	}
	return kept
}

// addThreadless adds a goroutine profile's labelled waits on no thread
// to spanTimes' sums of a thread profile: waits for a P alone (put back
// on a run queue) and the GC's suspensions (parked by preemptPark).
func addThreadless(bySpan map[string]*spanSum, byRoute map[string]int64, routeOf map[string]string, gp *profile.Profile) {
	for _, smp := range gp.Sample {
		l := schema.ProgramLabels(smp)
		reason := smp.Label[schema.LabelReason][0]
		if l["span_id"] == "" || (reason != golang.ReasonRunnable && reason != "preempted") {
			continue
		}
		v := bySpan[l["span_id"]]
		if v == nil {
			v = &spanSum{}
			bySpan[l["span_id"]] = v
		}
		v.blocked += smp.Value[0]
		v.runq += smp.Value[1]
		if gcWait(reason) {
			v.gc += smp.Value[0]
		}
		v.threadless += smp.Value[0] + smp.Value[1]
		byRoute[l["http.route"]] += smp.Value[0] + smp.Value[1]
		routeOf[l["span_id"]] = l["http.route"]
	}
}

// spanTimes sums a profile's labelled samples by span (blocked and
// waiting for a CPU: the values at bi and ri) and by route.
func spanTimes(p *profile.Profile, bi, ri int) (bySpan map[string]*spanSum, byRoute map[string]int64, routeOf map[string]string) {
	bySpan, byRoute, routeOf = map[string]*spanSum{}, map[string]int64{}, map[string]string{}
	for _, smp := range p.Sample {
		l := schema.ProgramLabels(smp)
		if l["span_id"] == "" {
			continue
		}
		v := bySpan[l["span_id"]]
		if v == nil {
			v = &spanSum{bi: bi}
			bySpan[l["span_id"]] = v
		}
		v.blocked += smp.Value[bi]
		v.runq += smp.Value[ri]
		v.samples = append(v.samples, smp)
		if r := smp.Label[schema.LabelReason]; len(r) > 0 && gcWait(r[0]) {
			v.gc += smp.Value[bi]
		}
		byRoute[l["http.route"]] += smp.Value[bi] + smp.Value[ri]
		routeOf[l["span_id"]] = l["http.route"]
	}
	return bySpan, byRoute, routeOf
}

// checkSpanTimes: every request that waited over 1 ms has its span, with
// its route; the 20 that waited most are within 5% of their own clocks
// (Go's thread view, goThreads: surplus run-queue time logged),
// each route within routeTol. With deferred walks, as many requests as
// the kernel ran no program for a switch-in of (missedIns: their walk
// never ran) may lack their span. A request of route mayNotPark (a lock taken
// without parking, its thread preempted by the kernel meanwhile: no
// goroutine wait) may lack its span, at most one waiting request in 200.
func checkSpanTimes(t *testing.T, reqs []labelledRequest, bySpan map[string]*spanSum, byRoute map[string]int64, routeOf map[string]string, routes int, mayNotPark string, routeTol float64, missedIns uint64, goThreads bool) {
	t.Helper()
	own := map[string]labelledRequest{}
	ownRoute, ownN := map[string]int64{}, map[string]int64{}
	// A request whose clock reads below zero had its wall and CPU clocks
	// disagree (once in a Debian 6.1 TCG guest: -1 ms for a span that
	// blocked 1 ms): left out, with its span, at most one in 100.
	var kept []labelledRequest
	var skewed int
	for _, r := range reqs {
		own[r.Span] = r
		if r.Wait < 0 {
			skewed++
			if v := bySpan[r.Span]; v != nil {
				byRoute[r.Route] -= v.blocked + v.runq
				delete(bySpan, r.Span)
			}
			t.Logf("request %s (%s): its own clock reads %v, left out", r.Span, r.Route, time.Duration(r.Wait))
			continue
		}
		kept = append(kept, r)
		ownRoute[r.Route] += r.Wait
		ownN[r.Route]++
	}
	if skewed > len(reqs)/100 {
		t.Errorf("%d of %d requests' own clocks read below zero", skewed, len(reqs))
	}
	reqs = kept
	for span, route := range routeOf {
		if r, ok := own[span]; !ok || r.Route != route {
			t.Errorf("span %s: route %q recorded, the server's %q (known %v)", span, route, r.Route, ok)
		}
	}
	// A request that waited parked at least once (an uncontended lock
	// does not): its span is recorded.
	var waited, missing, unparked int
	for i, r := range reqs {
		if r.Wait > int64(time.Millisecond) {
			waited++
			if bySpan[r.Span] == nil {
				t.Logf("no span recorded for request %d of %d: %+v", i, len(reqs), r)
				if r.Route == mayNotPark {
					unparked++
				} else {
					missing++
				}
			}
		}
	}
	t.Logf("%d requests, %d waited over 1 ms, %d of them without their span in the recording (%d of route %q)",
		len(reqs), waited, missing+unparked, unparked, mayNotPark)
	// A span holding more than its request waited holds another's waits
	// (a label set misnamed), or its thread's time preempted outside the
	// request's own clock (waiting for a CPU), or a collector's wait
	// outside it (in a Debian 6.1 guest one span read 2.8 ms over, with
	// 23.7 ms of collector waits among the run's labelled ones): logged.
	// Blocked beyond it, the collector's waits aside, is the misnamed
	// set's.
	surplus, blockedSurplus := 0, 0
	for span, v := range bySpan {
		r, ok := own[span]
		if !ok {
			continue
		}
		tol := r.Wait + max(r.Wait/20, int64(time.Millisecond))
		if v.blocked+v.runq > tol {
			surplus++
			t.Logf("span %s (%s): offcpu %v (blocked %v, %v of it in the collector), the request's own %v", span, r.Route, time.Duration(v.blocked+v.runq), time.Duration(v.blocked), time.Duration(v.gc), time.Duration(r.Wait))
		}
		if v.blocked-v.gc > tol {
			blockedSurplus++
			// Where the surplus blocked: the span's largest blocked samples.
			sort.Slice(v.samples, func(i, j int) bool { return v.samples[i].Value[v.bi] > v.samples[j].Value[v.bi] })
			for _, smp := range v.samples[:min(3, len(v.samples))] {
				t.Logf("  blocked %v: %s", time.Duration(smp.Value[v.bi]), schema.FoldedSample(smp))
			}
		}
	}
	t.Logf("%d spans hold over 5%% and 1 ms more than their request waited, %d of them blocked", surplus, blockedSurplus)
	// A collection after every request (GOLABELS_GC) checks the sets' ids:
	// a misnamed set gives its waits to another request. Its stops of the
	// world run inside other requests' clocks, not in a wait: the top 20
	// are logged, not held to 5%, and routes to 5%.
	gcEach := os.Getenv("GOLABELS_GC") != ""
	if gcEach {
		routeTol = max(routeTol, 0.05)
		if blockedSurplus > 0 {
			t.Errorf("%d spans hold blocked time beyond their request's own: another request's waits", blockedSurplus)
		}
	}
	if waited == 0 || uint64(missing) > missedIns || unparked > waited/200 {
		t.Errorf("%d of %d requests that waited over 1 ms have no span in the recording", missing+unparked, waited)
	}
	// The 20 requests with the most blocked time, each within 5%. A wait
	// whose switch-in ran no program lost its link (deferred walks): as
	// many spans as such switch-ins left over may be short.
	sort.Slice(reqs, func(i, j int) bool { return reqs[i].Wait > reqs[j].Wait })
	checked, worstSpan, over, threadlessTop := 0, 0.0, 0, int64(0)
	unlinked := int(missedIns) - missing
	for _, r := range reqs[:min(20, len(reqs))] {
		v := bySpan[r.Span]
		if short := v == nil || v.blocked+v.runq < r.Wait*9/10; short && unlinked > 0 {
			unlinked--
			t.Logf("span %s (%s, %v of waits): short of a wait, its switch-in missed (%d missed)", r.Span, r.Route, time.Duration(r.Wait), missedIns)
			continue
		}
		if v == nil {
			t.Errorf("span %s (%s, %v of waits): not recorded", r.Span, r.Route, time.Duration(r.Wait))
			continue
		}
		got := v.blocked + v.runq
		threadlessTop += v.threadless
		d := float64(got-r.Wait) / float64(r.Wait)
		worstSpan = max(worstSpan, math.Abs(d))
		if math.Abs(d) > 0.05 {
			over++
		}
		// A request's clock also runs while its thread is preempted under
		// a running goroutine, which no goroutine wait holds: under -race
		// one span in 20 read -8.4% in 1 of 4 runs. One may miss 5%, none 10%.
		// Emulated guests (one TCG vCPU, OFFCPU_TEST_SCALE > 1): a thread
		// preempted for milliseconds at the edge of its request's
		// publication counts in the request's clock only, and the top 20
		// by that clock select those requests: logged, the routes checked.
		if (gcEach || testenv.Scale() > 1) && math.Abs(d) > 0.05 {
			t.Logf("span %s (%s): offcpu %v (%v on no thread), the request's own %v: %+.1f%% (emulated or collecting: not checked)", r.Span, r.Route, time.Duration(got), time.Duration(v.threadless), time.Duration(r.Wait), 100*d)
		} else if goThreads && d > 0.05 && v.blocked <= r.Wait+max(r.Wait/20, int64(time.Millisecond)) {
			// Go's thread view under load: a thread preempted just after
			// its request's clock, its goroutine's labels still on (+12%
			// to +28% with two CPU burners): run-queue time, logged.
			over--
			t.Logf("span %s (%s): offcpu %v (blocked %v), the request's own %v: %+.1f%% (waiting for a CPU after its clock)", r.Span, r.Route, time.Duration(got), time.Duration(v.blocked), time.Duration(r.Wait), 100*d)
		} else if goThreads && math.Abs(d) > 0.05 && over <= 2 {
			// Go's thread view: two may miss, by any amount (one of 32
			// subtests read -12.9% with two CPU burners; CI's host run of
			// go1.19 one within 10% and one -36.4%, routes within 0.81%).
			t.Logf("span %s (%s): offcpu %v (blocked %v, %v on no thread), the request's own %v: %+.1f%% (two may miss)", r.Span, r.Route, time.Duration(got), time.Duration(v.blocked), time.Duration(v.threadless), time.Duration(r.Wait), 100*d)
		} else if math.Abs(d) > 0.10 || (math.Abs(d) > 0.05 && over > 1) {
			t.Errorf("span %s (%s): offcpu %v (blocked %v, %v on no thread), the request's own %v: %+.1f%%", r.Span, r.Route, time.Duration(got), time.Duration(v.blocked), time.Duration(v.threadless), time.Duration(r.Wait), 100*d)
		}
		checked++
	}
	// Emulated, each wait's uprobe traps and system calls run on the CPU
	// inside the request's clock, slowly: a CI guest (112 requests in 2 s)
	// read 150 µs a request short on /mutex (-5.1%, its waits 3 ms), 860
	// µs on /down. A route may miss by routeTol and 250 µs a request there.
	var slack int64
	if testenv.Scale() > 1 {
		slack = int64(250 * time.Microsecond)
	}
	worst := 0.0
	for route, w := range ownRoute {
		d := float64(byRoute[route]-w) / float64(w)
		worst = max(worst, math.Abs(d))
		t.Logf("route %-7s offcpu %8.1f ms, the requests' own %8.1f ms: %+.2f%% (%d requests)", route, float64(byRoute[route])/1e6, float64(w)/1e6, 100*d, ownN[route])
		if math.Abs(float64(byRoute[route]-w)) > routeTol*float64(w)+float64(slack*ownN[route]) {
			t.Errorf("route %s: offcpu %v, the requests' own %v: %+.1f%%", route, time.Duration(byRoute[route]), time.Duration(w), 100*d)
		}
	}
	t.Logf("%d spans recorded, %d of the top 20 checked (%d over 5%%, %v of their time on no thread), at most %.2f%% off; routes at most %.2f%% off", len(bySpan), checked, over, time.Duration(threadlessTop), 100*worstSpan, 100*worst)
	if len(ownRoute) != routes {
		t.Errorf("%d routes served, want %d", len(ownRoute), routes)
	}
}

// checkLabelledVerdicts: every labelled wait is blocked, whatever ended
// it, and none is idle: the request waited through it; some fall in each
// of cats.
func checkLabelledVerdicts(t *testing.T, gp *profile.Profile, cats ...string) {
	t.Helper()
	rules, err := analysis.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	d := loadRecorded(t, gp)
	byCat := map[string]int64{}
	var all, idle int64
	for i := range d.Stacks {
		st := &d.Stacks[i]
		if st.Kind != schema.KindOffCPU || st.WaitsForCPU() || !st.InTrace() {
			continue
		}
		c := rules.Categorize(st)[0]
		byCat[c] += st.Value
		all += st.Value
		if rules.IsIdle(c) {
			idle += st.Value
		}
	}
	t.Logf("labelled waits by category: %v", byCat)
	if all == 0 || idle > all/100 {
		t.Errorf("labelled waits: %v of %v idle, want none", time.Duration(idle), time.Duration(all))
	}
	for _, c := range cats {
		if byCat[c] == 0 {
			t.Errorf("no labelled wait in %s", c)
		}
	}
}

// The same server's handlers blocking their thread in a system call
// (a blocking pipe's read, a nanosleep) under pprof.Do: no goroutine
// parks, and the thread profile alone holds those waits, labelled from
// the thread's own g (read through its TLS). Linked internally (g at -8
// from the thread pointer), externally with C's thread-local variables
// (runtime.tlsg after them in the executable's TLS block) and with Go
// 1.19 (labels in a map); and with deferred walks (a walk threshold).
func TestGoThreadLabels(t *testing.T) {
	requireBPF(t)
	type build struct {
		tool []string
		opts Options
	}
	cases := map[string]build{"current": {[]string{"go"}, Options{NoWakeups: true}},
		"external-c-tls": {[]string{"go", "-tags=ctls", "-ldflags=-linkmode=external"}, Options{NoWakeups: true}},
		// Walked at the switch-in where the kernel has sched_exit_tp.
		"deferred-walks": {[]string{"go"}, Options{NoWakeups: true, WalkThreshold: 100 * time.Microsecond}},
		// A request's set at the address of the last one's, freed.
		"gc-each-request": {[]string{"go"}, Options{NoWakeups: true}}}
	if haveGo119(t) {
		cases["go1.19"] = build{[]string{go119Bin}, Options{NoWakeups: true}}
	}
	for name, c := range cases {
		// A thread back from its system call may find no P (a stop of the
		// world, sysmon took it): its goroutine waits for one on a run
		// queue, on no thread, inside the request's clock. The goroutine
		// profile's waits on no thread (for a P, the GC's suspensions),
		// labelled, count too: with two CPU burners here, spans read -64%
		// and -66% without them (5.4 and 6.0 ms waiting for a P).
		// Emulated, its traps are slow (92 s for the test in a 6.12 guest,
		// 32 s in an earlier run without), under tolerances that hold
		// without them.
		c.opts.Goroutines = testenv.Scale() == 1 || name == "gc-each-request"
		t.Run(name, func(t *testing.T) {
			if name == "gc-each-request" {
				t.Setenv("GOLABELS_GC", "1")
			}
			bin, report := buildGoLabels(t, c.tool[0], c.tool[1:]...)
			f, err := threadctx.FileAccess(bin)
			// With C's variables the slot moves (where, the linker says):
			// the labels read below tell whether it was found.
			if err != nil || f.Model != "go" || (f.Offset == -8) == (name == "external-c-tls") {
				t.Fatalf("%s: %+v, %v; want Go's g in TLS (at -8 without C's variables)", name, f, err)
			}
			p, s := recordCommand(t, c.opts, exec.Command(bin, report, "2s", "threads"))
			reqs := readLabelledRequests(t, report)
			st := s.Stats().ThreadContext
			if st == nil {
				t.Fatal("no thread context read")
			}
			t.Logf("%d requests; thread context %+v", len(reqs), *st)
			if b := s.Stats().Budget; b != nil {
				t.Logf("walks: %+v; missed switch-ins %d", *b, s.Stats().MissedSwitchIn)
			}
			if st.GoProcesses != 1 || st.GoLabelSets == 0 || st.LostGoLabelSets+st.Shed+st.TruncatedGoSets != 0 || len(st.Skipped) > 0 {
				t.Errorf("thread context: %+v for %d requests", *st, len(reqs))
			}
			bySpan, byRoute, routeOf := spanTimes(p, 3, 4)
			if gp := s.Profiles().Goroutines; gp != nil {
				addThreadless(bySpan, byRoute, routeOf, gp)
			} else if c.opts.Goroutines {
				t.Fatal("no goroutine profile")
			}
			// Emulated (one vCPU): a thread back from its system call may
			// find no P and wait for one on g0, unlabelled, inside the
			// request's clock. With GOMAXPROCS 1 that read -8% to -21%
			// per route in Debian's guests here, single spans -84% in CI's;
			// the program's 8 Ps read -0.1% to -12.3% (the worst with a
			// collection after every request) in 50 subtest runs: 25% there,
			// 2% here.
			// A stop of the world after every request holds such a thread
			// on g0 whatever the Ps: -25.5% in a 6.1 guest of .ci/run here;
			// held to 50%.
			tol := 0.02
			if testenv.Scale() > 1 {
				tol = 0.25
				if name == "gc-each-request" {
					tol = 0.5
				}
			}
			var missedIns uint64
			if c.opts.WalkThreshold > 0 {
				missedIns = s.Stats().MissedSwitchIn
			}
			checkSpanTimes(t, reqs, bySpan, byRoute, routeOf, 2, "", tol, missedIns, true)
			checkLabelledVerdicts(t, p)
		})
	}
}
