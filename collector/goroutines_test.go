package collector

import (
	"bufio"
	"context"
	"debug/elf"
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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"golang.org/x/exp/trace"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/collector/goroutines"
	"github.com/offcpu/offcpu/internal/testenv"
	"github.com/offcpu/offcpu/runtimes/golang"
	"github.com/offcpu/offcpu/schema"
)

// The runtime's offsets for the toolchain that builds this project are in
// the table, and equal to its DWARF: what a stripped binary of that
// release is read with.
func TestGoOffsetsTable(t *testing.T) {
	// The building toolchain, and Debian's Go 1.19 (CI installs it).
	tools := map[string]string{"current": "go"}
	if _, err := os.Stat(go119Bin); err == nil {
		tools["go1.19"] = go119Bin
	} else if os.Getenv("CI") != "" {
		t.Fatalf("no %s: .ci/run installs golang-1.19-go", go119Bin)
	}
	for name, gobin := range tools {
		t.Run(name, func(t *testing.T) { checkTableOffsets(t, gobin) })
	}
	if _, err := golang.ReadRuntime("/bin/sh"); err != golang.ErrNotGo {
		t.Errorf("/bin/sh: %v, want golang.ErrNotGo", err)
	}
}

const go119Bin = "/usr/lib/go-1.19/bin/go"

// checkTableOffsets builds the test program with gobin, with DWARF and
// stripped, and compares the offsets the table gives with DWARF's.
func checkTableOffsets(t *testing.T, gobin string) {
	dir := t.TempDir()
	src, err := os.ReadFile("testdata/goroutines/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	withDWARF, without, symsOnly := filepath.Join(dir, "with"), filepath.Join(dir, "without"), filepath.Join(dir, "syms")
	for _, args := range [][]string{{"-o", withDWARF}, {"-ldflags=-s -w", "-o", without}, {"-ldflags=-w", "-o", symsOnly}} {
		cmd := exec.Command(gobin, append(append([]string{"build"}, args...), "main.go")...)
		cmd.Dir = dir
		// Outside the module: an older toolchain builds the file alone.
		cmd.Env = append(os.Environ(), "GO111MODULE=off", "GOTOOLCHAIN=local", "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s build: %v\n%s", gobin, err, out)
		}
	}
	a, err := golang.ReadRuntime(withDWARF)
	if err != nil {
		t.Fatal(err)
	}
	b, err := golang.ReadRuntime(without)
	if err != nil {
		t.Fatalf("stripped: %v", err)
	}
	t.Logf("%s: %+v", a.Version, a.Offsets)
	checkProbeSite(t, withDWARF, a)
	checkProbeSite(t, without, b)
	if !a.FromDWARF || b.FromDWARF {
		t.Fatalf("DWARF read %v for the plain build, %v for the stripped one", a.FromDWARF, b.FromDWARF)
	}
	if a.Offsets != b.Offsets {
		t.Errorf("%s: table %+v, DWARF %+v", a.Version, b.Offsets, a.Offsets)
	}
	// runtime.memstats.numgc: from DWARF, from the table with symbols,
	// not at all stripped.
	c, err := golang.ReadRuntime(symsOnly)
	if err != nil {
		t.Fatalf("without DWARF: %v", err)
	}
	offA, offC := a.GCCycles-memstatsAddr(t, withDWARF), c.GCCycles-memstatsAddr(t, symsOnly)
	t.Logf("runtime.memstats.numgc at +%d (DWARF), +%d (table)", offA, offC)
	if a.GCCycles == 0 || c.GCCycles == 0 || offA != offC || b.GCCycles != 0 {
		t.Errorf("runtime.memstats.numgc at %#x (DWARF), %#x (table and symbols), %#x (stripped; want 0)", a.GCCycles, c.GCCycles, b.GCCycles)
	}
	if a.Casgstatus == 0 || a.Casgstatus != b.Casgstatus {
		t.Errorf("runtime.casgstatus at %#x (symbols), %#x (pclntab)", a.Casgstatus, b.Casgstatus)
	}
	for _, rt := range []*golang.Runtime{a, b} {
		if len(rt.Reasons) < 20 || rt.Reasons[2] != "IO wait" || !slices.Contains(rt.Reasons, "chan receive") {
			t.Errorf("wait reasons %q", rt.Reasons)
		}
	}
}

