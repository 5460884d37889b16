package collector

import (
	"encoding/base64"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"golang.org/x/exp/trace"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/collector/goroutines"
	"github.com/offcpu/offcpu/runtimes/golang"
	"github.com/offcpu/offcpu/schema"
)

const prometheusBin = "/usr/bin/prometheus"

// windowWaits is an execution trace's goroutine waits that began in a
// window of it (from, to: since the trace's start), those still open at
// its end counted up to it, by reason class.
type windowWaits struct {
	window  time.Duration
	byClass map[string]int64
	byG     map[goClassKey]int64 // by goroutine and class
	waits   map[string]int64     // how many, by class
	created map[int64]bool       // goroutines created inside the window
	// Runnable after running (preempted, yielded) or a system call (its
	// P lost) to running: waits for a P alone, and how many.
	requeued, requeues int64
	// Which goroutines serve requests, from the trace alone: a goroutine
	// with network waits (a connection's: readers) is inside a request
	// from the end of one to the start of its next; a goroutine it creates
	// then serves that request (request). Either lives about as long as a
	// request: born and ended within a second inside the trace (ended),
	// not a loop's life (a client loop dials too).
	readers, request, ended map[int64]bool
	// fedByReader: goroutines a reader made runnable inside its request
	// (a client's connection writer, handed each request by the goroutine
	// that then reads the response): serving it, not on their own.
	fedByReader map[int64]bool
}

func traceWindowWaits(t *testing.T, path string, from, to time.Duration) *windowWaits {
	t.Helper()
	r := openTrace(t, path)
	type open struct {
		at    trace.Time
		class string
	}
	w := &windowWaits{byClass: map[string]int64{}, byG: map[goClassKey]int64{}, waits: map[string]int64{}, created: map[int64]bool{},
		readers: map[int64]bool{}, request: map[int64]bool{}, ended: map[int64]bool{}, fedByReader: map[int64]bool{}}
	inRequest := map[int64]bool{}
	born := map[int64]trace.Time{}
	waiting := map[trace.GoID]open{}
	requeued := map[trace.GoID]trace.Time{}
	var first, last trace.Time
	winFrom, winTo := from, to
	inWindow := func(at trace.Time) bool {
		return at >= trace.Time(int64(first)+int64(winFrom)) && at < trace.Time(int64(first)+int64(winTo))
	}
	add := func(id trace.GoID, o open, end trace.Time) {
		start := trace.Time(int64(first) + int64(from))
		if o.at < start || o.at >= trace.Time(int64(first)+int64(to)) {
			return
		}
		end = min(end, trace.Time(int64(first)+int64(to)))
		ns := int64(end - o.at)
		w.byClass[o.class] += ns
		w.byG[goClassKey{int64(id), o.class}] += ns
		w.waits[o.class]++
	}
	for {
		ev, err := r.ReadEvent()
		if err != nil {
			break
		}
		if first == 0 {
			first = ev.Time()
		}
		// A second past the window tells which request goroutines ended
		// (ended); the rest of the trace is not read (seconds under -race).
		if ev.Time() > trace.Time(int64(first)+int64(winTo+time.Second)) {
			break
		}
		last = ev.Time()
		st, from, to, ok := goTransition(&ev)
		if !ok {
			continue
		}
		id := st.Resource.Goroutine()
		if from == trace.GoNotExist {
			w.created[int64(id)] = true
			born[int64(id)] = ev.Time()
			if c := int64(ev.Goroutine()); ev.Goroutine() != trace.NoGoroutine && (inRequest[c] || w.request[c]) {
				w.request[int64(id)] = true
			}
		}
		if b, ok := born[int64(id)]; ok && to == trace.GoNotExist && ev.Time()-b < trace.Time(time.Second) {
			w.ended[int64(id)] = true
		}
		if from == trace.GoWaiting && to != trace.GoWaiting && ev.Goroutine() != trace.NoGoroutine && inRequest[int64(ev.Goroutine())] {
			w.fedByReader[int64(id)] = true
		}
		if o, ok := waiting[id]; ok && to != trace.GoWaiting {
			add(id, o, ev.Time())
			delete(waiting, id)
			if o.class == "network" {
				inRequest[int64(id)] = true
			}
		}
		if at, ok := requeued[id]; ok && from == trace.GoRunnable {
			if inWindow(at) {
				w.requeued += int64(min(ev.Time(), trace.Time(int64(first)+int64(winTo))) - at)
				w.requeues++
			}
			delete(requeued, id)
		}
		if to == trace.GoRunnable && (from == trace.GoRunning || from == trace.GoSyscall) {
			requeued[id] = ev.Time()
		}
		if to == trace.GoWaiting && from != trace.GoWaiting {
			class := traceReasonClass(st.Reason)
			if class == "network" {
				w.readers[int64(id)], inRequest[int64(id)] = true, false
			}
			if from != trace.GoUndetermined {
				waiting[id] = open{ev.Time(), class}
			}
		}
	}
	for id, o := range waiting {
		add(id, o, last)
	}
	for _, at := range requeued {
		if inWindow(at) {
			w.requeued += int64(min(last, trace.Time(int64(first)+int64(winTo))) - at)
			w.requeues++
		}
	}
	w.window = time.Duration(last - first)
	if w.window < to {
		t.Fatalf("the trace lasts %v: it ends before the window compared (%v)", w.window, to)
	}
	return w
}

