package collector

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/schema"
)

// startPair starts a one-shot recording, for the intervals to add up to,
// and then the continuous one; the one-shot one is stopped at the end.
func startPair(t *testing.T, cont Options) (whole, s *Session) {
	whole, err := Start(context.Background(), Options{})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { whole.Stop() })
	s, err = Start(context.Background(), cont)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	return whole, s
}

// stopPair stops both recordings once the last exits' events are in, and
// returns the intervals with the last one and the one-shot profile.
func stopPair(t *testing.T, whole, s *Session, ivs []*Interval) ([]*Interval, *profile.Profile) {
	time.Sleep(100 * time.Millisecond)
	if _, err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	wp, err := whole.Stop()
	if err != nil {
		t.Fatal(err)
	}
	return append(ivs, s.FinalInterval()), wp
}

// A continuous recording of process churn, system-wide, cut every second:
// the intervals add up to what the processes' own clocks measured, their
// frames are named although each cut forgets the processes that exited,
// and what the session keeps follows what is alive, not what was seen.
func TestContinuousChurn(t *testing.T) {
	requireBPF(t)
	dir, churn, nap := buildChurn(t)

	whole, s := startPair(t, Options{Continuous: true})
	if _, err := s.Snapshot(); err != nil { // the machine's own, before the churn
		s.Stop()
		t.Fatal(err)
	}
	const rate, secs, napUs = 500, 8, 1000
	napLog := filepath.Join(dir, "naps")
	launcher := exec.Command(churn, fmt.Sprint(rate), fmt.Sprint(secs), nap, fmt.Sprint(napUs))
	launcher.Env = append(os.Environ(), "NAP_LOG="+napLog)
	done := make(chan error, 1)
	var out []byte
	go func() { var err error; out, err = launcher.Output(); done <- err }()

	var ivs []*Interval
	var maxKeys, maxProcs, maxSpill int
	var longest time.Duration
	tick := time.NewTicker(time.Second)
	for waiting := true; waiting; {
		select {
		case err := <-done:
			if err != nil {
				s.Stop()
				t.Fatalf("churn: %v", err)
			}
			waiting = false
		case <-tick.C:
			iv, err := s.Snapshot()
			if err != nil {
				s.Stop()
				t.Fatal(err)
			}
			ivs = append(ivs, iv)
			maxKeys = max(maxKeys, len(s.cont.recs)+len(s.cont.aggUses))
			maxProcs = max(maxProcs, s.procs.Len())
			s.spill.mu.Lock()
			maxSpill = max(maxSpill, len(s.spill.stacks))
			s.spill.mu.Unlock()
			longest = max(longest, iv.Duration)
		}
	}
	tick.Stop()
	ivs, wp := stopPair(t, whole, s, ivs)
	var wholeSlept, wholeTotal int64
	for _, smp := range wp.Sample {
		if smp.Label[schema.LabelThread][0] != "nap" {
			continue
		}
		wholeTotal += smp.Value[0]
		if stackHas(smp, "nap_here") || stackHas(smp, "clock_nanosleep") {
			wholeSlept += smp.Value[0]
		}
	}
	var started, ok int
	if _, err := fmt.Sscan(string(out), &started, &ok); err != nil || ok != started || started < rate*secs*9/10 {
		t.Fatalf("churn printed %q: want about %d processes, all exiting with 0", out, rate*secs)
	}
	var slept, named, total int64
	var missing uint64
	for _, iv := range ivs {
		missing += iv.Stats.StacksMissing
		for _, smp := range iv.Profile.Sample {
			if smp.Label[schema.LabelThread][0] != "nap" {
				continue
			}
			total += smp.Value[0]
			if namedUserFrame(smp) {
				named += smp.Value[0]
			}
			if stackHas(smp, "nap_here") || stackHas(smp, "clock_nanosleep") {
				slept += smp.Value[0]
			}
		}
	}
	var truth time.Duration
	raw, err := os.ReadFile(napLog)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Fields(string(raw)) {
		ns, _ := strconv.ParseInt(l, 10, 64)
		truth += time.Duration(ns)
	}
	// The threads' whole off-CPU time tells a wait lost from a wait
	// whose stack differs, should the nanosleep time differ.
	t.Logf("%d processes, %d intervals: %v in nanosleep recorded (one-shot recording: %v), %v by their own clocks; %v off-CPU in all (one-shot: %v); %.1f%% named; at most %d keys, %d processes, %d stacks in memory; %d stacks missing",
		started, len(ivs), time.Duration(slept), time.Duration(wholeSlept), truth, time.Duration(total), time.Duration(wholeTotal),
		100*float64(named)/float64(max(total, 1)), maxKeys, maxProcs, maxSpill, missing)
	// The intervals add up to the one-shot recording of the same switches;
	// both are within the processes' own clocks (which also count the
	// syscall's way in and out) as TestProcessChurn checks.
	if diff := slept - wholeSlept; diff < -wholeSlept/100 || diff > wholeSlept/100 {
		t.Errorf("%v recorded in the processes' nanosleeps over the intervals, %v in one recording of the same window: want within 1%%", time.Duration(slept), time.Duration(wholeSlept))
		logOutsideSleep(t, wp, ivs)
	}
	if diff := time.Duration(slept) - truth; diff < -truth/10 || diff > truth/10 {
		t.Errorf("%v recorded in the processes' nanosleeps over the intervals, their own clocks say %v: want within 10%%", time.Duration(slept), truth)
	}
	if total == 0 || float64(named) < 0.95*float64(total) {
		t.Errorf("%v of the short-lived processes' %v off-CPU time has a named user frame, want >= 95%%", time.Duration(named), time.Duration(total))
	}
	if missing > 0 {
		t.Errorf("%d stack ids were evicted while still used", missing)
	}
	// What exited within an interval is kept at most (500 a second here,
	// longer between cuts under the race detector), and the machine's own:
	// far fewer than the processes seen.
	if maxProcs > int(1.5*rate*longest.Seconds())+500 || maxKeys > 8*rate+20000 {
		t.Errorf("after %d processes: at most %d processes and %d keys kept between cuts: want what one interval saw", started, maxProcs, maxKeys)
	}
	for _, iv := range ivs {
		if iv.Stats.Lost() > 0 {
			t.Errorf("interval %d: %d lost (%+v)", iv.Seq, iv.Stats.Lost(), iv.Stats)
		}
	}
}