func memstatsAddr(t *testing.T, path string) uint64 {
	ef, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ef.Close()
	syms, _ := ef.Symbols()
	for _, s := range syms {
		if s.Name == "runtime.memstats" {
			return s.Value
		}
	}
	t.Fatalf("%s: no runtime.memstats", path)
	return 0
}

// goWaitKey is a wait's innermost function of package main and the class
// of its reason.
type goWaitKey struct{ fn, class string }

// traceReasonClass maps the execution trace's block reasons onto
// goroutines.ReasonClass's classes.
func traceReasonClass(r string) string {
	switch {
	case strings.HasPrefix(r, "chan "):
		return "chan"
	case r == "select":
		return "select"
	case strings.HasPrefix(r, "sync"):
		return "sync"
	case r == "network":
		return "network"
	case r == "sleep":
		return "sleep"
	case strings.Contains(strings.ToLower(r), "gc"):
		return "gc"
	}
	return "other"
}

// traceSums is what an execution trace says of goroutine waits that
// began and ended in it (from the block to being made runnable).
type traceSums struct {
	byKey   map[goWaitKey]int64
	byG     map[goClassKey]int64 // by goroutine and reason class
	waitsG  map[goClassKey]int64 // how many waits
	created map[int64]bool       // goroutines created during the trace
	wakes   map[[2]int64]int64   // (goroutine, the goroutine that made it runnable; 0: none) -> count
	// Goroutines still waiting when the trace ended: their last wait has
	// no end in it, while the recorder counts it to its own end.
	openAtEnd map[int64]bool
}

// compared says whether goroutine goid's waits are all inside the trace.
func (s *traceSums) compared(goid int64) bool { return s.created[goid] && !s.openAtEnd[goid] }

type goClassKey struct {
	goid  int64
	class string
}

