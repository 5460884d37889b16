package collector

import (
	"bufio"
	"context"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/threadctx"
	"github.com/offcpu/offcpu/schema"
)

// A C server that publishes OpenTelemetry thread context (OTEP 4947) and
// its attribute names in its process context (OTEP 4719): each request
// runs under its own trace and span with an http.route and a tenant, and
// measures its own time off a CPU. The waits recorded carry the request's
// ids and attributes, and their time per span and per route is the
// requests' own: the variable in the executable (static TLS), in a
// dlopen'd library (dynamic TLS through a TLS descriptor) recorded by pid,
// and with deferred walks (a walk threshold: read at the switch-in).
func TestThreadContext(t *testing.T) {
	requireBPF(t)
	dir := t.TempDir()
	exe, lib, viaLib := filepath.Join(dir, "server"), filepath.Join(dir, "libtctx.so"), filepath.Join(dir, "serverlib")
	runBuild(t, "gcc", "-O2", "-pthread", "-rdynamic", "-o", exe, "testdata/tctx/server.c")
	runBuild(t, "gcc", "-O2", "-pthread", "-DTCTX_LIB", "-o", viaLib, "testdata/tctx/server.c", "-ldl")
	runBuild(t, "gcc", "-O2", "-fPIC", "-shared", "-mtls-dialect=gnu2", "-o", lib, "testdata/tctx/lib.c")
	cases := []struct {
		name   string
		opts   Options
		bin    string
		access string
		byPID  bool
	}{
		{"executable", Options{}, exe, "local-exec", false},
		{"dlopen-by-pid", Options{}, viaLib, "tlsdesc", true},
		{"deferred-walks", Options{WalkThreshold: 100 * time.Microsecond}, exe, "local-exec", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			report := filepath.Join(t.TempDir(), "report")
			f := c.bin
			if c.bin == viaLib {
				f = lib
			}
			if got, err := threadctx.FileAccess(f); err != nil || got.Model != c.access {
				t.Fatalf("%s: access %v (%v), want %v", filepath.Base(f), got, err, c.access)
			}
			cmd := exec.Command(c.bin, "3", report, lib)
			cmd.Env = append(os.Environ(), "TCTX_WAIT=1")
			if !c.byPID {
				cmd.Env = nil
			}
			p, s := recordCommand(t, c.opts, cmd, c.byPID, c.byPID)
			reqs := readTctxReport(t, report)
			st := s.Stats().ThreadContext
			if st == nil {
				t.Fatal("no thread context read")
			}
			t.Logf("%d requests; thread context %+v", len(reqs), *st)
			if st.Processes != 1 || st.Lost+st.Shed+st.Truncated != 0 || len(st.Skipped) > 0 || st.Records < uint64(len(reqs))*9/10 {
				t.Errorf("thread context: %+v for %d requests", *st, len(reqs))
			}
			bySpan, byRoute, routeOf := spanTimes(p, 3, 4)
			var missedIns uint64
			if c.opts.WalkThreshold > 0 {
				missedIns = s.Stats().MissedSwitchIn
			}
			checkSpanTimes(t, reqs, bySpan, byRoute, routeOf, 3, "", 0.02, missedIns, false)
			checkTenants(t, p)
			checkLabelledVerdicts(t, p, "monitor-wait", "io", "request-timer")
		})
	}
}

// readTctxReport reads the server's requests: span, route, own off-CPU ns.
func readTctxReport(t *testing.T, path string) []labelledRequest {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var reqs []labelledRequest
	for sc := bufio.NewScanner(f); sc.Scan(); {
		w := strings.Fields(sc.Text())
		if len(w) != 3 {
			t.Fatalf("report line %q", sc.Text())
		}
		ns, err := strconv.ParseInt(w[2], 10, 64)
		if err != nil {
			t.Fatalf("report line %q: %v", sc.Text(), err)
		}
		reqs = append(reqs, labelledRequest{Span: w[0], Route: w[1], Wait: ns})
	}
	if len(reqs) < 100 {
		t.Fatalf("%d requests served", len(reqs))
	}
	return reqs
}

