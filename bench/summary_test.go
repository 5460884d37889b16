package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/workload"
)

// The cool-down line says what the waits did, giving up included.
func TestCooldownSummary(t *testing.T) {
	cfg := &Config{CooldownIdle: 10, CooldownMax: time.Minute}
	runs := []RunRecord{
		{Cooldown: cooled{Method: "idle", Waited: 2 * time.Second, Level: 4}},
		{Cooldown: cooled{Method: "idle", Waited: time.Minute, GaveUp: true, Level: 90}},
	}
	got := cooldownSummary(cfg, runs)
	for _, want := range []string{"below 10% busy", "longest wait 1m0s", "before 1 of 2 runs it gave up after 1m0s, at up to 90% busy"} {
		if !strings.Contains(got, want) {
			t.Errorf("cool-down line %q lacks %q", got, want)
		}
	}
	if got := cooldownSummary(cfg, runs[:1]); strings.Contains(got, "gave up") {
		t.Errorf("cool-down line %q says it gave up", got)
	}
	if got := cooldownSummary(cfg, []RunRecord{{Cooldown: cooled{Method: "none"}}}); got != "none" {
		t.Errorf("no cool-down: %q", got)
	}
}

func TestReadPIDFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "pid")
	os.WriteFile(p, []byte("123\n456\n"), 0o644)
	if pids, err := readPIDFile(p); err != nil || len(pids) != 2 || pids[1] != 456 {
		t.Errorf("pids %v, err %v", pids, err)
	}
	if _, err := os.Stat(p); err == nil {
		t.Error("pid file left for the next run")
	}
	os.WriteFile(p, []byte("abc"), 0o644)
	if _, err := readPIDFile(p); err == nil || !strings.Contains(err.Error(), "not a pid") {
		t.Errorf("bad pid file: %v", err)
	}
	if _, err := readPIDFile(p); err == nil || !strings.Contains(err.Error(), "wrote no pid file") {
		t.Errorf("missing pid file: %v", err)
	}
}

// The wake-up table keeps the story's pair when a dozen others moved more.
func TestWakeupsByPairKeepsStory(t *testing.T) {
	w, err := workload.NewBundled(workload.BundledConfig{Scenarios: []string{"publish-throttle-100p"}, Variants: []string{"baseline", "candidate"}, Rate: -1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &Config{Variants: []string{"baseline", "candidate"}, workload: w}
	b := &analysis.Report{Messages: 1000}
	c := &analysis.Report{Messages: 1000}
	b.Wakeups.ByPair = map[string]int64{"broker-rate-mon → broker-io-N": 27}
	c.Wakeups.ByPair = map[string]int64{"broker-rate-mon → broker-io-N": 33}
	for i := 0; i < 14; i++ {
		c.Wakeups.ByPair[fmt.Sprintf("g%d → h", i)] = int64(100 + i)
	}
	got := wakeupsByPair(&analysis.DiffReport{BaseReport: b, CandReport: c}, cfg)
	if !strings.Contains(got, "| broker-rate-mon → broker-io-N | 0.0270 | 0.0330 |") {
		t.Errorf("the story's pair left out:\n%s", got)
	}
	if strings.Contains(got, "| g0 → h |") || !strings.Contains(got, "| g13 → h |") {
		t.Errorf("want the 12 pairs that moved most:\n%s", got)
	}
}
