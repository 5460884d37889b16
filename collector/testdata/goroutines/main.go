// A Go program whose goroutines wait in every common way, each kind in a
// function of its own, with the runtime's execution trace on for the
// whole run: the truth goroutine waits recorded from outside are checked
// against. Usage: goroutines TRACE-FILE DURATION
//
// The waiting functions are not inlined: offcpu names a Go frame by the
// function its code belongs to, without expanding inlined calls, while
// the trace names the innermost inlined one.
package main

import (
	"io"
	"net"
	"os"
	"runtime/trace"
	"sync"
	"time"
)

var stop = make(chan struct{})

func running() bool {
	select {
	case <-stop:
		return false
	default:
		return true
	}
}

//go:noinline
func chanRecv(ch <-chan int) {
	for range ch {
	}
}

//go:noinline
func chanProducer(ch chan<- int) {
	for running() {
		time.Sleep(2 * time.Millisecond)
		ch <- 1
	}
	close(ch)
}

//go:noinline
func chanSend(ch chan<- int) {
	for running() {
		ch <- 1
	}
	close(ch)
}

//go:noinline
func slowConsumer(ch <-chan int) {
	for range ch {
		time.Sleep(3 * time.Millisecond)
	}
}

//go:noinline
func selectWait(a, b <-chan int) {
	for {
		select {
		case _, ok := <-a:
			if !ok {
				return
			}
		case <-b:
		}
	}
}

//go:noinline
func mutexHolder(mu *sync.Mutex) {
	for running() {
		mu.Lock()
		time.Sleep(time.Millisecond)
		mu.Unlock()
		time.Sleep(100 * time.Microsecond)
	}
}

//go:noinline
func mutexWait(mu *sync.Mutex) {
	for running() {
		mu.Lock()
		mu.Unlock()
	}
}

//go:noinline
func condWait(c *sync.Cond, done *bool) {
	c.L.Lock()
	for !*done {
		c.Wait()
	}
	c.L.Unlock()
}

//go:noinline
func condSignal(c *sync.Cond, done *bool) {
	for running() {
		time.Sleep(4 * time.Millisecond)
		c.Broadcast()
	}
	c.L.Lock()
	*done = true
	c.L.Unlock()
	c.Broadcast()
}

//go:noinline
func waitGroupWait() {
	for running() {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { time.Sleep(5 * time.Millisecond); wg.Done() }()
		wg.Wait()
	}
}

//go:noinline
func sleeper() {
	for running() {
		time.Sleep(time.Millisecond)
	}
}

//go:noinline
func netServer(l net.Listener) {
	c, err := l.Accept()
	if err != nil {
		return
	}
	io.Copy(c, c)
	c.Close()
}

//go:noinline
func netClient(addr string) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		panic(err)
	}
	buf := make([]byte, 64)
	for running() {
		time.Sleep(time.Millisecond)
		c.Write(buf)
		io.ReadFull(c, buf)
	}
	c.Close()
}

func main() {
	f, err := os.Create(os.Args[1])
	if err != nil {
		panic(err)
	}
	d, err := time.ParseDuration(os.Args[2])
	if err != nil {
		panic(err)
	}
	if err := trace.Start(f); err != nil {
		panic(err)
	}
	var wg sync.WaitGroup
	run := func(fn func()) {
		wg.Add(1)
		go func() { defer wg.Done(); fn() }()
	}
	a, b := make(chan int), make(chan int)
	run(func() { chanProducer(a) })
	run(func() { chanRecv(a) })
	run(func() { chanSend(b) })
	run(func() { slowConsumer(b) })
	s1, s2 := make(chan int), make(chan int)
	run(func() { chanProducer(s1) })
	run(func() { selectWait(s1, s2) })
	var mu sync.Mutex
	run(func() { mutexHolder(&mu) })
	run(func() { mutexWait(&mu) })
	c := sync.NewCond(&sync.Mutex{})
	done := false
	run(func() { condSignal(c, &done) })
	run(func() { condWait(c, &done) })
	run(waitGroupWait)
	run(sleeper)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	run(func() { netServer(l) })
	run(func() { netClient(l.Addr().String()) })
	time.Sleep(d)
	close(stop)
	wg.Wait()
	l.Close()
	trace.Stop()
	f.Close()
}
