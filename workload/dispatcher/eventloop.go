package dispatcher

import (
	"container/heap"
	"fmt"
	"math"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Wake-up states of EventLoop.nextWakeup, as in Netty's epoll loop.
const (
	awake = int64(-1)            // the loop is running
	none  = int64(math.MaxInt64) // blocked with no deadline
)

// FdHandler handles a file descriptor registered with an EventLoop. Its
// methods run on the loop's thread.
type FdHandler interface {
	OnReadable()
	OnWritable()
}

// EventLoop is a model of Netty 4.2's SingleThreadIoEventLoop with an
// EpollIoHandler (transport-classes-epoll/.../EpollIoHandler.java,
// transport/.../SingleThreadIoEventLoop.java): epoll on an eventfd, a
// timerfd and sockets; an MPSC task queue; and the AWAKE/NONE/deadline
// state that makes execute() write the eventfd exactly when work is handed
// to a loop that sleeps in epoll_wait. As in 4.2, the eventfd is
// registered edge-triggered and never read (pendingWakeup remembers a
// write not yet seen), and each turn runs the ready I/O, then up to
// maxTasksPerRun tasks: no ioRatio (that was 4.1's EpollEventLoop).
type EventLoop struct {
	name       string
	epfd       int
	efd        int
	tfd        int
	tasks      *mpsc[func()]
	nextWakeup atomic.Int64
	handlers   map[int32]FdHandler
	timers     timerHeap // loop thread only
	armed      int64     // deadline the timerfd is armed for
	// pendingWakeup: an eventfd write may still be on its way to epoll,
	// so the next wait will return at once (loop thread only).
	pendingWakeup bool
	stopped       atomic.Bool
	done          chan struct{}

	// Counters, read by the run report.
	Wakeups atomic.Uint64 // eventfd writes by other threads
}

// NewEventLoop creates a loop; Start runs it on a thread named name.
func NewEventLoop(name string) (*EventLoop, error) {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("epoll_create for %s: %w", name, err)
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("eventfd for %s: %w", name, err)
	}
	tfd, err := unix.TimerfdCreate(unix.CLOCK_MONOTONIC, unix.TFD_CLOEXEC|unix.TFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		unix.Close(efd)
		return nil, fmt.Errorf("timerfd for %s: %w", name, err)
	}
	l := &EventLoop{name: name, epfd: epfd, efd: efd, tfd: tfd, tasks: newMPSC[func()](),
		handlers: map[int32]FdHandler{}, done: make(chan struct{})}
	l.nextWakeup.Store(awake)
	for _, fd := range []int{efd, tfd} {
		// Edge-triggered: one notification per write, no read needed.
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(fd)}
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			l.closeFds()
			return nil, fmt.Errorf("epoll_ctl for %s: %w", name, err)
		}
	}
	return l, nil
}

func (l *EventLoop) Name() string { return l.name }

// Start runs the loop on its own named OS thread.
func (l *EventLoop) Start() { StartThread(l.name, l.run) }

// Execute hands a task to the loop. from is the loop the caller runs on
// (nil for other threads): a loop handing work to itself never wakes.
//
//go:noinline
func (l *EventLoop) Execute(from *EventLoop, task func()) {
	l.tasks.push(task)
	if from != l {
		l.wakeup()
	}
}

// wakeup writes the loop's eventfd unless the loop is already awake.
//
//go:noinline
func (l *EventLoop) wakeup() {
	if l.nextWakeup.Swap(awake) != awake {
		l.Wakeups.Add(1)
		eventfdWrite(l.efd)
	}
}

//go:noinline
func eventfdWrite(fd int) {
	one := uint64(1)
	unix.Write(fd, (*[8]byte)(unsafe.Pointer(&one))[:])
}

// Schedule runs task after d. Call it on the loop's thread (or through
// Execute).
func (l *EventLoop) Schedule(d time.Duration, task func()) {
	heap.Push(&l.timers, timer{at: nanotime() + int64(d), task: task})
}

// Register adds fd to the loop's epoll set; call on the loop's thread or
// before Start.
func (l *EventLoop) Register(fd int, h FdHandler) error {
	l.handlers[int32(fd)] = h
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	return unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev)
}

// RegisterAsync registers fd from any thread, through the loop's task
// queue, and waits for it.
func (l *EventLoop) RegisterAsync(fd int, h FdHandler) error {
	errc := make(chan error, 1)
	l.Execute(nil, func() { errc <- l.Register(fd, h) })
	return <-errc
}

// setInterest sets fd's epoll interest: EPOLLIN when read (Netty's
// auto-read), EPOLLOUT when write; on the loop's thread.
//
//go:noinline
func (l *EventLoop) setInterest(fd int, read, write bool) {
	ev := unix.EpollEvent{Fd: int32(fd)}
	if read {
		ev.Events |= unix.EPOLLIN
	}
	if write {
		ev.Events |= unix.EPOLLOUT
	}
	unix.EpollCtl(l.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
}

// Deregister removes fd; on the loop's thread.
func (l *EventLoop) Deregister(fd int) {
	delete(l.handlers, int32(fd))
	unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, fd, nil)
}

