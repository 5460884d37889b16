// A labelled Go HTTP server and its load, in one process: each request
// runs under pprof.Do with trace_id, span_id and http.route labels (as an
// OpenTelemetry span profiler wrapper sets them) and waits on a mutex, a
// channel fed by a worker, a downstream service over loopback and a
// sleep, measuring each of its own waits. It writes, per request, its
// ids, route and measured wait time to the file named by its first
// argument. Builds with Go 1.19 (labels kept in a map) and the newest.
// With "threads" its handlers instead block their thread in a system call
// (a read of a blocking pipe, a nanosleep): waits no goroutine park holds,
// which only the thread's own g carries the labels of.
//
// Usage: golabels REPORT DURATION [threads]
package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
	"syscall"
	"time"
)

type request struct {
	Trace string `json:"trace_id"`
	Span  string `json:"span_id"`
	Route string `json:"route"`
	Wait  int64  `json:"wait_ns"` // the sum of its measured waits
}

var (
	mu    sync.Mutex
	jobs  = make(chan chan struct{})
	conns = make(chan *bufio.ReadWriter, 8)

	reportMu sync.Mutex
	reports  []request
)

func id(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// timed runs f and adds the time it took to *sum.
func timed(sum *int64, f func()) {
	t := time.Now()
	f()
	*sum += int64(time.Since(t))
}

func waitMutex(sum *int64) {
	timed(sum, mu.Lock)
	time.Sleep(0) // a yield, not a wait
	mu.Unlock()
}

func waitWorker(sum *int64) {
	done := make(chan struct{})
	timed(sum, func() {
		jobs <- done // both workers busy: the send waits too
		<-done
	})
}

func waitDownstream(sum *int64) {
	c := <-conns // one per handler at most: never waits
	timed(sum, func() {
		c.WriteString("ping\n")
		c.Flush()
		c.ReadString('\n')
	})
	conns <- c
}

func waitSleep(sum *int64) { timed(sum, func() { time.Sleep(6 * time.Millisecond) }) }

// feeds takes the pipes waitPipe reads: their writers are started from
// an unlabelled goroutine, so that their own waits carry no request.
var feeds = make(chan int, 256)

func feeder() {
	for fd := range feeds {
		go func(fd int) {
			time.Sleep(5 * time.Millisecond)
			syscall.Write(fd, []byte{1})
		}(fd)
	}
}

// waitPipe blocks its thread in read(2) on a blocking pipe written to
// 5 ms later.
func waitPipe(sum *int64) {
	var p [2]int
	if err := syscall.Pipe(p[:]); err != nil {
		panic(err)
	}
	feeds <- p[1]
	var b [1]byte
	timed(sum, func() {
		for {
			if _, err := syscall.Read(p[0], b[:]); err != syscall.EINTR {
				break
			}
		}
	})
	syscall.Close(p[0])
	syscall.Close(p[1])
}

// waitNanosleep blocks its thread in nanosleep(2) for 3 ms.
func waitNanosleep(sum *int64) {
	timed(sum, func() {
		ts := syscall.NsecToTimespec(3e6)
		for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
		}
	})
}

var routes = map[string][]func(*int64){
	"/mutex":     {waitMutex},
	"/chan":      {waitWorker},
	"/down":      {waitDownstream},
	"/sleep":     {waitSleep},
	"/mix":       {waitMutex, waitWorker, waitDownstream, waitSleep},
	"/pipe":      {waitPipe},
	"/nanosleep": {waitNanosleep},
}

// gcEach: a collection after every request (GOLABELS_GC=1).
var gcEach = os.Getenv("GOLABELS_GC") != ""

func handle(w http.ResponseWriter, r *http.Request) {
	steps, ok := routes[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	rq := request{Trace: id(16), Span: id(8), Route: r.URL.Path}
	pprof.Do(r.Context(), pprof.Labels("trace_id", rq.Trace, "span_id", rq.Span, "http.route", rq.Route), func(context.Context) {
		for _, f := range steps {
			f(&rq.Wait)
		}
	})
	reportMu.Lock()
	reports = append(reports, rq)
	reportMu.Unlock()
	if gcEach {
		// The set is garbage now: the next request's may take its address.
		runtime.GC()
	}
	io.WriteString(w, "ok\n")
}

// holder keeps the mutex 4 ms of every 6, asleep: handlers wait for it.
func holder(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		mu.Lock()
		time.Sleep(4 * time.Millisecond)
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
	}
}

// worker does each job in 4 ms of sleep.
func worker() {
	for done := range jobs {
		time.Sleep(4 * time.Millisecond)
		close(done)
	}
}

// downstream answers each line after 8 ms.
func downstream(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func(c net.Conn) {
			rw := bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
			for {
				if _, err := rw.ReadString('\n'); err != nil {
					return
				}
				time.Sleep(8 * time.Millisecond)
				rw.WriteString("pong\n")
				rw.Flush()
			}
		}(c)
	}
}

func main() {
	if len(os.Args) != 3 && (len(os.Args) != 4 || os.Args[3] != "threads") {
		fmt.Fprintln(os.Stderr, "usage: golabels REPORT DURATION [threads]")
		os.Exit(2)
	}
	dur, err := time.ParseDuration(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	dln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go downstream(dln)
	for i := 0; i < cap(conns); i++ {
		c, err := net.Dial("tcp", dln.Addr().String())
		if err != nil {
			panic(err)
		}
		conns <- bufio.NewReadWriter(bufio.NewReader(c), bufio.NewWriter(c))
	}
	for i := 0; i < 2; i++ {
		go worker()
	}
	go feeder()
	stop := make(chan struct{})
	go holder(stop)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go http.Serve(ln, http.HandlerFunc(handle))

	// The load: 6 clients, each on its own connection, round the routes.
	// Waits of milliseconds: the CPU a wait takes (its system calls, a
	// thread preempted under it) is within a request's clock, not a wait.
	// Threads: 2 clients, so that a thread back from its system call
	// finds a P (otherwise its goroutine waits for one on g0's stack).
	var wg sync.WaitGroup
	end := time.Now().Add(dur)
	names, clients := []string{"/mutex", "/chan", "/down", "/sleep", "/mix"}, 6
	if len(os.Args) == 4 {
		names, clients = []string{"/pipe", "/nanosleep"}, 2
		// Idle Ps, so that a thread back from its system call takes one
		// rather than waiting for one on g0 (unlabelled, yet inside the
		// request's clock): on one CPU, GOMAXPROCS 1 left /nanosleep's
		// requests 8-21% short of their own clocks, 8 Ps 2-3%.
		if runtime.GOMAXPROCS(0) < 8 {
			runtime.GOMAXPROCS(8)
		}
	}
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			for i := c; time.Now().Before(end); i++ {
				resp, err := cl.Get("http://" + ln.Addr().String() + names[i%len(names)])
				if err != nil {
					panic(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}(c)
	}
	wg.Wait()
	close(stop)
	reportMu.Lock()
	b, _ := json.Marshal(reports)
	reportMu.Unlock()
	if err := os.WriteFile(os.Args[1], b, 0o644); err != nil {
		panic(err)
	}
}
