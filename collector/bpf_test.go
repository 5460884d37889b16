package collector

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/kernel"
	"github.com/offcpu/offcpu/schema"
)

func stackHas(s *profile.Sample, names ...string) bool {
	found := 0
	for _, n := range names {
		for _, l := range s.Location {
			for _, ln := range l.Line {
				if ln.Function != nil && ln.Function.Name == n {
					found++
					goto next
				}
			}
		}
	next:
	}
	return found == len(names)
}

// blockedIn sums the off-CPU time of one thread in stacks holding every
// named function.
func blockedIn(p *profile.Profile, tid int, names ...string) (ns int64) {
	for _, s := range p.Sample {
		if s.NumLabel[schema.LabelTID][0] == int64(tid) && stackHas(s, names...) {
			ns += s.Value[0]
		}
	}
	return ns
}

func checkWorkload(t *testing.T, p *profile.Profile, res []wlResult, each time.Duration, rounds int) {
	t.Helper()
	want := map[string][]string{
		"wl-nanosleep": {"main.napLoop", "do_nanosleep"},
		"wl-futex":     {"main.futexLoop", "futex_wait"},
		"wl-epoll":     {"main.epollLoop", "do_epoll_wait"},
		"wl-exiting":   {"main.exitingLoop", "do_nanosleep"},
	}
	if len(res) != len(want) {
		t.Fatalf("workload reported %d threads, want %d", len(res), len(want))
	}
	for _, r := range res {
		got := blockedIn(p, r.TID, want[r.Thread]...)
		n := rounds
		if r.Thread == "wl-exiting" {
			n = rounds / 2
		}
		requested := int64(n) * int64(each)
		// The workload's own clock brackets the calls, so it is an upper
		// bound; the requested total is a lower bound.
		if got < requested*98/100 || float64(got) > float64(r.Blocked)*1.02 {
			t.Errorf("%s: recorded %v in %v, requested %v, measured %v (want within 2%%)",
				r.Thread, time.Duration(got), want[r.Thread], time.Duration(requested), time.Duration(r.Blocked))
			for _, s := range p.Sample {
				if s.NumLabel[schema.LabelTID][0] == int64(r.TID) {
					t.Logf("  %v %v %s", time.Duration(s.Value[0]), s.Label, schema.FoldedSample(s))
				}
			}
		} else {
			t.Logf("%s: recorded %v, measured %v", r.Thread, time.Duration(got), time.Duration(r.Blocked))
		}
		named := false
		for _, s := range p.Sample {
			if s.NumLabel[schema.LabelTID][0] == int64(r.TID) && s.Label[schema.LabelThread][0] == r.Thread {
				named = true
			}
		}
		if !named {
			t.Errorf("no sample of tid %d carries the thread name %q", r.TID, r.Thread)
		}
	}
}

