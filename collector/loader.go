package collector

import (
	"bytes"
	"debug/elf"
	"os"
	"path/filepath"
	"strconv"

	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/bpf"
)

// loaderHook is the dynamic loader's debugger hook: glibc's loader calls
// it before and after it maps objects (the r_debug protocol debuggers
// use). A loader without it is not hooked.
const loaderHook = "_dl_debug_state"

// attachLoaders puts a uprobe on the hook of every dynamic loader the
// running programs use (their executables' PT_INTERP, in their own root).
// A loader seen first after the start is not hooked: programs started
// from it have their mappings re-read from /proc. False when none was
// hooked (the caller then follows mmap by its syscall tracepoints).
func (s *Session) attachLoaders() bool {
	prog := s.coll.Programs[bpf.OffcpuProgOffcpuDlState]
	if prog == nil || !s.kernelMaps {
		return false
	}
	seen := map[[2]uint64]bool{}
	hooked := false
	for _, path := range loaderPaths() {
		var st unix.Stat_t
		if unix.Stat(path, &st) != nil || seen[[2]uint64{st.Dev, st.Ino}] {
			continue
		}
		seen[[2]uint64{st.Dev, st.Ino}] = true
		ex, err := link.OpenExecutable(path)
		if err != nil {
			continue
		}
		l, err := ex.Uprobe(loaderHook, prog, nil)
		if err != nil {
			continue
		}
		s.links = append(s.links, l)
		hooked = true
	}
	return hooked
}

// loaderPaths lists the interpreters of this program, of /bin/sh and of
// every running process, each as seen from the process's root.
func loaderPaths() []string {
	var out []string
	add := func(root, exe string) {
		if interp := elfInterp(exe); interp != "" {
			out = append(out, filepath.Join(root, interp))
		}
	}
	add("/", "/proc/self/exe")
	add("/", "/bin/sh")
	for _, pid := range allProcesses() {
		dir := "/proc/" + strconv.Itoa(pid)
		add(dir+"/root", dir+"/exe")
	}
	return out
}

// elfInterp is an executable's PT_INTERP ("" for a static one or a
// file that cannot be read).
func elfInterp(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	ef, err := elf.NewFile(f)
	if err != nil {
		return ""
	}
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, min(p.Filesz, 4096))
			if _, err := p.ReadAt(b, 0); err != nil {
				return ""
			}
			if i := bytes.IndexByte(b, 0); i >= 0 {
				b = b[:i]
			}
			return string(b)
		}
	}
	return ""
}
