package collector

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/schema"
)

// Workers a server forks during the recording, and that never exec, are
// walked as their parent is: nginx recorded by its master's pid, then
// reloaded, forks new workers; their stacks reach _start as the same wait
// recorded by the worker's own pid does.
func TestForkedChildrenUnwound(t *testing.T) {
	requireBPF(t)
	bin := requireServer(t, "nginx", "nginx-light")
	dir := t.TempDir()
	port := freePort(t)
	if err := os.WriteFile(filepath.Join(dir, "index.html"), []byte(strings.Repeat("offcpu ", 1000)), 0o644); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`user root;
worker_processes 2;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events { worker_connections 256; }
http {
	access_log off;
	client_body_temp_path %[1]s;
	server { listen 127.0.0.1:%[2]d; root %[1]s; }
}
`, dir, port)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", filepath.Join(dir, "nginx.conf"), "-p", dir, "-g", "daemon off;")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() }()
	waitListening(t, port)
	master := cmd.Process.Pid
	old := children(t, master)
	url := fmt.Sprintf("http://127.0.0.1:%d/index.html", port)

	s, err := Start(context.Background(), Options{PIDs: []int{master}, FollowForks: true})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	syscall.Kill(master, syscall.SIGHUP) // reload: new workers are forked
	var fresh []int
	for i := 0; i < 100 && len(fresh) < 2; i++ {
		time.Sleep(20 * time.Millisecond)
		fresh = fresh[:0]
		for _, c := range children(t, master) {
			if !slices.Contains(old, c) {
				fresh = append(fresh, c)
			}
		}
	}
	if len(fresh) == 0 {
		s.Stop()
		t.Fatal("nginx forked no new worker on reload")
	}
	load(t, url, 1000*7, time.Second)
	p, err := s.Stop()
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	whole, all := startShare(p, fresh)
	t.Logf("forked workers %v: %v of %v off-CPU time reaches a thread start (%.1f%%); stats %+v", fresh, whole, all, 100*float64(whole)/float64(all), s.Stats().Unwind)
	if all == 0 || float64(whole) < 0.95*float64(all) {
		t.Errorf("forked workers: %.1f%% of their off-CPU time reaches a thread start, want >= 95%%", 100*float64(whole)/float64(max(all, 1)))
	}
	// The same worker recorded by its own pid: the same top stack.
	s2, err := Start(context.Background(), Options{PIDs: fresh[:1]})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	load(t, url, 1000*7, time.Second)
	p2, err := s2.Stop()
	if err != nil {
		t.Fatalf("Stop: %v", err)
	}
	a, b := topUserStack(p, fresh[0]), topUserStack(p2, fresh[0])
	if a == "" || a != b {
		t.Errorf("worker %d's longest wait, recorded through its parent:\n  %s\nby its own pid:\n  %s", fresh[0], a, b)
	}
}

func load(t *testing.T, url string, size int, d time.Duration) {
	stop := make(chan struct{})
	time.AfterFunc(d, func() { close(stop) })
	httpLoad(t, url, size, 4, stop)
}

// startShare is the off-CPU time of the processes' samples whose user
// stack reaches a thread start, and all their off-CPU time with a user stack.
func startShare(p *profile.Profile, pids []int) (whole, all time.Duration) {
	for _, smp := range p.Sample {
		if smp.Value[0] == 0 || !slices.Contains(pids, int(smp.NumLabel[schema.LabelPID][0])) {
			continue
		}
		root := smp.Location[len(smp.Location)-1]
		if root.Mapping == nil || root.Mapping.File == schema.KernelMapping {
			continue
		}
		all += time.Duration(smp.Value[0])
		if schema.IsThreadStart(root.Line[0].Function.Name) {
			whole += time.Duration(smp.Value[0])
		}
	}
	return whole, all
}

// topUserStack is the pid's user frames of its stack with the most
// off-CPU time.
func topUserStack(p *profile.Profile, pid int) string {
	var best *profile.Sample
	for _, smp := range p.Sample {
		if int(smp.NumLabel[schema.LabelPID][0]) == pid && (best == nil || smp.Value[0] > best.Value[0]) {
			best = smp
		}
	}
	if best == nil {
		return ""
	}
	var fr []string
	for _, l := range best.Location {
		if l.Mapping != nil && l.Mapping.File != schema.KernelMapping {
			fr = append(fr, l.Line[0].Function.Name)
		}
	}
	return strings.Join(fr, ";")
}
