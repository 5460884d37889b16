package timeline

import (
	"bytes"
	"encoding/json"
	"html"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/offcpu/offcpu/internal/testenv"
	"github.com/offcpu/offcpu/schema"
)

// viewerTimeline is 3 threads in 2 processes; waits 0, 2 and 3 have
// wakers (flows 1, 3, 4; wait 2's crosses processes, and its waker is
// running then), wait 1 is preempted, waits 0 and 2 are in one span,
// wait 5 is still open. Its own fixture, so that sample's edits do not
// move the counts below.
func viewerTimeline() *schema.Timeline {
	k := func(n string) schema.Frame { return schema.Frame{Name: n, Kernel: true, Module: "vmlinux"} }
	srv := func(n string) schema.Frame { return schema.Frame{Name: n, Module: "server"} }
	java := func(n string) schema.Frame { return schema.Frame{Name: n, Module: "[java]", Runtime: "jvm"} }
	span := map[string]string{"trace_id": "t1", "span_id": "s1", "span_name": "GET /x"}
	return &schema.Timeline{
		Start: 0, End: 6000, Lost: 2,
		Threads: []schema.TimelineThread{
			{PID: 100, TID: 100, Process: "server", Name: "main"},
			{PID: 100, TID: 101, Process: "server", Name: "worker-1"},
			{PID: 200, TID: 200, Process: "java", Name: "GC Thread"},
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
			{Thread: 1, Out: 2000, Wake: 2600, In: 2700, State: "sleeping", Stack: 1, Waker: 2,
				WakerStack: 2, Class: "pipe", Labels: map[string]string{"trace_id": "t1", "span_id": "s1"}},
			{Thread: 0, Out: 3000, Wake: 3250, In: 3300, State: "uninterruptible", Stack: 1, Waker: 1,
				WakerStack: 1, Class: "io"},
			{Thread: 2, Out: 3500, Wake: 4100, In: 4100, State: "sleeping", Stack: 2, Waker: -1,
				IRQ: true, Class: "timer", Verdict: "slow timer"},
			{Thread: 0, Out: 4500, Wake: 6000, In: 6000, State: "sleeping", Stack: 1, Waker: -1, Open: true},
		},
	}
}

// viewerBlocked are the names of viewerTimeline's waits' blocked slices
// (verdict, category, else state; "": preempted, none).
var viewerBlocked = []string{"lock", "", "blocked (sleeping)", "blocked (uninterruptible)", "slow timer", "blocked (sleeping)"}

