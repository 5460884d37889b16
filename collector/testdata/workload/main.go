// Workload for the recorder's tests: named OS threads that block for known
// totals in nanosleep, futex and epoll_wait, and one that exits early. It
// prints each thread's measured blocked time as JSON when done.
package main

import (
	"encoding/json"
	"flag"
	"os"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

var (
	rounds = flag.Int("rounds", 10, "blocking calls per thread")
	each   = flag.Duration("each", 50*time.Millisecond, "length of each blocking call")
)

type result struct {
	Thread  string `json:"thread"`
	TID     int    `json:"tid"`
	Blocked int64  `json:"blocked_ns"` // measured around the blocking calls
}

func main() {
	flag.Parse()
	var mu sync.Mutex
	var results []result
	var wg sync.WaitGroup
	run := func(name string, exit bool, body func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			if !exit {
				defer runtime.UnlockOSThread()
			} // else: the goroutine returns locked and Go ends the thread.
			unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&append([]byte(name), 0)[0])), 0, 0, 0)
			start := time.Now()
			body()
			mu.Lock()
			results = append(results, result{Thread: name, TID: unix.Gettid(), Blocked: int64(time.Since(start))})
			mu.Unlock()
		}()
	}
	run("wl-nanosleep", false, napLoop)
	run("wl-futex", false, futexLoop)
	run("wl-epoll", false, epollLoop)
	run("wl-exiting", true, exitingLoop)
	wg.Wait()
	json.NewEncoder(os.Stdout).Encode(results)
}

//go:noinline
func napLoop() {
	ts := unix.NsecToTimespec(int64(*each))
	for i := 0; i < *rounds; i++ {
		unix.Nanosleep(&ts, nil)
	}
}

//go:noinline
func futexLoop() {
	var word uint32
	ts := unix.NsecToTimespec(int64(*each))
	for i := 0; i < *rounds; i++ {
		unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&word)), futexWaitPrivate, 0, uintptr(unsafe.Pointer(&ts)), 0, 0)
	}
}

//go:noinline
func epollLoop() {
	ep, err := unix.EpollCreate1(0)
	if err != nil {
		panic(err)
	}
	defer unix.Close(ep)
	events := make([]unix.EpollEvent, 1)
	for i := 0; i < *rounds; i++ {
		unix.EpollWait(ep, events, int(*each/time.Millisecond))
	}
}

//go:noinline
func exitingLoop() {
	ts := unix.NsecToTimespec(int64(*each))
	for i := 0; i < *rounds/2; i++ {
		unix.Nanosleep(&ts, nil)
	}
}

const futexWaitPrivate = 0 | 128 // FUTEX_WAIT | FUTEX_PRIVATE_FLAG
