package collector

import (
	"bytes"
	"fmt"
	"io"
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

	"github.com/offcpu/offcpu/schema"
)

// Recording system-wide under process churn, side by side: offcpu record
// built from this tree, with OFFCPU_OTHER=PATH another offcpu build (an
// older one), and libbpf-tools offcputime, while a launcher starts RATE
// processes a second for SECONDS seconds, each sleeping 1 ms in nap_here
// (OFFCPU_CHURN="RATE SECONDS", default "500 30"). As root:
//
//	go test -run XXX -bench ProcessChurn -benchtime 1x ./collector
//
// For each: the share of the processes' off-CPU time with a named user
// frame, peak RSS, BPF map memory, its CPU per process while recording and
// over its whole life, and its BPF programs' run time per process (every
// program: the switch, wake-up and sampling programs of all threads).
func BenchmarkProcessChurn(b *testing.B) {
	requireBPF(b)
	rate, secs := 500, 30
	benchEnv(b, "OFFCPU_CHURN", "RATE SECONDS", &rate, &secs)
	dir := b.TempDir()
	churn, nap := filepath.Join(dir, "churn"), filepath.Join(dir, "nap")
	runBuild(b, "gcc", "-O2", "-o", churn, "testdata/churn/churn.c")
	runBuild(b, "gcc", "-O2", "-o", nap, "testdata/churn/nap.c")
	launch := func() int {
		out, err := exec.Command(churn, strconv.Itoa(rate), strconv.Itoa(secs), nap, "1000").Output()
		if err != nil {
			b.Fatalf("churn: %v", err)
		}
		var n int
		fmt.Sscan(string(out), &n)
		return n
	}
	defer enableBPFStats(b).Close()

	self := filepath.Join(dir, "offcpu")
	runBuild(b, "go", "build", "-o", self, "github.com/offcpu/offcpu/cmd/offcpu")
	var rows []churnRow
	record := func(name, bin string) {
		folded := filepath.Join(dir, filepath.Base(bin)+".folded")
		r := churnApart(b, launch, folded, bin, "record", "-d", "1h", "--folded", folded, "-o", folded+".pb.gz")
		r.name = name
		r.named = foldedNamed(b, folded, "nap")
		rows = append(rows, r)
	}
	for b.Loop() {
		record("offcpu record (this build)", self)
	}
	if other := os.Getenv("OFFCPU_OTHER"); other != "" {
		record(other+" record", other)
	}
	if tool := findTool("offcputime"); tool != "" {
		out := filepath.Join(dir, "offcputime")
		r := churnApart(b, launch, out, tool)
		r.name = "libbpf-tools offcputime"
		r.named = offcputimeNamed(b, out+".stdout", "nap")
		rows = append(rows, r)
	}
	fmt.Printf("\n%d processes a second for %d s, each sleeping 1 ms in nap_here:\n\n", rate, secs)
	fmt.Println("| recorder | processes | named user frame | peak RSS | BPF map memory | recorder CPU per process while recording | BPF run time per process | recorder CPU in all |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rows {
		fmt.Printf("| %s | %d | %.1f%% | %.0f MB | %.1f MB | %.0f µs | %.1f µs | %.2f s |\n", r.name, r.processes, r.named,
			float64(r.peakRSS)/(1<<20), float64(r.mapBytes)/(1<<20), perProcess(r.cpuDuring, r.processes), perProcess(r.bpf, r.processes), r.cpuAll.Seconds())
	}
	b.ReportMetric(rows[0].named, "named-%")
	b.ReportMetric(perProcess(rows[0].cpuDuring, rows[0].processes), "µs-cpu/process")
	b.ReportMetric(perProcess(rows[0].bpf, rows[0].processes), "µs-bpf/process")
	b.ReportMetric(float64(rows[0].peakRSS)/(1<<20), "peak-MB")
}

type churnRow struct {
	name                   string
	processes              int
	named                  float64 // percent
	peakRSS, mapBytes      int64
	cpuDuring, bpf, cpuAll time.Duration
}

func perProcess(d time.Duration, n int) float64 {
	return float64(d.Microseconds()) / float64(max(n, 1))
}

// churnApart records with a recorder program, stopped with SIGINT; it runs
// under /usr/bin/time for its peak RSS and CPU (a child forked from this
// process would count this process's RSS as its own peak).
func churnApart(b *testing.B, launch func() int, out, prog string, args ...string) churnRow {
	before := bpfPrograms()
	stdout, err := os.Create(out + ".stdout")
	if err != nil {
		b.Fatal(err)
	}
	defer stdout.Close()
	timeFile := out + ".time"
	cmd := exec.Command("/usr/bin/time", append([]string{"-f", "%U %S %M", "-o", timeFile, prog}, args...)...)
	cmd.Stdout, cmd.Stderr = stdout, stdout
	if err := cmd.Start(); err != nil {
		b.Fatalf("%s (needs /usr/bin/time: apt-get install time): %v", prog, err)
	}
	time.Sleep(3 * time.Second) // attached
	pid := childOf(cmd.Process.Pid)
	c0 := procCPU(pid)
	n := launch()
	r := churnRow{processes: n, cpuDuring: procCPU(pid) - c0}
	for id, p := range bpfPrograms() {
		if _, ok := before[id]; !ok {
			r.bpf += p.runtime
			r.mapBytes += p.maps
		}
	}
	syscall.Kill(pid, syscall.SIGINT)
	cmd.Wait()
	var user, sys float64
	var rssKB int64
	if raw, err := os.ReadFile(timeFile); err == nil {
		fmt.Sscan(string(raw), &user, &sys, &rssKB)
	}
	r.peakRSS = rssKB << 10
	r.cpuAll = time.Duration((user + sys) * float64(time.Second))
	return r
}

