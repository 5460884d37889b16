package collector

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// The cost of recording off-CPU stacks system-wide, side by side: a C
// ping-pong (two threads bouncing a byte over pipes, pinned to CPU 0,
// about two context switches per round; glibc here has no frame pointers,
// so its stacks go through the unwind tables) run with no recorder, under
// libbpf-tools offcputime and wakeuptime, and under offcpu without
// wake-ups (tables, --frame-pointers-only, every switch walked with and
// without tables) and with them, and with stacks walked at the switch-in
// (--walk-threshold, --budget), and with the floor: two empty tp_btf
// programs, on sched_switch and sched_waking, the least any recorder of
// switches and wake-ups costs. Reports the ping-pong's wall time and
// slowdown, and from the kernel's bpf_stats the ns of BPF time per switch:
// for offcpu, every program that runs per switch or wake-up (sched_switch,
// sched_exit_tp, sched_waking) over the switches; medians of
// REPEATS. OFFCPU_OVERHEAD="ROUNDS REPEATS" (default "400000
// 3"). As root:
//
//	go test -run XXX -bench RecorderOverhead -benchtime 1x ./collector
func BenchmarkRecorderOverhead(b *testing.B) {
	requireBPF(b)
	rounds, repeats := 400000, 3
	benchEnv(b, "OFFCPU_OVERHEAD", "ROUNDS REPEATS", &rounds, &repeats)
	bin := filepath.Join(b.TempDir(), "pingpong")
	runBuild(b, "gcc", "-O2", "-pthread", "-o", bin, "testdata/pingpong/pingpong.c")
	workload := func() time.Duration {
		out, err := exec.Command("taskset", "-c", "0", bin, strconv.Itoa(rounds)).Output()
		if err != nil {
			b.Fatalf("pingpong: %v", err)
		}
		ns, _ := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
		return time.Duration(ns)
	}
	defer enableBPFStats(b).Close()
	// under runs the workload under a libbpf-tools recorder; cost: mean ns
	// per run of its programs named like prog.
	under := func(path, prog string) (time.Duration, time.Duration) {
		before := bpfPrograms()
		cmd := exec.Command(path, "600")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		wall := workload()
		var rt time.Duration
		var runs uint64
		for id, p := range bpfPrograms() {
			if _, ok := before[id]; !ok && strings.Contains(p.name, prog) {
				rt += p.runtime
				runs += p.runs
			}
		}
		cmd.Process.Signal(syscall.SIGINT)
		cmd.Wait()
		return wall, rt / time.Duration(max(runs, 1))
	}
	// ours runs the workload under this package's recorder; costs: all
	// its per-switch and per-wake-up programs' time over the switches,
	// and the mean sched_waking run.
	ours := func(o Options) (wall, all, wk time.Duration) {
		o.Stats = true
		s, err := Start(context.Background(), o)
		if err != nil {
			b.Fatal(err)
		}
		time.Sleep(time.Second)
		wall = workload()
		if _, err := s.Stop(); err != nil {
			b.Fatal(err)
		}
		var rt time.Duration
		var switches uint64
		for _, p := range s.Stats().Programs {
			switch p.Name {
			case "offcpu_switch":
				switches = p.Runs
				rt += p.Runtime
			case "offcpu_waking":
				wk = p.MeanCost
				rt += p.Runtime
			case "offcpu_switched_in":
				rt += p.Runtime
			}
		}
		all = rt / time.Duration(max(switches, 1))
		return
	}
	// floor runs the workload under two empty tp_btf programs; cost: their
	// time over the switches, counted as for ours.
	floor := func() (time.Duration, time.Duration) {
		var ls []link.Link
		var progs []*ebpf.Program
		for _, tp := range []string{"sched_switch", "sched_waking"} {
			prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.Tracing, AttachType: ebpf.AttachTraceRawTp, AttachTo: tp, License: "GPL",
				Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()}})
			if err != nil {
				b.Fatalf("an empty tp_btf program on %s: %v", tp, err)
			}
			l, err := link.AttachTracing(link.TracingOptions{Program: prog})
			if err != nil {
				b.Fatalf("attaching an empty tp_btf program on %s: %v", tp, err)
			}
			ls, progs = append(ls, l), append(progs, prog)
		}
		time.Sleep(time.Second)
		before := map[*ebpf.Program]progRun{}
		for _, p := range progs {
			before[p] = runOf(b, p)
		}
		wall := workload()
		var rt time.Duration
		var switches uint64
		for i, p := range progs {
			r := runOf(b, p)
			rt += r.runtime - before[p].runtime
			if i == 0 {
				switches = r.runs - before[p].runs
			}
		}
		for i := range ls {
			ls[i].Close()
			progs[i].Close()
		}
		return wall, rt / time.Duration(max(switches, 1))
	}
	type row struct {
		label, unit string
		wall, cost  []time.Duration
	}
	rows := []*row{{label: "none"}}
	add := func(label, unit string) *row {
		r := &row{label: label, unit: unit}
		rows = append(rows, r)
		return r
	}
	offcputime, wakeuptime := findTool("offcputime"), findTool("wakeuptime")
	var rTool, rWTool *row
	if offcputime != "" {
		rTool = add("libbpf-tools offcputime", "sched_switch")
	}
	rOurs := add("offcpu record --no-wakeups", "switch")
	rFP := add("… --frame-pointers-only", "switch")
	rWalk := add("… --no-stack-reuse (every switch walked, tables)", "switch")
	rFPWalk := add("… --no-stack-reuse --frame-pointers-only", "switch")
	if wakeuptime != "" {
		rWTool = add("libbpf-tools wakeuptime", "wake-up")
	}
	rWake := add("offcpu record (wake-ups)", "sched_waking")
	rFloor := add("floor: two empty tp_btf programs (sched_switch, sched_waking)", "switch")
	rTotal := add("offcpu record, every feature (wake-ups), every interval walked", "switch")
	rAgent := add("… --walk-threshold 100µs (--continuous's default)", "switch")
	rAgentNW := add("… --walk-threshold 100µs --no-wakeups (the switch's side alone: two programs)", "switch")
	rThr := add("… --walk-threshold 1ms", "switch")
	rBudget := add("… --budget 1%", "switch")
	for b.Loop() {
		for range repeats {
			rows[0].wall = append(rows[0].wall, workload())
			if rTool != nil {
				w, c := under(offcputime, "sched_switch")
				rTool.wall, rTool.cost = append(rTool.wall, w), append(rTool.cost, c)
			}
			for _, v := range []struct {
				r *row
				o Options
			}{{rOurs, Options{NoWakeups: true}}, {rFP, Options{NoWakeups: true, FramePointersOnly: true}},
				{rWalk, Options{NoWakeups: true, NoStackReuse: true}}, {rFPWalk, Options{NoWakeups: true, NoStackReuse: true, FramePointersOnly: true}}} {
				w, all, _ := ours(v.o)
				v.r.wall, v.r.cost = append(v.r.wall, w), append(v.r.cost, all)
			}
			if rWTool != nil {
				w, c := under(wakeuptime, "wakeup")
				rWTool.wall, rWTool.cost = append(rWTool.wall, w), append(rWTool.cost, c)
			}
			w, c := floor()
			rFloor.wall, rFloor.cost = append(rFloor.wall, w), append(rFloor.cost, c)
			w, all, _ := ours(Options{WalkThreshold: DefaultContinuousWalkThreshold})
			rAgent.wall, rAgent.cost = append(rAgent.wall, w), append(rAgent.cost, all)
			w, all, _ = ours(Options{WalkThreshold: DefaultContinuousWalkThreshold, NoWakeups: true})
			rAgentNW.wall, rAgentNW.cost = append(rAgentNW.wall, w), append(rAgentNW.cost, all)
			w, all, wk := ours(Options{})
			rWake.cost = append(rWake.cost, wk)
			rTotal.wall, rTotal.cost = append(rTotal.wall, w), append(rTotal.cost, all)
			w, all, _ = ours(Options{WalkThreshold: time.Millisecond})
			rThr.wall, rThr.cost = append(rThr.wall, w), append(rThr.cost, all)
			w, all, _ = ours(Options{Budget: 0.01})
			rBudget.wall, rBudget.cost = append(rBudget.wall, w), append(rBudget.cost, all)
		}
	}
	median := func(d []time.Duration) time.Duration {
		if len(d) == 0 {
			return 0
		}
		d = slices.Clone(d)
		slices.Sort(d)
		return d[len(d)/2]
	}
	base := median(rows[0].wall)
	fmt.Printf("\nworkload: %d round trips, pinned to CPU 0, %d runs each, medians\n\n", rounds, repeats)
	fmt.Println("| recorder | wall | slowdown | cost |")
	fmt.Println("|---|---:|---:|---:|")
	for _, r := range rows {
		wall, slow, cost := "", "", ""
		if len(r.wall) > 0 {
			m := median(r.wall)
			wall = fmt.Sprintf("%.1f ms", float64(m)/1e6)
			if r != rows[0] {
				slow = fmt.Sprintf("%.1f%%", 100*float64(m-base)/float64(base))
			} else {
				slow = "–"
			}
		}
		if len(r.cost) > 0 {
			cost = fmt.Sprintf("%d ns per %s", median(r.cost).Nanoseconds(), r.unit)
		} else if r == rows[0] {
			cost = "–"
		}
		fmt.Printf("| %s | %s | %s | %s |\n", r.label, wall, slow, cost)
	}
	b.ReportMetric(float64(median(rTotal.cost).Nanoseconds()), "ns/switch")
	fl := float64(median(rFloor.cost))
	fmt.Printf("\nagainst the floor (%d ns per switch): %.2fx every interval walked, %.2fx --walk-threshold %v (--continuous's default; %.2fx without wake-ups), %.2fx --walk-threshold 1ms, %.2fx --budget 1%%\n",
		median(rFloor.cost).Nanoseconds(), float64(median(rTotal.cost))/fl, float64(median(rAgent.cost))/fl, DefaultContinuousWalkThreshold,
		float64(median(rAgentNW.cost))/fl, float64(median(rThr.cost))/fl, float64(median(rBudget.cost))/fl)
	b.ReportMetric(float64(median(rBudget.cost).Nanoseconds()), "ns/switch-budget")
	if rTool != nil {
		fmt.Printf("\nevery feature, per switch, against offcputime: %.2fx every interval walked, %.2fx --walk-threshold 1ms, %.2fx --budget 1%%\n",
			float64(median(rTotal.cost))/float64(median(rTool.cost)), float64(median(rThr.cost))/float64(median(rTool.cost)), float64(median(rBudget.cost))/float64(median(rTool.cost)))
	}
}

type progRun struct {
	runtime time.Duration
	runs    uint64
}

// runOf is a program's run time and count so far (bpf_stats).
func runOf(b *testing.B, p *ebpf.Program) progRun {
	st, err := p.Stats()
	if err != nil {
		b.Fatal(err)
	}
	return progRun{st.Runtime, st.RunCount}
}
