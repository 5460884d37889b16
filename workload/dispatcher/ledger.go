package dispatcher

import (
	"sync/atomic"
	"time"
)

// Entry is one stored message.
type Entry struct {
	ID   uint64
	Key  uint32 // key index, as published
	Hash uint32 // sticky-key hash slot (murmur3 mod 65536)
	Body []byte // message body as published, with its checksum
}

// ManagedLedger is an in-memory append-only entry log. Adds and reads
// run on the managed-ledger executor thread (ml-worker), where read
// completions (readEntriesComplete) run too.
type ManagedLedger struct {
	exec    *Executor
	entries []*Entry // ml-worker only
	cursors []*Cursor
	Added   atomic.Uint64
}

func NewManagedLedger(exec *Executor) *ManagedLedger { return &ManagedLedger{exec: exec} }

type pendingAdd struct {
	key  uint32
	hash uint32
	body []byte
	ack  func(entryID uint64)
}

// AsyncAddEntries appends a batch handed off by an IO loop (#26717's
// batched add) and completes each add on the ledger thread.
func (ml *ManagedLedger) AsyncAddEntries(batch []pendingAdd, done func(ids []uint64)) {
	ml.exec.Execute(func() { ml.addEntries(batch, done) })
}

//go:noinline
func (ml *ManagedLedger) addEntries(batch []pendingAdd, done func(ids []uint64)) {
	ids := make([]uint64, len(batch))
	for i, a := range batch {
		e := &Entry{ID: uint64(len(ml.entries)), Key: a.key, Hash: a.hash, Body: a.body}
		ml.entries = append(ml.entries, e)
		ids[i] = e.ID
	}
	ml.Added.Add(uint64(len(batch)))
	done(ids)
	for _, c := range ml.cursors {
		c.notifyEntriesAvailable()
	}
}

// Cursor is a subscription's read position with read-or-wait semantics.
type Cursor struct {
	ml      *ManagedLedger
	readPos uint64 // ml-worker only
	waiting *waitingRead
	Reads   atomic.Uint64
	Entries atomic.Uint64
}

type waitingRead struct {
	n  int
	cb func([]*Entry)
	// notified: the read waits for the next add; before that it waits
	// for its new-entries check.
	notified bool
}

// newEntriesCheckDelay is managedLedgerNewEntriesCheckDelayInMillis (10 ms
// by default): a read that finds no entries checks again after it, and
// only then waits to be notified of the next add
// (ManagedCursorImpl.asyncReadEntriesWithSkipOrWait, checkForNewEntries).
const newEntriesCheckDelay = 10 * time.Millisecond

// NewCursor must be called before entries are added.
func (ml *ManagedLedger) NewCursor() *Cursor {
	c := &Cursor{ml: ml}
	ml.cursors = append(ml.cursors, c)
	return c
}

// AsyncReadEntriesOrWait reads up to n entries from the read position; if
// none exist yet it checks again after newEntriesCheckDelay, then waits
// for the next add.
func (c *Cursor) AsyncReadEntriesOrWait(n int, cb func([]*Entry)) {
	c.ml.exec.Execute(func() {
		if c.tryRead(n, cb) {
			return
		}
		w := &waitingRead{n: n, cb: cb}
		c.waiting = w
		time.AfterFunc(newEntriesCheckDelay, func() {
			c.ml.exec.Execute(func() { c.checkForNewEntries(w) })
		})
	})
}

// checkForNewEntries reads what arrived during the delay, or has the
// read notified by the next add.
func (c *Cursor) checkForNewEntries(w *waitingRead) {
	if c.waiting != w {
		return
	}
	c.waiting = nil
	if !c.tryRead(w.n, w.cb) {
		w.notified = true
		c.waiting = w
	}
}

func (c *Cursor) tryRead(n int, cb func([]*Entry)) bool {
	avail := uint64(len(c.ml.entries)) - c.readPos
	if avail == 0 {
		return false
	}
	k := min(uint64(n), avail)
	out := make([]*Entry, k)
	copy(out, c.ml.entries[c.readPos:c.readPos+k])
	c.readPos += k
	c.Reads.Add(1)
	c.Entries.Add(k)
	cb(out)
	return true
}

func (c *Cursor) notifyEntriesAvailable() {
	if w := c.waiting; w != nil && w.notified {
		c.waiting = nil
		c.tryRead(w.n, w.cb)
	}
}

// AsyncReplayEntries reads specific entries (redeliveries).
func (c *Cursor) AsyncReplayEntries(ids []uint64, cb func([]*Entry)) {
	c.ml.exec.Execute(func() {
		out := make([]*Entry, 0, len(ids))
		for _, id := range ids {
			if id < uint64(len(c.ml.entries)) {
				out = append(out, c.ml.entries[id])
			}
		}
		cb(out)
	})
}
