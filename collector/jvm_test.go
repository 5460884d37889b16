package collector

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/internal/testenv"
	"github.com/offcpu/offcpu/runtimes"
	"github.com/offcpu/offcpu/schema"
)

// jdk returns the paths of java, javac and jcmd, or skips: a JDK is not
// part of what the project installs.
func jdk(t testing.TB) (java, javac, jcmd string) {
	t.Helper()
	var paths []string
	for _, name := range []string{"java", "javac", "jcmd"} {
		p, err := exec.LookPath(name)
		if err != nil {
			t.Skipf("no JDK here (%s not found): the JVM stack test needs java, javac and jcmd", name)
		}
		paths = append(paths, p)
	}
	return paths[0], paths[1], paths[2]
}

// A HotSpot thread blocked entering a contended synchronized block: the
// stack must run from the thread start through the JVM's native frames
// and the JIT-compiled Java method holding the block down to libc.
func TestJVMMonitorStacks(t *testing.T) {
	requireBPF(t)
	java, javac, jcmd := jdk(t)
	dir := t.TempDir()
	runBuild(t, javac, "-d", dir, "testdata/jvm/Contend.java")
	// Long enough to outlive a slow attach (-race, a loaded machine): the
	// test kills it. After 6 s it had exited once before jcmd ran, and
	// jcmd waited 10 s on the zombie.
	cmd := exec.Command(java, "-XX:+PreserveFramePointer", "-Xss512k", "-cp", dir, "Contend", "60000")
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	pid := cmd.Process.Pid
	defer os.Remove(filepath.Join(os.TempDir(), "perf-"+strconv.Itoa(pid)+".map"))
	time.Sleep(2 * time.Second) // JIT warm-up: holdLock gets compiled
	s, err := Start(context.Background(), Options{PIDs: []int{pid}, NoWakeups: true})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	time.Sleep(1500 * time.Millisecond)
	// The perf map names JIT code; written before Stop symbolizes.
	if out, err := exec.Command(jcmd, strconv.Itoa(pid), "Compiler.perfmap").CombinedOutput(); err != nil {
		s.Stop()
		t.Fatalf("jcmd Compiler.perfmap: %v\n%s", err, out)
	}
	p, err := s.Stop()
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	cmd.Process.Kill()
	cmd.Wait()

	want := []string{"start_thread", "thread_native_entry", "Contend.holdLock", "ObjectMonitor::enter", "os::PlatformEvent::park", "pthread_cond_*"}
	var monitor, whole int64
	for _, smp := range p.Sample {
		f := userFuncs(smp)
		if !containsFunc(f, "ObjectMonitor::enter") || !strings.HasPrefix(smp.Label[schema.LabelThread][0], "contender-") {
			continue
		}
		monitor += smp.Value[0]
		if inOrder(f, want) {
			whole += smp.Value[0]
		} else {
			t.Logf("partial (%v): %v", time.Duration(smp.Value[0]), f)
		}
	}
	if monitor == 0 {
		t.Fatal("no contender thread blocked in ObjectMonitor::enter")
	}
	if share := float64(whole) / float64(monitor); share < 0.9 {
		t.Errorf("%.1f%% of monitor-wait time has the whole stack %v", 100*share, want)
	}
	st := s.Stats()
	t.Logf("monitor waits %v, %.1f%% whole; all stacks complete %.1f%%; tables %+v", time.Duration(monitor), 100*float64(whole)/float64(monitor), 100*st.CompleteShare(), *st.Unwind)
}

// javaShare is the share of the off-CPU time of the threads whose name
// starts with thread (and, when set, whose stack holds inside) that has
// a frame for which named is true.
func javaShare(t *testing.T, p *profile.Profile, thread, inside string, named func(string) bool) (float64, time.Duration) {
	var all, hit int64
	for _, smp := range p.Sample {
		if !strings.HasPrefix(smp.Label[schema.LabelThread][0], thread) {
			continue
		}
		f := userFuncs(smp)
		if inside != "" && !containsFunc(f, inside) {
			continue
		}
		all += smp.Value[0]
		ok := false
		for _, fn := range f {
			ok = ok || named(fn)
		}
		if ok {
			hit += smp.Value[0]
		} else if smp.Value[0] > int64(5*time.Millisecond) {
			t.Logf("unnamed (%v): %v", time.Duration(smp.Value[0]), f)
		}
	}
	if all == 0 {
		return 0, 0
	}
	return float64(hit) / float64(all), time.Duration(all)
}

