// manygoroutines: N goroutines wait together on one channel, then each
// sleeps a millisecond, with the runtime's execution trace on.
// Usage: manygoroutines TRACE-FILE N
package main

import (
	"os"
	"runtime/trace"
	"strconv"
	"sync"
	"time"
)

//go:noinline
func waiter(start <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	<-start
	time.Sleep(time.Millisecond)
}

func main() {
	n, err := strconv.Atoi(os.Args[2])
	if err != nil {
		panic(err)
	}
	f, err := os.Create(os.Args[1])
	if err != nil {
		panic(err)
	}
	if err := trace.Start(f); err != nil {
		panic(err)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go waiter(start, &wg)
	}
	time.Sleep(500 * time.Millisecond)
	close(start)
	wg.Wait()
	trace.Stop()
	f.Close()
}
