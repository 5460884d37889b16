package dispatcher

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"golang.org/x/sys/unix"
)

// bitset is a growable set of entry ids safe for concurrent use.
type bitset struct {
	chunks [4096]atomic.Pointer[[1 << 14]atomic.Uint64] // 2^20 ids per chunk
}

// set marks id and reports whether it was already marked.
func (b *bitset) set(id uint64) bool {
	ci := id >> 20
	if ci >= uint64(len(b.chunks)) {
		return false
	}
	ch := b.chunks[ci].Load()
	if ch == nil {
		b.chunks[ci].CompareAndSwap(nil, new([1 << 14]atomic.Uint64))
		ch = b.chunks[ci].Load()
	}
	w := &ch[(id>>6)&(1<<14-1)]
	bit := uint64(1) << (id & 63)
	for {
		old := w.Load()
		if old&bit != 0 {
			return true
		}
		if w.CompareAndSwap(old, old|bit) {
			return false
		}
	}
}

// subState verifies one subscription's deliveries.
type subState struct {
	typ        SubType
	delivered  bitset
	distinct   atomic.Int64
	duplicates atomic.Int64
	violations atomic.Int64
	invalid    atomic.Int64
	lastEntry  []atomic.Uint64 // per key: last entry id + 1 (Key_Shared)
}

func (s *subState) record(entryID uint64, b body) {
	if !b.valid {
		s.invalid.Add(1)
		return
	}
	if s.delivered.set(entryID) {
		s.duplicates.Add(1)
		return
	}
	s.distinct.Add(1)
	if s.lastEntry == nil || int(b.key) >= len(s.lastEntry) {
		return
	}
	last := &s.lastEntry[b.key]
	for {
		prev := last.Load()
		if entryID+1 < prev {
			s.violations.Add(1)
			return
		}
		if last.CompareAndSwap(prev, entryID+1) {
			return
		}
	}
}

// clientConfig is what the client side of a run needs.
type clientConfig struct {
	producers       int
	producerThreads int
	consumerThreads int
	ioThreads       int
	receiverQueue   int
	maxPending      int
	payload         int
	keySpace        int
	rate            float64 // total msg/s; 0: as fast as possible
	topics          int     // producers spread over them round robin
	// With more than one topic, consumers are multi-topic consumers
	// that run this batch receive policy (seed 002).
	batch batchVariant
	// asyncSend: producers hand each Send to their connection's IO loop,
	// which writes it without blocking (Pulsar's client); publish
	// latency is then also kept per second.
	asyncSend bool
	// Consumers with a MessageListener on these pools (seed 003)
	// instead of consumer threads.
	listener        listenerVariant
	internalThreads int
	listenerThreads int
}

type producer struct {
	id       uint32
	topic    int
	cc       *clientConn
	seq      uint64 // producer thread only
	inflight atomic.Int64
	sentAt   []atomic.Int64 // by seq % maxPending
	thread   *producerThread
}

type producerThread struct {
	name      string
	producers []*producer
	wake      Notifier
	rng       *rand.Rand
	sent      int64
}

type clientConsumer struct {
	id      uint32
	sub     int
	cc      *clientConn
	thread  *consumerThread
	closed  atomic.Bool
	permits int      // consumer thread only: processed since the last Flow
	acks    []uint64 // consumer thread only
	lc      *listenerConsumer
	ic      *internalConsumer
}

type delivery struct {
	c       *clientConsumer
	entryID uint64
	body    []byte
}

type consumerThread struct {
	name string
	q    *BlockingQueue[delivery]
	e2e  []*hdrhistogram.Histogram // per subscription, µs
}

type clientConn struct {
	*conn
	cl        *Client
	mu        sync.Mutex
	producers map[uint32]*producer
	consumers map[uint32]*clientConsumer
	pubHist   *hdrhistogram.Histogram    // publish latency, µs; loop thread only
	secHists  *[]*hdrhistogram.Histogram // publish latency by second of the run; the loop's, loop thread only
}

