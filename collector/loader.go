package collector

import (
	"bytes"
	"debug/elf"
	"os"
	"path/filepath"
	"strconv"
)

// loaderHook is the dynamic loader's debugger hook: glibc's loader calls
// it before and after it maps objects (the r_debug protocol debuggers
// use). A loader without it is not hooked.
const loaderHook = "_dl_debug_state"

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
