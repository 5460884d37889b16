package collector

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/prometheus/procfs"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/internal/testenv"
	"github.com/offcpu/offcpu/runtimes"
	"github.com/offcpu/offcpu/schema"
)

// The helpers that start a program and record it, shared by the
// package's tests: the bundled Go workload, a command under the session,
// a server nobody here wrote with its load, checks against the kernel's
// schedstat, the analysis of what was recorded.

var (
	workloadOnce sync.Once
	workloadBin  string
)

var requireBPF = testenv.RequireRoot

// buildWorkload builds the Go workload once for the package's tests.
func buildWorkload(t *testing.T) string {
	t.Helper()
	workloadOnce.Do(func() {
		dir, err := os.MkdirTemp("", "offcpu-workload")
		if err != nil {
			t.Fatal(err)
		}
		bin := filepath.Join(dir, "workload")
		runBuild(t, "go", "build", "-o", bin, "./testdata/workload")
		workloadBin = bin
	})
	if workloadBin == "" {
		t.Fatal("building the workload failed in an earlier test")
	}
	return workloadBin
}

type wlResult struct {
	Thread  string `json:"thread"`
	TID     int    `json:"tid"`
	Blocked int64  `json:"blocked_ns"`
}

// runWorkload records the workload started under the session: its
// off-CPU profile, what it said of itself, the session's figures.
func runWorkload(t *testing.T, opts Options, args ...string) (*profile.Profile, []wlResult, Stats) {
	t.Helper()
	p, res, s := runWorkloadSession(t, opts, args...)
	return p, res, s.Stats()
}

// runWorkloadSession is runWorkload with the stopped session, whose
// other profiles (wake-ups, offwake) a test reads.
func runWorkloadSession(t *testing.T, opts Options, args ...string) (*profile.Profile, []wlResult, *Session) {
	t.Helper()
	cmd := exec.Command(buildWorkload(t), args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = os.Stderr
	p, s := recordCommand(t, opts, cmd)
	var res []wlResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("workload output %q: %v", out.String(), err)
	}
	return p, res, s
}

// startReady starts cmd and returns once it has printed its first line
// (it is ready); it is killed when the test ends.
func startReady(t *testing.T, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatalf("%s did not start: %v", filepath.Base(cmd.Path), err)
	}
	return cmd
}

// recordCommand records cmd, started under a new session, until it exits;
// with byPID the command is started first and recorded by pid (-p)
// 100 ms later.
// recordCommand records cmd as a started command, or with byPID[0] by
// its pid once it runs; with byPID[1] too, cmd is sent SIGUSR1 once the
// recorder is attached.
func recordCommand(t *testing.T, opts Options, cmd *exec.Cmd, byPID ...bool) (*profile.Profile, *Session) {
	t.Helper()
	var s *Session
	var err error
	if len(byPID) > 0 && byPID[0] {
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // let it come up
		opts.PIDs = []int{cmd.Process.Pid}
		if s, err = Start(context.Background(), opts); err != nil {
			cmd.Process.Kill()
			t.Fatalf("Start: %v", err)
		}
		if len(byPID) > 1 && byPID[1] {
			// It waits for this to start its timed work, so a slow
			// attach (a loaded machine, -race) misses none of it.
			cmd.Process.Signal(syscall.SIGUSR1)
		}
	} else {
		opts.TargetsOnly = true
		if s, err = Start(context.Background(), opts); err != nil {
			t.Fatalf("Start: %v", err)
		}
		if err := s.StartCommand(cmd); err != nil {
			s.Stop()
			t.Fatalf("StartCommand: %v", err)
		}
	}
	if err := cmd.Wait(); err != nil {
		s.Stop()
		t.Fatalf("%s: %v", filepath.Base(cmd.Path), err)
	}
	p, err := s.Stop()
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	return p, s
}

// runtimeStats is the figures of the runtime called name (zero: none met).
func runtimeStats(st Stats, name string) runtimes.Stats {
	for _, r := range st.Runtimes {
		if r.Runtime == name {
			return r
		}
	}
	return runtimes.Stats{}
}

// recordInsideTrace asks traceURL for an execution trace and records for
// dur with o inside it; it returns the session, the trace's file and when
// the trace was asked for (CLOCK_MONOTONIC).
func recordInsideTrace(t *testing.T, traceURL string, o Options, dur time.Duration) (*Session, string, uint64) {
	t.Helper()
	tr := filepath.Join(t.TempDir(), "server.trace")
	asked := monotonicNow()
	traced := fetchTrace(traceURL, tr)
	time.Sleep(300 * time.Millisecond)
	s, err := Start(context.Background(), o)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	time.Sleep(dur)
	if _, err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := <-traced; err != nil {
		t.Fatalf("the execution trace: %v", err)
	}
	return s, tr, asked
}