// Client is the benchmark's client side: producers, consumers, their IO
// loops (client-io-N) and the verification of every delivery.
type Client struct {
	cfg       clientConfig
	broker    *Broker
	loops     []*EventLoop
	conns     []*clientConn
	prodThr   []*producerThread
	consThr   []*consumerThread
	consumers [][]*clientConsumer // per subscription
	subs      []*subState
	listener  listenerVariant
	pools     *listenerPools
	multi     *multiClient // multi-topic consumers, with more than one topic
	nSubs     int          // subscriptions per topic
	nextID    atomic.Uint32

	toPublish atomic.Int64   // messages left to publish (message mode)
	deadline  time.Time      // end of publishing (duration mode)
	published atomic.Int64   // receipts
	pubTopic  []atomic.Int64 // receipts by topic
	latStart  atomic.Int64   // unix ns the per-second latencies count from
	loopSec   map[*EventLoop]*[]*hdrhistogram.Histogram
	stopPub   atomic.Bool
	pubDone   sync.WaitGroup
	pubEnded  atomic.Int64 // unix ns of the last receipt

	consDone sync.WaitGroup
	stopOnce sync.Once
}

// stop ends the consumer threads and client loops, so their histograms
// can be read.
func (cl *Client) stop() {
	cl.stopOnce.Do(func() {
		for _, ct := range cl.consThr {
			ct.q.Put(delivery{})
		}
		cl.consDone.Wait()
		for _, l := range cl.loops {
			l.Shutdown()
		}
		if cl.multi != nil {
			cl.multi.stop()
		}
		if cl.pools != nil {
			cl.pools.shutdown()
		}
	})
}

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, 120_000_000, 3) }

func newClient(b *Broker, cfg clientConfig, subTypes []SubType) (*Client, error) {
	cfg.topics = max(cfg.topics, 1)
	cl := &Client{cfg: cfg, broker: b, listener: cfg.listener, pubTopic: make([]atomic.Int64, cfg.topics),
		loopSec: map[*EventLoop]*[]*hdrhistogram.Histogram{}}
	for i := 0; i < cfg.ioThreads; i++ {
		l, err := NewEventLoop(fmt.Sprintf("client-io-%d", i))
		if err != nil {
			cl.stop()
			return nil, err
		}
		l.Start()
		cl.loops = append(cl.loops, l)
		if cfg.asyncSend {
			cl.loopSec[l] = new([]*hdrhistogram.Histogram)
		}
	}
	// One state per subscription of each topic, as the broker's
	// dispatchers are laid out.
	for range cfg.topics {
		for _, t := range subTypes {
			s := &subState{typ: t}
			if t == KeyShared {
				s.lastEntry = make([]atomic.Uint64, cfg.keySpace)
			}
			cl.subs = append(cl.subs, s)
		}
	}
	cl.nSubs = len(subTypes)
	if cfg.listener != nil {
		cl.pools = newListenerPools(cfg.internalThreads, cfg.listenerThreads, cfg.topics*len(subTypes))
		cfg.consumerThreads = 0
	}
	for i := 0; i < cfg.consumerThreads; i++ {
		// Thread names hold 15 bytes: keep the number visible.
		ct := &consumerThread{name: fmt.Sprintf("client-cons-%d", i), q: NewBlockingQueue[delivery]()}
		for range subTypes {
			ct.e2e = append(ct.e2e, newHist())
		}
		cl.consThr = append(cl.consThr, ct)
	}
	for i := 0; i < cfg.producerThreads; i++ {
		cl.prodThr = append(cl.prodThr, &producerThread{name: fmt.Sprintf("client-prod-%d", i),
			rng: rand.New(rand.NewPCG(uint64(i)+1, 42))})
	}
	// Producers, each on its own connection.
	for i := 0; i < cfg.producers; i++ {
		cc, err := cl.connect()
		if err != nil {
			cl.stop()
			return nil, err
		}
		if cfg.asyncSend {
			unix.SetNonblock(cc.fd, true) // the loop writes; it must not block
		}
		pt := cl.prodThr[i%len(cl.prodThr)]
		p := &producer{id: uint32(i), topic: i % cfg.topics, cc: cc, sentAt: make([]atomic.Int64, cfg.maxPending), thread: pt}
		cc.producers[p.id] = p
		pt.producers = append(pt.producers, p)
	}
	cl.consumers = make([][]*clientConsumer, len(cl.subs))
	if cfg.batch != nil {
		if err := cl.newMultiClient(cfg.batch, cfg.ioThreads); err != nil {
			cl.stop()
			return nil, err
		}
	}
	return cl, nil
}

// publishedTo is the number of messages published to the topic of
// subscription state k.
func (cl *Client) publishedTo(k int) int64 { return cl.pubTopic[k/cl.nSubs].Load() }

