// The program behind TestGoroutineRequeuesMatchTrace: on one P, two
// goroutines spin (the runtime preempts each every 10 ms), one yields in
// a loop and one sleeps in a system call, its P handed to a spinner
// meanwhile: each waits for the P, and none of them parks. With "gc", on
// two Ps, a fifth goroutine collects in a loop: the collector suspends
// the running spinners to scan their stacks.
//
// Usage: gorequeue TRACE DURATION [gc]
package main

import (
	"os"
	"runtime"
	"runtime/trace"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var stop atomic.Bool

// sink keeps the loops' work from being optimized away.
var sink atomic.Uint64

func spinA() {
	x := uint64(1)
	for !stop.Load() {
		x = x*6364136223846793005 + 1442695040888963407
	}
	sink.Add(x)
}

func spinB() {
	x := uint64(3)
	for !stop.Load() {
		x = x*2862933555777941757 + 3037000493
	}
	sink.Add(x)
}

func yielder() {
	x := uint64(5)
	for !stop.Load() {
		for i := 0; i < 10000; i++ {
			x = x*6364136223846793005 + 1
		}
		runtime.Gosched()
	}
	sink.Add(x)
}

func syscaller() {
	for !stop.Load() {
		ts := syscall.NsecToTimespec(2e6)
		for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
		}
	}
}

func collector() {
	for !stop.Load() {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

func main() {
	gc := len(os.Args) == 4 && os.Args[3] == "gc"
	if len(os.Args) != 3 && !gc {
		os.Stderr.WriteString("usage: gorequeue TRACE DURATION [gc]\n")
		os.Exit(2)
	}
	d, err := time.ParseDuration(os.Args[2])
	if err != nil {
		panic(err)
	}
	runtime.GOMAXPROCS(1)
	fns := []func(){spinA, spinB, yielder, syscaller}
	if gc {
		runtime.GOMAXPROCS(2)
		fns = append(fns, collector)
	}
	f, err := os.Create(os.Args[1])
	if err != nil {
		panic(err)
	}
	if err := trace.Start(f); err != nil {
		panic(err)
	}
	var wg sync.WaitGroup
	for _, fn := range fns {
		wg.Add(1)
		go func(fn func()) { defer wg.Done(); fn() }(fn)
	}
	// The timer needs the P too: main waits in a system call, not a park.
	ts := syscall.NsecToTimespec(d.Nanoseconds())
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
	stop.Store(true)
	wg.Wait()
	trace.Stop()
	f.Close()
}
