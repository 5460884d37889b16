package dispatcher

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Consumers with a MessageListener, as Pulsar's Java client runs them
// (pulsar-client .../impl/ConsumerImpl.java messageReceived and
// executeNotifyCallback, ConsumerBase.java triggerListener and
// callMessageListener, PulsarClientImpl.java's executor providers):
//
//   - the client IO loop hands each message to the consumer's pinned
//     internal executor (pulsar-client-internal, numIoThreads threads),
//     which puts it in the receiver queue, then asks the same executor to
//     trigger the listener;
//   - the trigger moves messages from the receiver queue to the listener's
//     external executor (pulsar-external-listener, numListenerThreads):
//     the consumer's pinned thread, or for Key_Shared the thread chosen by
//     the message's key (ExecutorProvider.getExecutor(key)), so each key
//     keeps its order while keys run in parallel.
//
// The kernel keeps 15 bytes of a thread's name, so the pools' threads are
// pulsar-intern-N and pulsar-extern-N (a JVM's pulsar-client-internal-1-1
// reads pulsar-client-i there).

// listenerPools are the client's internal and external executors.
type listenerPools struct {
	internal []*Executor
	external []*listenerThread
	next     atomic.Uint32 // round robin, as ExecutorProvider.getExecutor()

	handoffs atomic.Uint64 // tasks handed between the two pools
	wakes    atomic.Uint64 // of them, hand-offs that called futex wake
}

// listenerThread is one external executor and what its listener calls
// record.
type listenerThread struct {
	exec *Executor
	e2e  []*hdrhistogram.Histogram // per subscription, µs; this thread only
}

// ListenerThreads matches the names of the listener pools' threads.
const ListenerThreads = `^pulsar-(intern|extern)-\d`

func newListenerPools(internal, external, subs int) *listenerPools {
	p := &listenerPools{}
	for i := 0; i < internal; i++ {
		p.internal = append(p.internal, NewExecutor(fmt.Sprintf("pulsar-intern-%d", i)))
	}
	for i := 0; i < external; i++ {
		t := &listenerThread{exec: NewExecutor(fmt.Sprintf("pulsar-extern-%d", i))}
		for j := 0; j < subs; j++ {
			t.e2e = append(t.e2e, newHist())
		}
		p.external = append(p.external, t)
	}
	for _, e := range p.internal {
		e.Start()
	}
	for _, t := range p.external {
		t.exec.Start()
	}
	return p
}

// shutdown stops the internal executors, then the external ones, so the
// histograms can be read.
func (p *listenerPools) shutdown() {
	for _, e := range p.internal {
		e.Shutdown()
	}
	for _, t := range p.external {
		t.exec.Shutdown()
	}
}

// flowControl is a consumer's permits and grouped acknowledgements
// (ConsumerImpl's availablePermits and its acknowledgments tracker).
type flowControl struct {
	c       *clientConsumer
	half    int64        // receiverQueueSize / 2: the Flow threshold
	permits atomic.Int64 // availablePermits
	ackMu   sync.Mutex
	acks    []uint64
}

// listenerConsumer is the client side of one consumer with a listener.
type listenerConsumer struct {
	flowControl
	cl        *Client
	variant   listenerVariant
	keyShared bool
	pools     *listenerPools
	internal  *Executor       // internalPinnedExecutor
	external  *listenerThread // externalPinnedExecutor

	queue    []delivery   // incomingMessages: internal executor only
	inFlight atomic.Int32 // executorQueueSize (baseline)
}

// pin returns the next internal and external executors, round robin.
func (p *listenerPools) pin() (*Executor, *listenerThread) {
	n := int(p.next.Add(1) - 1)
	return p.internal[n%len(p.internal)], p.external[n%len(p.external)]
}

func (cl *Client) newListenerConsumer(c *clientConsumer) *listenerConsumer {
	in, ext := cl.pools.pin()
	return &listenerConsumer{flowControl: flowControl{c: c, half: int64(max(cl.cfg.receiverQueue/2, 1))},
		cl: cl, variant: cl.listener, keyShared: cl.subs[c.sub].typ == KeyShared, pools: cl.pools,
		internal: in, external: ext}
}

// messageReceived runs on the client IO loop (ConsumerImpl.messageReceived).
//
//go:noinline
func (lc *listenerConsumer) messageReceived(d delivery) {
	lc.internal.Execute(func() { lc.queue = append(lc.queue, d) }) // executeNotifyCallback
	lc.tryTriggerListener(false)
}

// tryTriggerListener asks the internal executor to run the variant's
// trigger; fromPool says it is handed over from the external pool.
//
//go:noinline
func (lc *listenerConsumer) tryTriggerListener(fromPool bool) {
	called, _ := lc.internal.Execute(func() { lc.variant.triggerListener(lc) })
	if fromPool {
		lc.pools.count(called)
	}
}