// requireServer finds a server binary from Debian's packages; CI installs
// them, so there a missing one fails instead of skipping.
func requireServer(t testing.TB, name, pkg string) string {
	t.Helper()
	for _, dir := range []string{"", "/usr/sbin/", "/usr/bin/"} {
		if p, err := exec.LookPath(dir + name); err == nil {
			return p
		}
	}
	if os.Getenv("OFFCPU_REQUIRE_BPF") == "1" {
		t.Fatalf("%s not found: apt-get install %s", name, pkg)
	}
	t.Skipf("%s not found: apt-get install %s", name, pkg)
	return ""
}

// freePort returns a loopback port nobody listens on.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitListening(t *testing.T, port int) {
	t.Helper()
	// Thirty seconds: an interpreter starting on two busy CPUs is slow.
	for i := 0; i < 600; i++ {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("nothing listens on 127.0.0.1:%d", port)
}

// kernelTime is the kernel's own accounting of one thread
// (/proc/PID/task/TID/schedstat): time on a CPU, time waiting on a run
// queue (run_delay), and context switches (voluntary and not, from status).
type kernelTime struct {
	cpu, runDelay time.Duration
	switches      int64
}

func threadTimes(t *testing.T, pids []int) map[int]kernelTime {
	t.Helper()
	out := map[int]kernelTime{}
	for _, pid := range pids {
		threads, err := procfs.AllThreads(pid)
		if err != nil {
			t.Fatalf("threads of %d: %v", pid, err)
		}
		for _, th := range threads {
			// run_delay grows when a wait for a CPU ends: a thread read while
			// runnable (a housekeeping timer beside CPU hogs) would count a
			// wait at one end that the window holds only in part. Read each
			// thread while it sleeps, if it does within 50 ms.
			for i := 0; i < 50; i++ {
				if ps, err := th.Stat(); err != nil || ps.State != "R" {
					break
				}
				time.Sleep(time.Millisecond)
			}
			st, err := th.Schedstat()
			if err != nil {
				t.Fatalf("schedstat of %d/%d: %v", pid, th.PID, err)
			}
			kt := kernelTime{cpu: time.Duration(st.RunningNanoseconds), runDelay: time.Duration(st.WaitingNanoseconds)}
			if status, err := th.NewStatus(); err == nil {
				kt.switches = int64(status.VoluntaryCtxtSwitches + status.NonVoluntaryCtxtSwitches)
			}
			out[th.PID] = kt
		}
	}
	return out
}

