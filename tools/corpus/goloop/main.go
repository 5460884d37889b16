// Command goloop is a Go server whose request goroutines signal one loop
// goroutine through a channel ("run the next round now"); each round the
// loop calls a downstream program over TCP and waits for its answer.
// The loop waits for work at its select (idle) and for the downstream
// inside a round (blocked). With -downstream it is that downstream: it
// answers each line after a delay.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "HTTP address (or the downstream's TCP address)")
	down := flag.String("down", "", "the downstream's address")
	serveDown := flag.Bool("downstream", false, "be the downstream")
	delay := flag.Duration("delay", 2*time.Millisecond, "downstream: delay an answer")
	flag.Parse()
	if *serveDown {
		downstream(*listen, *delay)
		return
	}
	kick := make(chan struct{}, 1)
	var rounds, requests atomic.Int64
	go loop(*down, kick, &rounds)
	http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		select {
		case kick <- struct{}{}:
		default:
		}
		fmt.Fprintf(w, "%d %d\n", requests.Load(), rounds.Load())
	})
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("ready", ln.Addr())
	log.Fatal(http.Serve(ln, nil))
}

// loop runs a round when kicked, or every second without a kick.
func loop(down string, kick <-chan struct{}, rounds *atomic.Int64) {
	c, err := net.Dial("tcp", down)
	if err != nil {
		log.Fatal(err)
	}
	r := bufio.NewReader(c)
	tick := time.NewTicker(time.Second)
	for {
		select {
		case <-kick:
		case <-tick.C:
		}
		round(c, r)
		rounds.Add(1)
	}
}

func round(c net.Conn, r *bufio.Reader) {
	if _, err := c.Write([]byte("round\n")); err != nil {
		log.Fatal(err)
	}
	if _, err := r.ReadString('\n'); err != nil {
		log.Fatal(err)
	}
}

func downstream(addr string, delay time.Duration) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("ready", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go func() {
			r := bufio.NewReader(c)
			for {
				l, err := r.ReadString('\n')
				if err != nil {
					return
				}
				time.Sleep(delay)
				c.Write([]byte(l))
			}
		}()
	}
}
