// Command gochain makes a wait chain of goroutines for a number of
// rounds: A waits on a channel that B sends on once it gets a mutex, which
// C holds while it sleeps 20 ms. A's wait is B's wait is C's sleep.
package main

import (
	"os"
	"strconv"
	"sync"
	"time"
)

var (
	mu    sync.Mutex
	held  = make(chan struct{})
	next  = make(chan struct{})
	reply = make(chan int)
)

func chainC() {
	for {
		<-next
		mu.Lock()
		held <- struct{}{}
		time.Sleep(20 * time.Millisecond)
		mu.Unlock()
	}
}

func chainB() {
	for i := 0; ; i++ {
		<-held
		mu.Lock()
		mu.Unlock()
		reply <- i
	}
}

// Small enough to be inlined into its go statement's wrapper: Go shows it
// all the same, and so must the recorder.
func chainA(rounds int, done chan<- struct{}) {
	for i := 0; i < rounds; i++ {
		next <- struct{}{}
		<-reply
	}
	close(done)
}

func main() {
	rounds := 50
	if len(os.Args) > 2 {
		rounds, _ = strconv.Atoi(os.Args[2])
	}
	go chainC()
	go chainB()
	// A go statement with arguments: the compiler wraps the call, and the
	// goroutine is still grouped by chainA.
	done := make(chan struct{})
	go chainA(rounds, done)
	<-done
}
