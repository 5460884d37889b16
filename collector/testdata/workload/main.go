// Workload for the recorder's tests: named OS threads that block for known
// totals in nanosleep, futex and epoll_wait, and one that exits early. It
// prints each thread's measured blocked time as JSON when done.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

var (
	rounds = flag.Int("rounds", 10, "blocking calls per thread")
	each   = flag.Duration("each", 50*time.Millisecond, "length of each blocking call")
	mode   = flag.String("mode", "block", "block: sleepers; wake: wakers and woken threads")
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
	// Every named thread ends with its goroutine (exit): an unlocked one
	// would go back to the runtime's pool and could be renamed by the
	// next, mixing two roles under one name.
	run := func(name string, body func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: Go ends the thread with the goroutine
			unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&append([]byte(name), 0)[0])), 0, 0, 0)
			start := time.Now()
			body()
			mu.Lock()
			results = append(results, result{Thread: name, TID: unix.Gettid(), Blocked: int64(time.Since(start))})
			mu.Unlock()
		}()
	}
	if *mode == "wake" {
		runWake(run)
	} else {
		run("wl-nanosleep", napLoop)
		run("wl-futex", futexLoop)
		run("wl-epoll", epollLoop)
		run("wl-exiting", exitingLoop)
	}
	wg.Wait()
	json.NewEncoder(os.Stdout).Encode(results)
}

// untilDeadline repeats a blocking call that a signal may cut short
// (Go preempts with SIGURG) until d has passed.
func untilDeadline(d time.Duration, call func(left time.Duration)) {
	end := time.Now().Add(d)
	for left := d; left > 0; left = time.Until(end) {
		call(left)
	}
}

//go:noinline
func napLoop() {
	for i := 0; i < *rounds; i++ {
		untilDeadline(*each, func(left time.Duration) {
			ts := unix.NsecToTimespec(int64(left))
			unix.Nanosleep(&ts, nil)
		})
	}
}

//go:noinline
func futexLoop() {
	var word uint32
	for i := 0; i < *rounds; i++ {
		untilDeadline(*each, func(left time.Duration) {
			ts := unix.NsecToTimespec(int64(left))
			unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(&word)), futexWaitPrivate, 0, uintptr(unsafe.Pointer(&ts)), 0, 0)
		})
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
		untilDeadline(*each, func(left time.Duration) {
			unix.EpollWait(ep, events, int((left+time.Millisecond-1)/time.Millisecond))
		})
	}
}

//go:noinline
func exitingLoop() {
	for i := 0; i < *rounds/2; i++ {
		untilDeadline(*each, func(left time.Duration) {
			ts := unix.NsecToTimespec(int64(left))
			unix.Nanosleep(&ts, nil)
		})
	}
}

const futexWaitPrivate = 0 | 128 // FUTEX_WAIT | FUTEX_PRIVATE_FLAG

// runWake starts pairs of wakers and woken threads: an event loop asleep
// in epoll_wait on an eventfd that a producer writes while it sleeps; a
// futex waiter and its releaser; a reader asleep in read on a loopback TCP
// socket that a writer writes (the receive softirq wakes it); a timer
// sleeper sharing CPU 0 with a thread that only spins.
func runWake(run func(string, func())) {
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		panic(err)
	}
	var sleeperDone atomic.Bool
	var word atomic.Uint32
	run("wl-loop", func() { loopTID.Store(int32(unix.Gettid())); eventLoop(efd, *rounds) })
	run("wl-producer", func() { produceEvents(efd, *rounds) })
	run("wl-waiter", func() { waitLoop(&word, *rounds) })
	run("wl-releaser", func() { releaseLoop(&word, *rounds) })
	ln, port := tcpListen()
	var readerTID atomic.Int32
	run("wl-tcp-reader", func() { readerTID.Store(int32(unix.Gettid())); tcpReader(ln, *rounds) })
	run("wl-tcp-writer", func() { tcpWriter(port, *rounds, &readerTID) })
	run("wl-sleeper", func() { pinCPU0(); timerSleeps(*rounds); sleeperDone.Store(true) })
	run("wl-spinner", func() { pinCPU0(); spin(&sleeperDone) })
}

