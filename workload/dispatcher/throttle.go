package dispatcher

import (
	"sync"
	"sync/atomic"
	"time"
)

// Publish throttling as Pulsar's broker ran it when seed 004 was written
// (pulsar-broker .../service/ServerCnx.java handleSend,
// PublishRateLimiterImpl.java, BrokerService.java
// setupBrokerPublishRateLimiterMonitor, checkBrokerPublishThrottlingRate
// and refreshBrokerPublishRate, AbstractTopic.java
// incrementPublishCount, disableProducerRead and
// resetBrokerPublishCountAndEnableReadIfRequired):
//
//   - every Send adds its size to the broker's limiter and its topic's;
//   - a monitor thread checks the counts every tick
//     (brokerPublisherThrottlingTickTimeMillis) and marks a limiter
//     exceeded once its count passes the rate; every second it resets the
//     counts and turns reading back on where throttling turned it off;
//   - ServerCnx.handleSend, after taking a message, turns auto-read off on
//     its own connection when the topic's or the broker's rate is exceeded.
//
// So a connection stops only after it read one more message. PR 6550
// (the candidate) also turns auto-read off on every producer connection
// when the monitor finds the rate exceeded.

// throttleVariant is what the monitor does when it finds a rate exceeded
// (seed 004).
type throttleVariant interface {
	Name() string
	Description() string
	onExceeded(t *throttling, topic int) // topic < 0: the broker's rate
}

func init() {
	registerSide(ChangeThrottle, throttleSide{throttleBaseline{}})
	registerSide(ChangeThrottle, throttleSide{throttleCandidate{}})
}

type throttleBaseline struct{}

func (throttleBaseline) Name() string { return "baseline" }
func (throttleBaseline) Description() string {
	return "a connection turns auto-read off itself, after reading one more message (before #6550)"
}
func (throttleBaseline) onExceeded(t *throttling, topic int) {}

type throttleCandidate struct{}

func (throttleCandidate) Name() string { return "candidate" }
func (throttleCandidate) Description() string {
	return "the monitor turns auto-read off on every producer connection when the rate is exceeded (#6550)"
}
func (throttleCandidate) onExceeded(t *throttling, topic int) { t.disableProducerRead(topic) }

// publishRateLimiter is PublishRateLimiterImpl: published bytes since the
// last reset, and whether they passed the rate.
type publishRateLimiter struct {
	maxBytes int64 // per second (publishMaxByteRate)
	bytes    atomic.Int64
	exceeded atomic.Bool
}

func newLimiter(maxBytes int64) *publishRateLimiter {
	if maxBytes <= 0 {
		return nil
	}
	return &publishRateLimiter{maxBytes: maxBytes}
}

func (r *publishRateLimiter) increment(n int) {
	if r != nil {
		r.bytes.Add(int64(n))
	}
}

func (r *publishRateLimiter) isExceeded() bool { return r != nil && r.exceeded.Load() }

// checkPublishRate reports whether the rate became exceeded at this check.
func (r *publishRateLimiter) checkPublishRate() bool {
	if r == nil || r.exceeded.Load() || r.bytes.Load() <= r.maxBytes {
		return false
	}
	r.exceeded.Store(true)
	return true
}

func (r *publishRateLimiter) resetPublishCount() {
	if r != nil {
		r.bytes.Store(0)
		r.exceeded.Store(false)
	}
}

// ThrottleConfig sets publish throttling up (no limit: none).
type ThrottleConfig struct {
	BrokerBytesPerS int64         // brokerPublisherThrottlingMaxByteRate
	TopicBytesPerS  int64         // each topic's publish rate (bytes/s)
	Tick            time.Duration // brokerPublisherThrottlingTickTimeMillis
	Variant         throttleVariant
}

// throttling is the broker's limiters and their monitor thread.
type throttling struct {
	b       *Broker
	variant throttleVariant
	broker  *publishRateLimiter
	topics  []*publishRateLimiter // by topic; nil entries: no topic limit
	tick    time.Duration

	mu       sync.Mutex
	topicCnx [][]*serverCnx // by topic: connections that published to it

	stopped atomic.Bool
	done    chan struct{}

	Ticks       atomic.Uint64 // checks run
	ReadOff     atomic.Uint64 // auto-read turned off (connections)
	ReadOffSelf atomic.Uint64 // of them, by the connection's own handleSend
}

func newThrottling(b *Broker, cfg ThrottleConfig, topics int) *throttling {
	if cfg.BrokerBytesPerS <= 0 && cfg.TopicBytesPerS <= 0 {
		return nil
	}
	if cfg.Tick <= 0 {
		cfg.Tick = time.Millisecond
	}
	if cfg.Variant == nil {
		cfg.Variant = throttleCandidate{}
	}
	t := &throttling{b: b, variant: cfg.Variant, broker: newLimiter(cfg.BrokerBytesPerS), tick: cfg.Tick,
		topicCnx: make([][]*serverCnx, topics), done: make(chan struct{})}
	for i := 0; i < topics; i++ {
		t.topics = append(t.topics, newLimiter(cfg.TopicBytesPerS))
	}
	return t
}

