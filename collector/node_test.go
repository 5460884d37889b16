package collector

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/internal/testenv"
	"github.com/offcpu/offcpu/schema"
)

// nodeTotals is what testdata/node/server.js measured of itself, in ms.
type nodeTotals struct {
	FIFO, Exec, Busy float64
	Requests         int
}

// Node's own HTTP server (testdata/node/server.js) recorded with no flag,
// attached to a running process and started under the recorder: the time
// its event loop blocked is under the JavaScript function of the handler
// that blocked it, by name, script and line, and agrees with the
// handler's own clock; the loop's waits for events and the thread pool's
// waits for work are idle, the handlers' synchronous calls blocked.
func TestNodeServer(t *testing.T) {
	requireBPF(t)
	node := requireServer(t, "node", "nodejs")
	t.Run("attached", func(t *testing.T) { nodeServer(t, node, true) })
	t.Run("started", func(t *testing.T) { nodeServer(t, node, false) })
}

func nodeServer(t *testing.T, node string, attach bool) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	cmd := exec.Command(node, "testdata/node/server.js", fmt.Sprint(port), fifo, "0.05")
	cmd.Stderr = os.Stderr
	var s *Session
	var err error
	if attach {
		startReady(t, cmd)
		if s, err = Start(context.Background(), Options{PIDs: []int{cmd.Process.Pid}}); err != nil {
			t.Fatalf("Start: %v", err)
		}
	} else {
		if s, err = Start(context.Background(), Options{TargetsOnly: true}); err != nil {
			t.Fatalf("Start: %v", err)
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := s.StartCommand(cmd); err != nil {
			s.Stop()
			t.Fatalf("StartCommand: %v", err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
			s.Stop()
			t.Fatalf("server.js did not start: %v", err)
		}
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	get := func(path string) string {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Error(err)
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	// The totals before the load: the attached process may have served
	// none yet, the started one none either; kept to subtract.
	var before nodeTotals
	json.Unmarshal([]byte(get("/stats")), &before)
	rounds := 15 * testenv.Scale()
	for range rounds {
		// The FIFO's writer opens it once the handler waits to read,
		// then writes 30 ms later.
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); get("/fifo") }()
		w, err := os.OpenFile(fifo, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond)
		w.Write([]byte("x\n"))
		w.Close()
		wg.Wait()
		get("/exec")
		get("/busy")
		for range 3 {
			get("/pool")
		}
		time.Sleep(20 * time.Millisecond) // the loop idles
	}
	var after nodeTotals
	if err := json.Unmarshal([]byte(get("/stats")), &after); err != nil {
		t.Fatalf("stats: %v", err)
	}
	p, err := s.Stop()
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	own := map[string]time.Duration{
		"readFifo": time.Duration((after.FIFO - before.FIFO) * 1e6),
		"runChild": time.Duration((after.Exec - before.Exec) * 1e6),
	}
	if v8 := runtimeStats(s.Stats(), "v8"); v8.Processes != 1 || v8.Named == 0 {
		t.Fatalf("runtimes %+v: want the V8 process read and its functions named", s.Stats().Runtimes)
	}

	// Each handler's frame names its script and a line of its function
	// (the call's where V8 kept its source positions, else its first),
	// the blocking call's line among them.
	src, err := os.ReadFile("testdata/node/server.js")
	if err != nil {
		t.Fatal(err)
	}
	for fn, call := range map[string]string{"readFifo": "fs.readFileSync(fifo)", "runChild": "cp.execSync("} {
		first := sourceLine(t, "testdata/node/server.js", "function "+fn+"(")
		want := map[int64]bool{}
		for i, l := range strings.Split(string(src), "\n")[first-1:] {
			want[first+int64(i)] = true
			if l == "}" {
				break
			}
		}
		seen := map[string]int64{}
		for _, l := range p.Location {
			for _, ln := range l.Line {
				if ln.Function.Name == fn {
					seen[fmt.Sprintf("%s:%d", ln.Function.Filename, ln.Line)]++
					if !strings.HasSuffix(ln.Function.Filename, "/testdata/node/server.js") || !want[ln.Line] {
						t.Errorf("%s at %s:%d, want server.js at one of lines %v", fn, ln.Function.Filename, ln.Line, want)
					}
				}
			}
		}
		t.Logf("%s frames: %v", fn, seen)
		callAt := fmt.Sprintf("%s:%d", filepath.Join(mustGetwd(t), "testdata/node/server.js"), sourceLine(t, "testdata/node/server.js", call))
		if len(seen) == 0 || (seen[callAt] == 0 && len(seen) == 1) {
			t.Errorf("%s frames %v: want the call's line %s or the function's", fn, seen, callAt)
		}
	}

	r, err := analysis.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	d := loadRecorded(t, p)
	loop := int64(cmd.Process.Pid)
	pool := map[int64]bool{} // threads the loop thread wakes: libuv's pool
	for i := range d.Stacks {
		if st := &d.Stacks[i]; st.Kind == analysis.KindOffCPU && st.WakerTID == loop && st.TID != loop && st.PID == loop {
			pool[st.TID] = true
		}
	}
	var blocked, underHandler, unread, loopIdleAll, loopIdle, poolAll, poolIdle int64
	offUnder := map[string]int64{}
	against := map[string]int64{}
	for i := range d.Stacks {
		st := &d.Stacks[i]
		if st.Kind != analysis.KindOffCPU || st.PID != loop {
			continue
		}
		handler := ""
		js := false
		for _, f := range st.Frames {
			if f.Runtime == "v8js" {
				js = true
				if _, ok := own[f.Name]; ok {
					handler = f.Name
				}
			}
			if f.Name == "[javascript unread]" {
				unread += st.Value
			}
		}
		if st.TID == loop && handler != "" {
			offUnder[handler] += st.Value
		}
		if st.WaitsForCPU() {
			continue
		}
		idle := r.IsIdle(r.Categorize(st)[0])
		epoll := false
		for _, f := range st.Frames {
			epoll = epoll || (f.Kernel && f.Name == "do_epoll_wait")
		}
		switch {
		case st.TID == loop && !js && !epoll:
		case st.TID == loop && !js:
			loopIdleAll += st.Value
			if idle {
				loopIdle += st.Value
			} else {
				against["loop's poll, blocked: "+schema.FoldFrames(st.Frames)] += st.Value
			}
		case st.TID == loop:
			if idle {
				against["loop in JavaScript, idle: "+schema.FoldFrames(st.Frames)] += st.Value
				continue
			}
			blocked += st.Value
			if handler != "" {
				underHandler += st.Value
			}
		case pool[st.TID]:
			poolAll += st.Value
			if idle {
				poolIdle += st.Value
			}
		}
	}
	for k, v := range against {
		if v > int64(time.Millisecond) {
			t.Logf("  %.3f s %s", float64(v)/1e9, k)
		}
	}
	t.Logf("V8: %+v; loop blocked %.3f s, %.1f%% under a handler; loop's polls for events %.3f s, %.1f%% idle; pool (%d threads) %.3f s, %.1f%% idle",
		runtimeStats(s.Stats(), "v8"), float64(blocked)/1e9, 100*float64(underHandler)/float64(max(blocked, 1)), float64(loopIdleAll)/1e9,
		100*float64(loopIdle)/float64(max(loopIdleAll, 1)), len(pool), float64(poolAll)/1e9, 100*float64(poolIdle)/float64(max(poolAll, 1)))
	if blocked == 0 || float64(underHandler) < 0.95*float64(blocked) {
		t.Errorf("loop thread: %.3f of %.3f s blocked under a handler's function, want >= 95%%", float64(underHandler)/1e9, float64(blocked)/1e9)
	}
	for fn, want := range own {
		got := time.Duration(offUnder[fn])
		t.Logf("%s: off-CPU %v, its own clock %v (%+.2f%%)", fn, got, want, 100*float64(got-want)/float64(want))
		if got < want*95/100 || got > want*105/100 {
			t.Errorf("%s: off-CPU %v, its own clock %v: want within 5%%", fn, got, want)
		}
	}
	if loopIdleAll == 0 || float64(loopIdle) < 0.95*float64(loopIdleAll) {
		t.Errorf("the loop's waits for events: %.1f%% idle, want >= 95%%", 100*float64(loopIdle)/float64(max(loopIdleAll, 1)))
	}
	if len(pool) == 0 || float64(poolIdle) < 0.9*float64(poolAll) {
		t.Errorf("the thread pool's waits (%d threads): %.1f%% idle, want >= 90%%", len(pool), 100*float64(poolIdle)/float64(max(poolAll, 1)))
	}
	if float64(unread) > 0.01*float64(blocked) {
		t.Errorf("%.3f s under JavaScript frames not read, want under 1%% of %.3f s", float64(unread)/1e9, float64(blocked)/1e9)
	}
}

// Worker threads in Atomics.wait are judged by their waker's JavaScript:
// the one waiting for a lock the main thread's unlock releases is blocked,
// the one waiting for what its postJob hands over idle.
func TestNodeAtomics(t *testing.T) {
	requireBPF(t)
	node := requireServer(t, "node", "nodejs")
	cmd := exec.Command(node, "testdata/node/atomics.js", fmt.Sprint(30*testenv.Scale()))
	cmd.Stderr = os.Stderr
	p, _ := recordCommand(t, Options{}, cmd)
	r, err := analysis.LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	d := loadRecorded(t, p)
	type tally struct{ all, blocked int64 }
	by := map[string]*tally{"acquire": {}, "waitForJob": {}}
	for i := range d.Stacks {
		st := &d.Stacks[i]
		if st.Kind != analysis.KindOffCPU || st.WaitsForCPU() {
			continue
		}
		for _, f := range st.Frames {
			if tl := by[f.Name]; tl != nil && f.Runtime == "v8js" {
				tl.all += st.Value
				if !r.IsIdle(r.Categorize(st)[0]) {
					tl.blocked += st.Value
				}
				break
			}
		}
	}
	for fn, tl := range by {
		t.Logf("%s: %.3f s waiting, %.1f%% blocked", fn, float64(tl.all)/1e9, 100*float64(tl.blocked)/float64(max(tl.all, 1)))
	}
	if a := by["acquire"]; a.all == 0 || float64(a.blocked) < 0.9*float64(a.all) {
		t.Errorf("the lock's waiter: %.3f of %.3f s blocked, want >= 90%%", float64(a.blocked)/1e9, float64(a.all)/1e9)
	}
	if j := by["waitForJob"]; j.all == 0 || float64(j.blocked) > 0.1*float64(j.all) {
		t.Errorf("the jobs' waiter: %.3f of %.3f s blocked, want <= 10%%", float64(j.blocked)/1e9, float64(j.all)/1e9)
	}
}

func mustGetwd(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return wd
}