// JVMs started with no profiling flag, frames neither kept nor mapped:
// the walker unwinds compiled frames by their sizes and interpreter
// frames by rbp, and the names come from the JVM's own structures. Each
// JDK runs once under G1 attached while running, and once under ZGC
// started as a command that exits before the recording ends (its names
// were read while it lived).
func TestJVMUnmodifiedMonitorStacks(t *testing.T) {
	requireBPF(t)
	for ver, home := range testenv.JDKHomes(t) {
		dir := t.TempDir()
		runBuild(t, filepath.Join(home, "bin", "javac"), "-d", dir, "testdata/jvm/Contend.java")
		java := filepath.Join(home, "bin", "java")
		t.Run("jdk"+ver+"-g1-running", func(t *testing.T) {
			cmd := exec.Command(java, "-XX:+UseG1GC", "-cp", dir, "Contend", "60000")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { cmd.Process.Kill(); cmd.Wait() }()
			time.Sleep(1500 * time.Millisecond)
			s, err := Start(context.Background(), Options{PIDs: []int{cmd.Process.Pid}, NoWakeups: true})
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			time.Sleep(2 * time.Second)
			p, err := s.Stop()
			if err != nil {
				t.Fatalf("Stop: %v", err)
			}
			checkContend(t, s, p)
		})
		t.Run("jdk"+ver+"-zgc-command-exited", func(t *testing.T) {
			s, err := Start(context.Background(), Options{TargetsOnly: true, NoWakeups: true})
			if err != nil {
				t.Fatalf("Start: %v", err)
			}
			cmd := exec.Command(java, "-XX:+UseZGC", "-cp", dir, "Contend", "3000")
			if err := s.StartCommand(cmd); err != nil {
				s.Stop()
				t.Fatal(err)
			}
			err = cmd.Wait()
			time.Sleep(300 * time.Millisecond) // gone well before the end
			p, stopErr := s.Stop()
			if err != nil {
				t.Fatalf("java: %v", err)
			}
			if stopErr != nil {
				t.Fatalf("Stop: %v", stopErr)
			}
			checkContend(t, s, p)
		})
	}
}

func checkContend(t *testing.T, s *Session, p *profile.Profile) {
	t.Helper()
	share, total := javaShare(t, p, "contender-", "ObjectMonitor::enter", func(fn string) bool { return fn == "Contend.holdLock" })
	if total == 0 {
		t.Fatal("no contender thread blocked in ObjectMonitor::enter")
	}
	want := []string{"start_thread", "java.lang.Thread.run", "Contend.holdLock", "ObjectMonitor::enter", "pthread_cond_*"}
	var whole, monitor, line9 int64
	for _, smp := range p.Sample {
		f := userFuncs(smp)
		if !strings.HasPrefix(smp.Label[schema.LabelThread][0], "contender-") || !containsFunc(f, "ObjectMonitor::enter") {
			continue
		}
		monitor += smp.Value[0]
		if inOrder(f, want) {
			whole += smp.Value[0]
		}
		// The wait is at `synchronized (lock)`, line 9 of Contend.java,
		// whether holdLock runs interpreted (its bci) or compiled (its
		// scope). The template interpreter moves bcp past monitorenter
		// before it locks, so an interpreted frame may say line 10.
		for _, l := range smp.Location {
			if len(l.Line) == 0 || l.Line[0].Function.Name != "Contend.holdLock" {
				continue
			}
			if ln := l.Line[0].Line; ln == 9 || ln == 10 && runtimes.KindOf(l.Address) == bpf.FrameJava {
				line9 += smp.Value[0]
				break
			}
		}
	}
	if float64(line9) < 0.9*float64(monitor) {
		t.Errorf("%.1f%% of the monitor waits are at Contend.holdLock line 9, want ≥ 90%%", 100*float64(line9)/float64(monitor))
	}
	st := s.Stats()
	t.Logf("monitor waits %v: %.1f%% name Contend.holdLock, %.1f%% whole, %.1f%% at line 9; JVM stats %+v", total, 100*share, 100*float64(whole)/float64(monitor), 100*float64(line9)/float64(monitor), runtimeStats(st, "hotspot"))
	if share < 0.9 {
		t.Errorf("%.1f%% of the contenders' monitor waits name Contend.holdLock, want ≥ 90%%", 100*share)
	}
	if float64(whole) < 0.9*float64(monitor) {
		t.Errorf("%.1f%% of the monitor waits have the whole stack %v, want ≥ 90%%", 100*float64(whole)/float64(monitor), want)
	}
	if jst := runtimeStats(st, "hotspot"); jst.Processes != 1 || jst.Unsupported != 0 {
		t.Errorf("JVM stats %+v: want one JVM read, none failed", jst)
	}
}

