package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
