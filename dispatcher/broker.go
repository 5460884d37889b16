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
	IOThreads     int // broker-io-N event loops (default 4)
	TopicWorkers  int // topic-worker-N executors (default 1)
	Variant       Variant
	Subscriptions []SubscriptionConfig
}

// SubscriptionConfig is one subscription of the topic.
type SubscriptionConfig struct {
	Name string
	Type SubType
}

// Broker is the model broker: one topic, its subscriptions, and the
// threads that serve them.
type Broker struct {
	variant  Variant
	loops    []*EventLoop
	next     atomic.Uint64
	mlWorker *Executor
	workers  []*Executor
	ledger   *ManagedLedger
	subs     []*Dispatcher

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
	b := &Broker{variant: cfg.Variant, mlWorker: NewExecutor("ml-worker")}
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
	b.ledger = NewManagedLedger(b.mlWorker)
	for i, s := range cfg.Subscriptions {
		d := newDispatcher(s.Name, s.Type, b, b.ledger.NewCursor(), b.workers[i%len(b.workers)])
		b.subs = append(b.subs, d)
	}
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
}

// Stop stops the broker's threads and closes its connections.
func (b *Broker) Stop() {
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

// Ledger returns the topic's managed ledger.
func (b *Broker) Ledger() *ManagedLedger { return b.ledger }

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
	sc := &serverCnx{broker: b, loop: loop, consumers: map[uint32]*Consumer{}}
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
	adds      []pendingAdd
	receipts  []byte
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
	if len(body) < 12+bodyHeader {
		return
	}
	msg := make([]byte, len(body)-12)
	copy(msg, body[12:])
	key := binary.BigEndian.Uint32(msg[12:])
	pid, seq := u32(body, 0), u64(body, 4)
	sc.adds = append(sc.adds, pendingAdd{key: key, hash: StickyKeyHash(key), body: msg,
		ack: func(entryID uint64) { sc.sendReceipt(pid, seq, entryID) }})
}

// publishMessages hands the collected adds to the managed ledger; the
// receipts come back to this loop.
//
//go:noinline
func (sc *serverCnx) publishMessages() {
	if len(sc.adds) == 0 {
		return
	}
	batch := sc.adds
	sc.adds = nil
	sc.broker.ledger.AsyncAddEntries(batch, func(ids []uint64) {
		sc.loop.Execute(nil, func() {
			for i, a := range batch {
				a.ack(ids[i])
			}
		})
	})
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
