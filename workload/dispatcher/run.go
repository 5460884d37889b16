package dispatcher

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"regexp"
	"runtime"
	"time"
)

// Config is one run of the dispatch core.
type Config struct {
	Scenario Scenario
	Variant  string
	// Drain bounds how long to wait for delivery after publishing ends.
	Drain time.Duration
	// Progress, if set, receives a line per second while the run lasts.
	Progress io.Writer
	// Pin puts the broker threads on the first half of the CPUs and the
	// client threads on the rest (with 2 CPUs or more).
	Pin bool
}

// KeyMetrics are the run's metrics a diff compares first, in this order.
var KeyMetrics = []string{"publish_rate", "publish_p50_ms", "publish_p99_ms", "e2e_p50_ms", "e2e_p99_ms",
	"backlog", "cpu_per_msg_us", "broker_cpu_s", "broker_wakeups_per_msg", "monitor_waits", "entries_per_read"}

// NotCompared are the run's counts that are not measurements: Verify
// checks the deliveries.
var NotCompared = []string{"pid", "duration_s", "delivered", "undelivered", "drain_wait_s", "duplicates", "order_violations", "invalid"}

// BrokerThreads matches the names of the broker's threads (IO loops, the
// managed-ledger thread, topic workers); the others are the clients'.
const BrokerThreads = `^(broker-io-\d|ml-worker$|topic-worker-\d|broker-rate-mon)`

var brokerThreads = regexp.MustCompile(BrokerThreads)

// IsBrokerThread tells broker threads from client threads by name.
func IsBrokerThread(comm string) bool { return brokerThreads.MatchString(comm) }

// AppThreads matches the threads of the multi-topic consumers'
// application: its IO loops, the listener pools and the timer.
const AppThreads = `^(app-io-\d|pulsar-(intern|extern)-\d|pulsar-timer)`

var (
	listenerThreads = regexp.MustCompile(ListenerThreads)
	appThreads      = regexp.MustCompile(AppThreads)
)

// Run runs one scenario on one variant and verifies every delivery.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	sc := cfg.Scenario.withDefaults()
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	vs, err := resolveVariants(sc.Change, cfg.Variant)
	if err != nil {
		return nil, err
	}
	if !sc.Listener {
		vs.listener = nil
	}
	if sc.Topics == 1 {
		vs.batch = nil
	}
	if cfg.Drain == 0 {
		cfg.Drain = 60 * time.Second
	}
	// Every locked thread may hold a P: the kernel, not Go, schedules them.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(lockedThreads(sc, vs.batch != nil) + 2))
	pinned := false
	if cfg.Pin {
		if split := splitCPUs(); split != nil {
			pinning.Store(split)
			defer pinning.Store(nil)
			pinned = true
		}
	}
	b, cl, err := startSystem(ctx, sc, vs)
	if err != nil {
		return nil, err
	}
	defer b.Stop()
	defer cl.stop()
	l := runLoad(ctx, cfg, sc, b, cl)

	r := &Result{Scenario: sc.Name, Variant: cfg.Variant, Published: l.published, PID: os.Getpid(),
		DurationS: l.elapsed.Seconds(), BrokerCPUs: l.cpu.broker, ProcessCPUs: l.cpu.total, ScenarioDetails: sc, PinnedCPUs: pinned, DrainWaitS: cfg.Drain.Seconds(),
		KeyOrder: KeyMetrics, NotComparedOrder: NotCompared}
	if sc.Listener {
		r.PoolsCPUs = l.cpu.pools
	}
	if vs.batch != nil {
		r.AppCPUs = l.cpu.app
	}
	if !l.warm.at.IsZero() && l.pubEnd.After(l.warm.at) && l.published > l.warm.published {
		r.WarmupS = l.warm.at.Sub(l.start).Seconds()
		r.PublishRate = float64(l.published-l.warm.published) / l.pubEnd.Sub(l.warm.at).Seconds()
	} else if d := l.pubEnd.Sub(l.start).Seconds(); d > 0 {
		r.PublishRate = float64(l.published) / d
	}
	collect(r, sc, b, cl, l.backlog, l.clock)
	if l.interrupted {
		return r, ctx.Err()
	}
	return r, nil
}

// lockedThreads counts the threads the core locks to OS threads.
func lockedThreads(sc Scenario, batch bool) int {
	n := sc.BrokerIOThreads + 1 + sc.TopicWorkers + sc.ClientIOThreads + sc.ProducerThreads + sc.ConsumerThreads
	if sc.Listener {
		n += sc.InternalThreads + sc.ListenerThreads
	}
	if batch {
		n += sc.ClientIOThreads + 1 // app-io-N, pulsar-timer
	}
	return n
}

