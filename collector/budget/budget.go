// Package budget keeps deferred walks to a share of a CPU: every interval
// is measured, its stacks walked at its switch-in once its length is
// known, and a controller moves the walk threshold so that the recorder's
// programs cost about the share asked for (by the kernel's bpf_stats).
package budget

import (
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/internal/loop"
)

// Deferred walks: every interval is measured, and its stacks are walked
// at its switch-in once its length is known. An interval of at least the
// threshold is always walked; a shorter one with probability length /
// threshold, its values weighted by threshold / length (a Horvitz-Thompson
// estimate, unbiased for the time of each stack). The exact time of the
// short intervals is kept per thread and state, and user space scales
// each thread's sampled keys to it (calibrate), so every thread's time
// adds up exactly and only its split between stacks is estimated.
const (
	// MaxWalkThreshold bounds the threshold: every wait at least this long
	// is walked whatever the budget (the variance counter also needs it).
	MaxWalkThreshold = time.Millisecond
	// minWalkThreshold: below it the budget walks nearly everything.
	minWalkThreshold = 2 * time.Microsecond
	// startWalkThreshold: where --budget starts before its first measure.
	startWalkThreshold = 100 * time.Microsecond
	period             = 500 * time.Millisecond
)

// Stats describes deferred walks.
type Stats struct {
	Budget    float64       `json:"budget"`       // share of a CPU asked for; 0: fixed threshold
	Threshold time.Duration `json:"threshold_ns"` // at the end
	// ThresholdMin and ThresholdMax: its range while recording.
	ThresholdMin time.Duration `json:"threshold_min_ns"`
	ThresholdMax time.Duration `json:"threshold_max_ns"`
	// Cost: the recorder's programs' share of a CPU while recording, by
	// the kernel's bpf_stats (with --budget).
	Cost float64 `json:"cost"`
	// Below: intervals shorter than the threshold, their exact time, and
	// how many were walked.
	Below     uint64        `json:"below"`
	BelowTime time.Duration `json:"below_ns"`
	Walked    uint64        `json:"walked"`
	// StdDev of the estimate of the below-threshold time of all stacks
	// together (before calibration): sqrt(sum length*(threshold-length)).
	StdDev time.Duration `json:"stddev_ns"`
	// Missed: intervals chosen whose walk never ran (kept without stacks).
	Missed uint64 `json:"missed"`
	// WakersSkipped: wake-ups whose waker stacks were not walked.
	WakersSkipped uint64  `json:"wakers_skipped"`
	variance      float64 // StdDev², for the change between cuts
}

// Since is b's change from prev (running counters; nil: from the start).
func (b *Stats) Since(prev *Stats) *Stats {
	if b == nil || prev == nil {
		return b
	}
	d := *b
	d.Below -= min(prev.Below, b.Below)
	d.BelowTime -= min(prev.BelowTime, b.BelowTime)
	d.Walked -= min(prev.Walked, b.Walked)
	d.Missed -= min(prev.Missed, b.Missed)
	d.WakersSkipped -= min(prev.WakersSkipped, b.WakersSkipped)
	d.variance = max(b.variance-prev.variance, 0)
	d.StdDev = time.Duration(math.Sqrt(d.variance))
	return &d
}

// Comment describes the estimate in a profile's comments.
func (b *Stats) Comment() string {
	return fmt.Sprintf("walk_threshold=%v (%v to %v) below=%d below_time=%v walked=%d stddev=%v missed=%d wakers_skipped=%d: the off-CPU values of intervals below the threshold are estimates (drawn with probability length/threshold, weighted), scaled to each thread's exact total",
		b.Threshold, b.ThresholdMin, b.ThresholdMax, b.Below, b.BelowTime, b.Walked, b.StdDev, b.Missed, b.WakersSkipped)
}

// StackError is a bound on the relative error (2σ) of the estimated time
// of a stack holding share of total off-CPU time: its below-threshold
// time U has σ <= sqrt(threshold * U), U <= share * total.
func (b *Stats) StackError(share float64, total time.Duration) float64 {
	u := share * total.Seconds()
	if u <= 0 {
		return math.Inf(1)
	}
	return 2 * math.Sqrt(b.ThresholdMax.Seconds()*u) / u
}

// Controller adapts the walk threshold so that the recorder's programs use
// about the asked share of a CPU.
type Controller struct {
	mu       sync.Mutex
	share    float64
	thr      time.Duration
	min, max time.Duration
	progs    []*ebpf.Program // the programs that run per switch or wake-up
	walkers  []*ebpf.Program // of them, those whose cost the threshold moves
	set      func(time.Duration) error
	last     time.Time
	rt, wrt  time.Duration
	first    time.Time
	firstRT  time.Duration
	final    float64   // cost over the whole recording, set when it stops
	statsOn  io.Closer // bpf_stats, on while the controller runs
	stopRun  chan struct{}
	ran      chan struct{} // closed when run returns
}

// Stop stops the controller and keeps its cost figure.
func (b *Controller) Stop() {
	if b == nil {
		return
	}
	if b.stopRun != nil {
		close(b.stopRun)
		<-b.ran
		b.stopRun = nil
	}
	if b.statsOn != nil {
		b.mu.Lock()
		b.final = b.cost(time.Now())
		b.mu.Unlock()
		b.statsOn.Close()
		b.statsOn = nil
	}
}