// Shutdown stops the loop and waits for it.
func (l *EventLoop) Shutdown() {
	l.stopped.Store(true)
	l.wakeup()
	<-l.done
	l.closeFds()
}

func (l *EventLoop) closeFds() {
	unix.Close(l.epfd)
	unix.Close(l.efd)
	unix.Close(l.tfd)
}

// maxTasksPerRun is SingleThreadIoEventLoop.DEFAULT_MAX_TASKS_PER_RUN.
const maxTasksPerRun = 4096

func (l *EventLoop) run() {
	defer close(l.done)
	events := make([]unix.EpollEvent, 128)
	for !l.stopped.Load() {
		n := l.runIo(events)
		l.processReady(events[:max(n, 0)])
		l.runExpiredTimers()
		l.runAllTasks(maxTasksPerRun)
	}
	for l.runAllTasks(maxTasksPerRun) {
	}
}

// runIo is EpollIoHandler.run: poll without blocking while tasks wait,
// otherwise publish the next deadline and sleep in epoll_wait.
func (l *EventLoop) runIo(events []unix.EpollEvent) int {
	if l.tasks.nonEmpty() || l.stopped.Load() {
		return epollWaitNow(l.epfd, events)
	}
	if l.pendingWakeup {
		// A wake-up is on its way: this wait returns at once (1 s
		// safeguard, as Netty's epollWaitTimeboxed).
		if n := epollWaitTimeout(l.epfd, events, 1000); n > 0 {
			return n
		}
		l.pendingWakeup = false
	}
	deadline := l.timers.next()
	l.nextWakeup.Store(deadline)
	n := 0
	if !l.tasks.nonEmpty() && !l.stopped.Load() {
		l.armTimer(deadline)
		n = epollWait(l.epfd, events)
	}
	if l.nextWakeup.Load() == awake || l.nextWakeup.Swap(awake) == awake {
		l.pendingWakeup = true // woken by a task hand-off
	}
	return n
}

// epollWait blocks: the loop is asleep here.
//
//go:noinline
func epollWait(epfd int, events []unix.EpollEvent) int {
	return epollWaitTimeout(epfd, events, -1)
}

//go:noinline
func epollWaitTimeout(epfd int, events []unix.EpollEvent, ms int) int {
	n, err := unix.EpollWait(epfd, events, ms)
	if err != nil {
		return 0
	}
	return n
}

//go:noinline
func epollWaitNow(epfd int, events []unix.EpollEvent) int {
	n, err := unix.EpollWait(epfd, events, 0)
	if err != nil {
		return 0
	}
	return n
}

func (l *EventLoop) armTimer(deadline int64) {
	if deadline == l.armed {
		return
	}
	l.armed = deadline
	var spec unix.ItimerSpec
	if deadline != none {
		spec.Value = unix.NsecToTimespec(max(deadline, 1))
	}
	unix.TimerfdSettime(l.tfd, unix.TFD_TIMER_ABSTIME, &spec, nil)
}

func (l *EventLoop) processReady(events []unix.EpollEvent) {
	for _, ev := range events {
		switch int(ev.Fd) {
		case l.efd:
			l.pendingWakeup = false // edge-triggered: nothing to read
		case l.tfd:
			l.armed = 0
		default:
			h := l.handlers[ev.Fd]
			if h == nil {
				continue
			}
			if ev.Events&(unix.EPOLLIN|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
				h.OnReadable()
			}
			if ev.Events&unix.EPOLLOUT != 0 {
				if h = l.handlers[ev.Fd]; h != nil {
					h.OnWritable()
				}
			}
		}
	}
}

// runAllTasks runs up to max queued tasks; it reports whether any ran.
func (l *EventLoop) runAllTasks(max int) bool {
	ran := 0
	for ran < max {
		task, ok := l.tasks.pop()
		if !ok {
			break
		}
		task()
		ran++
	}
	return ran > 0
}

func (l *EventLoop) runExpiredTimers() {
	now := nanotime()
	for len(l.timers) > 0 && l.timers[0].at <= now {
		t := heap.Pop(&l.timers).(timer)
		t.task()
	}
}

type timer struct {
	at   int64
	task func()
}

type timerHeap []timer

func (h timerHeap) Len() int           { return len(h) }
func (h timerHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h timerHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *timerHeap) Push(x any)        { *h = append(*h, x.(timer)) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}

func (h timerHeap) next() int64 {
	if len(h) == 0 {
		return none
	}
	return h[0].at
}

// nanotime is CLOCK_MONOTONIC, the timerfd's clock, read through Go's
// vDSO clock from a fixed origin instead of a syscall per call.
func nanotime() int64 { return monoBase + int64(time.Since(monoStart)) }

var monoStart, monoBase = func() (time.Time, int64) {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Now(), ts.Nano()
}()
