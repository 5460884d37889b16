package schema

import "strings"

// threadStarts are the outermost frames of a whole user stack: where the
// C library, the dynamic loader's entry and the Go runtime start threads
// (Go's TOPFRAME functions), and the tops of Go's g0 stack switches, where
// Go's own traceback stops too (SP-writing functions).
var threadStarts = map[string]bool{
	"clone": true, "__clone": true, "clone3": true, "__clone3": true,
	// thread_start: glibc's arm64 clone's child (aarch64/clone.S).
	"start_thread": true, "_start": true, "__libc_start_main": true, "thread_start": true,
	"runtime.goexit": true, "runtime.mstart": true, "runtime.rt0_go": true, "runtime.sigtramp": true,
	"runtime.mcall": true, "runtime.systemstack": true, "runtime.morestack": true,
}

// IsThreadStart reports whether fn, a symbolized function name, is the
// outermost frame of a thread's stack.
func IsThreadStart(fn string) bool {
	fn = strings.TrimSuffix(strings.TrimPrefix(fn, "__GI_"), ".abi0")
	return threadStarts[fn]
}