func (cl *Client) connect() (*clientConn, error) {
	return cl.connectOn(cl.loops[len(cl.conns)%len(cl.loops)])
}

// connectOn opens a connection read by loop.
func (cl *Client) connectOn(loop *EventLoop) (*clientConn, error) {
	fd, err := cl.broker.Accept()
	if err != nil {
		return nil, err
	}
	cc := &clientConn{cl: cl, producers: map[uint32]*producer{}, consumers: map[uint32]*clientConsumer{}, pubHist: newHist(),
		secHists: cl.loopSec[loop]}
	cc.conn = newConn(fd, loop, cc.handle)
	cl.conns = append(cl.conns, cc)
	if err := loop.RegisterAsync(fd, cc.conn); err != nil {
		return nil, fmt.Errorf("registering a client connection: %w", err)
	}
	return cc, nil
}

// subscribe adds a consumer to subscription sub on a new connection and
// sends its first Flow (the whole receiver queue).
func (cl *Client) subscribe(sub int, thread *consumerThread, cc *clientConn) (*clientConsumer, error) {
	return cl.subscribeWith(sub, thread, cc, cl.cfg.receiverQueue, func(c *clientConsumer) {
		if cl.pools != nil {
			c.lc = cl.newListenerConsumer(c)
		}
	})
}

// subscribeWith subscribes with a receiver queue of queue messages; attach
// runs before the broker can send the consumer anything.
func (cl *Client) subscribeWith(sub int, thread *consumerThread, cc *clientConn, queue int, attach func(*clientConsumer)) (*clientConsumer, error) {
	if cc == nil {
		var err error
		if cc, err = cl.connect(); err != nil {
			return nil, err
		}
	}
	c := &clientConsumer{id: cl.nextID.Add(1), sub: sub, cc: cc, thread: thread}
	attach(c)
	cc.mu.Lock()
	cc.consumers[c.id] = c
	cc.mu.Unlock()
	var b [8]byte
	binary.BigEndian.PutUint32(b[0:], c.id)
	binary.BigEndian.PutUint32(b[4:], uint32(sub))
	if err := cc.writeDirect(appendFrame(nil, cmdSubscribe, b[:])); err != nil {
		return nil, err
	}
	if err := c.sendFlow(queue); err != nil {
		return nil, err
	}
	cl.consumers[sub] = append(cl.consumers[sub], c)
	return c, nil
}

func (c *clientConsumer) sendFlow(n int) error {
	var b [8]byte
	binary.BigEndian.PutUint32(b[0:], c.id)
	binary.BigEndian.PutUint32(b[4:], uint32(n))
	return c.cc.writeDirect(appendFrame(nil, cmdFlow, b[:]))
}

func (c *clientConsumer) flushAcks() {
	if len(c.acks) == 0 {
		return
	}
	c.cc.writeDirect(ackFrame(c.id, c.acks))
	c.acks = c.acks[:0]
}

func ackFrame(consumer uint32, acks []uint64) []byte {
	b := make([]byte, 8+8*len(acks))
	binary.BigEndian.PutUint32(b[0:], consumer)
	binary.BigEndian.PutUint32(b[4:], uint32(len(acks)))
	for i, id := range acks {
		binary.BigEndian.PutUint64(b[8+8*i:], id)
	}
	return appendFrame(nil, cmdAck, b)
}

// close removes the consumer at the broker; queued deliveries are dropped
// and redelivered to others.
func (c *clientConsumer) close() error {
	c.closed.Store(true)
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], c.id)
	return c.cc.writeDirect(appendFrame(nil, cmdClose, b[:]))
}