func TestRecordWorkload(t *testing.T) {
	requireBPF(t)
	p, res, st := runWorkload(t, Options{FollowForks: true}, "-rounds", "10", "-each", "50ms")
	// The attach mode follows from the kernel's facilities, not the machine.
	want := "tracepoint"
	if kernel.BTFModePromised(kernel.Features()) {
		want = "tp_btf"
	}
	if st.Attach != want {
		t.Errorf("attach = %s, want %s: the kernel's facilities promise it (%+v); warnings %v", st.Attach, want, kernel.Features(), st.Warnings)
	}
	// Stacks are stored by a 64-bit hash in a plain hash map: nothing is
	// lost while it has room.
	if st.Lost() != 0 {
		t.Errorf("losses on a small workload: %+v", st)
	}
	checkWorkload(t, p, res, 50*time.Millisecond, 10)
	var buf bytes.Buffer
	if err := p.Write(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := profile.Parse(&buf); err != nil {
		t.Fatalf("written profile does not parse: %v", err)
	}
}

func TestRecordTracepointFallback(t *testing.T) {
	requireBPF(t)
	p, res, st := runWorkload(t, Options{ForceTracepoint: true, FollowForks: true}, "-rounds", "6", "-each", "40ms")
	if st.Attach != "tracepoint" {
		t.Fatalf("attach = %s, want tracepoint", st.Attach)
	}
	checkWorkload(t, p, res, 40*time.Millisecond, 6)
	// Threads that exited (wl-exiting, then all of them) switched out one
	// last time: that is not off-CPU time.
	for _, smp := range p.Sample {
		if stackHas(smp, "do_task_dead") {
			t.Errorf("a dead thread's last switch counted: %v %s", time.Duration(smp.Value[0]), schema.FoldedSample(smp))
		}
	}
}

func TestRecordFilters(t *testing.T) {
	requireBPF(t)
	t.Run("min-block", func(t *testing.T) {
		p, _, st := runWorkload(t, Options{MinBlock: 20 * time.Millisecond}, "-rounds", "4", "-each", "30ms")
		if len(p.Sample) == 0 {
			t.Fatal("nothing recorded")
		}
		for _, s := range p.Sample {
			if s.Value[1] == 0 {
				continue // on-CPU time
			}
			if mean := s.Value[0] / s.Value[1]; mean < int64(20*time.Millisecond) {
				t.Errorf("interval of %v kept despite --min-block 20ms", time.Duration(mean))
			}
		}
		if st.OutOfRange == 0 {
			t.Error("no interval counted as out of range")
		}
	})
	t.Run("state", func(t *testing.T) {
		p, _, _ := runWorkload(t, Options{StateMask: 1 << StateSleeping}, "-rounds", "2", "-each", "10ms")
		for _, s := range p.Sample {
			// On-CPU time is kept whatever off-CPU states are selected.
			if st := s.Label[schema.LabelState][0]; st != "sleeping" && st != "on-cpu" {
				t.Errorf("state %s recorded with only sleeping selected", s.Label[schema.LabelState][0])
			}
		}
	})
	t.Run("no-kernel-stacks", func(t *testing.T) {
		p, _, _ := runWorkload(t, Options{NoKernelStacks: true}, "-rounds", "2", "-each", "10ms")
		for _, s := range p.Sample {
			for _, l := range s.Location {
				if l.Mapping != nil && l.Mapping.File == schema.KernelMapping {
					t.Fatal("kernel frame recorded with NoKernelStacks")
				}
			}
		}
	})
}

func TestRecordPID(t *testing.T) {
	requireBPF(t)
	bin := buildWorkload(t)
	cmd := exec.Command(bin, "-rounds", "400", "-each", "10ms")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	s, err := Start(context.Background(), Options{PIDs: []int{cmd.Process.Pid}})
	if err != nil {
		t.Fatal(err)
	}
	window := 500 * time.Millisecond
	time.Sleep(window)
	p, err := s.Stop()
	if err != nil {
		t.Fatal(err)
	}
	var napping int64
	for _, smp := range p.Sample {
		if smp.NumLabel[schema.LabelPID][0] != int64(cmd.Process.Pid) {
			t.Fatalf("sample of pid %d recorded with -p %d", smp.NumLabel[schema.LabelPID][0], cmd.Process.Pid)
		}
		if stackHas(smp, "main.napLoop", "do_nanosleep") {
			napping += smp.Value[0]
		}
	}
	// napLoop sleeps all the time; the first and last sleeps are cut.
	if napping < int64(window)*7/10 || napping > int64(s.Stats().Duration) {
		t.Errorf("napLoop blocked %v in a %v recording", time.Duration(napping), s.Stats().Duration)
	}
}

func TestStartWithoutBTF(t *testing.T) {
	requireBPF(t)
	defer func(p string) { vmlinuxBTF = p }(vmlinuxBTF)
	vmlinuxBTF = "/nonexistent/vmlinux"
	_, err := Start(context.Background(), Options{})
	if err == nil || !strings.Contains(err.Error(), "CONFIG_DEBUG_INFO_BTF=y") {
		t.Errorf("err = %v, want the BTF fix named", err)
	}
}

func TestStartErrors(t *testing.T) {
	_, err := Start(context.Background(), Options{PIDs: []int{1 << 30}})
	if err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("missing pid: err = %v", err)
	}
	_, err = Start(context.Background(), Options{UserThreadsOnly: true, KernelThreadsOnly: true})
	if err == nil || !strings.Contains(err.Error(), "exclude") {
		t.Errorf("contradictory flags: err = %v", err)
	}
	_, err = Start(context.Background(), Options{Cgroup: "/nonexistent-cgroup-dir"})
	if err == nil || !strings.Contains(err.Error(), "cgroup") {
		t.Errorf("bad cgroup: err = %v", err)
	}
	_, err = Start(context.Background(), Options{UnwindRows: -1})
	if err == nil || !strings.Contains(err.Error(), "--unwind-rows") {
		t.Errorf("bad --unwind-rows: err = %v", err)
	}
}

func wakeupsOf(p *profile.Profile, tid int64, class string) (n int64, samples []*profile.Sample) {
	for _, s := range p.Sample {
		if s.NumLabel[schema.LabelTargetTID][0] == tid && (class == "" || s.Label[schema.LabelWakeupClass][0] == class) {
			n += s.Value[0]
			samples = append(samples, s)
		}
	}
	return n, samples
}