// checkAgainstSchedstat records the processes while load runs and compares
// each thread's time with the kernel's own accounting: on a CPU within 1%
// of schedstat's first field, waiting for a CPU within 5% of its second
// (run_delay), and on-CPU + waiting + blocked = the window within 1% (and
// the scheduler's path and the hypervisor's steal, which the recorder
// cannot see). A thread counts if it exists throughout the window. The
// load starts after the window opens and stops before it closes, so the
// server idles around the schedstat reads.
func checkAgainstSchedstat(t *testing.T, pids []int, load func(stop <-chan struct{}), opts ...Options) *profile.Profile {
	t.Helper()
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		t.Fatal(err)
	}
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	o.PIDs = pids
	s, err := Start(context.Background(), o)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	// The kernel's counts are read inside the window, as close to its ends
	// as the test can: threads that run on timers (housekeeping) would
	// otherwise be credited with runs outside it.
	before := threadTimes(t, pids)
	st0, err := fs.Stat()
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { load(stop); close(done) }()
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	<-done
	time.Sleep(300 * time.Millisecond)
	after := threadTimes(t, pids)
	st1, err := fs.Stat()
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Stop()
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	// Time the hypervisor ran other guests on our vCPUs (steal) is left out
	// of the running thread's schedstat time: the thread was off a real CPU
	// then, and the recorder cannot see it. It widens the bounds.
	steal := time.Duration((st1.CPUTotal.Steal - st0.CPUTotal.Steal) * float64(time.Second))
	t.Logf("steal time in the window: %v", steal)
	window := s.Stats().Duration
	recorded := map[int64]schema.ThreadTotal{}
	for _, tt := range schema.ThreadTotals(p) {
		recorded[tt.TID] = tt
	}
	checked, runqChecked := 0, 0
	for tid, k1 := range after {
		k0, ok := before[tid]
		if !ok {
			continue // not there throughout
		}
		cpu, runDelay := k1.cpu-k0.cpu, k1.runDelay-k0.runDelay
		truth := window - cpu
		if truth < 100*time.Millisecond {
			continue
		}
		checked++
		got := recorded[int64(tid)]
		name := fmt.Sprintf("%s/%d", got.Thread, tid)
		path := time.Duration(k1.switches-k0.switches) * schedPath
		// Classic tracepoints count no time on a CPU, nor a wait that began
		// before the start: there only the wait for a CPU is checked.
		exact := s.Stats().ExactOnCPU
		if d := got.OffCPU - truth; exact && (d < -truth/50-steal-path || d > truth/50+path) {
			t.Errorf("%s: recorded %v off-CPU; window %v less %v on CPU (schedstat) = %v (want within 2%% and %v of scheduler path, %v of steal below)",
				name, got.OffCPU, window, cpu, truth, path, steal)
		}
		if d := got.OnCPU - cpu; exact && (d < -cpu/100-time.Millisecond || d > cpu/100+time.Millisecond) {
			t.Errorf("%s: recorded %v on a CPU, schedstat %v (want within 1%% and 1ms)", name, got.OnCPU, cpu)
		}
		if runDelay >= 20*time.Millisecond {
			runqChecked++
		}
		// Classic mode misses the wait for a CPU that ends a wait begun
		// before the start (a few ms a thread, 20ms for a thread woken
		// beside busy CPUs): at most run_delay, and at least 80% of it
		// where it is 20ms or more over ten switches or more (with fewer,
		// that one missed wait can be most of it).
		switches := k1.switches - k0.switches
		below := runDelay/20 + time.Millisecond + steal
		if !exact {
			below = runDelay + 1
			if runDelay >= 20*time.Millisecond && switches >= 10 {
				below = runDelay/5 + steal
			}
		}
		if d := got.RunQueue - runDelay; d < -below || d > runDelay/20+time.Millisecond {
			t.Errorf("%s: recorded %v waiting for a CPU, schedstat run_delay %v (want within 5%% and 1ms, %v of steal below; classic mode: 80%% to 105%%)", name, got.RunQueue, runDelay, steal)
		}
		sum := got.OnCPU + got.RunQueue + got.Blocked
		if d := sum - window; exact && (d < -window/100-steal || d > window/100) {
			t.Errorf("%s: on-CPU %v + waiting for a CPU %v + blocked %v = %v, window %v (want within 1%%, %v of steal below)",
				name, got.OnCPU, got.RunQueue, got.Blocked, sum, window, steal)
		}
		t.Logf("%s: on-CPU %v (schedstat %v), waiting for a CPU %v (run_delay %v), blocked %v; sum %v of window %v; %d switches",
			name, got.OnCPU, cpu, got.RunQueue, runDelay, got.Blocked, sum, window, switches)
	}
	if checked < 2 {
		t.Errorf("only %d threads with more than 100ms off-CPU", checked)
	}
	if st := s.Stats(); st.Lost() != 0 {
		t.Errorf("losses: %d", st.Lost())
	}
	if o.skipFirstIn && s.Stats().MissedSwitchIn == 0 {
		t.Errorf("first switch-ins skipped, none recovered")
	}
	if !s.Stats().ExactOnCPU && s.Stats().Attach == "tp_btf" {
		t.Errorf("on-CPU time not recorded exactly (attach %s)", s.Stats().Attach)
	}
	t.Logf("%d threads checked, %d with 20ms or more of run-queue wait", checked, runqChecked)
	if t.Failed() {
		// What the kernel side dropped or filtered, to tell a lost interval
		// from one never opened.
		b, _ := json.Marshal(s.Stats())
		t.Logf("stats: %s", b)
	}
	return p
}

// children lists a process's child processes.
func children(t *testing.T, pid int) []int {
	t.Helper()
	var out []int
	for i := 0; i < 50 && len(out) == 0; i++ {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range strings.Fields(string(b)) {
			n, _ := strconv.Atoi(f)
			out = append(out, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return out
}

// httpLoad fetches url over conns keep-alive connections until stop.
func httpLoad(t *testing.T, url string, size, conns int, stop <-chan struct{}) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns}}
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	for c := 0; c < conns; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.Get(url)
				if err != nil {
					t.Error(err)
					return
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || int(n) != size {
					t.Errorf("GET %s: %s, %d bytes", url, resp.Status, n)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// loadRecorded reads a recorded profile as analysis reads its file.
func loadRecorded(t *testing.T, p *profile.Profile) *schema.Data {
	t.Helper()
	path := filepath.Join(t.TempDir(), "p.pb.gz")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Write(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	d, err := analysis.Load(schema.FoldedNanoseconds, path)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
