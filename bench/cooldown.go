package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/procfs"
)

// cooled is what a cool-down did before one run.
type cooled struct {
	Method string        `json:"method"` // "thermal", "idle" or "none"
	Waited time.Duration `json:"waited_ns"`
	GaveUp bool          `json:"gave_up,omitempty"`
	Level  float64       `json:"level"` // °C or % busy when it stopped waiting
}

// cooldown waits before a run until the machine is cool or idle, or
// until --cooldown-max.
func cooldown(ctx context.Context, cfg *Config) cooled {
	start := time.Now()
	deadline := start.Add(cfg.CooldownMax)
	zones, _ := filepath.Glob("/sys/class/thermal/thermal_zone*/temp")
	if len(zones) > 0 && cfg.CooldownTemp > 0 {
		for {
			t := hottest(zones)
			late := time.Now().After(deadline)
			if t < cfg.CooldownTemp || late || sleepCtx(ctx, time.Second) != nil {
				return cooled{Method: "thermal", Waited: time.Since(start), GaveUp: late && t >= cfg.CooldownTemp, Level: t}
			}
		}
	}
	if cfg.CooldownIdle <= 0 {
		return cooled{Method: "none"}
	}
	for {
		busy := cpuBusy(500 * time.Millisecond)
		late := time.Now().After(deadline)
		if busy < cfg.CooldownIdle || late || ctx.Err() != nil {
			return cooled{Method: "idle", Waited: time.Since(start), GaveUp: late && busy >= cfg.CooldownIdle, Level: busy}
		}
	}
}

// cooldownSummary says what the cool-downs did over the runs.
func cooldownSummary(cfg *Config, runs []RunRecord) string {
	if len(runs) == 0 || runs[0].Cooldown.Method == "none" || runs[0].Cooldown.Method == "" {
		return "none"
	}
	var longest time.Duration
	gaveUp := 0
	var worst float64
	for _, r := range runs {
		longest = max(longest, r.Cooldown.Waited)
		if r.Cooldown.GaveUp {
			gaveUp++
			worst = max(worst, r.Cooldown.Level)
		}
	}
	s := fmt.Sprintf("until the CPUs were below %.0f%% busy (/proc/stat; no thermal zones)", cfg.CooldownIdle)
	unit := "% busy"
	if runs[0].Cooldown.Method == "thermal" {
		s, unit = fmt.Sprintf("until the hottest thermal zone was below %.0f °C", cfg.CooldownTemp), " °C"
	}
	s += fmt.Sprintf(", at most %v before a run (longest wait %v)", cfg.CooldownMax, longest.Round(100*time.Millisecond))
	if gaveUp > 0 {
		s += fmt.Sprintf("; before %d of %d runs it gave up after %v, at up to %.0f%s", gaveUp, len(runs), cfg.CooldownMax, worst, unit)
	}
	return s
}

func hottest(zones []string) float64 {
	max := -1e9
	for _, z := range zones {
		b, err := os.ReadFile(z)
		if err != nil {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64); err == nil && v/1000 > max {
			max = v / 1000
		}
	}
	return max
}

func cpuBusy(window time.Duration) float64 {
	fs, err := procfs.NewDefaultFS()
	if err != nil {
		return 0
	}
	read := func() (busy, total float64) {
		st, err := fs.Stat()
		if err != nil {
			return 0, 0
		}
		c := st.CPUTotal
		idle := c.Idle + c.Iowait
		total = c.User + c.Nice + c.System + c.Idle + c.Iowait + c.IRQ + c.SoftIRQ + c.Steal
		return total - idle, total
	}
	b0, t0 := read()
	time.Sleep(window)
	b1, t1 := read()
	if t1 <= t0 {
		return 0
	}
	return 100 * (b1 - b0) / (t1 - t0)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