// childOf is a process's first child.
func childOf(pid int) int {
	raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	var c int
	fmt.Sscan(string(raw), &c)
	return c
}

// benchEnv reads integers from an environment variable ("400000 3").
func benchEnv(b *testing.B, name, form string, vals ...*int) {
	v := os.Getenv(name)
	if v == "" {
		return
	}
	args := make([]any, len(vals))
	for i := range vals {
		args[i] = vals[i]
	}
	if _, err := fmt.Sscan(v, args...); err != nil {
		b.Fatalf("%s=%q: want %s", name, v, form)
	}
}

func enableBPFStats(b *testing.B) io.Closer {
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatalf("enabling BPF run-time statistics: %v", err)
	}
	return stats
}

// findTool is a libbpf-tools program's path, or "".
func findTool(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/" + name); err == nil {
		return "/usr/sbin/" + name
	}
	return ""
}

type progInfo struct {
	name    string
	runtime time.Duration
	runs    uint64
	maps    int64 // memory of the maps it uses
}

// bpfPrograms is every loaded program's run time and its maps' memory.
func bpfPrograms() map[ebpf.ProgramID]progInfo {
	out := map[ebpf.ProgramID]progInfo{}
	seen := map[ebpf.MapID]bool{}
	for id := ebpf.ProgramID(0); ; {
		next, err := ebpf.ProgramGetNextID(id)
		if err != nil {
			return out
		}
		id = next
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue
		}
		var pi progInfo
		if st, err := p.Stats(); err == nil {
			pi.runtime, pi.runs = st.Runtime, st.RunCount
		}
		if info, err := p.Info(); err == nil {
			pi.name = info.Name
			if ids, ok := info.MapIDs(); ok {
				for _, mid := range ids {
					if seen[mid] {
						continue
					}
					seen[mid] = true
					if m, err := ebpf.NewMapFromID(mid); err == nil {
						pi.maps += memlock(m.FD())
						m.Close()
					}
				}
			}
		}
		p.Close()
		out[id] = pi
	}
}

// memlock is the memory the kernel charges a BPF map, from its fdinfo.
func memlock(fd int) int64 {
	return fdinfoField(fmt.Sprintf("/proc/self/fdinfo/%d", fd), "memlock:")
}

func fdinfoField(path, key string) int64 {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, key); ok {
			var n int64
			fmt.Sscan(v, &n) // "123 kB" in status
			return n
		}
	}
	return 0
}

// procCPU is a process's user and system time so far (clock ticks of 10 ms).
func procCPU(pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(u+s) * 10 * time.Millisecond
}

// foldedNamed is the share of comm's time in folded stacks with a named
// user frame.
func foldedNamed(b *testing.B, path, comm string) float64 {
	raw, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	var total, named int64
	schema.ScanFolded(raw, func(stack []byte, v int64) error {
		fr := strings.Split(string(stack), ";")
		if fr[0] != comm {
			return nil
		}
		total += v
		for _, f := range fr[1:] {
			if f == "-" {
				break
			}
			if namedFrame(f) {
				named += v
				break
			}
		}
		return nil
	})
	return 100 * float64(named) / float64(max(total, 1))
}

func namedFrame(f string) bool {
	return f != "" && !strings.HasPrefix(f, "[") && !strings.Contains(f, "+0x")
}

// offcputimeNamed reads offcputime's blocks: kernel frames, "-", user
// frames, "-  COMM (PID)", then the value.
func offcputimeNamed(b *testing.B, path, comm string) float64 {
	raw, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	var total, named int64
	for _, block := range strings.Split(string(raw), "\n\n") {
		var ls []string
		for _, l := range strings.Split(block, "\n") {
			if l = strings.TrimSpace(l); l != "" {
				ls = append(ls, l)
			}
		}
		if len(ls) < 2 {
			continue
		}
		v, err := strconv.ParseInt(ls[len(ls)-1], 10, 64)
		head := ls[len(ls)-2]
		if err != nil || !strings.HasPrefix(head, "-") || len(strings.Fields(head)) < 2 || strings.Fields(head)[1] != comm {
			continue
		}
		total += v
		user := ls[:len(ls)-2]
		for i := len(user) - 1; i >= 0; i-- {
			if user[i] == "-" {
				user = user[i+1:]
				break
			}
			if i == 0 {
				user = nil
			}
		}
		for _, f := range user {
			if namedFrame(f) && f != "[unknown]" {
				named += v
				break
			}
		}
	}
	return 100 * float64(named) / float64(max(total, 1))
}
