package analysis

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/internal/testenv"
	"github.com/offcpu/offcpu/schema"
)

// fixture writes an offcpu-shaped profile: a broker loop blocked on the
// monitor inside internalConsumerFlow, an idle loop, a preempted thread,
// an executor waiting for work, and a wake-up profile.
func fixture(t *testing.T, dir string) (offPath, wakePath string) {
	t.Helper()
	kmap := &profile.Mapping{ID: 1, File: "[kernel.kallsyms]"}
	umap := &profile.Mapping{ID: 2, File: "/usr/bin/broker"}
	p := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "off_cpu", Unit: "nanoseconds"}, {Type: "switches", Unit: "count"}, {Type: "cpu", Unit: "nanoseconds"}},
		Mapping:    []*profile.Mapping{kmap, umap},
	}
	funcs := map[string]*profile.Function{}
	loc := func(name string, kernel bool) *profile.Location {
		f := funcs[name]
		if f == nil {
			f = &profile.Function{ID: uint64(len(p.Function) + 1), Name: name}
			funcs[name] = f
			p.Function = append(p.Function, f)
		}
		m := umap
		if kernel {
			m = kmap
		}
		l := &profile.Location{ID: uint64(len(p.Location) + 1), Mapping: m, Address: uint64(len(p.Location) + 1), Line: []profile.Line{{Function: f}}}
		p.Location = append(p.Location, l)
		return l
	}
	// stack takes frames root first, "k:" marks kernel frames.
	add := func(thread, state string, ns, cpu int64, frames ...string) {
		var locs []*profile.Location
		for i := len(frames) - 1; i >= 0; i-- {
			name := frames[i]
			locs = append(locs, loc(strings.TrimPrefix(name, "k:"), strings.HasPrefix(name, "k:")))
		}
		p.Sample = append(p.Sample, &profile.Sample{Location: locs, Value: []int64{ns, 1, cpu},
			Label: map[string][]string{"thread": {thread}, "state": {state}}})
	}
	d := "github.com/offcpu/offcpu/dispatcher."
	add("broker-io-0", "sleeping", 3_000_000_000, 0, "runtime.goexit", d+"(*EventLoop).run", d+"baseline.ConsumerFlow.func1", d+"(*Dispatcher).internalConsumerFlow", d+"(*Monitor).Enter", d+"(*Monitor).enterSlow", d+"futexWait", "k:do_syscall_64", "k:futex_wait", "k:schedule")
	add("broker-io-1", "sleeping", 1_000_000_000, 0, "runtime.goexit", d+"(*EventLoop).run", d+"(*Dispatcher).readMoreEntries", d+"(*Monitor).Enter", d+"(*Monitor).enterSlow", d+"futexWait", "k:futex_wait", "k:schedule")
	add("broker-io-1", "sleeping", 5_000_000_000, 0, "runtime.goexit", d+"(*EventLoop).run", d+"epollWait", "golang.org/x/sys/unix.EpollWait", "k:do_epoll_wait", "k:schedule")
	add("broker-io-2", "preempted", 2_000_000_000, 0, "runtime.goexit", d+"(*EventLoop).run", d+"(*conn).OnReadable", "k:schedule")
	add("topic-worker-0", "sleeping", 4_000_000_000, 0, "runtime.goexit", d+"(*Executor).run", d+"(*BlockingQueue[go.shape.func()]).Take", d+"(*Notifier).Wait", d+"futexWait", "k:futex_wait", "k:schedule")
	add("client-io-0", "sleeping", 500_000_000, 0, "runtime.goexit", d+"(*Client).runProducer", "time.Sleep", "k:do_nanosleep", "k:schedule")
	add("broker-io-0", "on-cpu", 0, 700_000_000, "runtime.goexit", d+"(*EventLoop).wakeup", d+"eventfdWrite", "k:eventfd_write")
	offPath = filepath.Join(dir, "offcpu.pb.gz")
	writeProfile(t, offPath, p)

	w := &profile.Profile{
		SampleType: []*profile.ValueType{{Type: "wakeups", Unit: "count"}, {Type: "off_cpu", Unit: "nanoseconds"}},
		Mapping:    []*profile.Mapping{kmap, umap},
	}
	funcs = map[string]*profile.Function{}
	p2 := p
	p = w
	addW := func(waker, target, class string, n int64, frames ...string) {
		var locs []*profile.Location
		for i := len(frames) - 1; i >= 0; i-- {
			name := frames[i]
			locs = append(locs, loc(strings.TrimPrefix(name, "k:"), strings.HasPrefix(name, "k:")))
		}
		w.Sample = append(w.Sample, &profile.Sample{Location: locs, Value: []int64{n, n * 1000},
			Label: map[string][]string{"thread": {waker}, "target_thread": {target}, "wakeup_class": {class}}})
	}
	addW("topic-worker-0", "broker-io-2", "eventfd", 300, d+"(*Dispatcher).sendMessagesToConsumer", d+"(*EventLoop).Execute", d+"(*EventLoop).wakeup", d+"eventfdWrite", "k:eventfd_write", "k:try_to_wake_up")
	addW("ml-worker", "topic-worker-0", "futex", 200, d+"(*Dispatcher).readEntriesComplete", d+"(*Executor).Execute", d+"futexWake", "k:futex_wake", "k:try_to_wake_up")
	addW("[interrupt]", "client-io-0", "timer", 50, "k:hrtimer_wakeup", "k:try_to_wake_up")
	p = p2
	wakePath = filepath.Join(dir, "offcpu.wakeups.pb.gz")
	writeProfile(t, wakePath, w)
	return offPath, wakePath
}

