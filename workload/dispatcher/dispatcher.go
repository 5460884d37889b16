package dispatcher

import (
	"encoding/binary"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

const (
	maxReadBatchSize      = 100 // dispatcherMaxReadBatchSize
	maxEntriesPerConsumer = 20  // Shared: entries per consumer per round
	maxUnackedPerConsumer = 50000
	maxReplayLookAhead    = 5000 // Key_Shared: normal reads allowed while replay is below this
)

// SubType is a subscription type.
type SubType int

const (
	Shared SubType = iota
	KeyShared
)

func (t SubType) String() string {
	if t == KeyShared {
		return "Key_Shared"
	}
	return "Shared"
}

// Consumer is the broker side of a consumer.
type Consumer struct {
	ID   uint32
	Name string
	cnx  *serverCnx
	d    *Dispatcher

	permits atomic.Int64 // MESSAGE_PERMITS: may go negative

	// flowMu is the consumer's flow permit accounting lock; accounted says
	// whether the dispatcher's total includes this consumer's Flows
	// (candidate variant).
	flowMu    sync.Mutex
	accounted bool
	unapplied int64 // baseline: Flow permits whose task has not run

	pendingMu   sync.Mutex
	pendingAcks map[uint64]uint32 // entry id → hash
	unacked     atomic.Int64

	// Blocked on unacked messages: set by the sender, cleared by acks on
	// the IO loop, which alone touches parked.
	blocked atomic.Bool
	parked  int64
}

func newConsumer(id uint32, name string, cnx *serverCnx) *Consumer {
	return &Consumer{ID: id, Name: name, cnx: cnx, pendingAcks: map[uint64]uint32{}}
}

// Permits is the consumer's available permits.
func (c *Consumer) Permits() int64 { return c.permits.Load() }

// flowPermits runs on the connection's IO loop (ServerCnx.handleFlow).
//
//go:noinline
func (c *Consumer) flowPermits(from *EventLoop, n int64) {
	if c.blocked.Load() {
		c.parked += n
		return
	}
	c.d.consumerFlow(from, c, n) // the variant adds n to the consumer's permits too
}

// Dispatcher is PersistentDispatcherMultipleConsumers, with the Key_Shared
// behaviour of PersistentStickyKeyDispatcherMultipleConsumers.
type Dispatcher struct {
	Name    string
	typ     SubType
	broker  *Broker
	cursor  *Cursor
	worker  *Executor // dispatchMessagesThread (topic worker)
	variant Variant

	Monitor Monitor // synchronized(this)

	// Guarded by Monitor.
	consumers             []*Consumer
	members               map[*Consumer]bool
	havePendingRead       bool
	havePendingReplayRead bool
	sendInProgress        atomic.Bool // read without the monitor by requestRead
	readBatchSize         int
	replay                map[uint64]uint32 // entry id → hash
	replayHashes          map[uint32]int
	replayInFlight        map[uint64]bool // read but not yet handed to consumers
	rr                    int
	selector              autoSplitSelector

	totalPermits             atomic.Int64 // totalAvailablePermits
	readMoreEntriesRequested atomic.Bool
	draining                 drainingHashes

	Acked       atomic.Uint64 // distinct acknowledgements
	Redelivered atomic.Uint64
	FlowTasks   atomic.Uint64 // internalConsumerFlow runs (baseline)
}

func newDispatcher(name string, typ SubType, b *Broker, cursor *Cursor, worker *Executor) *Dispatcher {
	return &Dispatcher{Name: name, typ: typ, broker: b, cursor: cursor, worker: worker, variant: b.variant,
		members: map[*Consumer]bool{}, readBatchSize: maxReadBatchSize,
		replay: map[uint64]uint32{}, replayHashes: map[uint32]int{}, replayInFlight: map[uint64]bool{}}
}

// TotalPermits is totalAvailablePermits.
func (d *Dispatcher) TotalPermits() int64 { return d.totalPermits.Load() }

// consumerFlow is PersistentDispatcherMultipleConsumers.consumerFlow.
//
//go:noinline
func (d *Dispatcher) consumerFlow(from *EventLoop, c *Consumer, n int64) {
	d.variant.ConsumerFlow(d, from, c, n)
}

// internalConsumerFlow is the synchronized method the baseline runs as an
// executor task. Seed 000 describes its parent's: it "takes the dispatcher
// monitor only to add the permits to the dispatcher's total and request a
// read", through the coalescing readMoreEntriesAsync (older releases
// called readMoreEntries() in the same monitor section).
//
//go:noinline
func (d *Dispatcher) internalConsumerFlow(c *Consumer, n int64) {
	d.Monitor.Enter()
	defer d.Monitor.Exit()
	d.FlowTasks.Add(1)
	c.flowMu.Lock()
	c.unapplied -= n
	member := d.members[c]
	if member {
		d.totalPermits.Add(n)
	}
	c.flowMu.Unlock()
	if !member {
		return
	}
	d.requestRead(nil)
}

// consumerFlowAccounted adds a Flow to the consumer's permits and, while
// the dispatcher accounts the consumer, to the total, both under the
// consumer's own lock, so the update is ordered with its removal
// (candidate).
//
//go:noinline
func (d *Dispatcher) consumerFlowAccounted(c *Consumer, n int64) {
	c.flowMu.Lock()
	c.permits.Add(n)
	if c.accounted {
		d.totalPermits.Add(n)
	}
	c.flowMu.Unlock()
}

// requestRead is a Flow's read request. While a send is in progress it
// is coalesced into the dispatch cycle, whose end reads with the permits
// added before (Shared: at once; Key_Shared: when the pass's writes
// complete, or on the retry when nothing was sent); otherwise it is a
// coalesced readMoreEntriesAsync. Seed 000: "readMoreEntriesAsync already
// coalesces read requests".
//
//go:noinline
func (d *Dispatcher) requestRead(from *EventLoop) {
	if d.sendInProgress.Load() {
		return
	}
	d.readMoreEntriesAsync(from)
}

// readMoreEntriesAsync coalesces read requests into one executor task.
//
//go:noinline
func (d *Dispatcher) readMoreEntriesAsync(from *EventLoop) {
	if d.readMoreEntriesRequested.CompareAndSwap(false, true) {
		d.broker.executor().Execute(from, d.readMoreEntriesRequestedTask)
	}
}

// readMoreEntriesRequestedTask serves the pending request. It clears the
// request once it holds the monitor: a request made while it waited is
// served by this read, which sees the permits added before it.
//
//go:noinline
func (d *Dispatcher) readMoreEntriesRequestedTask() {
	d.Monitor.Enter()
	d.readMoreEntriesRequested.Store(false)
	d.readMoreEntriesLocked()
	d.Monitor.Exit()
}

// readMoreEntries is synchronized: the read older releases made in the
// same monitor section, kept beside readMoreEntriesAsync for reference.
//
//lint:ignore U1000 the older releases' path, as Pulsar had it
//go:noinline
func (d *Dispatcher) readMoreEntries() {
	d.Monitor.Enter()
	d.readMoreEntriesLocked()
	d.Monitor.Exit()
}

func (d *Dispatcher) readMoreEntriesLocked() {
	if d.sendInProgress.Load() || len(d.consumers) == 0 {
		return
	}
	first := d.firstConsumerWithPermits()
	if first == nil {
		return
	}
	n := int(min(max(d.totalPermits.Load(), first.permits.Load()), int64(d.readBatchSize)))
	if n <= 0 {
		return
	}
	if len(d.replay) > len(d.replayInFlight) && !d.havePendingReplayRead {
		if ids := d.smallestReplayIDs(n); len(ids) > 0 {
			for _, id := range ids {
				d.replayInFlight[id] = true
			}
			d.havePendingReplayRead = true
			d.cursor.AsyncReplayEntries(ids, func(es []*Entry) { d.readEntriesComplete(es, true) })
			return
		}
	}
	if d.havePendingRead || (len(d.replay) > 0 && (d.typ == Shared || len(d.replay) >= maxReplayLookAhead)) {
		return
	}
	d.havePendingRead = true
	d.cursor.AsyncReadEntriesOrWait(n, func(es []*Entry) { d.readEntriesComplete(es, false) })
}

func (d *Dispatcher) firstConsumerWithPermits() *Consumer {
	for _, c := range d.consumers {
		if c.permits.Load() > 0 {
			return c
		}
	}
	return nil
}

// smallestReplayIDs picks the oldest replay entries to read next. While
// an entry of a hash is read but not yet sent, later entries of that hash
// are not read: its send may hold it back, and they must not overtake it.
func (d *Dispatcher) smallestReplayIDs(n int) []uint64 {
	busy := map[uint32]bool{}
	for id := range d.replayInFlight {
		busy[d.replay[id]] = true
	}
	ids := make([]uint64, 0, len(d.replay))
	for id, h := range d.replay {
		if !busy[h] {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	if len(ids) > n {
		ids = ids[:n]
	}
	return ids
}

// readEntriesComplete runs on the managed-ledger thread and takes the
// monitor, then sends on this thread (dispatcherDispatchMessagesInSubscriptionThread
// false, Pulsar 5.0's default) or hands the send to the topic worker.
//
//go:noinline
func (d *Dispatcher) readEntriesComplete(entries []*Entry, replay bool) {
	d.Monitor.Enter()
	defer d.Monitor.Exit()
	if replay {
		d.havePendingReplayRead = false
	} else {
		d.havePendingRead = false
		d.readBatchSize = min(d.readBatchSize*2, maxReadBatchSize)
	}
	if len(d.consumers) == 0 {
		if replay {
			for _, e := range entries {
				delete(d.replayInFlight, e.ID)
			}
		} else {
			d.addToReplay(entries)
		}
		return
	}
	d.sendInProgress.Store(true)
	if d.broker.sendOnReadThread {
		d.handleSendingMessagesAndReadingMoreLocked(entries, replay)
		return
	}
	d.worker.Execute(func() { d.handleSendingMessagesAndReadingMore(entries, replay) })
}

// handleSendingMessagesAndReadingMore is synchronized and runs on the
// topic worker.
//
//go:noinline
func (d *Dispatcher) handleSendingMessagesAndReadingMore(entries []*Entry, replay bool) {
	d.Monitor.Enter()
	defer d.Monitor.Exit()
	d.handleSendingMessagesAndReadingMoreLocked(entries, replay)
}

//go:noinline
func (d *Dispatcher) handleSendingMessagesAndReadingMoreLocked(entries []*Entry, replay bool) {
	if replay {
		for _, e := range entries {
			delete(d.replayInFlight, e.ID)
		}
	}
	sent := d.sendMessagesToConsumers(entries, replay)
	d.sendInProgress.Store(false)
	if sent > 0 {
		// Shared reads on at once; Key_Shared's next read waits for the
		// writes of this pass (trySendMessagesToConsumers returns false).
		if d.typ == Shared {
			d.readMoreEntriesLocked()
		}
		return
	}
	if d.firstConsumerWithPermits() != nil {
		// Everything was blocked (Key_Shared): retry after a backoff.
		loop := d.broker.executor()
		loop.Execute(nil, func() { loop.Schedule(time.Millisecond, func() { d.readMoreEntriesAsync(loop) }) })
	}
}

// sendMessagesToConsumers dispatches entries under the monitor and
// returns how many were sent; the rest go to the replay set.
//
//go:noinline
func (d *Dispatcher) sendMessagesToConsumers(entries []*Entry, replay bool) int {
	if d.typ == KeyShared {
		return d.trySendKeyShared(entries, replay)
	}
	return d.trySendShared(entries, replay)
}

func (d *Dispatcher) trySendShared(entries []*Entry, replay bool) int {
	sent := 0
	i := 0
	for i < len(entries) {
		c := d.nextConsumer()
		if c == nil {
			break
		}
		k := min(int64(maxEntriesPerConsumer), int64(len(entries)-i), c.permits.Load(),
			maxUnackedPerConsumer-c.unacked.Load())
		if k <= 0 {
			break
		}
		batch := entries[i : i+int(k)]
		d.sendTo(c, batch, replay, nil)
		i += int(k)
		sent += int(k)
	}
	if replay {
		for _, e := range entries[:i] {
			d.removeFromReplay(e)
		}
	} else {
		d.addToReplay(entries[i:])
	}
	return sent
}

// nextConsumer picks the next consumer with permits, round robin.
func (d *Dispatcher) nextConsumer() *Consumer {
	n := len(d.consumers)
	for j := 0; j < n; j++ {
		c := d.consumers[(d.rr+j)%n]
		if c.permits.Load() > 0 && c.unacked.Load() < maxUnackedPerConsumer {
			d.rr = (d.rr + j + 1) % n
			return c
		}
	}
	return nil
}

func (d *Dispatcher) trySendKeyShared(entries []*Entry, replay bool) int {
	groups := map[*Consumer][]*Entry{}
	var order []*Consumer
	left := map[*Consumer]int64{}
	blockedNow := map[uint32]bool{} // hashes held back in this pass keep later entries back
	var held []*Entry
	var olderWaiting map[uint32]uint64
	if replay {
		olderWaiting = d.oldestOutsideBatch(entries)
	}
	for _, e := range entries {
		if oldest, ok := olderWaiting[e.Hash]; ok && oldest < e.ID {
			blockedNow[e.Hash] = true // an older entry of this key joined the replay set since this read
		}
		c := d.selector.selectConsumer(e.Hash)
		ok := c != nil && !blockedNow[e.Hash] && !d.draining.blocks(e.Hash, c)
		if ok && !replay && d.replayHashes[e.Hash] > 0 {
			ok = false // earlier entries of this key wait in the replay set
		}
		if ok {
			if _, seen := left[c]; !seen {
				left[c] = min(c.permits.Load(), maxUnackedPerConsumer-c.unacked.Load())
			}
			ok = left[c] > 0
		}
		if !ok {
			blockedNow[e.Hash] = true
			held = append(held, e)
			continue
		}
		left[c]--
		if groups[c] == nil {
			order = append(order, c)
		}
		groups[c] = append(groups[c], e)
	}
	sent := 0
	// The pass's last completed write requests the next read, as upstream's
	// remainingConsumersToFinishSending does
	// (PersistentStickyKeyDispatcherMultipleConsumers.trySendMessagesToConsumers).
	remaining := &atomic.Int32{}
	remaining.Store(int32(len(order)))
	for _, c := range order {
		g := groups[c]
		if replay {
			for _, e := range g {
				d.removeFromReplay(e)
			}
		}
		d.sendTo(c, g, replay, remaining)
		sent += len(g)
	}
	if !replay {
		d.addToReplay(held)
	}
	return sent
}

// oldestOutsideBatch returns, per hash of the batch, the oldest replay
// entry that is not in the batch: entries redelivered while a replay read
// was under way must still go first.
func (d *Dispatcher) oldestOutsideBatch(entries []*Entry) map[uint32]uint64 {
	in := make(map[uint64]bool, len(entries))
	hashes := map[uint32]bool{}
	for _, e := range entries {
		in[e.ID] = true
		hashes[e.Hash] = true
	}
	out := map[uint32]uint64{}
	for id, h := range d.replay {
		if !hashes[h] || in[id] {
			continue
		}
		if old, ok := out[h]; !ok || id < old {
			out[h] = id
		}
	}
	return out
}

// sendTo is Consumer.sendMessages: records pending acks, takes permits,
// and hands the write to the consumer connection's event loop.
func (d *Dispatcher) sendTo(c *Consumer, entries []*Entry, redelivery bool, remaining *atomic.Int32) {
	c.pendingMu.Lock()
	for _, e := range entries {
		c.pendingAcks[e.ID] = e.Hash
	}
	c.pendingMu.Unlock()
	n := int64(len(entries))
	if c.unacked.Add(n) >= maxUnackedPerConsumer {
		c.blocked.Store(true)
	}
	c.permits.Add(-n)
	d.totalPermits.Add(-n)
	d.sendMessagesToConsumer(c, entries, redelivery, remaining)
}

// sendMessagesToConsumer is PulsarCommandSenderImpl.sendMessagesToConsumer:
// it always hands the write to the connection's loop, waking it if asleep.
//
//go:noinline
func (d *Dispatcher) sendMessagesToConsumer(c *Consumer, entries []*Entry, redelivery bool, remaining *atomic.Int32) {
	loop := c.cnx.loop
	var red uint32
	if redelivery {
		red = 1
	}
	loop.Execute(nil, func() {
		for _, e := range entries {
			c.cnx.writeMessage(c.ID, e, red)
		}
		if remaining != nil && remaining.Add(-1) == 0 {
			d.readMoreEntriesAsync(loop)
		}
	})
}

func (d *Dispatcher) addToReplay(entries []*Entry) {
	for _, e := range entries {
		if _, ok := d.replay[e.ID]; !ok {
			d.replay[e.ID] = e.Hash
			d.replayHashes[e.Hash]++
		}
	}
}

func (d *Dispatcher) removeFromReplay(e *Entry) {
	if _, ok := d.replay[e.ID]; ok {
		delete(d.replay, e.ID)
		if d.replayHashes[e.Hash]--; d.replayHashes[e.Hash] <= 0 {
			delete(d.replayHashes, e.Hash)
		}
	}
}

// AddConsumer is synchronized addConsumer.
//
//go:noinline
func (d *Dispatcher) AddConsumer(c *Consumer) {
	d.Monitor.Enter()
	defer d.Monitor.Exit()
	c.d = d
	d.consumers = append(d.consumers, c)
	d.members[c] = true
	d.variant.AddConsumerAccounting(d, c)
	if d.typ == KeyShared {
		d.selector.add(c)
		d.markDraining()
	}
}

// markDraining blocks hashes that moved to a new owner while their
// previous owner still has them unacknowledged. Each consumer is examined
// under its pending-ack lock, which acknowledge holds while it releases
// draining hashes, so no acknowledgement falls between count and mark.
func (d *Dispatcher) markDraining() {
	for _, c := range d.consumers {
		c.pendingMu.Lock()
		counts := map[uint32]int{}
		for _, h := range c.pendingAcks {
			counts[h]++
		}
		for h, refs := range counts {
			if d.selector.selectConsumer(h) != c {
				d.draining.add(h, c, refs)
			}
		}
		c.pendingMu.Unlock()
	}
}

// RemoveConsumer is synchronized removeConsumer: the consumer's permits
// are debited and its unacknowledged messages redelivered.
//
//go:noinline
func (d *Dispatcher) RemoveConsumer(c *Consumer) {
	d.Monitor.Enter()
	defer d.Monitor.Exit()
	if !d.members[c] {
		return
	}
	delete(d.members, c)
	for i, x := range d.consumers {
		if x == c {
			d.consumers = append(d.consumers[:i], d.consumers[i+1:]...)
			break
		}
	}
	d.variant.RemoveConsumerAccounting(d, c)
	c.pendingMu.Lock()
	var redeliver []*Entry
	for id, h := range c.pendingAcks {
		redeliver = append(redeliver, &Entry{ID: id, Hash: h})
	}
	c.pendingAcks = map[uint64]uint32{}
	c.pendingMu.Unlock()
	c.unacked.Store(0)
	d.Redelivered.Add(uint64(len(redeliver)))
	d.addToReplay(redeliver)
	if d.typ == KeyShared {
		d.selector.remove(c)
		d.draining.dropOwner(c)
		d.markDraining()
	}
	if len(d.consumers) > 0 {
		d.readMoreEntriesAsync(nil)
	}
}

// acknowledge runs on the consumer connection's IO loop.
//
//go:noinline
func (d *Dispatcher) acknowledge(from *EventLoop, c *Consumer, ids []byte) {
	var unblocked bool
	var acked int64
	c.pendingMu.Lock()
	for off := 0; off+8 <= len(ids); off += 8 {
		id := binary.BigEndian.Uint64(ids[off:])
		h, ok := c.pendingAcks[id]
		if !ok {
			continue
		}
		delete(c.pendingAcks, id)
		acked++
		if d.typ == KeyShared && d.draining.acked(h, c) {
			unblocked = true
		}
	}
	c.pendingMu.Unlock()
	if acked == 0 {
		return
	}
	d.Acked.Add(uint64(acked))
	if c.unacked.Add(-acked) < maxUnackedPerConsumer/2 && c.blocked.Load() {
		c.blocked.Store(false)
		if p := c.parked; p > 0 {
			c.parked = 0
			c.flowPermits(from, p)
		}
	}
	if unblocked {
		d.readMoreEntriesAsync(from)
	}
}

// ReplaySize is the number of entries waiting for redelivery.
func (d *Dispatcher) ReplaySize() int {
	d.Monitor.Enter()
	defer d.Monitor.Exit()
	return len(d.replay)
}

// Consumers returns the current consumers.
func (d *Dispatcher) Consumers() []*Consumer {
	d.Monitor.Enter()
	defer d.Monitor.Exit()
	return append([]*Consumer(nil), d.consumers...)
}

// State describes the dispatcher for a stalled run's report.
func (d *Dispatcher) State() string {
	d.Monitor.Enter()
	defer d.Monitor.Exit()
	s := fmt.Sprintf("%s: total permits %d, pending read %v, pending replay read %v, send in progress %v, replay %d (in flight %d), draining hashes %d, read requested %v; consumers:",
		d.Name, d.totalPermits.Load(), d.havePendingRead, d.havePendingReplayRead, d.sendInProgress.Load(), len(d.replay), len(d.replayInFlight),
		d.draining.len(), d.readMoreEntriesRequested.Load())
	for _, c := range d.consumers {
		c.pendingMu.Lock()
		s += fmt.Sprintf(" %d[permits %d unacked %d pending %d blocked %v]", c.ID, c.permits.Load(), c.unacked.Load(), len(c.pendingAcks), c.blocked.Load())
		c.pendingMu.Unlock()
	}
	return s
}