// startPrometheus runs Debian's prometheus on loopback, scraping itself
// every second, and waits until it has scraped once.
func startPrometheus(t *testing.T) (*exec.Cmd, string) {
	t.Helper()
	if _, err := os.Stat(prometheusBin); err != nil {
		t.Fatalf("no %s: .ci/run installs Debian's prometheus", prometheusBin)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: self\n    static_configs:\n      - targets: ['%s']\n", addr)), 0o644)
	cmd := exec.Command(prometheusBin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	base := "http://" + addr
	// Ready, and scraping: its scrape loops start at the first update of
	// its service discovery, seconds after it is ready.
	for i := 0; ; i++ {
		resp, err := http.Get(base + "/api/v1/query?query=up")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(b), `"job":"self"`) {
				break
			}
		}
		if i == 300 {
			t.Fatalf("prometheus does not scrape itself after 15 s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return cmd, base
}

// queryLoad sends GETs to urls from n clients until stop is closed; it
// returns the requests answered.
func queryLoad(n int, stop <-chan struct{}, urls ...string) func() int64 {
	var done atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			// A connection per request: each connection's goroutine is
			// born and ends inside the trace.
			cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			for j := i; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := cl.Get(urls[j%len(urls)])
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				done.Add(1)
			}
		}(i)
	}
	return func() int64 { wg.Wait(); return done.Load() }
}