func (p *listenerPools) count(woke bool) {
	p.handoffs.Add(1)
	if woke {
		p.wakes.Add(1)
	}
}

// poll takes the next message of the receiver queue (internalReceive(0)).
func (lc *listenerConsumer) poll() (delivery, bool) {
	if len(lc.queue) == 0 {
		return delivery{}, false
	}
	d := lc.queue[0]
	lc.queue[0] = delivery{}
	lc.queue = lc.queue[1:]
	if len(lc.queue) == 0 {
		lc.queue = lc.queue[:0:0]
	}
	return d, true
}

// externalFor is the external executor that runs d's listener call.
func (lc *listenerConsumer) externalFor(d delivery) *listenerThread {
	return lc.pools.externalFor(lc.keyShared, lc.external, d)
}

// externalFor is pinned, or for Key_Shared the thread of d's key.
func (p *listenerPools) externalFor(keyShared bool, pinned *listenerThread, d delivery) *listenerThread {
	if keyShared && len(d.body) >= 16 {
		key := binary.BigEndian.Uint32(d.body[12:])
		return p.external[StickyKeyHash(key)%uint32(len(p.external))]
	}
	return pinned
}

// handToListener hands d to its external executor, which runs call.
//
//go:noinline
func (lc *listenerConsumer) handToListener(t *listenerThread, call func()) {
	called, _ := t.exec.Execute(call)
	lc.pools.count(called)
}

// increaseAvailablePermits returns n permits and sends a Flow once half
// the receiver queue is free (ConsumerImpl.increaseAvailablePermits).
//
//go:noinline
func (f *flowControl) increaseAvailablePermits(n int64) {
	v := f.permits.Add(n)
	for v >= f.half {
		if f.permits.CompareAndSwap(v, 0) {
			f.flushAcks()
			f.c.sendFlow(int(v))
			return
		}
		v = f.permits.Load()
	}
}

// received is the application's MessageListener.received: verify the
// message, record its end-to-end latency, acknowledge it through f.
//
//go:noinline
func (cl *Client) received(t *listenerThread, f *flowControl, d delivery) {
	b := parseBody(d.body)
	sub := f.c.sub
	cl.subs[sub].record(d.entryID, b)
	if b.valid {
		t.e2e[sub].RecordValue(max((time.Now().UnixNano()-b.publishNs)/1000, 1))
	}
	f.ackMu.Lock()
	f.acks = append(f.acks, d.entryID)
	full := len(f.acks) >= 100
	f.ackMu.Unlock()
	if full {
		f.flushAcks()
	}
}

// flushAcks sends the acknowledgements grouped so far.
func (f *flowControl) flushAcks() {
	f.ackMu.Lock()
	acks := f.acks
	f.acks = nil
	f.ackMu.Unlock()
	if len(acks) > 0 {
		f.c.cc.writeDirect(ackFrame(f.c.id, acks))
	}
}

// listenerBaseline is the client after PR 13023 and before PR 15162: one
// message at a time per consumer (executorQueueSize < 1), permits returned
// as it leaves the receiver queue, and the external thread hands the next
// trigger back to the internal executor after each listener call.
type listenerBaseline struct{}

func (listenerBaseline) Name() string { return "baseline" }
func (listenerBaseline) Description() string {
	return "one message in flight per consumer, internal → external → internal executor per message (after #13023)"
}

//go:noinline
func (listenerBaseline) triggerListener(lc *listenerConsumer) {
	if lc.inFlight.Load() >= 1 {
		return
	}
	d, ok := lc.poll()
	if !ok {
		return
	}
	lc.increaseAvailablePermits(1) // messageProcessed
	lc.inFlight.Add(1)
	t := lc.externalFor(d)
	lc.handToListener(t, func() { lc.callMessageListenerBaseline(t, d) })
}

//go:noinline
func (lc *listenerConsumer) callMessageListenerBaseline(t *listenerThread, d delivery) {
	lc.cl.received(t, &lc.flowControl, d)
	lc.inFlight.Add(-1)
	lc.tryTriggerListener(true)
}

// listenerCandidate is PR 15162: the trigger moves every queued message to
// the external executor's queue without returning permits; the listener
// call returns the permit just before the application sees the message.
type listenerCandidate struct{}

func (listenerCandidate) Name() string { return "candidate" }
func (listenerCandidate) Description() string {
	return "messages drained to the listener executors' queues, permits returned before each listener call (#15162)"
}

//go:noinline
func (listenerCandidate) triggerListener(lc *listenerConsumer) {
	for {
		d, ok := lc.poll()
		if !ok {
			return
		}
		t := lc.externalFor(d)
		lc.handToListener(t, func() { lc.callMessageListener(t, d) })
	}
}

//go:noinline
func (lc *listenerConsumer) callMessageListener(t *listenerThread, d delivery) {
	lc.increaseAvailablePermits(1)
	lc.cl.received(t, &lc.flowControl, d)
}
