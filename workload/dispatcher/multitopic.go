package dispatcher

import (
	"container/heap"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Multi-topic consumers, as Pulsar's Java client runs them
// (pulsar-client .../impl/MultiTopicsConsumerImpl.java
// startReceivingMessages, receiveMessageFromConsumer and messageReceived;
// ConsumerImpl's receiveAsync and batchReceiveAsync; ConsumerBase.java
// pendingBatchReceiveTask and doPendingBatchReceiveTask): a consumer of a
// partitioned topic is a MultiTopicsConsumerImpl over one internal
// ConsumerImpl per partition. Its receive loop asks each internal consumer
// for messages, on the internal executor: after a receive that returned
// messages a batch receive (for internal consumers: half the receiver
// queue, or a 1 ms timeout on the client's HashedWheelTimer), otherwise a
// receiveAsync that completes on the next message. The messages go to the
// multi-topic consumer's queue and on to its listener (ConsumerBase
// triggerListener, as PR 15162 left it).

// batchReceiveTimeout is the internal consumers' batch receive timeout.
const batchReceiveTimeout = time.Millisecond

// batchVariant decides, after a receive from an internal consumer,
// whether the next one is a batch receive (seed 002).
type batchVariant interface {
	Name() string
	Description() string
	batchNext(ic *internalConsumer, received int) bool
}

func init() {
	registerSide(ChangeBatch, batchSide{batchBaseline{}})
	registerSide(ChangeBatch, batchSide{batchCandidate{}})
}

// batchBaseline: a batch receive after every receive that returned
// messages (#16336).
type batchBaseline struct{}

func (batchBaseline) Name() string { return "baseline" }
func (batchBaseline) Description() string {
	return "a batch receive (1 ms timeout) after every receive that returned messages (#16336)"
}
func (batchBaseline) batchNext(ic *internalConsumer, received int) bool { return received > 0 }

// batchCandidate (PR 26966): a batch receive only when the internal
// consumer has queued messages; otherwise receiveAsync.
type batchCandidate struct{}

func (batchCandidate) Name() string { return "candidate" }
func (batchCandidate) Description() string {
	return "a batch receive only when the internal consumer has queued messages (#26966)"
}
func (batchCandidate) batchNext(ic *internalConsumer, received int) bool {
	return received > 0 && ic.queued.Load() > 0
}

// wheelTimer is the client's HashedWheelTimer (pulsar-timer): a thread
// that wakes every tick (1 ms), takes the timeouts added since, and runs
// the expired ones on its own thread.
type wheelTimer struct {
	tick    int64 // ns
	added   *mpsc[timer]
	pending timerHeap // timer thread only
	stopped atomic.Bool
	done    chan struct{}
}

func newWheelTimer(tick time.Duration) *wheelTimer {
	w := &wheelTimer{tick: int64(tick), added: newMPSC[timer](), done: make(chan struct{})}
	StartThread("pulsar-timer", w.run)
	return w
}

// newTimeout runs task on the timer thread after d (HashedWheelTimer.newTimeout).
func (w *wheelTimer) newTimeout(d time.Duration, task func()) {
	w.added.push(timer{at: nanotime() + int64(d), task: task})
}

func (w *wheelTimer) run() {
	defer close(w.done)
	next := nanotime()
	for !w.stopped.Load() {
		next += w.tick
		if now := nanotime(); next > now {
			waitForNextTick(next)
		}
		for {
			t, ok := w.added.pop()
			if !ok {
				break
			}
			heap.Push(&w.pending, t)
		}
		now := nanotime()
		for len(w.pending) > 0 && w.pending[0].at <= now {
			heap.Pop(&w.pending).(timer).task()
		}
	}
}

// waitForNextTick sleeps until the tick's deadline (CLOCK_MONOTONIC).
//
//go:noinline
func waitForNextTick(deadline int64) {
	ts := unix.NsecToTimespec(deadline)
	unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil)
}

func (w *wheelTimer) stop() {
	w.stopped.Store(true)
	<-w.done
}

// opBatchReceive is a batch receive waiting for messages or its timeout.
type opBatchReceive struct {
	created int64
	done    func([]delivery)
}

// internalConsumer is a multi-topic consumer's ConsumerImpl for one
// partition. Its queue and pending receives belong to its internal
// executor.
type internalConsumer struct {
	flowControl
	mt       *multiTopicConsumer
	exec     *Executor // internalPinnedExecutor
	maxBatch int       // the batch receive policy: half the receiver queue

	queue          []delivery   // incomingMessages; exec only
	queued         atomic.Int32 // len(queue), read by the receive loop
	pendingReceive func([]delivery)
	pendingBatch   *opBatchReceive
	timeoutArmed   bool // batchReceiveTimeout != nil
}