// Debian's prometheus (a Go 1.19 binary without DWARF or symbols) under a
// query load on loopback, recorded while its own execution trace runs:
// the goroutines' synchronisation and network blocking that began in the
// window match the trace's within 5%, and goroutines are grouped by the
// function Go's tracebacks show, not by the go statements' wrappers.
func TestGoroutineWaitsPrometheus(t *testing.T) {
	requireBPF(t)
	srv, base := startPrometheus(t)
	stop := make(chan struct{})
	wait := queryLoad(6, stop, base+"/api/v1/query?query=up", base+"/metrics",
		base+"/api/v1/query?query=rate(prometheus_http_requests_total%5B10s%5D)")
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
	}()
	s, truth := recordWithTrace(t, srv.Process.Pid, base+"/debug/pprof/trace?seconds=8")
	close(stop)
	requests := wait()
	t.Logf("%d requests", requests)

	gp := s.Profiles().Goroutines
	// No goroutine waits longer than the window (a suspension by the GC
	// taken for a park since the start would).
	window := s.Stats().Duration.Nanoseconds()
	perG := map[int64]int64{}
	for _, smp := range gp.Sample {
		if g := smp.NumLabel[schema.LabelGoid][0]; g > 0 {
			perG[g] += smp.Value[0] + smp.Value[1]
		}
	}
	for g, ns := range perG {
		if ns > window {
			t.Errorf("goroutine %d waited %.3f s in a %.3f s window", g, float64(ns)/1e9, float64(window)/1e9)
		}
	}
	mine := map[string]int64{}
	for _, smp := range gp.Sample {
		if iv := smp.Label[schema.LabelInterval]; len(iv) > 0 && iv[0] != "open" {
			continue // began before the window: the trace has no reason for those
		}
		mine[goroutines.ReasonClass(smp.Label[schema.LabelReason][0])] += smp.Value[0]
	}
	t.Logf("trace by class %v; offcpu %v", truth.byClass, mine)
	for _, c := range []struct {
		name    string
		classes []string
	}{{"sync", []string{"chan", "select", "sync"}}, {"net", []string{"network"}}} {
		var got, want int64
		for _, cl := range c.classes {
			got, want = got+mine[cl], want+truth.byClass[cl]
		}
		// The tracer stamps a park after taking its stack
		// (TestGoroutineWaitsNATSServer): up to 10 µs a wait apart here.
		var n int64
		for _, cl := range c.classes {
			n += truth.waits[cl]
		}
		diff := float64(got-want) / float64(want)
		t.Logf("%s: trace %.3f s, offcpu %.3f s (%+.2f%%), %d waits", c.name, float64(want)/1e9, float64(got)/1e9, 100*diff, n)
		if math.Abs(float64(got-want)) > float64(want)/20+10e3*float64(n) {
			t.Errorf("%s blocking: offcpu %.3f s, trace %.3f s over the same window", c.name, float64(got)/1e9, float64(want)/1e9)
			logGoroutineDiffs(t, gp, truth, c.classes)
		}
	}
	checkServerRequeues(t, gp, truth)
	checkPrometheusGroups(t, gp)
	checkRequestVerdicts(t, gp, truth)
}

// logGoroutineDiffs logs the goroutines whose waits of classes (begun
// in the window) differ most between offcpu and the trace.
func logGoroutineDiffs(t *testing.T, gp *profile.Profile, truth *windowWaits, classes []string) {
	t.Helper()
	got, want := map[int64]int64{}, map[int64]int64{}
	for _, smp := range gp.Sample {
		if iv := smp.Label[schema.LabelInterval]; (len(iv) == 0 || iv[0] == "open") && slices.Contains(classes, goroutines.ReasonClass(smp.Label[schema.LabelReason][0])) {
			got[smp.NumLabel[schema.LabelGoid][0]] += smp.Value[0]
		}
	}
	for k, ns := range truth.byG {
		if slices.Contains(classes, k.class) {
			want[k.goid] += ns
		}
	}
	var ids []int64
	for id := range got {
		ids = append(ids, id)
	}
	for id := range want {
		if _, ok := got[id]; !ok {
			ids = append(ids, id)
		}
	}
	diff := func(id int64) int64 { return max(got[id]-want[id], want[id]-got[id]) }
	sort.Slice(ids, func(i, j int) bool { return diff(ids[i]) > diff(ids[j]) })
	for _, id := range ids[:min(8, len(ids))] {
		t.Logf("goroutine %d: offcpu %v, trace %v (created in the trace %v)", id, time.Duration(got[id]), time.Duration(want[id]), truth.created[id])
	}
}

