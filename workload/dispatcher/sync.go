package dispatcher

import (
	"runtime"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	futexWaitPrivate = 0 | 128 // FUTEX_WAIT | FUTEX_PRIVATE_FLAG
	futexWakePrivate = 1 | 128
)

//go:noinline
func futexWait(addr *atomic.Uint32, val uint32) {
	// Syscall (not RawSyscall) so the Go scheduler may run others meanwhile.
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWaitPrivate, uintptr(val), 0, 0, 0)
}

// futexWake wakes up to n waiters; it returns how many it woke.
//
//go:noinline
func futexWake(addr *atomic.Uint32, n int) int {
	r, _, errno := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWakePrivate, uintptr(n), 0, 0, 0)
	if errno != 0 {
		return 0
	}
	return int(r)
}

// Monitor is the dispatcher monitor: a lock whose waiters sleep in the
// kernel (futex), as threads contending an inflated JVM monitor do, so a
// wait for it is off-CPU time with the waiter's stack.
type Monitor struct {
	state atomic.Uint32 // 0 free, 1 held, 2 held with waiters
	waits atomic.Uint64 // acquisitions that had to sleep
	// short is how far HotSpot's _SpinDuration is below SpinLimit (its
	// starting value): the zero value is a new monitor's.
	short atomic.Int32
}

// Enter acquires the monitor.
//
//go:noinline
func (m *Monitor) Enter() {
	if m.state.CompareAndSwap(0, 1) {
		return
	}
	m.enterSlow()
}

// HotSpot's spin knobs (objectMonitor.cpp): a contended enter tries a few
// times (PreSpin), then probes the owner up to _SpinDuration times, which
// starts at SpinLimit, grows by Bonus after a spin that won (from at least
// Poverty) and shrinks by Penalty after one that failed; a thread woken
// from its park spins again before it parks anew (SpinAfterFutile).
const (
	spinLimit   = 5000
	spinBonus   = 100
	spinPenalty = 200
	spinPoverty = 1000
	preSpin     = 10
)

//go:noinline
func (m *Monitor) enterSlow() {
	// Once it has slept, a thread takes the monitor marked as having
	// waiters, so that its exit wakes any other sleeper.
	var held uint32 = 1
	for !m.trySpin(held) {
		if m.state.Swap(2) == 0 {
			break
		}
		held = 2
		futexWait(&m.state, 2)
	}
	if held == 2 {
		m.waits.Add(1)
	}
}

// trySpin is ObjectMonitor::TrySpin: it reports whether it took the
// monitor, leaving it in state held.
func (m *Monitor) trySpin(held uint32) bool {
	for i := 0; i <= preSpin; i++ {
		if m.state.CompareAndSwap(0, held) {
			m.spinWon()
			return true
		}
	}
	for ctr := spinLimit - m.short.Load(); ctr > 0; ctr-- {
		if m.state.Load() == 0 {
			if m.state.CompareAndSwap(0, held) {
				m.spinWon()
				return true
			}
			return false // lost the race to another thread: HotSpot stops spinning
		}
	}
	m.short.Store(min(m.short.Load()+spinPenalty, spinLimit))
	return false
}

func (m *Monitor) spinWon() {
	if d := spinLimit - m.short.Load(); d < spinLimit {
		m.short.Store(spinLimit - min(max(d, spinPoverty)+spinBonus, spinLimit))
	}
}

// Exit releases the monitor and wakes one waiter if any sleeps.
//
//go:noinline
func (m *Monitor) Exit() {
	if m.state.Swap(0) == 2 {
		futexWake(&m.state, 1)
	}
}

// TryEnter acquires the monitor if it is free.
func (m *Monitor) TryEnter() bool {
	return m.state.CompareAndSwap(0, 1)
}

// Held reports whether any thread holds the monitor.
func (m *Monitor) Held() bool { return m.state.Load() != 0 }

// Waits is the number of acquisitions that slept.
func (m *Monitor) Waits() uint64 { return m.waits.Load() }

// mpsc is Vyukov's multi-producer single-consumer queue: push from any
// thread, pop from the owning thread only.
type mpsc[T any] struct {
	head atomic.Pointer[node[T]]
	tail *node[T]
	size atomic.Int64
}

type node[T any] struct {
	next atomic.Pointer[node[T]]
	val  T
}

