package dispatcher

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// BrokerConfig sizes the broker's threads.
type BrokerConfig struct {
	IOThreads    int // broker-io-N event loops (default 4)
	TopicWorkers int // topic-worker-N executors (default 1)
	// SendOnReadThread: a read's completion sends on its own thread, not
	// on the topic worker (dispatcherDispatchMessagesInSubscriptionThread
	// false, Pulsar 5.0's default).
	SendOnReadThread bool
	// Topics (the partitions of a partitioned topic) each have every
	// subscription (default 1); their ledgers share ml-worker.
	Topics        int
	Throttle      ThrottleConfig
	Variant       Variant
	Subscriptions []SubscriptionConfig
}

// SubscriptionConfig is one subscription of the topic.
type SubscriptionConfig struct {
	Name string
	Type SubType
}

// Broker is the model broker: its topics, their subscriptions, and the
// threads that serve them.
type Broker struct {
	variant  Variant
	loops    []*EventLoop
	next     atomic.Uint64
	mlWorker *Executor
	workers  []*Executor
	ledgers  []*ManagedLedger // by topic
	// subs holds each topic's dispatchers, topic by topic: subscription s
	// of topic t is subs[t*len(subscriptions)+s].
	subs     []*Dispatcher
	throttle *throttling // nil: no publish rate limit

	sendOnReadThread bool

	mu    sync.Mutex
	cnxes []*serverCnx
}

// NewBroker creates the broker's threads (not yet started).
func NewBroker(cfg BrokerConfig) (*Broker, error) {
	if cfg.IOThreads <= 0 {
		cfg.IOThreads = 4
	}
	if cfg.TopicWorkers <= 0 {
		cfg.TopicWorkers = 1
	}
	if cfg.Variant == nil {
		cfg.Variant = baseline{}
	}
	b := &Broker{variant: cfg.Variant, mlWorker: NewExecutor("ml-worker"), sendOnReadThread: cfg.SendOnReadThread}
	for i := 0; i < cfg.IOThreads; i++ {
		l, err := NewEventLoop(fmt.Sprintf("broker-io-%d", i))
		if err != nil {
			b.closeLoops()
			return nil, err
		}
		b.loops = append(b.loops, l)
	}
	for i := 0; i < cfg.TopicWorkers; i++ {
		b.workers = append(b.workers, NewExecutor(fmt.Sprintf("topic-worker-%d", i)))
	}
	for t := 0; t < max(cfg.Topics, 1); t++ {
		ml := NewManagedLedger(b.mlWorker)
		b.ledgers = append(b.ledgers, ml)
		for _, s := range cfg.Subscriptions {
			name := s.Name
			if cfg.Topics > 1 {
				name = fmt.Sprintf("%s@partition-%d", s.Name, t)
			}
			d := newDispatcher(name, s.Type, b, ml.NewCursor(), b.workers[len(b.subs)%len(b.workers)])
			b.subs = append(b.subs, d)
		}
	}
	b.throttle = newThrottling(b, cfg.Throttle, len(b.ledgers))
	return b, nil
}

func (b *Broker) closeLoops() {
	for _, l := range b.loops {
		l.closeFds()
	}
}

// Start starts every broker thread.
func (b *Broker) Start() {
	for _, l := range b.loops {
		l.Start()
	}
	b.mlWorker.Start()
	for _, w := range b.workers {
		w.Start()
	}
	if b.throttle != nil {
		b.throttle.start()
	}
}

// Stop stops the broker's threads and closes its connections.
func (b *Broker) Stop() {
	if b.throttle != nil {
		b.throttle.stop()
	}
	for _, l := range b.loops {
		l.Shutdown()
	}
	b.mlWorker.Shutdown()
	for _, w := range b.workers {
		w.Shutdown()
	}
	b.mu.Lock()
	for _, c := range b.cnxes {
		unix.Close(c.fd)
	}
	b.mu.Unlock()
}

// executor is BrokerService.executor(): the IO loop group, round robin.
func (b *Broker) executor() *EventLoop {
	return b.loops[b.next.Add(1)%uint64(len(b.loops))]
}

// Dispatchers returns the subscriptions' dispatchers.
func (b *Broker) Dispatchers() []*Dispatcher { return b.subs }

// Ledger returns topic 0's managed ledger.
func (b *Broker) Ledger() *ManagedLedger { return b.ledgers[0] }

// Loops returns the IO loops.
func (b *Broker) Loops() []*EventLoop { return b.loops }