// startSystem starts the broker and the client, subscribed.
func startSystem(ctx context.Context, sc Scenario, vs variantSet) (*Broker, *Client, error) {
	var subs []SubscriptionConfig
	var types []SubType
	for _, s := range sc.Subscriptions {
		t, _ := parseSubType(s.Type)
		subs = append(subs, SubscriptionConfig{Name: s.Name, Type: t})
		types = append(types, t)
	}
	b, err := NewBroker(BrokerConfig{IOThreads: sc.BrokerIOThreads, TopicWorkers: sc.TopicWorkers, SendOnReadThread: sc.SendOnReadThread, Topics: sc.Topics, Variant: vs.broker, Subscriptions: subs,
		Throttle: ThrottleConfig{BrokerBytesPerS: sc.PublishRateLimit, TopicBytesPerS: sc.TopicPublishRateLimit, Tick: sc.ThrottlingTick, Variant: vs.throttle}})
	if err != nil {
		return nil, nil, err
	}
	b.Start()
	cl, err := newClient(b, clientConfig{
		producers: sc.Producers, producerThreads: sc.ProducerThreads, consumerThreads: sc.ConsumerThreads,
		ioThreads: sc.ClientIOThreads, receiverQueue: sc.ReceiverQueue, maxPending: sc.MaxPending,
		payload: sc.PayloadSize, keySpace: sc.KeySpace, rate: sc.Rate,
		listener: vs.listener, internalThreads: sc.InternalThreads, listenerThreads: sc.ListenerThreads,
		topics: sc.Topics, batch: vs.batch, asyncSend: sc.throttled(),
	}, types)
	if err != nil {
		b.Stop()
		return nil, nil, err
	}
	if err := subscribeAll(ctx, b, cl, sc); err != nil {
		cl.stop()
		b.Stop()
		return nil, nil, err
	}
	return b, cl, nil
}

// load is what publishing and draining measured.
type load struct {
	start, pubEnd time.Time
	elapsed       time.Duration
	published     int64
	backlog       []int64
	warm          *warmup
	clock         *deliveryClock
	cpu           cpuTimes
	interrupted   bool
}

// runLoad publishes the scenario's messages, waits for their receipts and
// deliveries, and measures.
func runLoad(ctx context.Context, cfg Config, sc Scenario, b *Broker, cl *Client) load {
	l := load{}
	cpu0 := threadCPU()
	l.start = time.Now()
	clockStop := make(chan struct{})
	l.clock = watchDeliveries(cl, clockStop)
	startProducers(cl, sc, l.start)
	churnStop := make(chan struct{})
	churnDone := make(chan struct{})
	go func() {
		defer close(churnDone)
		if sc.Churn > 0 {
			cl.churn(sc.Churn, churnStop)
		}
	}()
	stopProgress := progress(cfg.Progress, cl, l.start)
	warmStop := make(chan struct{})
	l.warm = watchWarmup(cl, sc, l.start, warmStop)
	pubFinished := make(chan struct{})
	go func() { cl.pubDone.Wait(); close(pubFinished) }()

	select {
	case <-pubFinished:
	case <-ctx.Done():
		l.interrupted = true
		cl.stopPub.Store(true)
		for _, pt := range cl.prodThr {
			pt.wake.Notify() // a producer waiting for room
		}
		<-pubFinished
	}
	// Wait for the receipts of what was sent, then note the backlog.
	waitFor(ctx, cfg.Drain, func() bool { return cl.inflight() == 0 })
	l.published = cl.published.Load()
	for k, d := range b.subs {
		l.backlog = append(l.backlog, cl.publishedTo(k)-int64(d.Acked.Load()))
	}
	l.pubEnd = time.Unix(0, cl.pubEnded.Load())
	close(warmStop)
	<-l.warm.done
	close(churnStop)
	<-churnDone
	if !l.interrupted {
		waitDelivered(ctx, cfg, b, cl)
	}
	l.elapsed = time.Since(l.start)
	stopProgress()
	close(clockStop)
	<-l.clock.done
	l.cpu = threadCPU().sub(cpu0)
	cl.stop()
	return l
}

