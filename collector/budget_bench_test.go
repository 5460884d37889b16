package collector

import (
	"fmt"
	"math"
	"os/exec"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/schema"
)

// What --budget costs and what it keeps, on the ping-pong with 2 ms naps
// beside it (testdata/budget/mix.c, pinned to CPU 0): recorded at once
// with every interval walked (the truth) and with --budget, then with
// --budget alone for its cost, as fast as the ping-pong goes and paced at
// 100,000 and 20,000 switches a second. Reports the switch rate, the programs'
// share of a CPU, the threshold, and for each stack with 1% of the
// off-CPU time or more its estimate against the truth; the naps (2 ms
// waits) must all be there with their stack. OFFCPU_BUDGET="ROUNDS
// BUDGET_PERCENT" (default "400000 1"). As root:
//
//	go test -run XXX -bench BudgetAccuracy -benchtime 1x ./collector
func BenchmarkBudgetAccuracy(b *testing.B) {
	requireBPF(b)
	rounds, pct := 400000, 1
	benchEnv(b, "OFFCPU_BUDGET", "ROUNDS BUDGET_PERCENT", &rounds, &pct)
	bin := filepath.Join(b.TempDir(), "mix")
	runBuild(b, "gcc", "-O2", "-g", "-pthread", "-o", bin, "testdata/budget/mix.c")
	const naps = 500
	pace := 0 // rounds a second; 0: as fast as it can
	run := func(opts ...Options) ([]*profile.Profile, []Stats, time.Duration) {
		cmd := exec.Command("taskset", "-c", "0", bin, fmt.Sprint(rounds), fmt.Sprint(naps), fmt.Sprint(pace))
		in, err := cmd.StdinPipe()
		if err != nil {
			b.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer cmd.Process.Kill()
		ss := startOn(b, cmd.Process.Pid, opts...)
		start := time.Now()
		in.Write([]byte{1})
		if err := cmd.Wait(); err != nil {
			b.Fatal(err)
		}
		wall := time.Since(start)
		var ps []*profile.Profile
		var sts []Stats
		for _, s := range ss {
			p, err := s.Stop()
			if err != nil {
				b.Fatal(err)
			}
			ps, sts = append(ps, p), append(sts, s.Stats())
		}
		return ps, sts, wall
	}
	share := float64(pct) / 100
	for b.Loop() {
		ps, sts, wall := run(Options{Stats: true}, Options{Budget: share})
		truth, est := stackTimes(ps[0]), stackTimes(ps[1])
		var total int64
		for _, v := range truth {
			total += v
		}
		fmt.Printf("\nmix %d rounds + %d naps of 2 ms on CPU 0, %v: %.0f switches/s; truth: every interval walked, recorded at the same time\n",
			rounds, naps, wall.Round(time.Millisecond), float64(switchRuns(sts[0]))/wall.Seconds())
		bs := sts[1].Budget
		fmt.Printf("--budget %d%%: threshold %v to %v (%v at the end); %d of %d intervals below it walked (%.2f%%)\n\n",
			pct, bs.ThresholdMin, bs.ThresholdMax, bs.Threshold, bs.Walked, bs.Below, 100*float64(bs.Walked)/float64(max(bs.Below, 1)))
		keys := make([]string, 0, len(truth))
		for k, v := range truth {
			if float64(v) >= 0.01*float64(total) {
				keys = append(keys, k)
			}
		}
		sort.Slice(keys, func(i, j int) bool { return truth[keys[i]] > truth[keys[j]] })
		fmt.Println("| stack (thread; user; kernel leaf) | share | truth | --budget | error |")
		fmt.Println("|---|---:|---:|---:|---:|")
		worst := 0.0
		for _, k := range keys {
			e := (float64(est[k]) - float64(truth[k])) / float64(truth[k])
			worst = max(worst, math.Abs(e))
			fmt.Printf("| %s | %.1f%% | %v | %v | %+.2f%% |\n", shortStack(k), 100*float64(truth[k])/float64(total),
				time.Duration(truth[k]).Round(time.Microsecond), time.Duration(est[k]).Round(time.Microsecond), 100*e)
		}
		napsTruth, napsEst := napCount(ps[0]), napCount(ps[1])
		fmt.Printf("\nstacks with 1%% or more: %d, worst error %.2f%%; 2 ms naps with their stack: %d (truth %d, slept %d)\n", len(keys), 100*worst, napsEst, napsTruth, naps)

		_, alone, wall := run(Options{Budget: share})
		a := alone[0].Budget
		fmt.Printf("--budget %d%% alone: %.0f switches/s, the programs used %.2f%% of a CPU, threshold %v to %v\n",
			pct, float64(a.Below)/wall.Seconds(), 100*a.Cost, a.ThresholdMin, a.ThresholdMax)
		pace = 50000 // two switches a round
		_, paced, wall := run(Options{Budget: share})
		p := paced[0].Budget
		fmt.Printf("--budget %d%% alone, paced at 50,000 rounds/s: %.0f switches/s, the programs used %.2f%% of a CPU, threshold %v to %v\n",
			pct, float64(p.Below)/wall.Seconds(), 100*p.Cost, p.ThresholdMin, p.ThresholdMax)
		// A fifth of the rate: the programs' cost per switch before any
		// walk (two runs per switch and one per wake-up) against 1%.
		pace = 10000
		_, slow, wall := run(Options{Budget: share})
		sl := slow[0].Budget
		fmt.Printf("--budget %d%% alone, paced at 10,000 rounds/s: %.0f switches/s, the programs used %.2f%% of a CPU, threshold %v to %v\n",
			pct, float64(sl.Below)/wall.Seconds(), 100*sl.Cost, sl.ThresholdMin, sl.ThresholdMax)
		b.ReportMetric(100*sl.Cost, "cpu-%-paced-slow")
		pace = 50000
		// Without the wake-up program: what is left is the two per-switch
		// programs and the walks.
		_, pacedNW, wall := run(Options{Budget: share, NoWakeups: true})
		pace = 0
		nw := pacedNW[0].Budget
		fmt.Printf("--budget %d%% --no-wakeups, paced the same: %.0f switches/s, the programs used %.2f%% of a CPU, threshold %v to %v\n",
			pct, float64(nw.Below)/wall.Seconds(), 100*nw.Cost, nw.ThresholdMin, nw.ThresholdMax)
		b.ReportMetric(100*nw.Cost, "cpu-%-paced-no-wakeups")
		b.ReportMetric(100*worst, "worst-%")
		b.ReportMetric(100*a.Cost, "cpu-%")
		b.ReportMetric(100*p.Cost, "cpu-%-paced")
	}
}

func switchRuns(st Stats) uint64 {
	for _, p := range st.Programs {
		if p.Name == "offcpu_switch" {
			return p.Runs
		}
	}
	return 0
}

// stackTimes: off-CPU time by folded stack, intervals inside the window.
func stackTimes(p *profile.Profile) map[string]int64 {
	m := map[string]int64{}
	for _, s := range p.Sample {
		if offCPUInWindow(s) {
			m[schema.FoldedSample(s)] += s.Value[0]
		}
	}
	return m
}

func napCount(p *profile.Profile) int64 {
	var n int64
	for _, s := range p.Sample {
		if offCPUInWindow(s) && stackHas(s, "long_naps") && s.Value[0] >= s.Value[1]*int64(time.Millisecond) {
			n += s.Value[1]
		}
	}
	return n
}

// shortStack keeps a folded stack's thread, user leaf and kernel leaf.
func shortStack(folded string) string {
	st := schema.FoldedStack(folded)
	var user, kernel string
	for _, f := range st.Frames {
		if f.Kernel {
			if f.Name != "schedule" && f.Name != "__schedule" {
				kernel = f.Name
			}
		} else {
			user = f.Name
		}
	}
	return fmt.Sprintf("%s; %s; %s", st.Thread, user, kernel)
}