// Accept creates a connection served by the next IO loop and returns the
// client's end.
func (b *Broker) Accept() (int, error) {
	bfd, cfd, err := socketPair()
	if err != nil {
		return -1, fmt.Errorf("socketpair: %w", err)
	}
	loop := b.loops[len(b.cnxes)%len(b.loops)]
	sc := &serverCnx{broker: b, loop: loop, consumers: map[uint32]*Consumer{}, published: make([]bool, len(b.ledgers))}
	sc.conn = newConn(bfd, loop, sc.handle)
	sc.conn.onBatch = sc.publishMessages
	b.mu.Lock()
	b.cnxes = append(b.cnxes, sc)
	b.mu.Unlock()
	if err := loop.RegisterAsync(bfd, sc.conn); err != nil {
		return -1, fmt.Errorf("registering a connection: %w", err)
	}
	return cfd, nil
}

// serverCnx is ServerCnx: one client connection on its IO loop.
type serverCnx struct {
	*conn
	broker    *Broker
	loop      *EventLoop
	consumers map[uint32]*Consumer // loop thread only
	adds      [][]pendingAdd       // by topic; loop thread only
	receipts  []byte
	published []bool      // by topic: this connection published to it (loop thread only)
	throttled atomic.Bool // auto-read turned off by publish throttling
}

func (sc *serverCnx) handle(typ byte, body []byte) {
	switch typ {
	case cmdSend:
		sc.handleSend(body)
	case cmdFlow:
		if c := sc.consumers[u32(body, 0)]; c != nil {
			sc.handleFlow(c, int64(u32(body, 4)))
		}
	case cmdAck:
		if c := sc.consumers[u32(body, 0)]; c != nil {
			c.d.acknowledge(sc.loop, c, body[8:])
		}
	case cmdSubscribe:
		id, sub := u32(body, 0), int(u32(body, 4))
		if sub < len(sc.broker.subs) {
			c := newConsumer(id, fmt.Sprintf("consumer-%d", id), sc)
			sc.consumers[id] = c
			sc.broker.subs[sub].AddConsumer(c)
		}
	case cmdClose:
		if c := sc.consumers[u32(body, 0)]; c != nil {
			delete(sc.consumers, c.ID)
			c.d.RemoveConsumer(c)
		}
	}
}

//go:noinline
func (sc *serverCnx) handleFlow(c *Consumer, n int64) { c.flowPermits(sc.loop, n) }

// handleSend collects the adds of one read; they go to the ledger as a
// batch.
//
//go:noinline
func (sc *serverCnx) handleSend(body []byte) {
	if len(body) < sendHeader+bodyHeader {
		return
	}
	topic := int(u32(body, 12))
	if topic >= len(sc.broker.ledgers) {
		return
	}
	msg := make([]byte, len(body)-sendHeader)
	copy(msg, body[sendHeader:])
	key := binary.BigEndian.Uint32(msg[12:])
	pid, seq := u32(body, 0), u64(body, 4)
	for len(sc.adds) <= topic {
		sc.adds = append(sc.adds, nil)
	}
	sc.adds[topic] = append(sc.adds[topic], pendingAdd{key: key, hash: StickyKeyHash(key), body: msg,
		ack: func(entryID uint64) { sc.sendReceipt(pid, seq, entryID) }})
	if sc.broker.throttle != nil {
		sc.throttleOnSend(topic, len(msg))
	}
}

// publishMessages hands the collected adds to the managed ledger; the
// receipts come back to this loop.
//
//go:noinline
func (sc *serverCnx) publishMessages() {
	for topic, batch := range sc.adds {
		if len(batch) == 0 {
			continue
		}
		sc.adds[topic] = nil
		sc.broker.ledgers[topic].AsyncAddEntries(batch, func(ids []uint64) {
			sc.loop.Execute(nil, func() {
				for i, a := range batch {
					a.ack(ids[i])
				}
			})
		})
	}
}

func (sc *serverCnx) sendReceipt(pid uint32, seq, entryID uint64) {
	var b [20]byte
	binary.BigEndian.PutUint32(b[0:], pid)
	binary.BigEndian.PutUint64(b[4:], seq)
	binary.BigEndian.PutUint64(b[12:], entryID)
	sc.write(appendFrame(sc.receipts[:0], cmdSendReceipt, b[:]))
}

func (sc *serverCnx) writeMessage(consumerID uint32, e *Entry, redelivery uint32) {
	var h [16]byte
	binary.BigEndian.PutUint32(h[0:], consumerID)
	binary.BigEndian.PutUint64(h[4:], e.ID)
	binary.BigEndian.PutUint32(h[12:], redelivery)
	sc.write(appendFrame(nil, cmdMessage, h[:], e.Body))
}