// publishRateExceeded is AbstractTopic.isPublishRateExceeded: the topic's
// rate or the broker's.
func (t *throttling) publishRateExceeded(topic int) bool {
	return t.topics[topic].isExceeded() || t.broker.isExceeded()
}

// incrementPublishCount counts a message sent to topic on sc; the first
// one registers sc as a producer connection of the topic.
func (t *throttling) incrementPublishCount(sc *serverCnx, topic, size int) {
	t.topics[topic].increment(size)
	t.broker.increment(size)
	if sc.published[topic] {
		return
	}
	sc.published[topic] = true
	t.mu.Lock()
	t.topicCnx[topic] = append(t.topicCnx[topic], sc)
	t.mu.Unlock()
}

// forCnx calls f once for each producer connection of topic (all topics
// when topic < 0).
func (t *throttling) forCnx(topic int, f func(*serverCnx)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	seen := map[*serverCnx]bool{}
	for i, list := range t.topicCnx {
		if topic >= 0 && i != topic {
			continue
		}
		for _, sc := range list {
			if !seen[sc] {
				seen[sc] = true
				f(sc)
			}
		}
	}
}

// disableProducerRead turns auto-read off on the producer connections of
// topic (all when topic < 0), each on its IO loop.
//
//go:noinline
func (t *throttling) disableProducerRead(topic int) {
	t.forCnx(topic, func(sc *serverCnx) { sc.disableCnxAutoRead() })
}

// enableProducerRead turns reading back on where throttling turned it off.
//
//go:noinline
func (t *throttling) enableProducerRead() {
	t.forCnx(-1, func(sc *serverCnx) { sc.enableCnxAutoRead() })
}

func (t *throttling) start() { StartThread("broker-rate-mon", t.run) }

func (t *throttling) stop() {
	t.stopped.Store(true)
	<-t.done
}

// run is the monitor: a check every tick, a reset every second.
func (t *throttling) run() {
	defer close(t.done)
	next := nanotime()
	nextReset := next + int64(time.Second)
	for !t.stopped.Load() {
		next += int64(t.tick)
		if next > nanotime() {
			waitForNextTick(next)
		}
		t.checkPublishThrottlingRate()
		if nanotime() >= nextReset {
			nextReset += int64(time.Second)
			t.refreshPublishRate()
		}
	}
}

//go:noinline
func (t *throttling) checkPublishThrottlingRate() {
	t.Ticks.Add(1)
	if t.broker.checkPublishRate() {
		t.variant.onExceeded(t, -1)
	}
	for i, r := range t.topics {
		if r.checkPublishRate() {
			t.variant.onExceeded(t, i)
		}
	}
}

//go:noinline
func (t *throttling) refreshPublishRate() {
	t.broker.resetPublishCount()
	for _, r := range t.topics {
		r.resetPublishCount()
	}
	t.enableProducerRead()
}

// disableCnxAutoRead turns reading sc off from another thread (Netty runs
// setAutoRead(false) as a task on the channel's loop).
func (sc *serverCnx) disableCnxAutoRead() {
	if sc.throttled.Swap(true) {
		return
	}
	sc.loop.Execute(nil, func() {
		if sc.throttled.Load() && !sc.readOff { // not turned back on, nor off, meanwhile
			sc.setAutoRead(false)
			sc.broker.throttle.ReadOff.Add(1)
		}
	})
}

// enableCnxAutoRead turns reading sc back on if throttling turned it off.
func (sc *serverCnx) enableCnxAutoRead() {
	if !sc.throttled.Swap(false) {
		return
	}
	sc.loop.Execute(nil, func() {
		if !sc.throttled.Load() { // not throttled again meanwhile
			sc.setAutoRead(true)
		}
	})
}

// throttleOnSend is handleSend's check after taking a message: over the
// rate, this connection stops reading.
//
//go:noinline
func (sc *serverCnx) throttleOnSend(topic, size int) {
	t := sc.broker.throttle
	t.incrementPublishCount(sc, topic, size)
	if t.publishRateExceeded(topic) && !sc.readOff {
		sc.throttled.Store(true)
		sc.setAutoRead(false)
		t.ReadOff.Add(1)
		t.ReadOffSelf.Add(1)
	}
}

// latencyWindows returns the publish latency p50 and p99 of the first and
// the last 10 s of publishing (a third of the seconds each when the run
// is shorter than 30 s).
func (cl *Client) latencyWindows() (firstP50, firstP99, lastP50, lastP99 float64) {
	secs := int((cl.pubEnded.Load() - cl.latStart.Load()) / 1e9)
	if secs < 1 {
		return
	}
	w := min(10, max(secs/3, 1))
	first, last := newHist(), newHist()
	for _, hs := range cl.loopSec {
		for sec, h := range *hs {
			if sec < w {
				first.Merge(h)
			}
			if sec >= secs-w && sec <= secs {
				last.Merge(h)
			}
		}
	}
	return ms(first, 50), ms(first, 99), ms(last, 50), ms(last, 99)
}