// checkTenants: the attributes carry the names the process context gives
// their key indexes (not attr.N), with the values the server set.
func checkTenants(t *testing.T, p interface{ String() string }) {
	t.Helper()
	if s := p.String(); !strings.Contains(s, "tenant:[tenant-") || strings.Contains(s, "attr.") {
		t.Errorf("no tenant attribute named from the process context in the profile")
	}
}

// The OpenTelemetry eBPF Instrumentation's map (OTEP 4855): offcpu pins
// otel_traces_ctx_v1 in a BPF file system, the test fills it as the
// instrumentation does for threads serving requests (by pid_tgid), and
// each thread's sleeps carry its own span.
func TestTraceContextMap(t *testing.T) {
	requireBPF(t)
	pin := filepath.Join(t.TempDir(), "bpffs")
	if err := os.Mkdir(pin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("bpf", pin, "bpf", 0, ""); err != nil {
		t.Fatalf("mounting a BPF file system: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(pin, 0) })
	bin := filepath.Join(t.TempDir(), "obi")
	runBuild(t, "gcc", "-O2", "-pthread", "-o", bin, "testdata/tctx/obi.c")
	cmd := exec.Command(bin)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var tids []uint32
	for sc := bufio.NewScanner(out); sc.Scan() && sc.Text() != "ready"; {
		n, _ := strconv.Atoi(sc.Text())
		tids = append(tids, uint32(n))
	}
	pid := uint32(cmd.Process.Pid)
	s, err := Start(context.Background(), Options{PIDs: []int{int(pid)}, TraceMapPin: pin})
	if err != nil {
		t.Fatal(err)
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(pin, bpf.OffcpuMapOtelTracesCtxV1), nil)
	if err != nil {
		s.Stop()
		t.Fatalf("the pinned map: %v", err)
	}
	defer m.Close()
	spanOf := map[string]string{} // tid → span
	for i, tid := range tids {
		var v bpf.OffcpuObiTraceCtx
		v.TraceId[0], v.TraceId[15] = 0x4b, byte(i+1)
		v.SpanId[7] = byte(i + 1)
		if err := m.Put(uint64(pid)<<32|uint64(tid), v); err != nil {
			t.Fatal(err)
		}
		spanOf[strconv.Itoa(int(tid))] = hex.EncodeToString(v.SpanId[:])
	}
	time.Sleep(3 * threadctx.InstrumentationPoll) // the recorder looks at the map this often
	cmd.Process.Signal(syscall.SIGUSR1)
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	p, err := s.Stop()
	if err != nil {
		t.Fatal(err)
	}
	linked, other := map[string]int64{}, int64(0)
	for _, smp := range p.Sample {
		tid := strconv.FormatInt(smp.NumLabel[schema.LabelTID][0], 10)
		if spanOf[tid] == "" || !stackHas(smp, "clock_nanosleep") {
			continue
		}
		if sp := schema.ProgramLabels(smp)[schema.LabelSpanID]; sp == spanOf[tid] {
			linked[tid] += smp.Value[0]
		} else {
			other += smp.Value[0]
		}
	}
	t.Logf("sleeps by thread, linked to its span: %v; not linked or another's: %v", linked, time.Duration(other))
	for tid := range spanOf {
		if linked[tid] < int64(40*5*time.Millisecond) {
			t.Errorf("thread %s: %v of sleeps linked to span %s, want at least 200ms", tid, time.Duration(linked[tid]), spanOf[tid])
		}
	}
	if other > 0 {
		t.Errorf("%v of sleeps without their thread's span", time.Duration(other))
	}
	if st := s.Stats().ThreadContext; st == nil || st.Instrumentation < 3 {
		t.Errorf("thread context stats %+v: want 3 records from the instrumentation's map", st)
	}
}