// A Netty NIO event loop (Debian's libnetty-java), woken from another
// thread every 3 ms, recorded from its first 300 ms when most of its code
// still runs in the interpreter: its off-CPU time names Netty frames.
func TestJVMUnmodifiedNettyLoop(t *testing.T) {
	requireBPF(t)
	home := testenv.JDKHomes(t)["17"]
	var jars []string
	for _, j := range []string{"netty-common", "netty-buffer", "netty-resolver", "netty-transport"} {
		p := "/usr/share/java/" + j + ".jar"
		if _, err := os.Stat(p); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s missing: .ci/run installs libnetty-java", p)
			}
			t.Skipf("%s missing (apt-get install libnetty-java)", p)
		}
		jars = append(jars, p)
	}
	dir := t.TempDir()
	cp := strings.Join(jars, ":")
	runBuild(t, filepath.Join(home, "bin", "javac"), "-cp", cp, "-d", dir, "testdata/jvm/NettyLoop.java")
	// A loop method compiled (OSR) just after a code-cache walk is stepped
	// by frame pointer until the next one: under a loaded CI machine that
	// has once cost more than the 10% allowed. A second JVM gets one more
	// chance; the first attempt's figures are logged.
	for attempt := 1; ; attempt++ {
		in, all := recordNettyLoop(t, home, dir, cp)
		if all > 0 && float64(in) >= 0.9*float64(all) {
			return
		}
		if attempt == 2 {
			t.Errorf("%d of %d ns in epoll_wait have the loop's whole chain, want ≥ 90%%", in, all)
			return
		}
		t.Logf("attempt %d: %d of %d ns in epoll_wait have the loop's whole chain; once more with a new JVM", attempt, in, all)
	}
}

// recordNettyLoop records a new NettyLoop JVM from its first 300 ms and
// returns the event loop's epoll_wait time and the part of it with the
// loop's whole chain of frames.
func recordNettyLoop(t *testing.T, home, dir, cp string) (in, all int64) {
	t.Helper()
	cmd := exec.Command(filepath.Join(home, "bin", "java"), "-cp", dir+":"+cp, "NettyLoop", "60000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	time.Sleep(300 * time.Millisecond)
	s, err := Start(context.Background(), Options{PIDs: []int{cmd.Process.Pid}, NoWakeups: true})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	time.Sleep(2500 * time.Millisecond)
	p, err := s.Stop()
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	share, total := javaShare(t, p, "nioEventLoopGro", "", func(fn string) bool { return strings.HasPrefix(fn, "io.netty.") })
	t.Logf("event loop off-CPU %v: %.1f%% names a Netty frame; JVM stats %+v", total, 100*share, runtimeStats(s.Stats(), "hotspot"))
	if total < time.Second {
		t.Fatalf("event loop off-CPU time %v, want most of the 2.5 s recorded", total)
	}
	if share < 0.9 {
		t.Errorf("%.1f%% of the event loop's off-CPU time names a Netty frame, want ≥ 90%%", 100*share)
	}
	// The whole loop, whether its methods run interpreted, compiled, or
	// inlined into one another (compiled frames expand what they inlined).
	chain := []string{"java.lang.Thread.run", "io.netty.util.concurrent.SingleThreadEventExecutor$4.run",
		"io.netty.channel.nio.NioEventLoop.run", "io.netty.channel.nio.NioEventLoop.select", "sun.nio.ch.EPoll.wait", "epoll_wait"}
	for _, smp := range p.Sample {
		if !strings.HasPrefix(smp.Label[schema.LabelThread][0], "nioEventLoopGro") {
			continue
		}
		f := userFuncs(smp)
		if !containsFunc(f, "epoll_wait") {
			continue
		}
		all += smp.Value[0]
		if inOrder(f, chain) {
			in += smp.Value[0]
		} else if smp.Value[0] > int64(10*time.Millisecond) {
			t.Logf("partial loop stack (%v): %v", time.Duration(smp.Value[0]), f)
		}
	}
	return in, all
}
