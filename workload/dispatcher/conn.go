package dispatcher

import (
	"sync"

	"golang.org/x/sys/unix"
)

// Executor is a single-threaded executor (the managed-ledger executor,
// a topic worker): tasks queue in a BlockingQueue and run in order.
type Executor struct {
	name string
	q    *BlockingQueue[func()]
	done chan struct{}
}

func NewExecutor(name string) *Executor {
	return &Executor{name: name, q: NewBlockingQueue[func()](), done: make(chan struct{})}
}

func (e *Executor) Start() { StartThread(e.name, e.run) }

// Execute queues a task; it reports whether the thread had announced its
// sleep (called: a futex wake, as LinkedBlockingQueue.offer's
// signalNotEmpty) and whether the kernel found it asleep (woke).
func (e *Executor) Execute(task func()) (called, woke bool) { return e.q.Put(task) }

func (e *Executor) run() {
	defer close(e.done)
	for {
		task := e.q.Take()
		if task == nil {
			return
		}
		task()
	}
}

// Shutdown runs what is queued, then stops the thread.
func (e *Executor) Shutdown() {
	e.q.Put(nil)
	<-e.done
}

// conn is one end of a socketpair. On the broker side the loop owns it:
// reads until EAGAIN, writes buffered and flushed after the loop's current
// tasks, with EPOLLOUT when the socket is full. On the client side other
// threads write directly (blocking, under a mutex) and the loop only reads.
type conn struct {
	fd      int
	loop    *EventLoop
	rd      frameReader
	readBuf []byte
	spare   []byte
	onFrame func(typ byte, body []byte)
	onBatch func() // after the frames of one read, if set

	out          []byte // pending output, loop thread only
	flushPending bool
	writeWait    bool // EPOLLOUT wanted: the socket was full
	readOff      bool // auto-read off: EPOLLIN cleared (loop thread only)

	wmu sync.Mutex // client side: serializes direct writes
}

func newConn(fd int, loop *EventLoop, onFrame func(byte, []byte)) *conn {
	return &conn{fd: fd, loop: loop, onFrame: onFrame, readBuf: make([]byte, 64<<10), spare: make([]byte, 0, 64<<10)}
}

// OnReadable reads everything available and hands complete frames on.
func (c *conn) OnReadable() {
	for {
		n, _, err := unix.Recvfrom(c.fd, c.readBuf, unix.MSG_DONTWAIT)
		if n <= 0 || err != nil {
			break
		}
		c.rd.buf = append(c.rd.buf, c.readBuf[:n]...)
		for {
			typ, body, ok := c.rd.next()
			if !ok {
				break
			}
			c.onFrame(typ, body)
		}
		// Keep the partial frame at the front of a reused buffer.
		c.spare = append(c.spare[:0], c.rd.buf...)
		c.rd.buf, c.spare = c.spare, c.rd.buf[:0]
		// Auto-read turned off while handling these frames: the read
		// in hand is done, no further one (Netty's semantics).
		if n < len(c.readBuf) || c.readOff {
			break
		}
	}
	if c.onBatch != nil {
		c.onBatch()
	}
}

// write queues a frame on the loop's thread; it is flushed after the
// tasks already queued, so writes of one task batch share a syscall.
func (c *conn) write(frame []byte) {
	c.out = append(c.out, frame...)
	if !c.flushPending {
		c.flushPending = true
		c.loop.Execute(c.loop, c.flush)
	}
}

//go:noinline
func (c *conn) flush() {
	c.flushPending = false
	for len(c.out) > 0 {
		n, err := unix.Write(c.fd, c.out)
		if n > 0 {
			c.out = c.out[n:]
			continue
		}
		if err == unix.EAGAIN && !c.writeWait {
			c.writeWait = true
			c.loop.setInterest(c.fd, !c.readOff, true)
		}
		break
	}
	if len(c.out) == 0 {
		c.out = c.out[:0:0]
	}
}

func (c *conn) OnWritable() {
	c.flush()
	if len(c.out) == 0 && c.writeWait {
		c.writeWait = false
		c.loop.setInterest(c.fd, !c.readOff, false)
	}
}

// setAutoRead turns reading the connection on or off (Netty's
// setAutoRead: EPOLLIN set or cleared); on the loop's thread.
//
//go:noinline
func (c *conn) setAutoRead(on bool) {
	if c.readOff == !on {
		return
	}
	c.readOff = !on
	c.loop.setInterest(c.fd, on, c.writeWait)
}

// writeDirect writes a frame from any thread (client side).
func (c *conn) writeDirect(frame []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	for len(frame) > 0 {
		n, err := unix.Write(c.fd, frame)
		if err != nil {
			return err
		}
		frame = frame[n:]
	}
	return nil
}

// socketPair returns a broker end (non-blocking) and a client end.
func socketPair() (broker, client int, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, -1, err
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return -1, -1, err
	}
	for _, fd := range fds {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 1<<20)
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	}
	return fds[0], fds[1], nil
}