func newMPSC[T any]() *mpsc[T] {
	q := &mpsc[T]{}
	stub := &node[T]{}
	q.head.Store(stub)
	q.tail = stub
	return q
}

func (q *mpsc[T]) push(v T) {
	n := &node[T]{val: v}
	q.size.Add(1)
	prev := q.head.Swap(n)
	prev.next.Store(n)
}

func (q *mpsc[T]) pop() (T, bool) {
	next := q.tail.next.Load()
	if next == nil {
		var zero T
		return zero, false
	}
	q.tail = next
	v := next.val
	var zero T
	next.val = zero
	q.size.Add(-1)
	return v, true
}

func (q *mpsc[T]) nonEmpty() bool { return q.size.Load() > 0 }

// Notifier lets one thread sleep in the kernel (futex) until another
// notifies it. Take a token, check the condition, then Wait(token): a
// Notify after the token was taken makes Wait return at once.
type Notifier struct {
	seq     atomic.Uint32
	waiters atomic.Int32
}

func (n *Notifier) Token() uint32 { return n.seq.Load() }

//go:noinline
func (n *Notifier) Wait(token uint32) {
	n.waiters.Add(1)
	futexWait(&n.seq, token)
	n.waiters.Add(-1)
}

// Notify wakes the waiter: called, whether one had announced its sleep
// (a futex wake call); woke, whether the kernel found it asleep (the call
// finds none when the waiter has announced but not yet slept).
func (n *Notifier) Notify() (called, woke bool) {
	n.seq.Add(1)
	if n.waiters.Load() > 0 {
		return true, futexWake(&n.seq, 1) > 0
	}
	return false, false
}

// BlockingQueue is an executor's task queue: take sleeps in the kernel
// (futex) while the queue is empty, like LinkedBlockingQueue.take.
type BlockingQueue[T any] struct {
	q *mpsc[T]
	n Notifier
}

func NewBlockingQueue[T any]() *BlockingQueue[T] { return &BlockingQueue[T]{q: newMPSC[T]()} }

// Put adds v and wakes the taker if it sleeps (Notifier.Notify).
func (b *BlockingQueue[T]) Put(v T) (called, woke bool) {
	b.q.push(v)
	return b.n.Notify()
}

// Take returns the next element, sleeping while there is none. Only one
// thread may take.
//
//go:noinline
func (b *BlockingQueue[T]) Take() T {
	for {
		tok := b.n.Token()
		if v, ok := b.q.pop(); ok {
			return v
		}
		b.n.Wait(tok)
	}
}

// Poll returns the next element if there is one.
func (b *BlockingQueue[T]) Poll() (T, bool) { return b.q.pop() }

// Len is the number of queued elements.
func (b *BlockingQueue[T]) Len() int { return int(b.q.size.Load()) }

// StartThread runs fn on its own OS thread named name (prctl), so
// profiles show broker threads by name. The thread ends with fn.
func StartThread(name string, fn func()) {
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with fn
		SetThreadName(name)
		if p := pinning.Load(); p != nil {
			set := p.client
			if IsBrokerThread(name) {
				set = p.broker
			}
			unix.SchedSetaffinity(0, &set)
		}
		fn()
	}()
}

// cpuSplit keeps broker and client threads on CPUs of their own while a
// run pins them (Config.Pin): the clients then cannot take the broker's
// CPU time, and the broker's CPU per message sets the throughput.
type cpuSplit struct{ broker, client unix.CPUSet }

var pinning atomic.Pointer[cpuSplit]

// splitCPUs gives the broker the first half of the CPUs this process may
// use and the clients the rest; nil with fewer than 2.
func splitCPUs() *cpuSplit {
	var all unix.CPUSet
	if err := unix.SchedGetaffinity(0, &all); err != nil || all.Count() < 2 {
		return nil
	}
	var cpus []int
	for i := 0; i < len(all)*64; i++ {
		if all.IsSet(i) {
			cpus = append(cpus, i)
		}
	}
	s := &cpuSplit{}
	for i, c := range cpus {
		if i < len(cpus)/2 {
			s.broker.Set(c)
		} else {
			s.client.Set(c)
		}
	}
	return s
}

// SetThreadName names the calling OS thread (15 bytes at most).
func SetThreadName(name string) {
	b := make([]byte, 16)
	copy(b[:15], name)
	unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&b[0])), 0, 0, 0)
}
