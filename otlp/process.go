package otlp

import (
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"

	"github.com/prometheus/procfs"
)

// ProcessCache reads each process's resource attributes once, from /proc:
// its executable, OTEL_SERVICE_NAME (or service.name in
// OTEL_RESOURCE_ATTRIBUTES) from its environment, its container from its
// cgroup. Prune drops the processes that exited.
type ProcessCache struct {
	mu sync.Mutex
	m  map[int64]Process
}

func NewProcessCache() *ProcessCache { return &ProcessCache{m: map[int64]Process{}} }

// Get returns pid's attributes; comm names a process already gone.
func (c *ProcessCache) Get(pid int64, comm string) Process {
	c.mu.Lock()
	p, ok := c.m[pid]
	c.mu.Unlock()
	if ok {
		return p
	}
	p = readProcess(pid)
	if p.Executable == "" {
		p.Executable = comm
	}
	c.mu.Lock()
	c.m[pid] = p
	c.mu.Unlock()
	return p
}

// Prune forgets the processes that no longer exist.
func (c *ProcessCache) Prune() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for pid := range c.m {
		if err := syscall.Kill(int(pid), 0); err == syscall.ESRCH {
			delete(c.m, pid)
		}
	}
}

// Len is how many processes are cached.
func (c *ProcessCache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

func readProcess(pid int64) Process {
	var p Process
	proc, err := procfs.NewProc(int(pid))
	if err != nil {
		return p
	}
	if exe, err := proc.Executable(); err == nil && exe != "" {
		p.Executable = filepath.Base(exe)
	}
	if env, err := proc.Environ(); err == nil {
		p.ServiceName = serviceName(env)
	}
	if cgs, err := proc.Cgroups(); err == nil {
		for _, cg := range cgs {
			if id := ContainerID(cg.Path); id != "" {
				p.ContainerID = id
				break
			}
		}
	}
	return p
}

// serviceName is the service a process declares in its environment.
func serviceName(env []string) string {
	var fromAttrs string
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "OTEL_SERVICE_NAME="); ok && v != "" {
			return v
		}
		if v, ok := strings.CutPrefix(e, "OTEL_RESOURCE_ATTRIBUTES="); ok {
			for _, kv := range strings.Split(v, ",") {
				if name, ok := strings.CutPrefix(strings.TrimSpace(kv), "service.name="); ok {
					fromAttrs = name
				}
			}
		}
	}
	return fromAttrs
}

// containerRE finds a container id in a cgroup path: 64 hex digits, as
// Docker, containerd, CRI-O and Podman name their cgroups
// (docker-ID.scope, cri-containerd-ID.scope, crio-ID.scope, /docker/ID).
var containerRE = regexp.MustCompile(`(?:^|[/-])([0-9a-f]{64})(?:\.scope)?(?:/|$)`)

// ContainerID returns the container id in a cgroup path, or "".
func ContainerID(cgroupPath string) string {
	if m := containerRE.FindStringSubmatch(cgroupPath); m != nil {
		return m[1]
	}
	return ""
}