func writeProfile(t *testing.T, path string, p *profile.Profile) {
	t.Helper()
	if err := p.CheckValid(); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := p.Write(f); err != nil {
		t.Fatal(err)
	}
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	testenv.Golden(t, filepath.Join("testdata", name), got)
}

func TestAnalyzeFixture(t *testing.T) {
	dir := t.TempDir()
	off, wake := fixture(t, dir)
	rules, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	d, err := Load(schema.FoldedMicroseconds, off, wake)
	if err != nil {
		t.Fatal(err)
	}
	rep := Analyze(d, rules, Options{Threads: regexp.MustCompile(`^(broker-io|ml-worker|topic-worker)`), Messages: 1000})
	rep.Sources = []string{"offcpu.pb.gz", "offcpu.wakeups.pb.gz"}

	// Checked by hand: blocked with an application frame are the two
	// monitor waits (3 s + 1 s); the idle loop, the executor and the
	// preempted thread are not.
	if rep.TotalOffCPUNs != 15e9 || rep.AppBlockedNs != 4e9 {
		t.Errorf("total %d app %d, want 15e9 and 4e9", rep.TotalOffCPUNs, rep.AppBlockedNs)
	}
	cat := map[string]CategoryResult{}
	for _, c := range rep.Categories {
		cat[c.Name] = c
	}
	if cat["monitor-wait"].Share != 1 || cat["flow-handling"].AppNs != 3e9 || cat["flow-handling"].Share != 0.75 {
		t.Errorf("monitor-wait %+v flow-handling %+v", cat["monitor-wait"], cat["flow-handling"])
	}
	if cat["event-loop-idle"].Ns != 5e9 || cat["queue-wait"].Ns != 4e9 || cat["runqueue"].Ns != 2e9 {
		t.Errorf("idle %d queue %d preempted %d", cat["event-loop-idle"].Ns, cat["queue-wait"].Ns, cat["runqueue"].Ns)
	}
	if rep.Wakeups.Total != 500 || rep.Wakeups.ByClass["eventfd"] != 300 || rep.Wakeups.EventfdPerMessage != 0.3 {
		t.Errorf("wake-ups %+v", rep.Wakeups)
	}
	// A waker without an application frame is named by its thread group;
	// [interrupt] keeps its one pair of brackets.
	if all := Analyze(d, rules, Options{}); all.WakerFunctions["[interrupt]"] != 50 {
		t.Errorf("waker functions %v, want [interrupt]: 50", all.WakerFunctions)
	}
	var buf bytes.Buffer
	if err := rep.Write(&buf, "json"); err != nil {
		t.Fatal(err)
	}
	golden(t, "analyze.json", buf.Bytes())
	buf.Reset()
	rep.Write(&buf, "markdown")
	golden(t, "analyze.md", buf.Bytes())
	if err := rep.Write(&buf, "yaml"); err == nil {
		t.Error("unknown format accepted")
	}
}