// messageReceived runs on the client IO loop (ConsumerImpl.messageReceived
// → executeNotifyCallback).
//
//go:noinline
func (ic *internalConsumer) messageReceived(d delivery) {
	ic.exec.Execute(func() { ic.notifyCallback(d) })
}

//go:noinline
func (ic *internalConsumer) notifyCallback(d delivery) {
	if r := ic.pendingReceive; r != nil {
		ic.pendingReceive = nil
		r([]delivery{d})
		return
	}
	ic.queue = append(ic.queue, d)
	ic.queued.Store(int32(len(ic.queue)))
	if op := ic.pendingBatch; op != nil && len(ic.queue) >= ic.maxBatch {
		ic.pendingBatch = nil
		op.done(ic.take(ic.maxBatch))
	}
}

// take removes up to n queued messages.
func (ic *internalConsumer) take(n int) []delivery {
	n = min(n, len(ic.queue))
	out := append([]delivery(nil), ic.queue[:n]...)
	ic.queue = ic.queue[n:]
	if len(ic.queue) == 0 {
		ic.queue = nil
	}
	ic.queued.Store(int32(len(ic.queue)))
	return out
}

// receiveAsync completes done with the next message.
//
//go:noinline
func (ic *internalConsumer) receiveAsync(done func([]delivery)) {
	ic.exec.Execute(func() {
		if len(ic.queue) > 0 {
			done(ic.take(1))
			return
		}
		ic.pendingReceive = done
	})
}

// batchReceiveAsync completes done with up to maxBatch messages once that
// many are queued or the timeout expires.
//
//go:noinline
func (ic *internalConsumer) batchReceiveAsync(done func([]delivery)) {
	ic.exec.Execute(func() {
		if len(ic.queue) >= ic.maxBatch {
			done(ic.take(ic.maxBatch))
			return
		}
		ic.pendingBatch = &opBatchReceive{created: nanotime(), done: done}
		ic.triggerBatchReceiveTimeoutTask(batchReceiveTimeout)
	})
}

func (ic *internalConsumer) triggerBatchReceiveTimeoutTask(d time.Duration) {
	if ic.timeoutArmed {
		return
	}
	ic.timeoutArmed = true
	ic.mt.cl.multi.timer.newTimeout(d, ic.pendingBatchReceiveTask)
}

// pendingBatchReceiveTask runs on the timer thread and hands the timeout
// to the internal executor.
//
//go:noinline
func (ic *internalConsumer) pendingBatchReceiveTask() {
	mc := ic.mt.cl.multi
	mc.timerTasks.Add(1)
	called, woke := ic.exec.Execute(ic.doPendingBatchReceiveTask)
	if called {
		mc.timerWakes.Add(1)
	}
	if woke {
		mc.timerWoke.Add(1)
	}
}

//go:noinline
func (ic *internalConsumer) doPendingBatchReceiveTask() {
	ic.timeoutArmed = false
	op := ic.pendingBatch
	if op == nil {
		return
	}
	if left := int64(batchReceiveTimeout) - (nanotime() - op.created); left > 0 {
		ic.triggerBatchReceiveTimeoutTask(time.Duration(left))
		return
	}
	ic.pendingBatch = nil
	msgs := ic.take(ic.maxBatch)
	mc := ic.mt.cl.multi
	mc.batchTimeouts.Add(1)
	if len(msgs) == 0 {
		mc.emptyBatches.Add(1)
	}
	op.done(msgs)
}

// multiTopicConsumer is MultiTopicsConsumerImpl with a MessageListener.
type multiTopicConsumer struct {
	cl        *Client
	variant   batchVariant
	keyShared bool
	exec      *Executor       // internalPinnedExecutor
	external  *listenerThread // externalPinnedExecutor
	internals []*internalConsumer

	queue []topicMessage // incomingMessages; exec only
}

// topicMessage is a TopicMessageImpl: a message and the internal
// consumer that received it.
type topicMessage struct {
	ic *internalConsumer
	d  delivery
}

// multiClient holds what multi-topic consumers share and count.
type multiClient struct {
	variant batchVariant
	loops   []*EventLoop  // the consumers' IO loops (app-io-N)
	conns   []*clientConn // their connections, one per loop
	next    int
	timer   *wheelTimer
	multis  []*multiTopicConsumer

	timerTasks    atomic.Uint64 // pendingBatchReceiveTask runs
	timerWakes    atomic.Uint64 // of them, hand-offs that called futex wake
	timerWoke     atomic.Uint64 // of those, calls that woke the executor
	batchTimeouts atomic.Uint64 // batch receives completed by their timeout
	emptyBatches  atomic.Uint64 // of them, with no message
}