// handle runs on the client IO loop.
func (cc *clientConn) handle(typ byte, body []byte) {
	switch typ {
	case cmdSendReceipt:
		p := cc.producers[u32(body, 0)]
		if p == nil {
			return
		}
		seq := u64(body, 4)
		sent := p.sentAt[seq%uint64(len(p.sentAt))].Load()
		now := time.Now().UnixNano()
		cc.pubHist.RecordValue(max((now-sent)/1000, 1))
		if h := cc.secHists; h != nil {
			sec := max(int((now-cc.cl.latStart.Load())/1e9), 0)
			for len(*h) <= sec {
				*h = append(*h, newHist())
			}
			(*h)[sec].RecordValue(max((now-sent)/1000, 1))
		}
		// Counted before its slot is freed: a run reads published once
		// nothing is in flight (CI read 19999 published, 20000 delivered).
		cc.cl.pubTopic[p.topic].Add(1)
		cc.cl.published.Add(1)
		cc.cl.pubEnded.Store(now)
		p.inflight.Add(-1)
		p.thread.wake.Notify()
	case cmdMessage:
		cc.mu.Lock()
		c := cc.consumers[u32(body, 0)]
		cc.mu.Unlock()
		if c == nil {
			return
		}
		msg := make([]byte, len(body)-16)
		copy(msg, body[16:])
		d := delivery{c: c, entryID: u64(body, 4), body: msg}
		if c.lc != nil {
			c.lc.messageReceived(d)
			return
		}
		if c.ic != nil {
			c.ic.messageReceived(d)
			return
		}
		c.thread.q.Put(d)
	}
}

// runProducer publishes from one producer thread until the budget or the
// deadline is reached.
func (cl *Client) runProducer(pt *producerThread) {
	defer cl.pubDone.Done()
	payload := make([]byte, cl.cfg.payload)
	for i := range payload {
		payload[i] = byte(pt.rng.IntN(256))
	}
	perThread := cl.cfg.rate / float64(len(cl.prodThr))
	start := time.Now()
	next := 0
	var frame []byte
	for !cl.stopPub.Load() {
		if !cl.deadline.IsZero() && time.Now().After(cl.deadline) {
			return
		}
		if perThread > 0 {
			due := int64(time.Since(start).Seconds()*perThread) - pt.sent
			if due <= 0 {
				time.Sleep(200 * time.Microsecond)
				continue
			}
		}
		// Next producer with room for another pending message.
		tok := pt.wake.Token()
		var p *producer
		for j := 0; j < len(pt.producers); j++ {
			q := pt.producers[(next+j)%len(pt.producers)]
			if q.inflight.Load() < int64(cl.cfg.maxPending) {
				p = q
				next = (next + j + 1) % len(pt.producers)
				break
			}
		}
		if p == nil {
			pt.wake.Wait(tok)
			continue
		}
		if cl.toPublish.Add(-1) < 0 {
			return
		}
		key := uint32(pt.rng.IntN(cl.cfg.keySpace))
		now := time.Now().UnixNano()
		p.sentAt[p.seq%uint64(len(p.sentAt))].Store(now)
		b := makeBody(p.id, p.seq, key, now, payload)
		var h [sendHeader]byte
		binary.BigEndian.PutUint32(h[0:], p.id)
		binary.BigEndian.PutUint64(h[4:], p.seq)
		binary.BigEndian.PutUint32(h[12:], uint32(p.topic))
		frame = appendFrame(frame[:0], cmdSend, h[:], b)
		p.seq++
		p.inflight.Add(1)
		pt.sent++
		if cl.cfg.asyncSend {
			f, cc := append([]byte(nil), frame...), p.cc
			cc.loop.Execute(nil, func() { cc.conn.write(f) })
			continue
		}
		if err := p.cc.writeDirect(frame); err != nil {
			return
		}
	}
}

// runConsumerThread processes deliveries: verify, ack, and return permits
// in Flows of half the receiver queue.
func (cl *Client) runConsumerThread(ct *consumerThread) {
	defer cl.consDone.Done()
	half := max(cl.cfg.receiverQueue/2, 1)
	var pending []*clientConsumer // consumers with unsent acks
	for {
		d, ok := ct.q.Poll()
		if !ok {
			for _, c := range pending {
				if !c.closed.Load() {
					c.flushAcks()
				}
			}
			pending = pending[:0]
			d = ct.q.Take()
		}
		if d.c == nil {
			return
		}
		c := d.c
		if c.closed.Load() {
			continue
		}
		b := parseBody(d.body)
		cl.subs[c.sub].record(d.entryID, b)
		if b.valid {
			ct.e2e[c.sub].RecordValue(max((time.Now().UnixNano()-b.publishNs)/1000, 1))
		}
		if len(c.acks) == 0 {
			pending = append(pending, c)
		}
		c.acks = append(c.acks, d.entryID)
		c.permits++
		if len(c.acks) >= 100 || c.permits >= half {
			c.flushAcks()
		}
		if c.permits >= half {
			c.sendFlow(c.permits)
			c.permits = 0
		}
	}
}