// With an aggregation map too small for one interval of process churn,
// the agent moves the map to memory between cuts: the intervals still add
// up to a one-shot recording of the same window, and nothing is lost.
func TestContinuousFold(t *testing.T) {
	requireBPF(t)
	_, churn, nap := buildChurn(t)
	const entries = 4096
	whole, s := startPair(t, Options{Continuous: true, AggEntries: entries})
	defer s.Stop()
	launcher := exec.Command(churn, "500", "6", nap, "500")
	done := make(chan error, 1)
	go func() { done <- launcher.Run() }()
	var ivs []*Interval
	tick := time.NewTicker(3 * time.Second)
	for waiting := true; waiting; {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("churn: %v", err)
			}
			waiting = false
		case <-tick.C:
			iv, err := s.Snapshot()
			if err != nil {
				t.Fatal(err)
			}
			ivs = append(ivs, iv)
		}
	}
	tick.Stop()
	ivs, wp := stopPair(t, whole, s, ivs)
	napTime := func(p *profile.Profile) (sum int64) {
		for _, smp := range p.Sample {
			if smp.Label[schema.LabelThread][0] == "nap" {
				sum += smp.Value[0]
			}
		}
		return sum
	}
	// Time under threads named by their tid alone tells names lost (with
	// their exit events) from time lost, should the sums differ.
	unnamed := func(p *profile.Profile) (sum int64) {
		for _, smp := range p.Sample {
			if strings.HasPrefix(smp.Label[schema.LabelThread][0], "tid-") {
				sum += smp.Value[0]
			}
		}
		return sum
	}
	var slept, moved, keys, noName int64
	var lost uint64
	for _, iv := range ivs {
		slept += napTime(iv.Profile)
		noName += unnamed(iv.Profile)
		lost += iv.Stats.Lost()
		moved += int64(iv.Stats.AggMoved)
		keys = max(keys, int64(iv.Stats.Keys))
		if iv.Stats.AggFull > 0 {
			t.Errorf("interval %d: %d of %d intervals dropped for a full map", iv.Seq, iv.Stats.AggFull, iv.Stats.Intervals)
		}
	}
	wholeSlept := napTime(wp)
	t.Logf("%d intervals: %v off-CPU in the short-lived processes (one-shot: %v); %d entries moved to memory, at most %d keys in the map at a cut (of %d); %v under unnamed threads (one-shot: %v), %d lost",
		len(ivs), time.Duration(slept), time.Duration(wholeSlept), moved, keys, entries, time.Duration(noName), time.Duration(unnamed(wp)), lost)
	if moved == 0 {
		t.Errorf("no entry moved: the churn did not fill half the map between cuts")
	}
	// The maps are swapped, never deleted from under the programs: the
	// two recordings differ only by the intervals ending at the edges of
	// the window (microseconds; deleting under the programs lost 0.6-2.5%).
	if diff := slept - wholeSlept; wholeSlept == 0 || diff < -wholeSlept/1000 || diff > wholeSlept/1000 {
		t.Errorf("%v over the intervals, %v in one recording of the same window: want within 0.1%%", time.Duration(slept), time.Duration(wholeSlept))
	}
}

