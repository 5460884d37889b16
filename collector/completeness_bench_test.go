package collector

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
)

// The share of off-CPU time whose user stack reaches the thread's entry
// function, for offcpu (unwind tables), offcpu --frame-pointers-only and
// libbpf-tools offcputime, on two workloads:
//   - c: testdata/unwind/blocker.c built -O2 -fomit-frame-pointer
//     (threads blocked in pthread_cond_wait, nanosleep, read, epoll_wait);
//   - jvm: testdata/jvm/Contend.java under -XX:+PreserveFramePointer with
//     a perf map (threads contending on a synchronized block).
//
// A stack counts as whole when it holds the entry frame: run_* or main for
// c, thread_native_entry or JavaMain for the JVM. Threads blocked since
// before a recording started have no user stack and are left out. As root:
//
//	go test -run XXX -bench StackCompleteness -benchtime 1x ./collector
func BenchmarkStackCompleteness(b *testing.B) {
	requireBPF(b)
	const secs = 3
	type workload struct {
		name   string
		entry  *regexp.Regexp
		start  func() *exec.Cmd
		before func(pid int) // just before a recording stops
	}
	blocker := buildBlocker(b, "-fomit-frame-pointer")
	loads := []workload{{name: "c", entry: regexp.MustCompile(`^(run_(cond|sleep|read|epoll)|main)$`),
		start: func() *exec.Cmd { return exec.Command(blocker, "100000") }}}
	if _, err := exec.LookPath("jcmd"); err == nil {
		java, javac, jcmd := jdk(b)
		dir := b.TempDir()
		runBuild(b, javac, "-d", dir, "testdata/jvm/Contend.java")
		loads = append(loads, workload{name: "jvm", entry: regexp.MustCompile(`thread_native_entry|JavaMain`),
			start: func() *exec.Cmd {
				return exec.Command(java, "-XX:+PreserveFramePointer", "-cp", dir, "Contend", "100000")
			},
			before: func(pid int) { exec.Command(jcmd, strconv.Itoa(pid), "Compiler.perfmap").Run() }})
	}
	tool := findTool("offcputime")
	fmt.Println("\n| workload | offcpu | offcpu --frame-pointers-only | libbpf-tools offcputime |")
	fmt.Println("|---|---:|---:|---:|")
	for b.Loop() {
		for _, w := range loads {
			cmd := w.start()
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			pid := cmd.Process.Pid
			time.Sleep(2 * time.Second)
			var shares []string
			for _, fpOnly := range []bool{false, true} {
				s, err := Start(context.Background(), Options{PIDs: []int{pid}, NoWakeups: true, FramePointersOnly: fpOnly})
				if err != nil {
					b.Fatal(err)
				}
				time.Sleep(secs * time.Second)
				if w.before != nil {
					w.before(pid)
				}
				p, err := s.Stop()
				if err != nil {
					b.Fatal(err)
				}
				shares = append(shares, percent(wholeShare(p, w.entry)))
			}
			theirs := "n/a"
			if tool != "" {
				out, _ := exec.Command(tool, "-p", strconv.Itoa(pid), strconv.Itoa(secs)).Output()
				theirs = percent(offcputimeWhole(string(out), w.entry))
			}
			cmd.Process.Kill()
			cmd.Wait()
			os.Remove(filepath.Join(os.TempDir(), fmt.Sprintf("perf-%d.map", pid)))
			fmt.Printf("| %s | %s | %s | %s |\n", w.name, shares[0], shares[1], theirs)
		}
	}
}

func percent(share float64) string {
	if share < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.1f%%", 100*share)
}

// wholeShare is the share of off-CPU time with a user stack whose frames
// include one matching entry; -1 without any.
func wholeShare(p *profile.Profile, entry *regexp.Regexp) float64 {
	var total, whole int64
	for _, smp := range p.Sample {
		funcs := userFuncs(smp)
		if len(funcs) == 0 || strings.HasPrefix(funcs[0], "[user stack") {
			continue
		}
		total += smp.Value[0]
		for _, f := range funcs {
			if entry.MatchString(f) {
				whole += smp.Value[0]
				break
			}
		}
	}
	if total == 0 {
		return -1
	}
	return float64(whole) / float64(total)
}

// offcputimeWhole is wholeShare for offcputime's output: frames, then
// "-  COMM (PID)", then the value.
func offcputimeWhole(out string, entry *regexp.Regexp) float64 {
	var total, whole int64
	var frames []string
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "-") && strings.Contains(l, "(") && i+1 < len(lines):
			v, _ := strconv.ParseInt(strings.TrimSpace(lines[i+1]), 10, 64)
			total += v
			for _, f := range frames {
				if entry.MatchString(f) {
					whole += v
					break
				}
			}
			frames = nil
		case l == "":
			frames = nil
		default:
			if _, err := strconv.Atoi(l); err != nil {
				frames = append(frames, l)
			}
		}
	}
	if total == 0 {
		return -1
	}
	return float64(whole) / float64(total)
}
