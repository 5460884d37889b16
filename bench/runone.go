package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/collector"
	"github.com/offcpu/offcpu/internal/output"
	"github.com/offcpu/offcpu/schema"
)

func runOne(ctx context.Context, cfg *Config, side string, pr plannedRun, name string) RunRecord {
	dir := filepath.Join(cfg.Out, "runs", name)
	os.RemoveAll(dir)
	rec := RunRecord{Name: name, Scenario: pr.scenario, Side: side, Index: pr.index, Profiled: pr.profiled, Dir: dir}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		rec.Failed, rec.Error = true, err.Error()
		return rec
	}
	metricsPath := filepath.Join(dir, schema.MetricsFile)
	cmd := cfg.workload.Command(pr.scenario, pr.side, metricsPath)
	logf, err := os.Create(filepath.Join(dir, schema.RunLogFile))
	if err != nil {
		rec.Failed, rec.Error = true, err.Error()
		return rec
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}

	var sess *collector.Session
	t0 := time.Now()
	if pr.profiled {
		sess, err = collector.Start(ctx, collector.Options{TargetsOnly: true, FollowForks: true, CPUHz: cfg.CPUHz, MinBlock: cfg.MinBlock, Goroutines: cfg.Goroutines})
		if err == nil {
			err = sess.StartCommand(cmd)
		}
	} else {
		err = cmd.Start()
	}
	if err != nil {
		if sess != nil {
			sess.Stop()
		}
		rec.Failed, rec.Error = true, err.Error()
		writeRunInfo(dir, rec)
		return rec
	}
	waitErr := waitRun(ctx, cmd)
	rec.WallS = time.Since(t0).Seconds()
	if sess != nil {
		if err := saveProfiles(sess, dir); err != nil {
			fmt.Fprintf(logf, "offcpu bench: %v\n", err)
			rec.Failed, rec.Error = true, err.Error()
		}
		st := sess.Stats()
		kept := st.KeptShare()
		rec.Kept = &kept
	}
	if isPIDFile(cfg.Target) {
		pids, err := readPIDFile(cfg.Target)
		if err != nil && !rec.Failed {
			rec.Failed, rec.Error = true, fmt.Sprintf("--target: %v", err)
		}
		rec.TargetPIDs = pids
	}
	readMetrics(&rec, metricsPath, cmd)
	if waitErr != nil && !rec.Failed {
		rec.Failed = true
		rec.Error = waitErr.Error()
		if last := lastLine(filepath.Join(dir, schema.RunLogFile)); last != "" {
			rec.Error += ": " + last
		}
	}
	writeRunInfo(dir, rec)
	return rec
}

// waitRun waits for a run; on cancellation it interrupts the run's
// process group, and kills it 5 s later.
func waitRun(ctx context.Context, cmd *exec.Cmd) error {
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		select {
		case err := <-done:
			return err
		case <-time.After(5 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			return <-done
		}
	}
}

// readMetrics reads what the run wrote, adds wall_s and cpu_s, and
// writes the file back.
func readMetrics(rec *RunRecord, metricsPath string, cmd *exec.Cmd) {
	m := map[string]any{}
	if b, err := os.ReadFile(metricsPath); err == nil {
		if err := json.Unmarshal(b, &m); err != nil {
			rec.Failed, rec.Error = true, fmt.Sprintf("metrics file is not a JSON object: %v", err)
		}
	}
	m[schema.MetricWall] = rec.WallS
	if ps := cmd.ProcessState; ps != nil {
		// wait4's rusage: the run and the children it waited for.
		m[schema.MetricCPU] = (ps.UserTime() + ps.SystemTime()).Seconds()
	}
	if b, err := json.MarshalIndent(m, "", "  "); err == nil {
		os.WriteFile(metricsPath, append(b, '\n'), 0o644)
	}
	rec.Metrics = map[string]float64{}
	for k, v := range m {
		if f, ok := v.(float64); ok {
			rec.Metrics[k] = f
		}
	}
}

func writeRunInfo(dir string, rec RunRecord) {
	b, _ := json.MarshalIndent(analysis.RunInfo{Profiled: rec.Profiled, Failed: rec.Failed, Error: rec.Error}, "", "  ")
	os.WriteFile(filepath.Join(dir, schema.RunInfoFile), append(b, '\n'), 0o644)
}

func saveProfiles(s *collector.Session, dir string) error {
	p, err := s.Stop()
	if err != nil {
		return err
	}
	write := func(name string, f func(io.Writer) error) error { return output.WriteFile(filepath.Join(dir, name), f) }
	if err := write(schema.ProfileFile, p.Write); err != nil {
		return err
	}
	if err := write(schema.FoldedFile, func(w io.Writer) error { return schema.WriteFolded(w, p, schema.OffCPU, 1000) }); err != nil {
		return err
	}
	if wp := s.Profiles().Wakeups; wp != nil {
		if err := write(schema.WakeupsFile, wp.Write); err != nil {
			return err
		}
		if err := write(schema.WakeupsFoldedFile, func(w io.Writer) error { return schema.WriteWakeupsFolded(w, wp) }); err != nil {
			return err
		}
	}
	if gp := s.Profiles().Goroutines; gp != nil {
		if err := write(schema.GoroutinesFile, gp.Write); err != nil {
			return err
		}
	}
	st := s.Stats()
	b, _ := json.MarshalIndent(st, "", "  ")
	return os.WriteFile(filepath.Join(dir, schema.RecordStatsFile), append(b, '\n'), 0o644)
}

func lastLine(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