func TestWakeups(t *testing.T) {
	requireBPF(t)
	const n = 100
	_, res, s := runWorkloadSession(t, Options{}, "-mode", "wake", "-rounds", "100")
	st := s.Stats()
	tids := map[string]int64{}
	for _, r := range res {
		tids[r.Thread] = int64(r.TID)
	}
	wp, off := s.Profiles().Wakeups, s.Profiles().Offwake
	if wp == nil || off == nil {
		t.Fatal("no wake-up or offwake profile")
	}

	t.Run("eventfd", func(t *testing.T) { checkEventfdWakeups(t, wp, tids["wl-loop"], n) })

	t.Run("futex-offwake", func(t *testing.T) {
		var linked, waiting int64
		for _, s := range off.Sample {
			if s.NumLabel[schema.LabelTID][0] != tids["wl-waiter"] || !stackHas(s, "main.waitLoop", "futex_wait") {
				continue
			}
			waiting += s.Value[0]
			if stackHas(s, "main.releaseLoop", "futex_wake") && s.Label[schema.LabelWaker][0] == "wl-releaser" {
				linked += s.Value[0]
			}
		}
		if waiting == 0 || linked < waiting*95/100 {
			t.Errorf("waiter blocked %v in futex_wait, %v of it linked to the releaser's stack", time.Duration(waiting), time.Duration(linked))
		}
	})

	t.Run("interrupt", func(t *testing.T) {
		_, samples := wakeupsOf(wp, tids["wl-sleeper"], "")
		var irq int64
		for _, s := range samples {
			switch s.Label[schema.LabelThread][0] {
			case "wl-spinner":
				// Futex wake-ups by the Go runtime on that thread are real.
				if s.Label[schema.LabelWakeupClass][0] == "timer" {
					t.Errorf("%d timer wake-ups blamed on the unrelated spinning thread", s.Value[0])
				}
			case "[interrupt]", "[softirq]":
				if s.Label[schema.LabelWakeupClass][0] == "timer" {
					irq += s.Value[0]
				}
			}
		}
		if irq < n*9/10 {
			t.Errorf("%d of %d timer wake-ups attributed to [interrupt]", irq, n)
		}
	})
	t.Run("net-rx", func(t *testing.T) {
		// Each write wakes the reader from the loopback's receive softirq
		// (plus the accept). Their kernel stacks are reused between walks:
		// the class, read from the stack, must hold for every one.
		// A receive softirq the kernel left to ksoftirqd (seen once in
		// 101 on a one-CPU 6.1 under qemu) runs in that thread and is
		// charged to it, its class still read from the frames.
		got, samples := wakeupsOf(wp, tids["wl-tcp-reader"], "net-rx")
		var irq int64
		for _, s := range samples {
			th := s.Label[schema.LabelThread][0]
			if th == "[softirq]" || th == "[interrupt]" || strings.HasPrefix(th, "ksoftirqd/") {
				irq += s.Value[0]
			} else {
				t.Logf("net-rx wake-up by %s: %s (%d)", th, schema.FoldedSample(s), s.Value[0])
			}
		}
		if got < n-2 || got > n+3 || irq != got {
			t.Errorf("reader's net-rx wake-ups: %d (%d from interrupt context or ksoftirqd), want %d to %d, all from there", got, irq, n-2, n+3)
		}
		t.Logf("net-rx %d, irq %d, reused %d", got, irq, st.IRQWakesReused)
		if st.Attach == "tp_btf" && st.IRQWakesReused < n/2 {
			t.Errorf("interrupt wake-ups with a reused kernel stack: %d, want at least %d", st.IRQWakesReused, n/2)
		}
	})
	if st.Wakeups == 0 || st.WakeupsByClass["eventfd"] == 0 {
		t.Errorf("stats: %d wake-ups, by class %v", st.Wakeups, st.WakeupsByClass)
	}
}

// checkEventfdWakeups: the loop thread's n eventfd wake-ups, each by the
// producer thread with its function, within 1%.
func checkEventfdWakeups(t *testing.T, wp *profile.Profile, loop int64, n int64) {
	t.Helper()
	_, samples := wakeupsOf(wp, loop, "eventfd")
	var byProducer int64
	for _, s := range samples {
		if stackHas(s, "main.produceEvents", "eventfd_write") && s.Label[schema.LabelThread][0] == "wl-producer" {
			byProducer += s.Value[0]
		} else {
			t.Logf("other eventfd waker: %s (%d)", schema.FoldedSample(s), s.Value[0])
		}
	}
	if byProducer < n*99/100 || byProducer > n*101/100 {
		t.Errorf("eventfd wake-ups of the loop from main.produceEvents: %d, want %d within 1%%", byProducer, n)
	}
}