// openTrace opens an execution trace for reading (closed at the end of
// the test).
func openTrace(t *testing.T, path string) *trace.Reader {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	r, err := trace.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// traceWaits reads an execution trace's goroutine waits.
func traceWaits(t *testing.T, path string) *traceSums {
	r := openTrace(t, path)
	type open struct {
		at  trace.Time
		key goWaitKey
	}
	blocked := map[trace.GoID]open{}
	sums := &traceSums{byKey: map[goWaitKey]int64{}, byG: map[goClassKey]int64{}, waitsG: map[goClassKey]int64{}, created: map[int64]bool{},
		wakes: map[[2]int64]int64{}, openAtEnd: map[int64]bool{}}
	for {
		ev, err := r.ReadEvent()
		if err != nil {
			for id := range blocked {
				sums.openAtEnd[int64(id)] = true
			}
			break
		}
		st, from, to, ok := goTransition(&ev)
		if !ok {
			continue
		}
		id := st.Resource.Goroutine()
		switch {
		case from == trace.GoNotExist && to == trace.GoRunnable:
			sums.created[int64(id)] = true
		case from == trace.GoRunning && to == trace.GoWaiting:
			fn := ""
			for fr := range st.Stack.Frames() {
				if strings.HasPrefix(fr.Func, "main.") {
					fn = fr.Func
					break
				}
			}
			blocked[id] = open{ev.Time(), goWaitKey{fn, traceReasonClass(st.Reason)}}
		case from == trace.GoWaiting:
			if o, ok := blocked[id]; ok {
				sums.byKey[o.key] += int64(ev.Time() - o.at)
				sums.byG[goClassKey{int64(id), o.key.class}] += int64(ev.Time() - o.at)
				sums.waitsG[goClassKey{int64(id), o.key.class}]++
				delete(blocked, id)
				waker := int64(ev.Goroutine())
				if ev.Goroutine() == trace.NoGoroutine {
					waker = 0
				}
				sums.wakes[[2]int64{int64(id), waker}]++
			}
		}
	}
	return sums
}

// offcpuWaits sums the goroutine profile's blocked time by goWaitKey.
func offcpuWaits(p *profile.Profile) map[goWaitKey]int64 {
	out := map[goWaitKey]int64{}
	for _, s := range p.Sample {
		fn := ""
	find:
		for _, l := range s.Location {
			for _, ln := range l.Line {
				if strings.HasPrefix(ln.Function.Name, "main.") {
					fn = ln.Function.Name
					break find
				}
			}
		}
		out[goWaitKey{fn, goroutines.ReasonClass(s.Label[schema.LabelReason][0])}] += s.Value[0]
	}
	return out
}

// recordGoProgram builds the Go program in dir and records its goroutine
// waits from its start to its exit; it writes its execution trace to the
// file returned (its first argument, then args).
func recordGoProgram(t *testing.T, dir string, args ...string) (*Session, string) {
	t.Helper()
	tmp := t.TempDir()
	bin, tr := filepath.Join(tmp, "prog"), filepath.Join(tmp, "trace.out")
	runBuild(t, "go", "build", "-o", bin, dir)
	return recordGoCommand(t, bin, append([]string{tr}, args...)...), tr
}

// recordGoCommand records the goroutine waits of bin run with args from
// its start to its exit, which must be clean.
func recordGoCommand(t *testing.T, bin string, args ...string) *Session {
	t.Helper()
	s, err := Start(context.Background(), Options{TargetsOnly: true, NoWakeups: true, Goroutines: true})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	if err := s.StartCommand(cmd); err != nil {
		s.Stop()
		t.Fatal(err)
	}
	runErr := cmd.Wait()
	if _, err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if runErr != nil {
		t.Fatalf("the program: %v", runErr)
	}
	return s
}

// A Go program waits in every common way with the runtime's execution
// trace on: the goroutine waits recorded from outside match the trace's,
// per innermost function and reason, within 5%.
func TestGoroutineWaitsMatchTrace(t *testing.T) {
	requireBPF(t)
	s, tr := recordGoProgram(t, "./testdata/goroutines", "1500ms")
	gp := s.Profiles().Goroutines
	if gp == nil {
		t.Fatal("no goroutine profile")
	}
	st := s.Stats().Goroutines
	t.Logf("goroutine stats %+v", *st)
	if st.Processes != 1 || st.LostParks+st.LostWaits+st.LostStack != 0 {
		t.Errorf("processes %d, lost %d/%d/%d", st.Processes, st.LostParks, st.LostWaits, st.LostStack)
	}
	sums := traceWaits(t, tr)
	want, wakes := sums.byKey, sums.wakes
	wakers := offcpuWakers(gp)
	got := offcpuWaits(gp)
	var total int64
	for _, v := range want {
		total += v
	}
	var keys []goWaitKey
	for k := range want {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return want[keys[i]] > want[keys[j]] })
	compared := 0
	for _, k := range keys {
		w, g := want[k], got[k]
		diff := float64(g-w) / float64(w)
		t.Logf("%-24s %-8s trace %8.2f ms  offcpu %8.2f ms  %+6.2f%%", k.fn, k.class, float64(w)/1e6, float64(g)/1e6, 100*diff)
		if k.fn == "" || float64(w) < 0.01*float64(total) {
			continue // runtime goroutines, and what is too small to hold to 5%
		}
		compared++
		if diff > 0.05 || diff < -0.05 {
			t.Errorf("%s (%s): offcpu %.2f ms, trace %.2f ms: off by %+.1f%%", k.fn, k.class, float64(g)/1e6, float64(w)/1e6, 100*diff)
		}
	}
	if compared < 8 {
		t.Errorf("%d kinds of wait compared, want every kind the program has (8 or more)", compared)
	}
	// Who made each goroutine runnable: the same goroutine as the trace's
	// unblocking one, or like it none (network poller, timers).
	var all, same int64
	for k, n := range wakes {
		all += n
		same += min(n, wakers[k])
	}
	if all == 0 || float64(same) < 0.95*float64(all) {
		t.Errorf("the waker matches the trace's for %d of %d wake-ups, want ≥ 95%%", same, all)
	}
	t.Logf("trace: %d wake-ups, %.1f ms blocked; waker as in the trace for %.2f%%", all, float64(total)/1e6, 100*float64(same)/float64(max(all, 1)))
	checkGoroutineVerdicts(t, gp)
}

