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
	build(t, javac, "-d", dir, "testdata/jvm/Contend.java")
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
		if !containsFunc(f, "ObjectMonitor::enter") || !strings.HasPrefix(smp.Label[LabelThread][0], "contender-") {
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