func TestRulesErrors(t *testing.T) {
	for _, tc := range []struct{ yaml, want string }{
		{"categories:\n  - name: a\nrules:\n  - category: b\n    frames: [x]\n", `rules.yaml:4: unknown category "b"`},
		{"categories:\n  - name: a\nrules:\n  - category: a\n    frames:\n      - ok\n      - 'bad(('\n", `rules.yaml:7: bad regexp "bad(("`},
		{"categories: [\n", "rules.yaml: "},
		{"categories:\n  - name: a\nrules:\n  - category: a\n", "rules.yaml:4: rule for a matches everything"},
		{"categories:\n  - name: a\nrules:\n  - category: a\n    states: [dozing]\n", `rules.yaml:5: unknown state "dozing"`},
		{"categorie:\n  - name: a\n", "rules.yaml: "},
	} {
		_, err := ParseRules("rules.yaml", []byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want %q", tc.yaml, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("multi-line error: %q", err)
		}
	}
	if _, err := ParseRules("default", DefaultRules()); err != nil {
		t.Errorf("built-in rules: %v", err)
	}
}

func TestLoadCorrupt(t *testing.T) {
	dir := t.TempDir()
	off, _ := fixture(t, dir)
	b, _ := os.ReadFile(off)
	cases := map[string][]byte{
		"truncated.pb.gz": b[:len(b)/2],
		"garbage.pb.gz":   append([]byte{0x1f, 0x8b}, bytes.Repeat([]byte{0xff}, 100)...),
		"binary":          {0, 1, 2, 3},
		"novalue.folded":  []byte("a;b;c\n"),
		"badvalue.folded": []byte("a;b;c x12\n"),
	}
	for name, data := range cases {
		p := filepath.Join(dir, name)
		os.WriteFile(p, data, 0o644)
		if _, err := Load(schema.FoldedMicroseconds, p); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	if _, err := Load(schema.FoldedMicroseconds, filepath.Join(dir, "missing")); err == nil {
		t.Error("missing file accepted")
	}
}

func TestLoadFolded(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.folded")
	os.WriteFile(p, []byte(""+
		"broker-io-1;main;loop;-;do_epoll_wait;schedule 2000\n"+
		"java/lang/Thread.run;Worker.run;Object.wait 30\n"+
		"t;a;--;b;w 5\n"), 0o644)
	d, err := Load(schema.FoldedMicroseconds, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Stacks) != 2 {
		t.Fatalf("%d stacks, want 2 (offwake lines skipped)", len(d.Stacks))
	}
	a, b := d.Stacks[0], d.Stacks[1]
	if a.Thread != "broker-io-1" || a.Value != 2e6 || !a.Frames[2].Kernel || a.Frames[1].Kernel {
		t.Errorf("bcc line: %+v", a)
	}
	if b.Thread != "" || len(b.Frames) != 3 || b.Value != 30000 {
		t.Errorf("collapsed line: %+v", b)
	}
	js, _ := json.Marshal(d.Stacks[0].Frames)
	if !strings.Contains(string(js), "do_epoll_wait") {
		t.Error(string(js))
	}
}

func TestGoBlockProfile(t *testing.T) {
	// A Go block profile: contentions/count, delay/nanoseconds, no threads.
	fn := &profile.Function{ID: 1, Name: "sync.(*Mutex).Lock"}
	fn2 := &profile.Function{ID: 2, Name: "main.handler"}
	m := &profile.Mapping{ID: 1, File: "/bin/app"}
	l1 := &profile.Location{ID: 1, Mapping: m, Line: []profile.Line{{Function: fn}}}
	l2 := &profile.Location{ID: 2, Mapping: m, Line: []profile.Line{{Function: fn2}}}
	p := &profile.Profile{SampleType: []*profile.ValueType{{Type: "contentions", Unit: "count"}, {Type: "delay", Unit: "nanoseconds"}},
		Mapping: []*profile.Mapping{m}, Function: []*profile.Function{fn, fn2}, Location: []*profile.Location{l1, l2},
		Sample: []*profile.Sample{{Location: []*profile.Location{l1, l2}, Value: []int64{3, 900}}}}
	path := filepath.Join(t.TempDir(), "block.pb.gz")
	writeProfile(t, path, p)
	d, err := Load(schema.FoldedMicroseconds, path)
	if err != nil {
		t.Fatal(err)
	}
	rules, _ := LoadRules("")
	rep := Analyze(d, rules, Options{})
	if rep.TotalOffCPUNs != 900 || rep.AppBlockedNs != 900 || rep.Categories[1].Name != "monitor-wait" || rep.Categories[1].AppNs != 900 {
		t.Errorf("block profile: total %d app %d %+v", rep.TotalOffCPUNs, rep.AppBlockedNs, rep.Categories[1])
	}
}

func TestAppFramesByModule(t *testing.T) {
	rules, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		f    Frame
		want bool
	}{
		{Frame{Name: "clock_nanosleep", Module: "libc.so.6"}, false},
		{Frame{Name: "_dl_runtime_resolve", Module: "ld-linux-x86-64.so.2"}, false},
		{Frame{Name: "ObjectMonitor::EnterI", Module: "libjvm.so"}, false},
		{Frame{Name: "handle_request", Module: "server"}, true},
		{Frame{Name: "handle_request", Module: "libcustom.so"}, true},
		{Frame{Name: "schedule", Kernel: true}, false},
		// HotSpot's generated code, as its code cache names it (JDK 17, 25):
		// the Java method below it is the application frame.
		{Frame{Name: "_complete_monitor_locking_Java"}, false},
		{Frame{Name: "C2 Runtime complete_monitor_locking"}, false},
		{Frame{Name: "C1 Runtime monitorenter_nofpu_blob"}, false},
		{Frame{Name: "Shared Runtime resolve_virtual_call_blob"}, false},
		{Frame{Name: "monitorenter_nofpu Runtime1 stub"}, false},
		{Frame{Name: "NullPointerException at call throw_exception"}, false},
		{Frame{Name: "StubRoutines (initialstubs)"}, false},
		{Frame{Name: "g1_post_barrier_slow"}, false},
		{Frame{Name: "Contend.holdLock"}, true},
		{Frame{Name: "Echo$1$1.channelRead"}, true},
	} {
		if got := rules.IsApp(tc.f); got != tc.want {
			t.Errorf("IsApp(%+v) = %v, want %v", tc.f, got, tc.want)
		}
	}
}