// startProducers starts the producer threads on the scenario's messages
// or duration.
func startProducers(cl *Client, sc Scenario, start time.Time) {
	cl.latStart.Store(start.UnixNano())
	if sc.Messages > 0 {
		cl.toPublish.Store(sc.Messages)
	} else {
		cl.toPublish.Store(1 << 62)
		cl.deadline = start.Add(sc.Duration)
	}
	for _, pt := range cl.prodThr {
		pt := pt
		cl.pubDone.Add(1)
		StartThread(pt.name, func() { cl.runProducer(pt) })
	}
}

// waitDelivered waits until every subscription received every published
// message, and says where each dispatcher stands if that stalls.
func waitDelivered(ctx context.Context, cfg Config, b *Broker, cl *Client) {
	err := waitFor(ctx, cfg.Drain, func() bool {
		for k, s := range cl.subs {
			if s.distinct.Load() < cl.publishedTo(k) {
				return false
			}
		}
		return true
	})
	if err != nil && cfg.Progress != nil {
		fmt.Fprintf(cfg.Progress, "delivery stalled (%v):\n", err)
		for _, d := range b.subs {
			fmt.Fprintf(cfg.Progress, "  %s\n", d.State())
		}
	}
}

// subscribeAll starts the consumer threads and subscribes every consumer
// of the scenario, round-robin over the threads.
func subscribeAll(ctx context.Context, b *Broker, cl *Client, sc Scenario) error {
	for _, ct := range cl.consThr {
		ct := ct
		cl.consDone.Add(1)
		StartThread(ct.name, func() { cl.runConsumerThread(ct) })
	}
	if cl.multi != nil {
		return subscribeMultiAll(ctx, b, cl, sc)
	}
	n := 0
	for i, s := range sc.Subscriptions {
		for j := 0; j < s.Consumers; j++ {
			var ct *consumerThread // none: the consumer has a listener
			if len(cl.consThr) > 0 {
				ct = cl.consThr[n%len(cl.consThr)]
			}
			if _, err := cl.subscribe(i, ct, nil); err != nil {
				return fmt.Errorf("subscribing: %w", err)
			}
			n++
		}
	}
	return waitSubscribed(ctx, b, sc)
}

// waitSubscribed waits until every dispatcher has its consumers.
func waitSubscribed(ctx context.Context, b *Broker, sc Scenario) error {
	if err := waitFor(ctx, 10*time.Second, func() bool {
		for k, d := range b.subs {
			if len(d.Consumers()) != sc.Subscriptions[k%len(sc.Subscriptions)].Consumers {
				return false
			}
		}
		return true
	}); err != nil {
		return fmt.Errorf("consumers did not subscribe: %w", err)
	}
	return nil
}

// subscribeMultiAll creates the scenario's multi-topic consumers, one
// internal consumer per topic each, and starts their receive loops once
// the broker has them all.
func subscribeMultiAll(ctx context.Context, b *Broker, cl *Client, sc Scenario) error {
	for i, s := range sc.Subscriptions {
		for j := 0; j < s.Consumers; j++ {
			if _, err := cl.subscribeMulti(i, sc.Topics); err != nil {
				return fmt.Errorf("subscribing: %w", err)
			}
		}
	}
	if err := waitSubscribed(ctx, b, sc); err != nil {
		return err
	}
	for _, mt := range cl.multi.multis {
		mt.start()
	}
	return nil
}

func (cl *Client) inflight() int64 {
	var n int64
	for _, pt := range cl.prodThr {
		for _, p := range pt.producers {
			n += p.inflight.Load()
		}
	}
	return n
}

// churn makes a random consumer leave and a new one join on its
// connection, every period.
func (cl *Client) churn(period time.Duration, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(7, 7))
	every(period, stop, func() bool {
		sub := rng.IntN(len(cl.consumers))
		list := cl.consumers[sub]
		if len(list) == 0 {
			return true
		}
		i := rng.IntN(len(list))
		old := list[i]
		if old.close() != nil {
			return false
		}
		cl.consumers[sub] = append(list[:i:i], list[i+1:]...)
		_, err := cl.subscribe(sub, old.thread, old.cc)
		return err == nil
	})
}

func waitFor(ctx context.Context, limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

func progress(w io.Writer, cl *Client, start time.Time) func() {
	if w == nil {
		return func() {}
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		every(time.Second, stop, func() bool {
			var delivered int64
			for _, s := range cl.subs {
				delivered += s.distinct.Load()
			}
			fmt.Fprintf(w, "  %4.0fs  published %d  delivered %d\n", time.Since(start).Seconds(), cl.published.Load(), delivered)
			return true
		})
	}()
	return func() { close(stop); <-done }
}