// TestTracepointWakeupsOfCommand: classic tracepoints record the wake-ups
// of a recorded command's threads too (their records name the woken
// thread, not its process).
func TestTracepointWakeupsOfCommand(t *testing.T) {
	requireBPF(t)
	const n = 100
	_, res, s := runWorkloadSession(t, Options{ForceTracepoint: true}, "-mode", "wake", "-rounds", "100")
	if st := s.Stats(); st.Attach != "tracepoint" {
		t.Fatalf("attach = %s, want tracepoint", st.Attach)
	}
	wp := s.Profiles().Wakeups
	if wp == nil {
		t.Fatal("no wake-up profile")
	}
	for _, r := range res {
		if r.Thread == "wl-loop" {
			checkEventfdWakeups(t, wp, int64(r.TID), n)
			return
		}
	}
	t.Fatal("the workload reported no wl-loop thread")
}

func TestCPUSamples(t *testing.T) {
	requireBPF(t)
	p, res, st := runWorkload(t, Options{CPUHz: 499, NoWakeups: true}, "-mode", "wake", "-rounds", "100")
	var spinner int64
	for _, r := range res {
		if r.Thread == "wl-spinner" {
			spinner = int64(r.TID)
		}
	}
	var spinNs, offInSpin int64
	for _, s := range p.Sample {
		if s.NumLabel[schema.LabelTID][0] == spinner && stackHas(s, "main.spin") {
			spinNs += s.Value[2]
			offInSpin += s.Value[0]
		}
	}
	// The spinner shares CPU 0 with the sleeper and, under load, with
	// others: require samples that name it, not an amount.
	if spinNs < int64(5*time.Second/499) || st.CPUSamples == 0 {
		t.Errorf("on-CPU time in main.spin: %v (%d samples in all)", time.Duration(spinNs), st.CPUSamples)
	}
	if p.SampleType[2].Type != "cpu" || p.SampleType[2].Unit != "nanoseconds" {
		t.Errorf("third sample type %v, want cpu/nanoseconds", p.SampleType[2])
	}
	t.Logf("main.spin: %v on CPU, %v off CPU while preempted", time.Duration(spinNs), time.Duration(offInSpin))
}

// A thread still blocked when recording stops is counted up to the end,
// labelled open, with its stack.
func TestOpenIntervalsAtStop(t *testing.T) {
	requireBPF(t)
	for _, tp := range []bool{false, true} {
		s, err := Start(context.Background(), Options{TargetsOnly: true, ForceTracepoint: tp})
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(buildWorkload(t), "-rounds", "1", "-each", "3s")
		if err := s.StartCommand(cmd); err != nil {
			s.Stop()
			t.Fatal(err)
		}
		time.Sleep(600 * time.Millisecond)
		p, err := s.Stop()
		cmd.Process.Kill()
		cmd.Wait()
		if err != nil {
			t.Fatal(err)
		}
		var open int64
		for _, smp := range p.Sample {
			if len(smp.Label[schema.LabelInterval]) > 0 && smp.Label[schema.LabelThread][0] == "wl-nanosleep" && stackHas(smp, "main.napLoop", "do_nanosleep") {
				open += smp.Value[0]
			}
		}
		st := s.Stats()
		if open < int64(400*time.Millisecond) || open > int64(st.Duration) || st.OpenIntervals == 0 {
			t.Errorf("%s: open nanosleep interval %v in a %v recording (%d open)", st.Attach, time.Duration(open), st.Duration, st.OpenIntervals)
		}
	}
}

// A process in another mount namespace, whose binary path does not exist
// in ours, is symbolized through its mapped files (/proc/PID/map_files,
// /proc/PID/root).
func TestOtherMountNamespace(t *testing.T) {
	requireBPF(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("unshare not installed")
	}
	bin := buildWorkload(t)
	hidden := "/offcpu-test-ns-" + strings.ReplaceAll(t.Name(), "/", "-")
	script := fmt.Sprintf("mkdir -p %[1]s && mount -t tmpfs none %[1]s && cp %[2]s %[1]s/wl && exec %[1]s/wl -rounds 4 -each 50ms", hidden, bin)
	s, err := Start(context.Background(), Options{TargetsOnly: true, FollowForks: true})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c", script)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := s.StartCommand(cmd); err != nil {
		s.Stop()
		t.Fatal(err)
	}
	err = cmd.Wait()
	p, serr := s.Stop()
	os.Remove(hidden) // the directory was made in our namespace too; the mount was not
	if serr != nil {
		t.Fatal(serr)
	}
	if err != nil {
		t.Fatalf("workload in a new mount namespace: %v\n%s", err, out.String())
	}
	if _, err := os.Stat(hidden + "/wl"); err == nil {
		t.Fatal("the binary is visible in our namespace: the test proves nothing")
	}
	found := false
	for _, smp := range p.Sample {
		if stackHas(smp, "main.napLoop", "do_nanosleep") {
			found = true
		}
	}
	if !found {
		t.Error("main.napLoop not symbolized for a process in another mount namespace")
	}
}

