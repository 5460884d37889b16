package hotspot

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/internal/testenv"
)

// javacLoop starts a JVM compiling Contend.java in a loop (JavacLoop) for
// secs seconds and returns it once it has at least minCompiled compiled
// methods, with its VM open.
func javacLoop(t testing.TB, secs, minCompiled int) (*exec.Cmd, *VM) {
	t.Helper()
	dir := testenv.JDKHomes(t)["17"]
	tmp := t.TempDir()
	if out, err := exec.Command(filepath.Join(dir, "bin", "javac"), "-d", tmp, "../../collector/testdata/jvm/JavacLoop.java").CombinedOutput(); err != nil {
		t.Fatalf("javac: %v\n%s", err, out)
	}
	cmd := exec.Command(filepath.Join(dir, "bin", "java"), "-cp", tmp, "JavacLoop", "../../collector/testdata/jvm/Contend.java", tmp, fmt.Sprint(secs))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	var vm *VM
	var err error
	for deadline := time.Now().Add(time.Duration(secs) * time.Second); time.Now().Before(deadline); time.Sleep(500 * time.Millisecond) {
		if vm == nil {
			if vm, err = attach(cmd.Process.Pid); err != nil {
				continue
			}
		}
		if cc, err := vm.CodeCache(); err == nil && compiled(cc) >= minCompiled {
			return cmd, vm
		}
	}
	t.Fatalf("the javac loop did not reach %d compiled methods (%v)", minCompiled, err)
	return nil, nil
}

func compiled(cc *CodeCache) int {
	n := 0
	for _, b := range cc.Blobs {
		if b.Kind == KindCompiled {
			n++
		}
	}
	return n
}

func threadCPU() time.Duration {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_THREAD, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The CPU of one code-cache walk (reading every block of the committed
// code heap through windows, describing each blob) of a JVM running javac
// in a loop, at 4,000 compiled methods or more (OFFCPU_JVM_COMPILED=N for
// another floor). As root or the JVM's user:
//
//	go test -run XXX -bench CodeCacheWalk -benchtime 10x ./runtimes/hotspot
//
// The cost is per page touched rather than per byte: a remote read pins
// each page (access_remote_vm, as process_vm_readv does), and the blocks
// are a few KiB apart, so reading only headers touches nearly as many
// pages as reading the heap.
//
// Tried: reading only the blocks the last walk found (their headers and
// blob descriptions, batched with process_vm_readv, 1,024 pieces a call)
// instead of the whole heap: identical blobs, but 5.2 ms of CPU a walk
// against 3.7 ms (4,170 compiled methods): the per-piece cost of
// process_vm_readv outweighs copying the heap in 256 KiB windows. What
// helped: the windows read with process_vm_readv rather than
// /proc/PID/mem (each walk is made both ways, interleaved:
// median-proc-mem-ms/walk), and 32 KiB windows rather than 256.
func BenchmarkCodeCacheWalk(b *testing.B) {
	floor := 4000
	if v, err := strconv.Atoi(os.Getenv("OFFCPU_JVM_COMPILED")); err == nil {
		floor = v
	}
	cmd, vm := javacLoop(b, 180, floor)
	procMem := vm.mem
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var cpu time.Duration
	var each, viaProc []time.Duration
	var blobs, comp int
	for b.Loop() {
		// Each walk as the recorder makes it (process_vm_readv), then one
		// through /proc/PID/mem for comparison, interleaved.
		vm.mem = Remote{PID: cmd.Process.Pid}
		start := threadCPU()
		cc, err := vm.CodeCache()
		d := threadCPU() - start
		cpu += d
		each = append(each, d)
		if err != nil {
			b.Fatal(err)
		}
		blobs, comp = len(cc.Blobs), compiled(cc)
		vm.mem = procMem
		start = threadCPU()
		if _, err := vm.CodeCache(); err != nil {
			b.Fatal(err)
		}
		viaProc = append(viaProc, threadCPU()-start)
	}
	// The JVM compiles on the other CPU meanwhile: the median is steadier.
	slices.Sort(each)
	slices.Sort(viaProc)
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/walk")
	b.ReportMetric(float64(each[len(each)/2].Microseconds())/1000, "median-cpu-ms/walk")
	b.ReportMetric(float64(viaProc[len(viaProc)/2].Microseconds())/1000, "median-proc-mem-ms/walk")
	b.ReportMetric(float64(blobs), "blobs")
	b.ReportMetric(float64(comp), "compiled")
}