// start begins receiving from every internal consumer
// (startReceivingMessages).
func (mt *multiTopicConsumer) start() {
	for _, ic := range mt.internals {
		ic := ic
		mt.exec.Execute(func() { mt.receiveMessageFromConsumer(ic, true) })
	}
}

// receiveMessageFromConsumer runs on the internal executor: the next
// receive from ic, whose messages come back to this executor
// (thenAcceptAsync).
//
//go:noinline
func (mt *multiTopicConsumer) receiveMessageFromConsumer(ic *internalConsumer, batch bool) {
	done := func(msgs []delivery) { mt.exec.Execute(func() { mt.messagesReceived(ic, msgs) }) }
	if batch {
		ic.batchReceiveAsync(done)
	} else {
		ic.receiveAsync(done)
	}
}

//go:noinline
func (mt *multiTopicConsumer) messagesReceived(ic *internalConsumer, msgs []delivery) {
	for _, d := range msgs {
		mt.queue = append(mt.queue, topicMessage{ic, d})
		mt.exec.Execute(mt.triggerListener) // tryTriggerListener
	}
	mt.receiveMessageFromConsumer(ic, mt.variant.batchNext(ic, len(msgs)))
}

// triggerListener drains the queue to the listener executor (PR 15162's
// path).
//
//go:noinline
func (mt *multiTopicConsumer) triggerListener() {
	for _, m := range mt.queue {
		m := m
		t := mt.cl.pools.externalFor(mt.keyShared, mt.external, m.d)
		t.exec.Execute(func() { mt.callMessageListener(t, m) })
	}
	mt.queue = nil
}

//go:noinline
func (mt *multiTopicConsumer) callMessageListener(t *listenerThread, m topicMessage) {
	m.ic.increaseAvailablePermits(1)
	mt.cl.received(t, &m.ic.flowControl, m.d)
}

// newMultiClient creates the multi-topic consumers' IO loops, their
// connections and the timer.
func (cl *Client) newMultiClient(v batchVariant, loops int) error {
	mc := &multiClient{variant: v}
	cl.multi = mc
	for i := 0; i < loops; i++ {
		l, err := NewEventLoop(appLoopName(i))
		if err != nil {
			return err
		}
		l.Start()
		mc.loops = append(mc.loops, l)
		cc, err := cl.connectOn(l)
		if err != nil {
			return err
		}
		mc.conns = append(mc.conns, cc)
	}
	mc.timer = newWheelTimer(time.Millisecond)
	mc.timer.newTimeout(ackGroupTime, mc.flushAcks)
	return nil
}

// ackGroupTime is acknowledgementsGroupTimeMicros (100 ms): grouped
// acknowledgements are sent at least this often.
const ackGroupTime = 100 * time.Millisecond

// flushAcks sends every internal consumer's grouped acknowledgements and
// schedules itself again.
func (mc *multiClient) flushAcks() {
	for _, mt := range mc.multis {
		for _, ic := range mt.internals {
			ic.flushAcks()
		}
	}
	mc.timer.newTimeout(ackGroupTime, mc.flushAcks)
}

func appLoopName(i int) string { return fmt.Sprintf("app-io-%d", i) }

// subscribeMulti creates a multi-topic consumer of subscription sub over
// every topic: one internal consumer per topic, on the consumers' shared
// connections.
func (cl *Client) subscribeMulti(sub, topics int) (*multiTopicConsumer, error) {
	mc := cl.multi
	exec, ext := cl.pools.pin()
	mt := &multiTopicConsumer{cl: cl, variant: mc.variant, keyShared: cl.subs[sub].typ == KeyShared, exec: exec, external: ext}
	// Each partition's receiver queue: min(receiverQueueSize,
	// maxTotalReceiverQueueSizeAcrossPartitions (50,000) / partitions).
	queue := min(cl.cfg.receiverQueue, 50_000/topics)
	for t := 0; t < topics; t++ {
		cc := mc.conns[mc.next%len(mc.conns)]
		mc.next++
		iexec, _ := cl.pools.pin()
		_, err := cl.subscribeWith(t*cl.nSubs+sub, nil, cc, queue, func(c *clientConsumer) {
			ic := &internalConsumer{flowControl: flowControl{c: c, half: int64(max(queue/2, 1))}, mt: mt, exec: iexec, maxBatch: max(queue/2, 1)}
			c.ic = ic
			mt.internals = append(mt.internals, ic)
		})
		if err != nil {
			return nil, err
		}
	}
	mc.multis = append(mc.multis, mt)
	return mt, nil
}

func (mc *multiClient) stop() {
	for _, l := range mc.loops {
		l.Shutdown()
	}
	mc.timer.stop()
}