// Threads blocked since before the start are counted from the start with
// their kernel stacks: one woken during the recording, one blocked for
// all of it.
func TestBlockedBeforeStart(t *testing.T) {
	requireBPF(t)
	// Its sleep must outlast Start, which loads and verifies the programs:
	// 3 s here, more in a kernel under qemu.
	const each = 12 * time.Second
	wl := exec.Command(buildWorkload(t), "-rounds", "1", "-each", each.String())
	sl := exec.Command("sleep", "30")
	for _, c := range []*exec.Cmd{wl, sl} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	defer sl.Process.Kill()
	time.Sleep(250 * time.Millisecond) // both are asleep now
	s, err := Start(context.Background(), Options{PIDs: []int{wl.Process.Pid, sl.Process.Pid}})
	if err != nil {
		t.Fatal(err)
	}
	wl.Wait()
	time.Sleep(100 * time.Millisecond)
	p, err := s.Stop()
	if err != nil {
		t.Fatal(err)
	}
	sum := map[string]int64{}
	for _, smp := range p.Sample {
		if iv := smp.Label[schema.LabelInterval]; len(iv) > 0 && stackHas(smp, "hrtimer_nanosleep") {
			sum[smp.Label[schema.LabelThread][0]+"/"+iv[0]] += smp.Value[0]
		}
	}
	window := int64(s.Stats().Duration)
	// The workload's sleep ends well into the window (attached after
	// 250ms plus the time Start takes).
	if v := sum["wl-nanosleep/before-start"]; v < int64(300*time.Millisecond) || v > int64(each) {
		t.Errorf("woken during the recording: %v blocked since the start (all: %v; started in %v)", time.Duration(v), sum, s.Stats().StartUp)
	}
	if v := sum["sleep/whole"]; v < window*9/10 || v > window {
		t.Errorf("blocked for the whole %v recording: %v (all: %v)", time.Duration(window), time.Duration(v), sum)
	}
	// Their user stacks were walked when recording started (glibc's names
	// as sameFunc takes them: a static glibc's __clock_nanosleep and
	// __libc_start_main_impl in the arm64 guests).
	for thread, want := range map[string][]string{
		"wl-nanosleep": {"runtime.goexit", "main.napLoop"},
		"sleep":        {"_start", "__libc_start_main*", "clock_nanosleep"},
	} {
		found := false
		for _, smp := range p.Sample {
			if iv := smp.Label[schema.LabelInterval]; len(iv) > 0 && smp.Label[schema.LabelThread][0] == thread {
				if inOrder(userFuncs(smp), want) {
					found = true
				} else {
					t.Logf("%s: %s", thread, schema.FoldedSample(smp))
				}
			}
		}
		if !found {
			t.Errorf("%s: no interval blocked since before the start with user frames %v", thread, want)
		}
	}
}

// System-wide under classic tracepoints, sched_waking reads the record's
// common flags; a wrong field path there once kept the programs from
// loading.
func TestTracepointWakeupsSystemWide(t *testing.T) {
	requireBPF(t)
	s, err := Start(context.Background(), Options{ForceTracepoint: true})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	time.Sleep(300 * time.Millisecond)
	if _, err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	st := s.Stats()
	if st.Attach != "tracepoint" || st.Wakeups == 0 {
		t.Errorf("attach %s, %d wake-ups: want tracepoint with wake-ups", st.Attach, st.Wakeups)
	}
}

// Start-up cost (the verifier, and with tables this process's libc and
// loader) and stop with nothing recorded:
// go test -run XXX -bench StartStop ./collector (as root).
func BenchmarkStartStop(b *testing.B) {
	requireBPF(b)
	for _, fpOnly := range []bool{false, true} {
		b.Run(map[bool]string{false: "tables", true: "frame-pointers-only"}[fpOnly], func(b *testing.B) {
			for b.Loop() {
				s, err := Start(context.Background(), Options{TargetsOnly: true, NoWakeups: true, FramePointersOnly: fpOnly})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := s.Stop(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