func TestWholeUserStacks(t *testing.T) {
	u := func(names ...string) []Frame {
		var fs []Frame
		for _, n := range names {
			fs = append(fs, Frame{Name: n})
		}
		return append(fs, Frame{Name: "schedule", Kernel: true})
	}
	d := &Data{Stacks: []Stack{
		{Kind: KindOffCPU, Thread: "a", Frames: u("__clone3", "start_thread", "worker", "read"), Value: 3},
		{Kind: KindOffCPU, Thread: "b", Frames: u("__futex_abstimed_wait_common"), Value: 1}, // truncated at libc
		{Kind: KindOffCPU, Thread: "c", Frames: u("[user stack: blocked since before the recording]"), Value: 5},
		{Kind: KindOffCPU, Thread: "kworker", Frames: []Frame{{Name: "worker_thread", Kernel: true}}, Value: 7},
	}}
	r, err := ParseRules("default", DefaultRules())
	if err != nil {
		t.Fatal(err)
	}
	rep := Analyze(d, r, Options{})
	if rep.UserStackNs != 4 || rep.WholeStackNs != 3 {
		t.Errorf("user-stack ns %d, whole %d: want 4 and 3", rep.UserStackNs, rep.WholeStackNs)
	}
}

func TestThreadGroup(t *testing.T) {
	for in, want := range map[string]string{
		"broker-io-3":     "broker-io-N",
		"pool-2-thread-7": "pool-N-thread-N",
		"GC Thread#0":     "GC Thread#N",
		"G1 Conc#0":       "G1 Conc#N",
		"C2 CompilerThre": "C2 CompilerThre", // a name's own digits stay
		"worker12":        "workerN",
		"offcpu-f2d2371":  "offcpu-f2d2371", // a build id is no counter
		"kworker/u4:2":    "kworker/u4:N",
		"1-2":             "N-N",
		"":                "[unnamed]",
	} {
		if got := schema.ThreadGroup(in); got != want {
			t.Errorf("schema.ThreadGroup(%q) = %q, want %q", in, got, want)
		}
	}
}

