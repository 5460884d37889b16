package collector

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/schema"
)

func buildLate(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "late")
	runBuild(t, "gcc", "-O2", "-pthread", "-o", bin, "testdata/late/late.c")
	return bin
}

// lateThread is one line of late.c's output: its own off-CPU time and
// the kernel's count of its context switches.
type lateThread struct {
	name     string
	tid      int64
	off      time.Duration
	switches int64
}

func parseLate(t *testing.T, out string) []lateThread {
	t.Helper()
	var res []lateThread
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		var n [4]int64
		for i := range n {
			var err error
			if len(f) != 5 {
				err = fmt.Errorf("%d fields", len(f))
			} else {
				n[i], err = strconv.ParseInt(f[i+1], 10, 64)
			}
			if err != nil {
				t.Fatalf("late: unexpected line %q: %v", sc.Text(), err)
			}
		}
		res = append(res, lateThread{f[0], n[0], time.Duration(n[1]), n[2] + n[3]})
	}
	if len(res) != 2 {
		t.Fatalf("late printed %d threads, want 2: %q", len(res), out)
	}
	return res
}

// perThread is each thread's off-CPU time and intervals, all states and
// stacks.
func perThread(p *profile.Profile) (map[int64]time.Duration, map[int64]int64) {
	sum, n := map[int64]time.Duration{}, map[int64]int64{}
	for _, t := range schema.ThreadTotals(p) {
		sum[t.TID], n[t.TID] = t.OffCPU, t.Switches
	}
	return sum, n
}

// Threads created during a recording are off-CPU only from their first
// run: their totals match their own clocks, and none of their time is
// "blocked since before the start" (it once was, from the window's start).
func TestThreadsCreatedDuringRecording(t *testing.T) {
	requireBPF(t)
	bin := buildLate(t)
	for _, mode := range []struct {
		name  string
		opts  Options
		byPID bool
	}{
		{"tp_btf/command", Options{}, false},
		{"tp_btf/pid", Options{}, true},
		{"tracepoint/command", Options{ForceTracepoint: true}, false},
		{"tracepoint/pid", Options{ForceTracepoint: true}, true},
	} {
		t.Run(mode.name, func(t *testing.T) {
			var out bytes.Buffer
			var p *profile.Profile
			var s *Session
			if mode.byPID {
				cmd := exec.Command(bin, "-")
				cmd.Stdout = &out
				in, err := cmd.StdinPipe()
				if err != nil {
					t.Fatal(err)
				}
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				opts := mode.opts
				opts.PIDs = []int{cmd.Process.Pid}
				if s, err = Start(context.Background(), opts); err != nil {
					cmd.Process.Kill()
					cmd.Wait()
					t.Fatalf("Start: %v", err)
				}
				time.Sleep(300 * time.Millisecond) // as long as the command's delay
				io.WriteString(in, "go\n")
				if err := cmd.Wait(); err != nil {
					s.Stop()
					t.Fatal(err)
				}
				if p, err = s.Stop(); err != nil {
					t.Fatal(err)
				}
			} else {
				cmd := exec.Command(bin, "300")
				cmd.Stdout = &out
				p, s = recordCommand(t, mode.opts, cmd)
			}
			sum, count := perThread(p)
			for _, th := range parseLate(t, out.String()) {
				// The kernel counted its switches before the thread's last ones.
				if count[th.tid] < th.switches {
					t.Errorf("%s: %d intervals recorded, the kernel counted %d context switches", th.name, count[th.tid], th.switches)
				}
				got := sum[th.tid]
				if d := got - th.off; d < -th.off/100 || d > th.off/100 {
					t.Errorf("%s: recorded %v off-CPU, its own clock says %v (want within 1%%); stats %+v", th.name, got, th.off, s.Stats())
					for _, smp := range p.Sample {
						if smp.NumLabel[schema.LabelTID][0] == th.tid {
							t.Logf("  %v ×%d %v %s", time.Duration(smp.Value[0]), smp.Value[1], smp.Label, schema.FoldedSample(smp))
						}
					}
				} else {
					t.Logf("%s: recorded %v, its own clock %v", th.name, got, th.off)
				}
				for _, smp := range p.Sample {
					if smp.NumLabel[schema.LabelTID][0] == th.tid && len(smp.Label[schema.LabelInterval]) > 0 {
						t.Errorf("%s: %v labelled interval=%s: %s", th.name, time.Duration(smp.Value[0]), smp.Label[schema.LabelInterval][0], schema.FoldedSample(smp))
					}
				}
			}
			if st := s.Stats(); !mode.byPID && st.NoStart != 0 {
				t.Errorf("before_start=%d for a command whose threads all started during the recording", st.NoStart)
			}
		})
	}
}
