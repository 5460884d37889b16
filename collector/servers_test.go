package collector

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// schedPath bounds, per context switch, the scheduler's own path around
// sched_switch (dequeue, pick, idle balancing, the switch itself), which
// schedstat charges to the incoming thread, or to no thread when the CPU
// goes idle, while a tracepoint sees it as the outgoing thread's: about
// 3 µs on this VM (nginx aio threads +36 ms over 12,000 switches, workers
// -40 ms over 13,000).
const schedPath = 3 * time.Microsecond

// cpuHogs keeps every CPU busy with n processes until the test ends, so
// that woken threads wait for a CPU.
func cpuHogs(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
}

// Ground truth on servers nobody here wrote: memcached (an event-loop
// thread per worker, plus maintenance threads) and nginx (two worker
// processes and their aio thread pool), under a load on loopback.
func TestSchedstatTruth(t *testing.T) {
	requireBPF(t)
	for _, hogs := range []int{0, 2} {
		name := "idle-cpus"
		if hogs > 0 {
			name = "cpu-hogs"
		}
		t.Run(name, func(t *testing.T) { schedstatTruth(t, hogs) })
	}
}

// TestSchedstatWorkload is the same check on a small C program beside two
// CPU hogs: it needs no server, so kernels booted under qemu run it too
// (tools/kmatrix).
func TestSchedstatWorkload(t *testing.T) {
	requireBPF(t)
	bin := filepath.Join(t.TempDir(), "split")
	runBuild(t, "gcc", "-O2", "-pthread", "-o", bin, "testdata/split/split.c")
	cpuHogs(t, 2)
	// first-in-missed: every thread's first switch-in runs no program, as
	// the kernel sometimes skips one; the waits begun before the start
	// are counted at the next switch-out.
	for _, mode := range []string{"tp_btf", "tracepoint", "first-in-missed"} {
		t.Run(mode, func(t *testing.T) {
			cmd := exec.Command(bin, "1", "3")
			in, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			startReady(t, cmd)
			// It works 1 s of the load's 1.5 s and idles around the reads.
			checkAgainstSchedstat(t, []int{cmd.Process.Pid}, func(stop <-chan struct{}) {
				if mode == "first-in-missed" {
					// Waits begun before the start that outlast 2% of the window.
					time.Sleep(200 * time.Millisecond)
				}
				in.Write([]byte{'g'})
				<-stop
			}, Options{ForceTracepoint: mode == "tracepoint", skipFirstIn: mode == "first-in-missed"})
		})
	}
}

func schedstatTruth(t *testing.T, hogs int) {
	t.Run("memcached", func(t *testing.T) {
		cmd, port := startMemcached(t)
		cpuHogs(t, hogs)
		checkAgainstSchedstat(t, []int{cmd.Process.Pid}, func(stop <-chan struct{}) {
			memcachedLoad(t, port, 8, stop)
		})
	})
	t.Run("nginx", func(t *testing.T) {
		bin := requireServer(t, "nginx", "nginx-light")
		dir := t.TempDir()
		port := freePort(t)
		body := strings.Repeat("offcpu ", 20000)
		if err := os.WriteFile(filepath.Join(dir, "index.html"), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		conf := fmt.Sprintf(`user root;
worker_processes 2;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
thread_pool io threads=2;
events { worker_connections 256; }
http {
	access_log off;
	client_body_temp_path %[1]s;
	server {
		listen 127.0.0.1:%[2]d;
		root %[1]s;
		sendfile off;
		aio threads=io;
	}
}
`, dir, port)
		if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "-c", filepath.Join(dir, "nginx.conf"), "-p", dir, "-g", "daemon off;")
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		// The workers outlive a killed master: kill the process group.
		defer func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() }()
		waitListening(t, port)
		pids := append([]int{cmd.Process.Pid}, children(t, cmd.Process.Pid)...)
		if len(pids) < 3 {
			t.Fatalf("nginx has %d processes, want a master and 2 workers", len(pids))
		}
		cpuHogs(t, hogs)
		checkAgainstSchedstat(t, pids, func(stop <-chan struct{}) {
			httpLoad(t, fmt.Sprintf("http://127.0.0.1:%d/index.html", port), len(body), 8, stop)
		})
	})
}

// startMemcached starts memcached with 4 worker threads on a free
// loopback port, killed when the test ends.
func startMemcached(t *testing.T) (*exec.Cmd, int) {
	t.Helper()
	bin := requireServer(t, "memcached", "memcached")
	port := freePort(t)
	cmd := exec.Command(bin, "-u", "root", "-l", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "0", "-t", "4")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitListening(t, port)
	return cmd, port
}

// memcachedLoad sets and gets keys over conns connections until stop.
func memcachedLoad(t *testing.T, port, conns int, stop <-chan struct{}) {
	var wg sync.WaitGroup
	for c := 0; c < conns; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			conn, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				t.Error(err)
				return
			}
			defer conn.Close()
			r := bufio.NewReader(conn)
			val := strings.Repeat("v", 100)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("k%d-%d", c, i%1000)
				fmt.Fprintf(conn, "set %s 0 0 %d\r\n%s\r\nget %s\r\n", key, len(val), val, key)
				// STORED, VALUE line, data, END
				for n := 0; n < 4; n++ {
					if _, err := r.ReadString('\n'); err != nil {
						t.Error(err)
						return
					}
				}
			}
		}(c)
	}
	wg.Wait()
}