func (b *Controller) runtimes() (all, walk time.Duration) {
	for _, p := range b.progs {
		if st, err := p.Stats(); err == nil {
			all += st.Runtime
		}
	}
	for _, p := range b.walkers {
		if st, err := p.Stats(); err == nil {
			walk += st.Runtime
		}
	}
	return
}

// nextThreshold is the controller's step: from the threshold thr, the
// cost of everything (cost) and of the walks (walk) over the last period,
// as shares of a CPU, the threshold for the next period. The walks' cost
// falls about as 1/threshold; what is not walks stays whatever it is.
func nextThreshold(thr time.Duration, share, cost, walk float64) time.Duration {
	room := share - (cost - walk)
	var f float64
	switch {
	case room <= 0:
		f = 4 // the base cost alone is over: walk as little as allowed
	case walk <= 0:
		f = 0.5
	default:
		f = min(max(walk/room, 0.5), 4)
	}
	next := time.Duration(float64(thr) * f)
	return min(max(next, minWalkThreshold), MaxWalkThreshold)
}

func (b *Controller) step(now time.Time) {
	all, walk := b.runtimes()
	b.mu.Lock()
	defer b.mu.Unlock()
	wall := now.Sub(b.last).Seconds()
	if wall <= 0 {
		return
	}
	cost, wcost := (all-b.rt).Seconds()/wall, (walk-b.wrt).Seconds()/wall
	b.last, b.rt, b.wrt = now, all, walk
	next := nextThreshold(b.thr, b.share, cost, wcost)
	if next != b.thr && b.set(next) == nil {
		b.thr = next
		b.min, b.max = min(b.min, next), max(b.max, next)
	}
}

func (b *Controller) run(stop <-chan struct{}) {
	loop.SleepLoop(period, nil, stop, func(now time.Time) time.Duration {
		b.step(now)
		return period
	})
}

// cost is the programs' share of a CPU since the start.
func (b *Controller) cost(now time.Time) float64 {
	all, _ := b.runtimes()
	if w := now.Sub(b.first).Seconds(); w > 0 {
		return (all - b.firstRT).Seconds() / w
	}
	return 0
}

// New sets the first threshold (0: where the controller starts) and,
// with a share of a CPU to keep to, starts the controller (bpf_stats on
// while it runs).
func New(coll *ebpf.Collection, thr time.Duration, share float64) (*Controller, error) {
	if thr == 0 {
		thr = startWalkThreshold
	}
	v, ok := coll.Variables[bpf.OffcpuVarWalkThresholdNs]
	if !ok {
		return nil, fmt.Errorf("BPF object has no walk threshold")
	}
	set := func(d time.Duration) error { return v.Set(uint64(d)) }
	if err := set(thr); err != nil {
		return nil, fmt.Errorf("setting the walk threshold: %w", err)
	}
	b := &Controller{share: share, thr: thr, min: thr, max: thr, set: set}
	if share == 0 {
		return b, nil
	}
	closer, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		return nil, fmt.Errorf("--budget measures the recorder's cost with kernel.bpf_stats_enabled: %w", err)
	}
	b.statsOn = closer
	for _, name := range []string{bpf.OffcpuProgOffcpuSwitch, bpf.OffcpuProgOffcpuSwitchedIn, bpf.OffcpuProgOffcpuWaking} {
		if p := coll.Programs[name]; p != nil {
			b.progs = append(b.progs, p)
			if name == bpf.OffcpuProgOffcpuSwitchedIn || name == bpf.OffcpuProgOffcpuWaking {
				b.walkers = append(b.walkers, p)
			}
		}
	}
	b.first = time.Now()
	b.last = b.first
	b.rt, b.wrt = b.runtimes()
	b.firstRT = b.rt
	b.stopRun, b.ran = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(b.ran)
		b.run(b.stopRun)
	}()
	return b, nil
}

// Stats are the figures, from the kernel's counters and the
// controller.
func (b *Controller) Stats(get func(bpf.OffcpuOffcpuStat) uint64) *Stats {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	out := &Stats{Budget: b.share, Threshold: b.thr, ThresholdMin: b.min, ThresholdMax: b.max, Cost: b.final}
	b.mu.Unlock()
	if b.share > 0 && b.statsOn != nil {
		out.Cost = b.cost(time.Now())
	}
	out.Below = get(bpf.OffcpuOffcpuStatSTAT_BELOW_N)
	out.BelowTime = time.Duration(min(get(bpf.OffcpuOffcpuStatSTAT_BELOW_NS), math.MaxInt64))
	out.Walked = get(bpf.OffcpuOffcpuStatSTAT_BELOW_WALKED)
	out.variance = float64(get(bpf.OffcpuOffcpuStatSTAT_BELOW_VAR)) * 1024
	out.StdDev = time.Duration(math.Sqrt(out.variance))
	out.Missed = get(bpf.OffcpuOffcpuStatSTAT_WALK_MISSED)
	out.WakersSkipped = get(bpf.OffcpuOffcpuStatSTAT_WAKER_SKIPPED)
	return out
}