// A real HotSpot recording (4 threads contending on a synchronized block,
// -XX:+PreserveFramePointer, perf map; recorded by offcpu record -p): the
// blocked time with an application frame is the monitor wait, under the
// Java method holding the block, not under HotSpot's stubs, libjvm,
// libc or the java launcher.
func TestAnalyzeJVM(t *testing.T) {
	d, err := Load(schema.FoldedMicroseconds, "testdata/jvm-contend.pb.gz")
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseRules("default", DefaultRules())
	if err != nil {
		t.Fatal(err)
	}
	rep := Analyze(d, r, Options{})
	if rep.AppBlockedNs == 0 {
		t.Fatal("no blocked time with an application frame")
	}
	for _, c := range rep.Categories {
		if c.Name == "monitor-wait" && c.Share < 0.99 {
			t.Errorf("monitor-wait is %.1f%% of the blocked time with an application frame, want all of it", 100*c.Share)
		}
	}
	if len(rep.TopAppFunctions) == 0 || rep.TopAppFunctions[0].Name != "Contend.holdLock" {
		t.Errorf("top application functions %v, want Contend.holdLock first", rep.TopAppFunctions)
	}
	if rep.WholeStackNs != rep.UserStackNs {
		t.Errorf("whole user stacks %d of %d ns", rep.WholeStackNs, rep.UserStackNs)
	}
}