// viewerHarness loads Catapult's trace viewer as `go tool trace` does
// (the HTML-imports polyfill, then trace_viewer_full.html), imports
// /trace.json with the viewer's own importer, writes what the model holds
// into #result (times in ns) and shows the model in a timeline view.
const viewerHarness = `<!DOCTYPE html><html><head>
<script src="/static/webcomponents.min.js"></script>
<link rel="import" href="/static/trace_viewer_full.html">
<style>html, body { margin: 0; width: 100%; height: 100%; overflow: hidden; }
#trace-viewer { width: 100%; height: 100%; } #result { display: none; }</style>
</head><body><pre id="result">pending</pre>
<script>
'use strict';
function ns(ms) { return Math.round(ms * 1e6); }
function frames(f) { var out = []; for (; f; f = f.parentFrame) { out.push(f.title); } return out; }
function describe(model) {
  var r = {warnings: model.importWarnings.map(function (w) { return w.type + ': ' + w.message; }),
    processes: [], flows: []}, tidOf = {};
  model.getAllProcesses().forEach(function (p) {
    var pr = {pid: p.pid, name: p.name, threads: []};
    Object.keys(p.threads).forEach(function (k) {
      var t = p.threads[k], th = {tid: t.tid, name: t.name, slices: [], async: []};
      t.sliceGroup.slices.forEach(function (s) {
        tidOf[s.guid] = t.tid;
        th.slices.push({title: s.title, cat: s.category, start: ns(s.start), dur: ns(s.duration),
          stack: frames(s.startStackFrame)});
      });
      t.asyncSliceGroup.slices.forEach(function (s) {
        th.async.push({title: s.title, cat: s.category, start: ns(s.start), dur: ns(s.duration)});
      });
      pr.threads.push(th);
    });
    r.processes.push(pr);
  });
  model.flowEvents.forEach(function (f) {
    r.flows.push({id: String(f.id), start: ns(f.start), end: ns(f.start + f.duration),
      from: f.startSlice ? f.startSlice.title : '', fromTid: f.startSlice ? tidOf[f.startSlice.guid] : -1,
      to: f.endSlice ? f.endSlice.title : '', toTid: f.endSlice ? tidOf[f.endSlice.guid] : -1});
  });
  return r;
}
function show(model) {
  var container = document.createElement('track-view-container');
  container.id = 'track_view_container';
  var viewer = document.createElement('tr-ui-timeline-view');
  viewer.track_view_container = container;
  Polymer.dom(viewer).appendChild(container);
  viewer.id = 'trace-viewer';
  viewer.globalMode = true;
  Polymer.dom(document.body).appendChild(viewer);
  viewer.model = model;
  viewer.viewTitle = 'offcpu';
}
document.addEventListener('WebComponentsReady', function () {
  var out = document.getElementById('result');
  var req = new XMLHttpRequest();
  req.open('GET', '/trace.json', true);
  req.onload = function () {
    try {
      var model = new tr.Model(), opts = new tr.importer.ImportOptions();
      opts.shiftWorldToZero = false;
      new tr.importer.Import(model, opts).importTraces([req.responseText]);
      out.textContent = JSON.stringify(describe(model));
      show(model);
    } catch (e) {
      out.textContent = JSON.stringify({error: String(e && e.stack || e)});
    }
  };
  req.send(null);
});
</script></body></html>`

// viewerModel is what the harness writes.
type viewerModel struct {
	Warnings  []string
	Processes []struct {
		PID     int64
		Name    string
		Threads []viewerThread
	}
	Flows []struct {
		ID, From, To   string
		Start, End     int64
		FromTid, ToTid int64
	}
	Error string
}

type viewerThread struct {
	TID           int64
	Name          string
	Slices, Async []viewerSlice
}

type viewerSlice struct {
	Title, Cat string
	Start, Dur int64
	Stack      []string // leaf first
}

// traceViewer is the directory of the Catapult viewer Go's toolchain ships.
func traceViewer(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOROOT").Output()
	dir := filepath.Join(strings.TrimSpace(string(out)), "src", "internal", "trace", "traceviewer", "static")
	if _, serr := os.Stat(filepath.Join(dir, "trace_viewer_full.html")); err != nil || serr != nil {
		if os.Getenv("OFFCPU_REQUIRE_BROWSER") == "1" {
			t.Fatalf("OFFCPU_REQUIRE_BROWSER=1 but no trace viewer in GOROOT: %v %v", err, serr)
		}
		t.Skipf("no trace viewer in GOROOT (%s)", dir)
	}
	return dir
}