// checkGoroutineVerdicts analyzes the goroutine profile with the default
// rules: each function of the test program waits in the category its
// wait reason and waker give, idle or blocked as a Go developer reads it.
func checkGoroutineVerdicts(t *testing.T, gp *profile.Profile) {
	t.Helper()
	r, err := analysis.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"main.chanRecv": "queue-wait", "main.selectWait": "queue-wait", "main.condWait": "queue-wait",
		"main.chanSend": "chan-send", "main.mutexWait": "monitor-wait", "main.waitGroupWait": "join-wait",
		"main.sleeper": "sleep-timer", "main.netServer": "input-wait",
	}
	got := map[string]map[string]int64{}
	d := loadRecorded(t, gp)
	for i := range d.Stacks {
		st := &d.Stacks[i]
		if st.WaitsForCPU() {
			continue
		}
		fn := ""
		for _, f := range st.Frames {
			if strings.HasPrefix(f.Name, "main.") && !strings.HasPrefix(f.Name, "main.main") {
				fn = f.Name // innermost last: frames are root first
			}
		}
		if got[fn] == nil {
			got[fn] = map[string]int64{}
		}
		got[fn][r.Categorize(st)[0]] += st.Value
	}
	for fn, cat := range want {
		var all int64
		for _, ns := range got[fn] {
			all += ns
		}
		t.Logf("%s: %v", fn, got[fn])
		if all == 0 || float64(got[fn][cat]) < 0.95*float64(all) {
			t.Errorf("%s: %v of %v in %s (idle %v), want >= 95%%", fn, time.Duration(got[fn][cat]), time.Duration(all), cat, r.IsIdle(cat))
		}
	}
}

// offcpuWakers counts the goroutine profile's waits by (goroutine, waker).
func offcpuWakers(p *profile.Profile) map[[2]int64]int64 {
	out := map[[2]int64]int64{}
	for _, s := range p.Sample {
		if s.Label[schema.LabelReason][0] == golang.ReasonRunnable {
			continue // no wake-up: a wait for a P alone
		}
		out[[2]int64{s.NumLabel[schema.LabelGoid][0], s.NumLabel[schema.LabelWakerGoid][0]}] += s.Value[2]
	}
	return out
}

// natsClient speaks enough of the NATS protocol to publish or subscribe.
func natsClient(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	if _, err := r.ReadString('\n'); err != nil { // INFO
		t.Fatal(err)
	}
	fmt.Fprintf(c, "CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n")
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "PONG") {
			return c, r
		}
	}
}

