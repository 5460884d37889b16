// Command load drives a server on loopback for the corpus recordings:
// HTTP GETs, memcached set/get pairs or fixed-size echoes over N
// connections for a duration, and prints what it did.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	mode := flag.String("mode", "http", "http, memcached or echo")
	body := flag.String("body", "", "http: POST this JSON body instead of a GET")
	addr := flag.String("addr", "", "URL (http: a comma-separated list is cycled) or host:port")
	conns := flag.Int("c", 8, "connections")
	d := flag.Duration("d", 3*time.Second, "duration")
	size := flag.Int("size", 64, "echo: bytes a round trip")
	pause := flag.Duration("pause", 0, "pause between a connection's requests")
	flag.Parse()
	if *addr == "" {
		fmt.Fprintln(os.Stderr, "load: -addr is required")
		os.Exit(2)
	}
	var done, failed atomic.Int64
	end := time.Now().Add(*d)
	paused.pause = *pause
	var wg sync.WaitGroup
	for i := range *conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			switch *mode {
			case "http":
				err = httpLoop(strings.Split(*addr, ","), *body, i, end, &done)
			case "memcached":
				err = mcLoop(*addr, end, &done)
			case "echo":
				err = echoLoop(*addr, *size, end, &done)
			default:
				err = fmt.Errorf("unknown mode %q", *mode)
			}
			if err != nil {
				failed.Add(1)
				fmt.Fprintln(os.Stderr, "load:", err)
			}
		}()
	}
	wg.Wait()
	fmt.Printf("%s: %d requests in %v over %d connections (%d failed)\n", *mode, done.Load(), *d, *conns, failed.Load())
	if failed.Load() == int64(*conns) {
		os.Exit(1)
	}
}

// paused: every loop sleeps this long after each request.
var paused struct{ pause time.Duration }

func rest() {
	if paused.pause > 0 {
		time.Sleep(paused.pause)
	}
}

func httpLoop(urls []string, body string, i int, end time.Time, done *atomic.Int64) error {
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: 10 * time.Second}
	for n := i; time.Now().Before(end); n++ {
		var resp *http.Response
		var err error
		if body != "" {
			resp, err = c.Post(urls[n%len(urls)], "application/json", strings.NewReader(body))
		} else {
			resp, err = c.Get(urls[n%len(urls)])
		}
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done.Add(1)
		rest()
	}
	return nil
}

func mcLoop(addr string, end time.Time, done *atomic.Int64) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	r := bufio.NewReader(c)
	val := strings.Repeat("v", 100)
	for k := 0; time.Now().Before(end); k++ {
		key := fmt.Sprintf("k%d", k%1000)
		fmt.Fprintf(c, "set %s 0 0 %d\r\n%s\r\nget %s\r\n", key, len(val), val, key)
		for _, want := range []string{"STORED", "VALUE", "", "END"} {
			l, err := r.ReadString('\n')
			if err != nil {
				return err
			}
			if want != "" && !strings.HasPrefix(l, want) {
				return fmt.Errorf("memcached: %q, want %s", l, want)
			}
		}
		done.Add(1)
		rest()
	}
	return nil
}

func echoLoop(addr string, size int, end time.Time, done *atomic.Int64) error {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, size)
	for time.Now().Before(end) {
		if _, err := c.Write(buf); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		done.Add(1)
		rest()
	}
	return nil
}