// serveViewer serves the viewer's files, the harness and the JSON trace.
func serveViewer(t *testing.T, tl *schema.Timeline) *httptest.Server {
	t.Helper()
	var trace bytes.Buffer
	if err := WriteJSON(&trace, tl); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/static/", http.StripPrefix("/static/", http.FileServer(http.Dir(traceViewer(t)))))
	mux.HandleFunc("/harness.html", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write([]byte(viewerHarness))
	})
	mux.HandleFunc("/trace.json", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(trace.Bytes())
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// TestViewer opens WriteJSON's trace in the trace viewer `go tool trace`
// embeds, in headless Chromium, and checks the model the viewer built.
func TestViewer(t *testing.T) {
	bin := testenv.Chromium(t)
	tl := viewerTimeline()
	srv := serveViewer(t, tl)
	dom, logs := testenv.RunChromium(t, bin, "--virtual-time-budget=20000", "--dump-dom", srv.URL+"/harness.html")
	if regexp.MustCompile(`(?i)uncaught|SyntaxError|ReferenceError|TypeError`).MatchString(logs) {
		t.Errorf("script errors in the console:\n%s", logs)
	}
	m := regexp.MustCompile(`(?s)<pre id="result">(.*?)</pre>`).FindStringSubmatch(dom)
	if m == nil {
		t.Fatalf("no result in the DOM (%d bytes); console:\n%s", len(dom), logs)
	}
	var got viewerModel
	if err := json.Unmarshal([]byte(html.UnescapeString(m[1])), &got); err != nil || got.Error != "" {
		t.Fatalf("result %.500q: %v %s\nconsole:\n%s", m[1], err, got.Error, logs)
	}
	defer func() {
		if t.Failed() {
			t.Logf("the viewer's model: %s", html.UnescapeString(m[1]))
		}
	}()
	for _, w := range got.Warnings {
		t.Errorf("import warning: %s", w)
	}
	threads := checkViewerThreads(t, tl, &got)
	checkViewerSlices(t, tl, threads)
	checkViewerFlows(t, tl, &got)
	viewerScreenshot(t, bin, srv.URL+"/harness.html")
}

// checkViewerThreads: every process and thread by pid/tid with its name,
// and no others (an event on a wrong pid/tid would make one).
func checkViewerThreads(t *testing.T, tl *schema.Timeline, got *viewerModel) map[int64]viewerThread {
	t.Helper()
	byTID := map[int64]viewerThread{}
	pidOf := map[int64]int64{}
	procs := map[int64]string{}
	for _, p := range got.Processes {
		procs[p.PID] = p.Name
		for _, th := range p.Threads {
			byTID[th.TID], pidOf[th.TID] = th, p.PID
		}
	}
	want := map[int64]string{}
	for _, th := range tl.Threads {
		want[th.PID] = th.Process
		v, ok := byTID[th.TID]
		if !ok || v.Name != th.Name || pidOf[th.TID] != th.PID {
			t.Errorf("thread %d: in the viewer %+v in pid %d; want %q in pid %d",
				th.TID, v, pidOf[th.TID], th.Name, th.PID)
		}
	}
	if len(byTID) != len(tl.Threads) {
		t.Errorf("%d threads in the viewer, want %d", len(byTID), len(tl.Threads))
	}
	for pid, name := range want {
		if procs[pid] != name {
			t.Errorf("process %d named %q in the viewer, want %q", pid, procs[pid], name)
		}
	}
	if len(procs) != len(want) {
		t.Errorf("processes %v, want %v", procs, want)
	}
	return byTID
}

// frameNames are a stack's names leaf first, as the viewer lists them.
func frameNames(st []schema.Frame) []string {
	out := []string{}
	for i := len(st) - 1; i >= 0; i-- {
		out = append(out, st[i].Name)
	}
	return out
}

// findSlice is the thread's slice of a category starting at start.
func findSlice(th viewerThread, cat string, start int64) (viewerSlice, bool) {
	for _, s := range th.Slices {
		if s.Cat == cat && s.Start == start {
			return s, true
		}
	}
	return viewerSlice{}, false
}

// checkViewerSlices: each thread's slice count, and each wait's blocked
// and runnable slices and each wake-up's instant with their names,
// durations and stacks exactly as the Timeline says.
func checkViewerSlices(t *testing.T, tl *schema.Timeline, threads map[int64]viewerThread) {
	t.Helper()
	// Per thread: blocked and runnable slices of its waits (preempted
	// wait 1 has no blocked one), running ones between its waits, a
	// zero-length "wakes" slice per wake-up it made.
	for tid, n := range map[int64]int{100: 2 + 1 + 2 + 1, 101: 2 + 1 + 2 + 1, 200: 1 + 1 + 2 + 1} {
		if got := len(threads[tid].Slices); got != n {
			t.Errorf("thread %d: %d slices in the viewer, want %d", tid, got, n)
		}
	}
	blocked := viewerBlocked
	for i, w := range tl.Waits {
		th := threads[tl.Threads[w.Thread].TID]
		if blocked[i] != "" {
			s, ok := findSlice(th, catBlocked, w.Out)
			if !ok || s.Title != blocked[i] || s.Dur != w.Wake-w.Out ||
				!slices.Equal(s.Stack, frameNames(tl.Stacks[w.Stack])) {
				t.Errorf("wait %d: blocked slice %+v (found %v); want %q, %d ns, stack %v",
					i, s, ok, blocked[i], w.Wake-w.Out, frameNames(tl.Stacks[w.Stack]))
			}
		}
		if s, ok := findSlice(th, catRunnable, w.Wake); !ok || s.Dur != w.In-w.Wake {
			t.Errorf("wait %d: runnable slice %+v (found %v); want %d ns", i, s, ok, w.In-w.Wake)
		}
		if w.Waker < 0 {
			continue
		}
		waker, woken := tl.Threads[w.Waker], tl.Threads[w.Thread]
		name := "wakes " + woken.Name + " [" + itoa(woken.TID) + "]"
		s, ok := findSlice(threads[waker.TID], catWakeup, w.Wake)
		if !ok || s.Title != name || s.Dur != 0 || !slices.Equal(s.Stack, frameNames(tl.Stacks[w.WakerStack])) {
			t.Errorf("wait %d: wake-up slice %+v (found %v); want %q", i, s, ok, name)
		}
	}
	a := threads[101].Async
	if len(a) != 1 || a[0].Title != "GET /x" || a[0].Cat != catRequest || a[0].Start != 1000 || a[0].Dur != 1700 {
		t.Errorf("thread 101's async slices %+v; want the span GET /x, 1000..2700", a)
	}
}

// checkViewerFlows: a flow per wake-up, from the waker's "wakes" slice to
// the woken thread, both at the wake-up. Which of the woken thread's two
// slices that meet there (blocked, ending; runnable, starting) the viewer
// binds it to ("bp":"e", closed intervals) is left to float rounding:
// either is accepted, and logged.
func checkViewerFlows(t *testing.T, tl *schema.Timeline, got *viewerModel) {
	t.Helper()
	n := 0
	for i, w := range tl.Waits {
		if w.Waker < 0 {
			continue
		}
		n++
		waker, woken := tl.Threads[w.Waker], tl.Threads[w.Thread]
		found := false
		for _, f := range got.Flows {
			if f.ID != itoa(int64(i)+1) {
				continue
			}
			found = true
			if f.Start != w.Wake || f.End != w.Wake || f.FromTid != waker.TID || f.ToTid != woken.TID ||
				!strings.HasPrefix(f.From, "wakes ") {
				t.Errorf("wait %d: flow %+v; want %d→%d at %d from its wakes slice", i, f, waker.TID, woken.TID, w.Wake)
			}
			if want := viewerBlocked[i]; f.To != want && f.To != "runnable" {
				t.Errorf("wait %d: flow ends on %q; want %q or runnable", i, f.To, want)
			}
			t.Logf("wait %d: flow %s ends on the woken thread's %q slice", i, f.ID, f.To)
		}
		if !found {
			t.Errorf("wait %d: no flow %d in the viewer", i, i+1)
		}
	}
	if len(got.Flows) != n {
		t.Errorf("%d flows in the viewer, want %d", len(got.Flows), n)
	}
}

// viewerScreenshot saves the harness's timeline view as a PNG, best
// effort: its content is not checked.
func viewerScreenshot(t *testing.T, bin, url string) {
	t.Helper()
	art := os.Getenv("OFFCPU_ARTIFACTS")
	if art == "" {
		art = t.TempDir()
	}
	os.MkdirAll(art, 0o755)
	shot := filepath.Join(art, "timeline-viewer.png")
	testenv.RunChromium(t, bin, "--virtual-time-budget=20000", "--window-size=1400,800", "--screenshot="+shot, url)
	if st, err := os.Stat(shot); err != nil || st.Size() < 1000 {
		t.Logf("no screenshot written: %v", err)
		return
	}
	t.Logf("screenshot: %s", shot)
}
