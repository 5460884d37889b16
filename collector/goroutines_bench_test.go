package collector

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// The cost of recording goroutine waits: testdata/goparks (pairs of
// goroutines handing a message back and forth, WORK of CPU per message,
// nearly one park per message; at 40 µs and 2 CPUs about 50,000 parks/s)
// run unprofiled, under offcpu recording its threads, under offcpu
// recording threads and goroutines, the same with every wait streamed
// (--timeline: threads' and goroutines'), and with an empty program on the same
// uprobe (the traps alone: the floor), interleaved, REPEATS times each.
// Reports each mode's median messages/s and its ratio to unprofiled (and
// the median and range of each round's ratio to that round's unprofiled run), and
// for goroutines the recorder's cost per park: the BPF program's run time
// per park (bpf_stats) and the program's CPU per message over the
// unprofiled one (uprobe traps included). The kernel's BPF statistics
// cost every program run two clock reads, so they are on only in one
// extra run, after the rounds, that measures the time per park.
// OFFCPU_GOPARKS="WORK_US SECONDS REPEATS" (default "40 3 3");
// OFFCPU_GOPARKS_LABELS=N: every goroutine puts a new set of pprof labels
// on itself every N messages (a request's), read by the probe. As root:
//
//	go test -run XXX -bench GoroutineParks -benchtime 1x ./collector
func BenchmarkGoroutineParks(b *testing.B) {
	requireBPF(b)
	work, secs, repeats := 40, 3, 3
	benchEnv(b, "OFFCPU_GOPARKS", "WORK_US SECONDS REPEATS", &work, &secs, &repeats)
	labels := 0
	benchEnv(b, "OFFCPU_GOPARKS_LABELS", "N", &labels)
	bin := filepath.Join(b.TempDir(), "goparks")
	runBuild(b, "go", "build", "-o", bin, "./testdata/goparks")
	type result struct{ rate, cpuPerMsg float64 }
	var bpfPerPark, parksPerSec, runsPerPark float64
	var labelSets uint64
	modes := []string{"unprofiled", "threads", "threads+goroutines", "with --timeline", "empty probe"}
	results := map[string][]result{}
	var stats io.Closer
	for i := 0; i <= repeats*len(modes); i++ {
		mode := modes[i%len(modes)]
		measure := i == repeats*len(modes)
		if measure {
			mode = "threads+goroutines"
			stats = enableBPFStats(b)
		}
		cmd := exec.Command(bin, fmt.Sprintf("%ds", secs), fmt.Sprintf("%dus", work), "8", fmt.Sprint(labels))
		var out strings.Builder
		cmd.Stdout = &out
		var s *Session
		var err error
		detach := func() {}
		if mode == "empty probe" {
			// The floor: the same uprobe with a program that does nothing,
			// put on the process alone as the recorder puts its own.
			if err = cmd.Start(); err == nil {
				detach = emptyUprobe(b, bin, "runtime.casgstatus", cmd.Process.Pid)
			}
		} else if mode != "unprofiled" {
			o := Options{TargetsOnly: true, Goroutines: mode != "threads", Stream: mode == "with --timeline"}
			if s, err = Start(context.Background(), o); err != nil {
				b.Fatal(err)
			}
			err = s.StartCommand(cmd)
		} else {
			err = cmd.Start()
		}
		if err != nil {
			b.Fatal(err)
		}
		var r result
		var runtime time.Duration
		var runs uint64
		if err := cmd.Wait(); err != nil {
			b.Fatalf("goparks: %v", err)
		}
		detach()
		if measure {
			for _, p := range bpfPrograms() {
				if strings.HasPrefix(p.name, "go_casg") {
					runtime += p.runtime
					runs += p.runs
				}
			}
		}
		if s != nil {
			if _, err := s.Stop(); err != nil {
				b.Fatal(err)
			}
			if g := s.Stats().Goroutines; measure && g != nil && g.Parks > 0 {
				bpfPerPark = float64(runtime) / float64(g.Parks)
				parksPerSec = float64(g.Parks) / float64(secs)
				runsPerPark = float64(runs) / float64(g.Parks)
				labelSets = g.LabelSets
			}
		}
		var msgs, cpu int64
		if _, err := fmt.Sscan(out.String(), &msgs, &cpu); err != nil || msgs == 0 {
			b.Fatalf("goparks printed %q", out.String())
		}
		if measure {
			stats.Close()
			continue
		}
		r.rate, r.cpuPerMsg = float64(msgs)/float64(secs), float64(cpu)/float64(msgs)
		results[mode] = append(results[mode], r)
	}
	med := func(mode string, f func(result) float64) float64 {
		var v []float64
		for _, r := range results[mode] {
			v = append(v, f(r))
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	base := med("unprofiled", func(r result) float64 { return r.rate })
	baseCPU := med("unprofiled", func(r result) float64 { return r.cpuPerMsg })
	for _, mode := range modes {
		rate := med(mode, func(r result) float64 { return r.rate })
		line := fmt.Sprintf("%-19s %8.0f msg/s  %.3f× unprofiled  CPU %6.0f ns/msg (+%.0f)", mode, rate, rate/base,
			med(mode, func(r result) float64 { return r.cpuPerMsg }), med(mode, func(r result) float64 { return r.cpuPerMsg })-baseCPU)
		// Each round against the unprofiled run of the same round: the
		// load drifts between rounds.
		var paired []float64
		for i, r := range results[mode] {
			paired = append(paired, r.rate/results["unprofiled"][i].rate)
		}
		slices.Sort(paired)
		line += fmt.Sprintf("  paired %.3f× (%.3f–%.3f)", paired[len(paired)/2], paired[0], paired[len(paired)-1])
		if mode == "threads+goroutines" {
			line += fmt.Sprintf("  %.0f parks/s, BPF %.0f ns/park in %.2f runs (an extra run with BPF statistics on), %d label sets read", parksPerSec, bpfPerPark, runsPerPark, labelSets)
		}
		b.Log(line)
	}
}

// emptyUprobe attaches a program that returns at once to symbol in exe;
// it returns the detach.
func emptyUprobe(b *testing.B, exe, symbol string, pid int) func() {
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.Kprobe, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
	if err != nil {
		b.Fatal(err)
	}
	ex, err := link.OpenExecutable(exe)
	if err != nil {
		b.Fatal(err)
	}
	l, err := ex.Uprobe(symbol, prog, &link.UprobeOptions{PID: pid})
	if err != nil {
		b.Fatal(err)
	}
	return func() { l.Close(); prog.Close() }
}