// checkServerRequeues holds offcpu's waits for a P alone (runnable, from a
// requeue inside the window) to the trace's: as many within 2%, their time
// within 5% and 2 µs a wait (Debian's prometheus, Go 1.19, read 7.3% and
// 1 µs a wait short of its tracer's, which stamps a system call's end
// before the runtime's attempts to get a P; Go 1.26's matched to 0.01%:
// TestGoroutineRequeuesMatchTrace).
func checkServerRequeues(t *testing.T, gp *profile.Profile, truth *windowWaits) {
	t.Helper()
	var got, n int64
	for _, smp := range gp.Sample {
		if iv := smp.Label[schema.LabelInterval]; len(iv) > 0 && iv[0] == "before-start" {
			continue
		}
		if smp.Label[schema.LabelReason][0] == golang.ReasonRunnable {
			got, n = got+smp.Value[1], n+smp.Value[2]
		}
	}
	want := truth.requeued
	t.Logf("waits for a P alone: trace %.3f ms in %d, offcpu %.3f ms in %d (%+.2f%%)", float64(want)/1e6, truth.requeues,
		float64(got)/1e6, n, 100*float64(got-want)/float64(max(want, 1)))
	if truth.requeues == 0 || math.Abs(float64(n-truth.requeues)) > float64(truth.requeues)/50 ||
		math.Abs(float64(got-want)) > float64(want)/20+2e3*float64(truth.requeues) {
		t.Errorf("waits for a P alone: offcpu %d, %.3f ms; trace %d, %.3f ms over the same window", n, float64(got)/1e6, truth.requeues, float64(want)/1e6)
	}
}

// checkRequestVerdicts holds the verdicts to the trace's reading of who
// serves requests (windowWaits): the waits other than for the network (a
// goroutine's input) of the short-lived connection and request
// goroutines, blocked (≥ 90%); the waits of the goroutines that loop on
// their own (there before the trace, reading no network, made runnable
// by no goroutine inside a request, not the runtime's) idle (≥ 90%). Under load
// a scrape's goroutine waits for its response's body (a network read):
// the trace names it a reader, and offcpu its loop's timer a wait inside
// a request, its connection writer's wait for it a wait chain.
func checkRequestVerdicts(t *testing.T, gp *profile.Profile, truth *windowWaits) {
	t.Helper()
	r, err := analysis.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	d := loadRecorded(t, gp)
	analysis.Analyze(d, r, analysis.Options{})
	var req, reqBlocked, loop, loopIdle int64
	against := map[string]int64{} // waits judged against the trace's reading
	for i := range d.Stacks {
		st := &d.Stacks[i]
		if st.WaitsForCPU() {
			continue
		}
		cat := r.Categorize(st)[0]
		idle := r.IsIdle(cat)
		switch {
		case (truth.request[st.Goid] || truth.readers[st.Goid]) && truth.ended[st.Goid] && st.Reason != "IO wait":
			req += st.Value
			if !idle {
				reqBlocked += st.Value
			} else {
				against["request-path, idle: "+st.Thread+" "+st.Reason+" "+cat] += st.Value
			}
		// A loop's wait ended by a goroutine serving requests (a reader
		// handing it a response) serves that request: not judged. Whole
		// goroutines a reader ever fed (fedByReader) left none in one CI run.
		case !truth.created[st.Goid] && !truth.readers[st.Goid] && !truth.request[st.Goid] && !strings.HasPrefix(st.Thread, "runtime.") &&
			!truth.readers[st.WakerGoid] && !truth.request[st.WakerGoid]:
			loop += st.Value
			if idle {
				loopIdle += st.Value
			} else {
				k := "loop, blocked: " + st.Thread + " " + st.Reason + " " + cat
				if against[k] == 0 { // which rule, and why: a flake in CI once
					t.Logf("%s: waker %s (%s), in request %v %q; %s", k, st.Waker, st.Class, st.InRequest, st.InRequestWhy, strings.Join(r.Explain(st), "; "))
				}
				against[k] += st.Value
			}
		}
	}
	fed := 0
	for id := range truth.fedByReader {
		if !truth.created[id] && !truth.readers[id] && !truth.request[id] {
			fed++
		}
	}
	t.Logf("%d goroutines there before the trace, reading no network, made runnable by one inside a request: those waits not held to a loop's verdicts", fed)
	t.Logf("request-path waits %.3f s, %.1f%% blocked; loop goroutines' waits %.3f s, %.1f%% idle",
		float64(req)/1e9, 100*float64(reqBlocked)/float64(req), float64(loop)/1e9, 100*float64(loopIdle)/float64(loop))
	for k, v := range against {
		t.Logf("  %s %.3f s", k, float64(v)/1e9)
	}
	if req == 0 || float64(reqBlocked) < 0.9*float64(req) {
		t.Errorf("request-path waits: %.3f of %.3f s blocked, want >= 90%%", float64(reqBlocked)/1e9, float64(req)/1e9)
	}
	if loop == 0 || float64(loopIdle) < 0.9*float64(loop) {
		t.Errorf("loop goroutines' waits: %.3f of %.3f s idle, want >= 90%%", float64(loopIdle)/1e9, float64(loop)/1e9)
	}
}