// A Go server nobody here wrote (Debian's nats-server: Go 1.19, stripped,
// started before the recorder) under a load of publishers and
// subscribers: the goroutine waits of the connections opened and closed
// within its own execution trace (/debug/pprof/trace) match the trace's,
// goroutine by goroutine and reason class, within 5%, and so do wakers.
func TestGoroutineWaitsNATSServer(t *testing.T) {
	requireBPF(t)
	bin := requireServer(t, "nats-server", "nats-server")
	port, prof := freePort(t), freePort(t)
	srv := exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port), "--profile", strconv.Itoa(prof))
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for i := 0; ; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		} else if i == 100 {
			t.Fatalf("nats-server does not listen: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	s, err := Start(context.Background(), Options{PIDs: []int{srv.Process.Pid}, NoWakeups: true, Goroutines: true})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	tr := filepath.Join(t.TempDir(), "nats.trace")
	got := make(chan error, 1)
	go func() {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/trace?seconds=3", prof))
		if err != nil {
			got <- err
			return
		}
		defer resp.Body.Close()
		f, err := os.Create(tr)
		if err == nil {
			_, err = io.Copy(f, resp.Body)
			f.Close()
		}
		got <- err
	}()
	time.Sleep(500 * time.Millisecond) // the trace has started
	var subs, pubs []net.Conn
	for i := 0; i < 2; i++ {
		c, r := natsClient(t, addr)
		fmt.Fprintf(c, "SUB load %d\r\n", i+1)
		go io.Copy(io.Discard, r)
		subs = append(subs, c)
	}
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		c, _ := natsClient(t, addr)
		pubs = append(pubs, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			msg := []byte("PUB load 16\r\n0123456789abcdef\r\n")
			for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); {
				c.Write(msg)
				time.Sleep(200 * time.Microsecond)
			}
		}()
	}
	wg.Wait()
	for _, c := range append(pubs, subs...) {
		c.Close()
	}
	if err := <-got; err != nil {
		s.Stop()
		t.Fatalf("the server's execution trace: %v", err)
	}
	if _, err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	st := s.Stats().Goroutines
	t.Logf("goroutine stats %+v", *st)
	if st.Processes != 1 {
		t.Fatalf("%d Go processes probed, want 1 (%v)", st.Processes, st.Skipped)
	}
	sums := traceWaits(t, tr)
	mine := map[goClassKey]int64{}
	wakers := map[[2]int64]int64{}
	for _, smp := range s.Profiles().Goroutines.Sample {
		goid := smp.NumLabel[schema.LabelGoid][0]
		if sums.compared(goid) {
			mine[goClassKey{goid, goroutines.ReasonClass(smp.Label[schema.LabelReason][0])}] += smp.Value[0]
			wakers[[2]int64{goid, smp.NumLabel[schema.LabelWakerGoid][0]}] += smp.Value[2]
		}
	}
	var total int64
	for k, v := range sums.byG {
		if sums.compared(k.goid) {
			total += v
		}
	}
	compared := 0
	for k, w := range sums.byG {
		if !sums.compared(k.goid) || float64(w) < 0.01*float64(total) {
			continue
		}
		compared++
		g := mine[k]
		diff := float64(g-w) / float64(w)
		n := sums.waitsG[k]
		t.Logf("goroutine %d %-8s trace %8.2f ms  offcpu %8.2f ms  %+6.2f%%  (%d waits, %+.2f µs each)", k.goid, k.class,
			float64(w)/1e6, float64(g)/1e6, 100*diff, n, float64(g-w)/1e3/float64(n))
		// The tracer stamps a park before the state changes, after taking
		// the goroutine's stack (runtime park_m: "Trace the event before
		// the transition. It may take a stack trace"): its waits are
		// longer by that (7 to 19 µs each on this 2-CPU VM under load), on
		// top of 5%, up to 10 µs a wait.
		if allow := 0.05*float64(w) + 10e3*float64(n); math.Abs(float64(g-w)) > allow {
			t.Errorf("goroutine %d (%s): offcpu %.2f ms, trace %.2f ms", k.goid, k.class, float64(g)/1e6, float64(w)/1e6)
			for kk, v := range mine {
				if kk.goid == k.goid {
					t.Logf("  offcpu %s %.2f ms; trace %.2f ms", kk.class, float64(v)/1e6, float64(sums.byG[kk])/1e6)
				}
			}
		}
	}
	if compared < 4 {
		t.Errorf("%d goroutine waits compared, want the connections' (4 or more)", compared)
	}
	var all, same int64
	for k, n := range sums.wakes {
		if sums.compared(k[0]) {
			all += n
			same += min(n, wakers[k])
		}
	}
	if all < 1000 || float64(same) < 0.95*float64(all) {
		t.Errorf("the waker matches the trace's for %d of %d wake-ups, want ≥ 95%% of 1000 or more", same, all)
	}
	t.Logf("%d goroutine waits compared (%.1f ms); waker as in the trace for %d of %d wake-ups", compared, float64(total)/1e6, same, all)
}

// 100,000 goroutines wait on one channel, then sleep: more than the
// aggregation map holds by goroutine, so waits are merged without their
// ids, and none is lost; per function and reason the time matches the
// execution trace's.
func TestManyGoroutines(t *testing.T) {
	requireBPF(t)
	s, tr := recordGoProgram(t, "./testdata/manygoroutines", "100000")
	st := s.Stats().Goroutines
	t.Logf("goroutine stats %+v", *st)
	if st.Parks < 200000 || st.LostParks+st.LostWaits+st.LostStack != 0 || st.Merged == 0 {
		t.Errorf("parks %d (want >= 200000), lost %d/%d/%d (want none), merged %d (want some)", st.Parks, st.LostParks, st.LostWaits, st.LostStack, st.Merged)
	}
	want, got := traceWaits(t, tr).byKey, offcpuWaits(s.Profiles().Goroutines)
	// Each of the 100,000 sleeps lasts a millisecond at least. In about
	// half of the runs under -race, the trace's timestamps put their sum
	// well below that (56-78 s), or the two disagree by 20%: the trace is
	// no truth for them then, and offcpu is held to the sleeps' bounds
	// instead (a timer late by half its period at most).
	least := int64(100000 * time.Millisecond)
	for _, k := range []goWaitKey{{"main.waiter", "chan"}, {"main.waiter", "sleep"}} {
		w, g := want[k], got[k]
		t.Logf("%s %s: trace %.1f s, offcpu %.1f s", k.fn, k.class, float64(w)/1e9, float64(g)/1e9)
		if k.class == "sleep" && (w < least*99/100 || math.Abs(float64(g-w)) > 0.05*float64(w)) {
			// Also seen (a full -race suite on a loaded machine): the
			// trace at 113 s, offcpu at 135 s, both possible; and in CI
			// the trace at 103 s, offcpu at 171.5 s (timers run late by
			// 0.7 ms on average with 2 CPUs busy): the bound is the
			// floor and a timer late by 1.5 ms on average.
			t.Logf("the trace's %.1f s for 100,000 sleeps of 1 ms is impossible or off offcpu's by more than 5%%: offcpu checked against [%.0f s, %.0f s]", float64(w)/1e9, float64(least)/1e9, 2.5*float64(least)/1e9)
			if g < least || g > least*5/2 {
				t.Errorf("%s %s: offcpu %.1f s, want within [%.0f s, %.0f s]", k.fn, k.class, float64(g)/1e9, float64(least)/1e9, 2.5*float64(least)/1e9)
			}
			continue
		}
		if w == 0 || math.Abs(float64(g-w)) > 0.05*float64(w) {
			t.Errorf("%s %s: offcpu %.1f s, trace %.1f s: want within 5%%", k.fn, k.class, float64(g)/1e9, float64(w)/1e9)
		}
	}
}

