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
	"unsafe"

	"github.com/offcpu/offcpu/bpf"
)

// The wait stream's cost, side by side in one run: the C ping-pong of
// BenchmarkRecorderOverhead (two threads bouncing a byte over pipes,
// pinned to CPU 0) recorded with every interval walked and with the
// continuous mode's 100µs walk threshold, each with the stream off and
// on (Options.Stream; a flight recorder's StreamKeep). Reports, per
// switch, the BPF time of the programs that run per switch or wake-up
// (bpf_stats) and the ping-pong's wall time, medians of REPEATS
// interleaved; and the stream's bytes per wait. OFFCPU_STREAM_BENCH=
// "ROUNDS REPEATS" (default "200000 5"). As root:
//
//	go test -run XXX -bench StreamOverhead -benchtime 1x ./collector
func BenchmarkStreamOverhead(b *testing.B) {
	requireBPF(b)
	rounds, repeats := 200000, 5
	benchEnv(b, "OFFCPU_STREAM_BENCH", "ROUNDS REPEATS", &rounds, &repeats)
	bin := filepath.Join(b.TempDir(), "pingpong")
	runBuild(b, "gcc", "-O2", "-pthread", "-o", bin, "testdata/pingpong/pingpong.c")
	defer enableBPFStats(b).Close()
	type variant struct {
		label      string
		o          Options
		wall, cost []time.Duration
		waits      uint64
	}
	vs := []*variant{
		{label: "every interval walked, stream off", o: Options{}},
		{label: "every interval walked, stream on (--timeline)", o: Options{Stream: true}},
		{label: "--walk-threshold 100µs (--continuous), stream off", o: Options{WalkThreshold: DefaultContinuousWalkThreshold, Continuous: true}},
		{label: "--walk-threshold 100µs (--continuous), flight recorder 10s", o: Options{WalkThreshold: DefaultContinuousWalkThreshold, Continuous: true, Stream: true, StreamKeep: 10 * time.Second}},
	}
	for b.Loop() {
		for range repeats {
			for _, v := range vs {
				wall, cost, st := streamRun(b, bin, rounds, v.o)
				v.wall, v.cost = append(v.wall, wall), append(v.cost, cost)
				v.waits = max(v.waits, st.StreamWaits)
			}
		}
	}
	median := func(d []time.Duration) time.Duration {
		d = slices.Clone(d)
		slices.Sort(d)
		return d[len(d)/2]
	}
	fmt.Printf("\n%d round trips pinned to CPU 0, %d runs of each, interleaved; medians\n\n| recorder | wall | BPF ns per switch |\n|---|---:|---:|\n", rounds, repeats)
	for _, v := range vs {
		fmt.Printf("| %s | %.1f ms | %d |\n", v.label, float64(median(v.wall))/1e6, median(v.cost).Nanoseconds())
	}
	on, off := median(vs[1].cost), median(vs[0].cost)
	fmt.Printf("\nthe stream: +%d ns per switch walked whole (%.1f%%), +%d ns at 100µs; %d bytes a wait in the ring and in memory\n",
		(on - off).Nanoseconds(), 100*float64(on-off)/float64(off), (median(vs[3].cost) - median(vs[2].cost)).Nanoseconds(), unsafe.Sizeof(bpf.OffcpuWaitEvent{}))
	b.ReportMetric(float64((on - off).Nanoseconds()), "stream-ns/switch")
}

// streamRun records the ping-pong under o: its wall time, the recorder's
// BPF time per switch and the session's stats.
func streamRun(b *testing.B, bin string, rounds int, o Options) (time.Duration, time.Duration, Stats) {
	o.Stats = true
	s, err := Start(context.Background(), o)
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	out, err := exec.Command("taskset", "-c", "0", bin, strconv.Itoa(rounds)).Output()
	if err != nil {
		b.Fatalf("pingpong: %v", err)
	}
	ns, _ := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	if o.Continuous {
		if _, err := s.Snapshot(); err != nil {
			b.Fatal(err)
		}
	}
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
		case "offcpu_waking", "offcpu_switched_in":
			rt += p.Runtime
		}
	}
	return time.Duration(ns), rt / time.Duration(max(switches, 1)), s.Stats()
}