// checkPrometheusGroups: no goroutine is grouped under a go statement's
// wrapper or the runtime's frames when it runs code of its own.
func checkPrometheusGroups(t *testing.T, gp interface{ Write(io.Writer) error }) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "g.pb.gz")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	gp.Write(f)
	f.Close()
	d, err := analysis.Load(schema.FoldedNanoseconds, path)
	if err != nil {
		t.Fatal(err)
	}
	groups := map[string]int64{}
	for _, s := range d.Stacks {
		groups[s.Thread] += s.Value
	}
	var names []string
	for g := range groups {
		names = append(names, g)
		if strings.Contains(g, ".gowrap") {
			t.Errorf("goroutines grouped under a go statement's wrapper: %s", g)
		}
	}
	sort.Slice(names, func(i, j int) bool { return groups[names[i]] > groups[names[j]] })
	for _, g := range names[:min(12, len(names))] {
		t.Logf("group %-70s %8.3f s", g, float64(groups[g])/1e9)
	}
}

// recordWithTrace records process pid's goroutines for 2.5 s inside the
// execution trace traceURL serves (net/http/pprof's), and reads the
// trace's waits over the recorder's window.
// fetchTrace writes what url (a Go server's /debug/pprof/trace) answers
// to path; the channel gets the error when it is done.
func fetchTrace(url, path string) <-chan error {
	done := make(chan error, 1)
	go func() {
		resp, err := http.Get(url)
		if err == nil {
			f, ferr := os.Create(path)
			if ferr == nil {
				_, err = io.Copy(f, resp.Body)
				f.Close()
			}
			resp.Body.Close()
		}
		done <- err
	}()
	return done
}

func recordWithTrace(t *testing.T, pid int, traceURL string) (*Session, *windowWaits) {
	t.Helper()
	time.Sleep(time.Second)
	// The recorder's window lies inside the trace's: the trace's times
	// start at its request (within the request's latency, ~1 ms).
	// The trace long enough for the recorder's start-up (seconds under -race).
	s, tr, asked := recordInsideTrace(t, traceURL, Options{PIDs: []int{pid}, NoWakeups: true, Goroutines: true}, 2500*time.Millisecond)
	st := s.Stats().Goroutines
	if st.Processes != 1 {
		t.Fatalf("%d Go processes probed, want 1 (%v)", st.Processes, st.Skipped)
	}
	from, to := time.Duration(s.startMono-asked), time.Duration(s.stopMono-asked)
	if at, n := traceStartOf(t, tr, s.Profiles().Goroutines, from); n > 0 {
		t.Logf("the recorder's start, by %d waits open at it: %v into the trace (%v by the request's time)", n, at, from)
		from, to = at, at+(to-from)
	}
	truth := traceWindowWaits(t, tr, from, to)
	t.Logf("recorder window %v to %v of the trace's %v; %d parks", from, to, truth.window, st.Parks)
	return s, truth
}