// Goroutines of a running program, sleeping 1 ms in a loop, recorded for
// one second: each one's waits (blocked and run queue) fill the window and
// never exceed it: waits open at the start count from it, those open at
// the end up to it, none after.
func TestGoroutineWaitsInsideWindow(t *testing.T) {
	requireBPF(t)
	bin := filepath.Join(t.TempDir(), "gosleepers")
	runBuild(t, "go", "build", "-o", bin, "./testdata/gosleepers")
	cmd := startReady(t, exec.Command(bin, "4"))
	s, err := Start(context.Background(), Options{PIDs: []int{cmd.Process.Pid}, NoWakeups: true, Goroutines: true})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	time.Sleep(time.Second)
	if _, err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	window := s.Stats().Duration.Nanoseconds()
	totals := map[int64]int64{}
	open := 0
	for _, smp := range s.Profiles().Goroutines.Sample {
		var fn string
		for _, l := range smp.Location {
			if n := l.Line[0].Function.Name; n == "main.sleeper" {
				fn = n
			}
		}
		if fn == "" {
			continue
		}
		totals[smp.NumLabel[schema.LabelGoid][0]] += smp.Value[0] + smp.Value[1]
		if len(smp.Label[schema.LabelInterval]) > 0 {
			open++
		}
	}
	if len(totals) != 4 {
		t.Fatalf("%d sleeping goroutines recorded, want 4", len(totals))
	}
	// Each 1 ms sleep's loop and traps run on the CPU: slowly under
	// emulation (a 6.1 guest read 97.9% in CI's run of a slow day).
	least := 0.98
	if testenv.Scale() > 1 {
		least = 0.96
	}
	for g, ns := range totals {
		t.Logf("goroutine %d: %.2f ms of a %.2f ms window (%.2f%%)", g, float64(ns)/1e6, float64(window)/1e6, 100*float64(ns)/float64(window))
		if ns > window || float64(ns) < least*float64(window) {
			t.Errorf("goroutine %d waited %.2f ms in a %.2f ms window: want at most the window and %.0f%% of it", g, float64(ns)/1e6, float64(window)/1e6, 100*least)
		}
	}
	t.Logf("%d waits open at the end", open)
}

// A waits on a channel that B sends on after B waited on a mutex that C
// held while it slept: A's wait is traced through B to C.
func TestGoroutineWaitChain(t *testing.T) {
	requireBPF(t)
	s, _ := recordGoProgram(t, "./testdata/gochain", "50")
	r, err := analysis.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	d := loadRecorded(t, s.Profiles().Goroutines)
	rep := analysis.Analyze(d, r, analysis.Options{Top: 20})
	var a, toC int64
	for _, rc := range rep.Chains {
		if rc.Waiters != "main.chainA" {
			continue
		}
		t.Logf("%s: %v (%.1f%%) %v", rc.Waiters, time.Duration(rc.Ns), 100*rc.Share, rc.Path)
		a = int64(float64(rc.Ns) / rc.Share)
		for _, h := range rc.Path {
			if h.Group == "main.chainC" {
				toC += rc.Ns
				break
			}
		}
	}
	if a == 0 {
		t.Fatalf("no chain of main.chainA's blocked time: %+v", rep.Chains)
	}
	if float64(toC) < 0.9*float64(a) {
		t.Errorf("%v of main.chainA's %v traced to main.chainC, want >= 90%%", time.Duration(toC), time.Duration(a))
	}
}