// logOutsideSleep logs where the short-lived processes' time without the
// sleep's frames went in each recording, by state and leaf user frame.
func logOutsideSleep(t *testing.T, whole *profile.Profile, ivs []*Interval) {
	by := func(ps ...*profile.Profile) map[string]int64 {
		m := map[string]int64{}
		for _, p := range ps {
			for _, smp := range p.Sample {
				if smp.Label[schema.LabelThread][0] != "nap" || stackHas(smp, "nap_here") || stackHas(smp, "clock_nanosleep") {
					continue
				}
				leaf := "[no user frame]"
				for _, l := range smp.Location {
					if l.Mapping != nil && l.Mapping.File != schema.KernelMapping && len(l.Line) > 0 {
						leaf = l.Line[0].Function.Name
						break
					}
				}
				m[fmt.Sprint(smp.Label[schema.LabelState], " ", leaf)] += smp.Value[0]
			}
		}
		return m
	}
	var parts []*profile.Profile
	for _, iv := range ivs {
		parts = append(parts, iv.Profile)
	}
	w, c := by(whole), by(parts...)
	for k := range c {
		w[k] += 0
	}
	for k, v := range w {
		if d := c[k] - v; d > v/100+int64(time.Millisecond) || -d > v/100+int64(time.Millisecond) {
			t.Logf("outside the sleep, %s: %v over the intervals, %v in one recording", k, time.Duration(c[k]), time.Duration(v))
		}
	}
	// By thread name: names lost move time from nap to tid-N or the
	// launcher's name.
	byName := func(ps ...*profile.Profile) map[string]int64 {
		m := map[string]int64{}
		for _, p := range ps {
			for _, smp := range p.Sample {
				name := smp.Label[schema.LabelThread][0]
				if strings.HasPrefix(name, "tid-") {
					name = "tid-N"
				}
				m[name] += smp.Value[0]
			}
		}
		return m
	}
	wn, cn := byName(whole), byName(parts...)
	for k := range cn {
		wn[k] += 0
	}
	for k, v := range wn {
		if d := cn[k] - v; d > v/100+int64(10*time.Millisecond) || -d > v/100+int64(10*time.Millisecond) {
			t.Logf("thread %s: %v over the intervals, %v in one recording", k, time.Duration(cn[k]), time.Duration(v))
		}
	}
}