// traceStartOf finds the recorder's start in the trace's time (since its
// first event): the trace's times start when the server began tracing,
// some milliseconds after it was asked to, and a 1 s wait begun in the gap
// counts on one side alone. A wait open at the start ended (made
// runnable) its before-start blocked time after the start: each such
// goroutine's wake-up in the trace near guess, less that time, is a
// candidate; the start is the median of the largest cluster (within
// 50 µs), if 5 or more agree (n: how many; 0: none found).
func traceStartOf(t *testing.T, path string, gp *profile.Profile, guess time.Duration) (at time.Duration, n int) {
	t.Helper()
	blocked := map[int64]int64{}
	for _, smp := range gp.Sample {
		if iv := smp.Label[schema.LabelInterval]; len(iv) > 0 && iv[0] == "before-start" && smp.Value[2] == 1 {
			if g := smp.NumLabel[schema.LabelGoid][0]; g > 0 {
				blocked[g] += smp.Value[0]
			}
		}
	}
	r := openTrace(t, path)
	var first trace.Time
	var cands []time.Duration
	for {
		ev, err := r.ReadEvent()
		if err != nil {
			break
		}
		if first == 0 {
			first = ev.Time()
		}
		at := time.Duration(ev.Time() - first)
		if at > guess+time.Second {
			break
		}
		st, from, _, ok := goTransition(&ev)
		if !ok || from != trace.GoWaiting || at < guess-50*time.Millisecond {
			continue
		}
		if b, ok := blocked[int64(st.Resource.Goroutine())]; ok {
			cands = append(cands, at-time.Duration(b))
		}
	}
	slices.Sort(cands)
	best, bestN := 0, 0
	for i := range cands {
		n := sort.Search(len(cands)-i, func(j int) bool { return cands[i+j] > cands[i]+50*time.Microsecond })
		if n > bestN {
			best, bestN = i, n
		}
	}
	if bestN < 5 {
		t.Logf("the recorder's start: %d candidates agree, %d goroutines open at it: by the request's time", bestN, len(blocked))
		return 0, 0
	}
	return cands[best+bestN/2], bestN
}

// Debian's etcd (grpc-go with its HTTP/JSON gateway in the same process,
// Go 1.19) under puts and ranges through the gateway, a connection per
// request, recorded while its own execution trace runs: the gateway's
// and the gRPC server's request goroutines' waits blocked, its loops
// idle, as the trace alone tells them apart (checkRequestVerdicts).
func TestGoroutineWaitsEtcd(t *testing.T) {
	requireBPF(t)
	etcd := requireServer(t, "etcd", "etcd-server")
	port := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	srv := exec.Command(etcd, "--data-dir", t.TempDir(), "--listen-client-urls", base, "--advertise-client-urls", base,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), "--enable-pprof", "--log-outputs", "stderr", "--logger", "zap", "--log-level", "error")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	put := func(cl *http.Client, path, body string) error {
		resp, err := cl.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", path, resp.Status)
		}
		return nil
	}
	for i := 0; ; i++ {
		if put(http.DefaultClient, "/v3/kv/put", `{"key":"cmVhZHk=","value":"MQ=="}`) == nil {
			break
		}
		if i == 100 {
			t.Fatal("etcd not serving its gateway after 10 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop := make(chan struct{})
	var done atomic.Int64
	var wg sync.WaitGroup
	for c := 0; c < 6; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			cl := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				key := base64.StdEncoding.EncodeToString([]byte(fmt.Sprintf("k%d-%d", c, j%50)))
				body, path := fmt.Sprintf(`{"key":%q,"value":"dmFsdWU="}`, key), "/v3/kv/put"
				if j%2 == 1 {
					body, path = fmt.Sprintf(`{"key":%q}`, key), "/v3/kv/range"
				}
				if put(cl, path, body) == nil {
					done.Add(1)
				}
			}
		}(c)
	}
	// etcd 3.4 registers its trace handler as "trace " (a space at the
	// end: pkg/debugutil/pprof.go); "trace" answers "Unknown profile".
	s, truth := recordWithTrace(t, srv.Process.Pid, base+"/debug/pprof/trace%20?seconds=8")
	close(stop)
	wg.Wait()
	t.Logf("%d requests", done.Load())
	checkRequestVerdicts(t, s.Profiles().Goroutines, truth)
}
