package collector

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/schema"
)

// namedUserFrame says whether the sample has a user frame named by a
// function: not a file offset, an address or a marker.
func namedUserFrame(s *profile.Sample) bool {
	for _, l := range s.Location {
		if l.Mapping == nil || l.Mapping.File == schema.KernelMapping || len(l.Line) == 0 {
			continue
		}
		n := l.Line[0].Function.Name
		if n != "" && !strings.HasPrefix(n, "[") && !strings.Contains(n, "+0x") {
			return true
		}
	}
	return false
}

func mapEntries(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	var n int
	var k uint32
	var prev any // nil: the first key
	for m.NextKey(prev, &k) == nil {
		n++
		prev = k
	}
	return n
}

// buildChurn builds the launcher and the short-lived program into a
// temporary directory.
func buildChurn(t *testing.T) (dir, churn, nap string) {
	dir = t.TempDir()
	churn, nap = filepath.Join(dir, "churn"), filepath.Join(dir, "nap")
	runBuild(t, "gcc", "-O2", "-o", churn, "testdata/churn/churn.c")
	runBuild(t, "gcc", "-O2", "-o", nap, "testdata/churn/nap.c")
	return dir, churn, nap
}

// Processes that live about 2 ms, 500 a second for 15 s, recorded
// system-wide: every one has exited long before the end, yet their frames
// are named (their code mappings come from the kernel as they are made),
// their sleeps are where their own clock says, nothing is lost, and the
// per-process BPF entries leave with them.
func TestProcessChurn(t *testing.T) {
	requireBPF(t)
	dir, churn, nap := buildChurn(t)

	s, err := Start(context.Background(), Options{NoWakeups: true})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	const rate, secs, napUs = 500, 15, 1000
	napLog := filepath.Join(dir, "naps")
	launcher := exec.Command(churn, fmt.Sprint(rate), fmt.Sprint(secs), nap, fmt.Sprint(napUs))
	launcher.Env = append(os.Environ(), "NAP_LOG="+napLog)
	out, err := launcher.Output()
	if err != nil {
		s.Stop()
		t.Fatalf("churn: %v", err)
	}
	var started, ok int
	if _, err := fmt.Sscan(string(out), &started, &ok); err != nil || ok != started || started < rate*secs*9/10 {
		s.Stop()
		t.Fatalf("churn printed %q: want about %d processes, all exiting with 0", out, rate*secs)
	}
	time.Sleep(100 * time.Millisecond) // the last exits' events
	procsLeft, threadsLeft := mapEntries(t, s.p.coll.Maps[bpf.OffcpuMapProcs]), mapEntries(t, s.p.coll.Maps[bpf.OffcpuMapThreads])
	unwindLeft := mapEntries(t, s.p.coll.Maps[bpf.OffcpuMapUnwindProcs])
	p, err := s.Stop()
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	st := s.Stats()

	var total, named, slept, inNap, prestart int64
	for _, smp := range p.Sample {
		if smp.Label[schema.LabelThread][0] != "nap" {
			continue
		}
		total += smp.Value[0]
		if iv := smp.Label[schema.LabelInterval]; len(iv) > 0 && iv[0] != "open" {
			prestart += smp.Value[0] // created during the recording: never blocked before it
		}
		if namedUserFrame(smp) {
			named += smp.Value[0]
		}
		// The sleep and any preemption around it (on the way out of the
		// syscall, say): what the process's own clock measured.
		if stackHas(smp, "nap_here") || stackHas(smp, "clock_nanosleep") {
			slept += smp.Value[0]
			if stackHas(smp, "nap_here") {
				inNap += smp.Value[0]
			}
		}
	}
	var truth time.Duration
	raw, err := os.ReadFile(napLog)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(raw))
	for _, l := range lines {
		ns, _ := strconv.ParseInt(l, 10, 64)
		truth += time.Duration(ns)
	}
	if len(lines) != started {
		t.Errorf("%d processes logged their sleep, want %d", len(lines), started)
	}
	t.Logf("%d processes: %v off-CPU, %.1f%% with a named user frame, %v in nanosleep by their own clocks, %v recorded (%v of it through nap_here); %d stacks moved to memory; procs %d threads %d unwind %d entries left",
		started, time.Duration(total), 100*float64(named)/float64(max(total, 1)), truth, time.Duration(slept), time.Duration(inNap), st.StacksMoved, procsLeft, threadsLeft, unwindLeft)
	// Libraries are followed by the loader's hook, not the mmap syscall
	// tracepoints (which slow every syscall of every task).
	if st.Attach == "tp_btf" && st.CodeMaps != "loader" {
		t.Errorf("code mappings followed by %q, want the loader hook", st.CodeMaps)
	}
	if total == 0 || float64(named) < 0.95*float64(total) {
		t.Errorf("%v of the short-lived processes' %v off-CPU time has a named user frame, want >= 95%%", time.Duration(named), time.Duration(total))
	}
	// Each process measured its own sleep (wall time around nanosleep,
	// the wait for a CPU after the timer included): the recorded time in
	// nanosleep must match their sum. The stack reaches nap_here through
	// libc (no frame pointers here) only if the process's unwind entry was
	// made as it mapped libc, in the kernel, not when the reader got to it.
	if diff := time.Duration(slept) - truth; diff < -truth/20 || diff > truth/20 {
		t.Errorf("%v recorded in the processes' nanosleeps, their own clocks say %v (%+.1f%%), want within 5%%",
			time.Duration(slept), truth, 100*float64(diff)/float64(truth))
	}
	if float64(inNap) < 0.9*float64(slept) {
		t.Errorf("%v of the %v in nanosleep reaches nap_here, want >= 90%%: stacks cut at libc (unwind stats %+v; %d unwind entries left)",
			time.Duration(inNap), time.Duration(slept), *st.Unwind, unwindLeft)
		n := 0
		for _, smp := range p.Sample {
			if smp.Label[schema.LabelThread][0] == "nap" && stackHas(smp, "clock_nanosleep") && !stackHas(smp, "nap_here") && n < 5 {
				n++
				t.Logf("cut: %v %s", time.Duration(smp.Value[0]), schema.FoldedSample(smp))
			}
		}
	}
	if prestart > 0 {
		t.Errorf("%v of the short-lived processes' time counted as blocked since before the recording", time.Duration(prestart))
	}
	if lost := st.UserStackLost + st.KernelStackLost + st.AggFull + st.StartFull + st.EventsLost; lost > 0 {
		t.Errorf("losses: %+v", st)
	}
	// Entries of exited processes and threads are removed: what is left
	// is the machine's own, far fewer than the processes seen.
	if procsLeft > 2000 || threadsLeft > 4000 || unwindLeft > 1000 {
		t.Errorf("after %d processes: %d process, %d thread and %d unwind entries left in the BPF maps, want them removed at exit",
			started, procsLeft, threadsLeft, unwindLeft)
	}
}
