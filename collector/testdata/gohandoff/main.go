// Command gohandoff N DELAY_US CPU_US OUT: a request chain of known shape
// across goroutines and processes, timed by its own clocks. Goroutine
// "handle" serves N requests one after the other, each under pprof labels
// (span_id, trace_id): it hands the request to goroutine "work" over a
// channel and waits for the answer on another. The worker spins CPU_US,
// asks the backend process (this program run as "backend", over a socket
// pair the runtime's netpoller watches) and spins CPU_US again before it
// answers. The backend sleeps DELAY_US in nanosleep(2) (the injected
// delay) before it replies. Writes to OUT one JSON object per request with
// every step's CLOCK_MONOTONIC ns (bpf_ktime_get_ns's clock), the
// goroutines' ids and the backend's thread.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

type times struct {
	Start      int64  `json:"start"` // handle: handed over
	End        int64  `json:"end"`   // handle: answer received
	WGot       int64  `json:"w_got"` // the worker's clock
	WAsk       int64  `json:"w_ask"`
	WReply     int64  `json:"w_reply"`
	WDone      int64  `json:"w_done"`
	BSleep     int64  `json:"b_sleep"` // the backend's, around its sleep
	BWoke      int64  `json:"b_woke"`
	BackendTID int64  `json:"backend_tid"`
	HandleGoID int64  `json:"handle_goid"`
	WorkGoID   int64  `json:"work_goid"`
	SpanID     string `json:"span_id"`
	TraceID    string `json:"trace_id"`
}

func now() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func spin(us int) {
	end := now() + int64(us)*1000
	for now() < end {
	}
}

// goid is the calling goroutine's id, as its stack trace's header says.
func goid() int64 {
	b := make([]byte, 64)
	b = b[:runtime.Stack(b, false)]
	f := strings.Fields(string(b))
	id, _ := strconv.ParseInt(f[1], 10, 64)
	return id
}

// backend answers each 8-byte request on fd 3 after sleeping delay µs,
// with its clock around the sleep and its thread id.
func backend(delay int) {
	runtime.LockOSThread()
	tid := int64(syscall.Gettid())
	var req [8]byte
	var resp [24]byte
	for {
		if n, err := syscall.Read(3, req[:]); n != len(req) || err != nil {
			return
		}
		a := now()
		ts := syscall.NsecToTimespec(int64(delay) * 1000)
		syscall.Nanosleep(&ts, nil)
		b := now()
		binary.LittleEndian.PutUint64(resp[0:], uint64(a))
		binary.LittleEndian.PutUint64(resp[8:], uint64(b))
		binary.LittleEndian.PutUint64(resp[16:], uint64(tid))
		syscall.Write(3, resp[:])
	}
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		fmt.Fprintln(os.Stderr, "usage: gohandoff N DELAY_US CPU_US OUT")
		os.Exit(2)
	}
	return n
}

func main() {
	if len(os.Args) == 3 && os.Args[1] == "backend" {
		backend(atoi(os.Args[2]))
		return
	}
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: gohandoff N DELAY_US CPU_US OUT")
		os.Exit(2)
	}
	n, cpu := atoi(os.Args[1]), atoi(os.Args[3])
	atoi(os.Args[2])
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		panic(err)
	}
	cmd := exec.Command(os.Args[0], "backend", os.Args[2])
	cmd.ExtraFiles = []*os.File{os.NewFile(uintptr(fds[1]), "backend")}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		panic(err)
	}
	syscall.Close(fds[1])
	f := os.NewFile(uintptr(fds[0]), "worker")
	conn, err := net.FileConn(f) // a copy, non-blocking, the netpoller's
	if err != nil {
		panic(err)
	}
	f.Close()
	out, err := os.Create(os.Args[4])
	if err != nil {
		panic(err)
	}
	w := bufio.NewWriter(out)
	work, answer := make(chan *times), make(chan *times)
	go func() { // work
		var resp [24]byte
		for t := range work {
			t.WGot, t.WorkGoID = now(), goid()
			spin(cpu)
			t.WAsk = now()
			conn.Write(make([]byte, 8))
			if _, err := ioReadFull(conn, resp[:]); err != nil {
				panic(err)
			}
			t.WReply = now()
			t.BSleep = int64(binary.LittleEndian.Uint64(resp[0:]))
			t.BWoke = int64(binary.LittleEndian.Uint64(resp[8:]))
			t.BackendTID = int64(binary.LittleEndian.Uint64(resp[16:]))
			spin(cpu)
			t.WDone = now()
			answer <- t
		}
	}()
	done := make(chan struct{})
	go func() { // handle
		enc := json.NewEncoder(w)
		for i := 0; i < n; i++ {
			t := &times{SpanID: fmt.Sprintf("%016x", i+1), TraceID: fmt.Sprintf("%032x", i+1), HandleGoID: goid()}
			pprof.Do(context.Background(), pprof.Labels("trace_id", t.TraceID, "span_id", t.SpanID), func(context.Context) {
				t.Start = now()
				work <- t
				<-answer
				t.End = now()
			})
			enc.Encode(t)
		}
		close(done)
	}()
	<-done
	close(work)
	w.Flush()
	out.Close()
	conn.Close()
	cmd.Wait()
}

func ioReadFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
