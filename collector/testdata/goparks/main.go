// goparks: pairs of goroutines hand a message back and forth over
// unbuffered channels, each spinning WORK of CPU per message, so that
// nearly every receive parks. Prints messages handed over and the
// process's CPU time (ns) when DURATION is up. With LABELS above 0, each
// goroutine puts a new set of pprof labels (trace_id, span_id, route) on
// itself every LABELS messages, as a server does per request.
// Usage: goparks DURATION WORK PAIRS [LABELS]
package main

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var sink atomic.Uint64

// labels: messages per label set (0: none); sets counts them.
var (
	labels int
	sets   atomic.Uint64
)

// relabel puts a new label set on the calling goroutine every labels
// messages (n counts them).
func relabel(n *int) {
	if labels <= 0 {
		return
	}
	if *n%labels == 0 {
		id := sets.Add(1)
		pprof.SetGoroutineLabels(pprof.WithLabels(context.Background(), pprof.Labels(
			"trace_id", fmt.Sprintf("%032x", id), "span_id", fmt.Sprintf("%016x", id), "http.route", "/ping")))
	}
	*n++
}

// spin burns about d of CPU without parking or making system calls.
func spin(d time.Duration, perNs float64) {
	n := uint64(float64(d) * perNs)
	x := uint64(1)
	for i := uint64(0); i < n; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	sink.Add(x & 1)
}

// loopsPerNs measures the spin loop's speed once.
func loopsPerNs() float64 {
	const n = 20_000_000
	t := time.Now()
	x := uint64(1)
	for i := 0; i < n; i++ {
		x = x*6364136223846793005 + 1442695040888963407
	}
	sink.Add(x & 1)
	return n / float64(time.Since(t))
}

func main() {
	if len(os.Args) != 4 && len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: goparks DURATION WORK PAIRS [LABELS]")
		os.Exit(2)
	}
	if len(os.Args) == 5 {
		labels, _ = strconv.Atoi(os.Args[4])
	}
	dur, err1 := time.ParseDuration(os.Args[1])
	work, err2 := time.ParseDuration(os.Args[2])
	pairs, err3 := strconv.Atoi(os.Args[3])
	if err1 != nil || err2 != nil || err3 != nil {
		fmt.Fprintln(os.Stderr, "goparks: bad arguments")
		os.Exit(2)
	}
	perNs := loopsPerNs()
	var msgs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for p := 0; p < pairs; p++ {
		ping, pong := make(chan int), make(chan int)
		wg.Add(2)
		go func() {
			defer wg.Done()
			n := 0
			for {
				relabel(&n)
				spin(work, perNs)
				select {
				case ping <- 1:
				case <-stop:
					return
				}
				if _, ok := <-pong; !ok {
					return
				}
				msgs.Add(1)
			}
		}()
		go func() {
			defer wg.Done()
			defer close(pong)
			n := 0
			for range ping {
				relabel(&n)
				spin(work, perNs)
				select {
				case pong <- 1:
				case <-stop:
					return
				}
				msgs.Add(1)
			}
		}()
	}
	var r0 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	m0 := msgs.Load()
	time.Sleep(dur)
	m1 := msgs.Load()
	var r1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	cpu := (r1.Utime.Nano() + r1.Stime.Nano()) - (r0.Utime.Nano() + r0.Stime.Nano())
	fmt.Println(m1-m0, cpu)
	close(stop)
	os.Exit(0)
}