// The default rules on programs nobody here wrote (testdata/real): little
// is left unexplained, idle waits land in idle categories, and the largest
// blocking cause is a real one.
func TestRealPrograms(t *testing.T) {
	rules, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		minIdle  float64  // share of off-CPU time
		idle     []string // idle categories that must hold time
		blocking string   // the largest blocking category (first match), "" if none
		fn       string   // the most blocked application function
		// JVMs recorded with no profiling flag: threads whose name starts
		// with thread spend ≥ 90% of their off-CPU time under frame.
		thread, frame string
	}{
		{"nginx", 0.85, []string{"event-loop-idle", "queue-wait", "signal-wait"}, "monitor-wait", "ngx_thread_cond_wait", "", ""},
		{"memcached", 0.95, []string{"event-loop-idle", "queue-wait", "sleep-timer"}, "monitor-wait", "", "", ""},
		// Recorded with Python frames: the handler threads contend for
		// the GIL, and wait in the socket module's reads.
		{"python", 0.30, []string{"event-loop-idle"}, "gil-wait", "socket.SocketIO.readinto", "", ""},
		{"go", 0.95, []string{"runtime", "event-loop-idle", "signal-wait", "child-wait"}, "", "", "", ""},
		{"juc", 0.80, []string{"queue-wait", "runtime", "sleep-timer", "child-wait"}, "monitor-wait", "Juc.holdLock", "locker-", "Juc.holdLock"},
		{"netty", 0.90, []string{"event-loop-idle", "queue-wait", "runtime"}, "", "", "nioEventLoopGro", "io.netty.channel.nio.NioEventLoop.select"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join("testdata", "real", tc.name+".pb.gz")
			d, err := Load(schema.FoldedMicroseconds, path)
			if err != nil {
				t.Fatal(err)
			}
			rep := Analyze(d, rules, Options{})
			tot := float64(rep.TotalOffCPUNs)
			cat := map[string]CategoryResult{}
			for _, c := range rep.Categories {
				cat[c.Name] = c
			}
			if other := float64(cat["other"].Ns) / tot; other > 0.10 {
				t.Errorf("other is %.1f%% of the off-CPU time, want at most 10%%", 100*other)
			}
			if idle := float64(rep.IdleNs) / tot; idle < tc.minIdle {
				t.Errorf("idle is %.1f%% of the off-CPU time, want at least %.0f%%", 100*idle, 100*tc.minIdle)
			}
			for _, c := range tc.idle {
				if !cat[c].Idle || cat[c].Ns == 0 {
					t.Errorf("idle category %s: %+v", c, cat[c])
				}
			}
			top := ""
			var topNs int64
			for _, c := range rep.Categories {
				if !c.Idle && c.Name != "other" && c.Name != "runqueue" && c.FirstNs > topNs {
					top, topNs = c.Name, c.FirstNs
				}
			}
			if top != tc.blocking {
				t.Errorf("largest blocking cause %q, want %q", top, tc.blocking)
			}
			if tc.fn != "" && (len(rep.TopAppFunctions) == 0 || rep.TopAppFunctions[0].Name != tc.fn) {
				t.Errorf("most blocked function %v, want %s", rep.TopAppFunctions, tc.fn)
			}
			if tc.thread != "" {
				var all, under int64
				for _, st := range d.Stacks {
					if st.Kind != "offcpu" || !strings.HasPrefix(st.Thread, tc.thread) {
						continue
					}
					all += st.Value
					for _, f := range st.Frames {
						if f.Name == tc.frame {
							under += st.Value
							break
						}
					}
				}
				if all == 0 || float64(under) < 0.9*float64(all) {
					t.Errorf("%s threads: %d of %d ns under %s, want ≥ 90%%", tc.thread, under, all, tc.frame)
				}
			}
			rep.Sources = []string{tc.name + ".pb.gz"}
			var buf bytes.Buffer
			rep.Write(&buf, "markdown")
			golden(t, filepath.Join("real", tc.name+".md"), buf.Bytes())
		})
	}
}

// Explain says which rule matched, through which frame, and what the time
// counts as.
func TestExplain(t *testing.T) {
	rules, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	for stack, want := range map[string][]string{
		"nginx;main;ngx_process_events_and_timers;epoll_wait;-;do_epoll_wait": {`frame do_epoll_wait matches`, "counts as idle: event-loop-idle"},
		"app;main;worker;pthread_mutex_lock;__lll_lock_wait;-;futex_wait":     {"innermost: worker", "(monitor-wait) matches: frame pthread_mutex_lock", "counts as blocked time with an application frame"},
		"pool;start_thread;pthread_cond_wait;-;futex_wait":                    {"application frames: none", "counts as idle: queue-wait"},
		"x;main;mystery;-;schedule":                                           {"no rule matches: other", "first match: other"},
	} {
		st := schema.FoldedStack(stack)
		st.State = "sleeping"
		got := strings.Join(rules.Explain(&st), "\n")
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: explanation lacks %q:\n%s", stack, w, got)
			}
		}
	}
}