func pinCPU0() {
	var set unix.CPUSet
	set.Set(0)
	unix.SchedSetaffinity(0, &set)
}

//go:noinline
func eventLoop(efd, n int) {
	ep, _ := unix.EpollCreate1(0)
	defer unix.Close(ep)
	unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, efd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(efd)})
	events := make([]unix.EpollEvent, 1)
	buf := make([]byte, 8)
	for consumed.Load() < int32(n) {
		if k, _ := unix.EpollWait(ep, events, 2000); k == 0 {
			return // producer gone
		}
		unix.Read(efd, buf)
		consumed.Add(1)
	}
}

var loopTID, consumed atomic.Int32

// produceEvents writes the eventfd each time the loop has taken the last
// event and sleeps again (state S in /proc), so every write wakes it.
//
//go:noinline
func produceEvents(efd, n int) {
	one := []byte{1, 0, 0, 0, 0, 0, 0, 0}
	for i := 0; i < n; i++ {
		for consumed.Load() < int32(i) || !sleeping(loopTID.Load()) {
			time.Sleep(200 * time.Microsecond)
		}
		unix.Write(efd, one)
	}
}

func sleeping(tid int32) bool {
	if tid == 0 {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/stat", tid))
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && b[i+2] == 'S'
}

// sleepingIn is sleeping inside system call nr: a Go thread also sleeps
// in the runtime's futex (a P taken during its syscall), where a write
// would find it and its read would not block.
func sleepingIn(tid int32, nr uintptr) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/syscall", tid))
	if err != nil {
		return false
	}
	// The file says "running" when the thread is; state S read after it
	// means it still sleeps in that call.
	f := strings.Fields(string(b))
	return len(f) > 0 && f[0] == strconv.FormatUint(uint64(nr), 10) && sleeping(tid)
}

//go:noinline
func waitLoop(word *atomic.Uint32, n int) {
	for i := 0; i < n; i++ {
		for word.Load() == uint32(i) {
			unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWaitPrivate, uintptr(i), 0, 0, 0)
		}
	}
}

//go:noinline
func releaseLoop(word *atomic.Uint32, n int) {
	for i := 0; i < n; i++ {
		time.Sleep(5 * time.Millisecond)
		word.Add(1)
		unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(word)), futexWakePrivate, 1, 0, 0, 0)
	}
}

//go:noinline
func timerSleeps(n int) {
	ts := unix.NsecToTimespec(int64(2 * time.Millisecond))
	for i := 0; i < n; i++ {
		unix.Nanosleep(&ts, nil)
	}
}

//go:noinline
func spin(done *atomic.Bool) {
	for !done.Load() {
	}
}

const futexWakePrivate = 1 | 128 // FUTEX_WAKE | FUTEX_PRIVATE_FLAG

func tcpListen() (fd, port int) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		panic(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		panic(err)
	}
	if err := unix.Listen(fd, 1); err != nil {
		panic(err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		panic(err)
	}
	return fd, sa.(*unix.SockaddrInet4).Port
}

// tcpReader reads one byte a round with a blocking read (not Go's poller:
// the thread itself sleeps in the socket).
//
//go:noinline
func tcpReader(ln, n int) {
	c, _, err := unix.Accept4(ln, unix.SOCK_CLOEXEC)
	if err != nil {
		panic(err)
	}
	defer unix.Close(c)
	buf := make([]byte, 1)
	for got := 0; got < n; {
		k, err := unix.Read(c, buf)
		if err != nil && err != unix.EINTR {
			panic(err)
		}
		if k > 0 {
			got += k
		}
	}
}

// tcpWriter writes a byte whenever the reader sleeps in read, so each write
// wakes it from the receive path.
//
//go:noinline
func tcpWriter(port, n int, reader *atomic.Int32) {
	c, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		panic(err)
	}
	defer unix.Close(c)
	if err := unix.Connect(c, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		panic(err)
	}
	for i := 0; i < n; i++ {
		for !sleepingIn(reader.Load(), unix.SYS_READ) {
			time.Sleep(200 * time.Microsecond)
		}
		unix.Write(c, []byte{1})
		time.Sleep(time.Millisecond)
	}
}
