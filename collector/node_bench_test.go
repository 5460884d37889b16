package collector

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The recorder's BPF time per switch of a Node program's threads (the
// main thread and a worker bouncing a turn through Atomics.wait, their
// stacks holding JavaScript frames, each read) against a C program's
// (two threads bouncing a byte over pipes), in one recording, the two
// alternated; both pinned to CPU 0, the default recording (every
// interval walked, wake-ups). OFFCPU_NODE_COST="ROUNDS REPEATS"
// (default "100000 5"). As root, on a quiet machine:
//
//	go test -run XXX -bench NodeSwitchCost -benchtime 1x ./collector
func BenchmarkNodeSwitchCost(b *testing.B) {
	requireBPF(b)
	node := requireServer(b, "node", "nodejs")
	rounds, repeats := 100000, 5
	benchEnv(b, "OFFCPU_NODE_COST", "ROUNDS REPEATS", &rounds, &repeats)
	bin := filepath.Join(b.TempDir(), "pingpong")
	runBuild(b, "gcc", "-O2", "-pthread", "-o", bin, "testdata/pingpong/pingpong.c")
	s, err := Start(context.Background(), Options{Stats: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	time.Sleep(time.Second)
	// cost runs a ping-pong and returns the BPF time of the programs that
	// run per switch and wake-up over the switches made meanwhile.
	cost := func(args ...string) time.Duration {
		before := map[string]ProgramStat{}
		for _, p := range s.p.programStats() {
			before[p.Name] = p
		}
		out, err := exec.Command("taskset", append([]string{"-c", "0"}, args...)...).Output()
		if err != nil {
			b.Fatalf("%s: %v", strings.Join(args, " "), err)
		}
		if _, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err != nil {
			b.Fatalf("%s printed %q", strings.Join(args, " "), out)
		}
		var rt time.Duration
		var switches uint64
		for _, p := range s.p.programStats() {
			switch p.Name {
			case "offcpu_switch", "offcpu_switch_tp":
				switches += p.Runs - before[p.Name].Runs
				rt += p.Runtime - before[p.Name].Runtime
			case "offcpu_waking", "offcpu_waking_tp", "offcpu_switched_in":
				rt += p.Runtime - before[p.Name].Runtime
			}
		}
		return rt / time.Duration(max(switches, 1))
	}
	var native, js []time.Duration
	for b.Loop() {
		for range repeats {
			native = append(native, cost(bin, strconv.Itoa(rounds)))
			js = append(js, cost(node, "testdata/node/pingpong.js", strconv.Itoa(rounds)))
		}
	}
	median := func(d []time.Duration) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		return d[len(d)/2]
	}
	fmt.Printf("\nper switch (median of %d, %d round trips each): C threads %d ns, Node threads %d ns (%.2fx); all: C %v, Node %v\n",
		len(native), rounds, median(native).Nanoseconds(), median(js).Nanoseconds(), float64(median(js))/float64(median(native)), native, js)
	b.ReportMetric(float64(median(native).Nanoseconds()), "ns/switch-c")
	b.ReportMetric(float64(median(js).Nanoseconds()), "ns/switch-node")
}
