package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/prometheus/procfs"
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

// SubResult is one subscription's outcome.
type SubResult struct {
	Name            string `json:"name"`
	Type            string `json:"type"`
	Consumers       int    `json:"consumers"`
	Delivered       int64  `json:"delivered"`
	Duplicates      int64  `json:"duplicates"`
	OrderViolations int64  `json:"order_violations"`
	Invalid         int64  `json:"invalid"`
	// Undelivered: published, not received within the drain wait.
	Undelivered int64   `json:"undelivered"`
	Backlog     int64   `json:"backlog"`
	E2EP50ms    float64 `json:"e2e_p50_ms"`
	E2EP99ms    float64 `json:"e2e_p99_ms"`
	Redelivered uint64  `json:"redelivered"`
	// ConsumeRate is msg/s received by the consumers from a fifth of
	// the subscription's deliveries to its last (sampled every 10 ms).
	ConsumeRate float64 `json:"consume_rate"`
}

// KeyMetrics are the run's metrics a diff compares first, in this order.
var KeyMetrics = []string{"publish_rate", "publish_p50_ms", "publish_p99_ms", "e2e_p50_ms", "e2e_p99_ms",
	"backlog", "cpu_per_msg_us", "broker_cpu_s", "broker_wakeups_per_msg", "monitor_waits", "entries_per_read"}

// NotCompared are the run's counts that are not measurements: Verify
// checks the deliveries.
var NotCompared = []string{"pid", "duration_s", "delivered", "undelivered", "drain_wait_s", "duplicates", "order_violations", "invalid"}

// Result is what a run reports (offcpu dispatch --json).
type Result struct {
	Scenario        string      `json:"scenario"`
	Variant         string      `json:"variant"`
	Published       int64       `json:"published"`
	Delivered       int64       `json:"delivered"`
	Subscriptions   []SubResult `json:"subscriptions"`
	Duplicates      int64       `json:"duplicates"`
	OrderViolations int64       `json:"order_violations"`
	Invalid         int64       `json:"invalid"`
	// Undelivered: published, not received within DrainWaitS after
	// publishing ended.
	Undelivered  int64   `json:"undelivered"`
	DrainWaitS   float64 `json:"drain_wait_s"`
	PublishRate  float64 `json:"publish_rate"`
	PublishP50ms float64 `json:"publish_p50_ms"`
	PublishP99ms float64 `json:"publish_p99_ms"`
	E2EP50ms     float64 `json:"e2e_p50_ms"`
	E2EP99ms     float64 `json:"e2e_p99_ms"`
	Backlog      int64   `json:"backlog"`
	BrokerCPUs   float64 `json:"broker_cpu_s"`
	CPUPerMsgUs  float64 `json:"cpu_per_msg_us"`
	// ConsumeRate sums the subscriptions' consume rates (msg/s).
	ConsumeRate float64 `json:"consume_rate"`
	// Steady state: from 20% of the messages (or of the duration) to the
	// last receipt, leaving out the start-up (first reads, batch ramp-up).
	WarmupS     float64 `json:"warmup_s"`
	PinnedCPUs  bool    `json:"pinned_cpus"`
	ProcessCPUs float64 `json:"process_cpu_s"`
	PID         int     `json:"pid"`
	DurationS   float64 `json:"duration_s"`

	// Counters behind the story of seed 000.
	BrokerWakeups  uint64  `json:"broker_eventfd_wakeups"`
	WakeupsPerMsg  float64 `json:"broker_wakeups_per_msg"`
	MonitorWaits   uint64  `json:"monitor_waits"`
	FlowTasks      uint64  `json:"flow_tasks"`
	Reads          uint64  `json:"reads"`
	EntriesPerRead float64 `json:"entries_per_read"`

	// Counters behind the story of seed 003 (consumers with a listener),
	// per message received by the listeners.
	ListenerHandoffsPerMsg  float64 `json:"listener_handoffs_per_msg,omitempty"`   // tasks between the internal and listener pools
	ListenerWakeCallsPerMsg float64 `json:"listener_wake_calls_per_msg,omitempty"` // of them, ones that called futex wake: the thread had said it would sleep (the kernel counts the threads really woken: profiled runs)
	PoolsCPUs               float64 `json:"pools_cpu_s,omitempty"`                 // the pools' threads
	PoolsCPUPerMsgUs        float64 `json:"pools_cpu_per_msg_us,omitempty"`

	// Counters behind the story of seed 002 (multi-topic consumers), per
	// message received by the applications.
	AppCPUs              float64 `json:"app_cpu_s,omitempty"` // app-io-N, the pools and pulsar-timer
	AppCPUPerMsgUs       float64 `json:"app_cpu_per_msg_us,omitempty"`
	BatchReceiveTimeouts uint64  `json:"batch_receive_timeouts,omitempty"` // batch receives completed by their timeout
	EmptyBatchReceives   uint64  `json:"empty_batch_receives,omitempty"`   // of them, with no message
	TimerTasksPerMsg     float64 `json:"timer_tasks_per_msg,omitempty"`    // pendingBatchReceiveTask runs
	TimerWakeCallsPerMsg float64 `json:"timer_wake_calls_per_msg,omitempty"`
	WorstAppE2EP99ms     float64 `json:"worst_app_e2e_p99_ms"`

	// Seed 004 (publish throttling): the steady publish rate in bytes
	// against the limit, and publish latency early and late in the run
	// (the first and the last 10 s of publishing, or thirds of a shorter
	// run).
	PublishBytesPerS   float64 `json:"publish_bytes_per_s,omitempty"`
	RateLimitBytesPerS float64 `json:"rate_limit_bytes_per_s,omitempty"`
	RateOverLimit      float64 `json:"rate_over_limit,omitempty"`
	PublishFirstP50ms  float64 `json:"publish_first_p50_ms,omitempty"`
	PublishFirstP99ms  float64 `json:"publish_first_p99_ms,omitempty"`
	PublishLastP50ms   float64 `json:"publish_last_p50_ms,omitempty"`
	PublishLastP99ms   float64 `json:"publish_last_p99_ms,omitempty"`
	AutoReadOff        uint64  `json:"auto_read_off,omitempty"`         // connections throttling turned reading off on
	AutoReadOffBySend  uint64  `json:"auto_read_off_by_send,omitempty"` // of them, by their own handleSend
	ThrottleChecks     uint64  `json:"throttle_checks,omitempty"`

	ScenarioDetails Scenario `json:"scenario_parameters"`
}

// Verify reports any delivery violation as an error.
func (r *Result) Verify() error {
	var problems []string
	if r.Undelivered > 0 {
		s := fmt.Sprintf("%d messages not delivered within the %v drain wait after publishing ended", r.Undelivered, time.Duration(r.DrainWaitS*float64(time.Second)))
		if r.ConsumeRate > 0 {
			need := time.Duration(float64(r.Undelivered) / r.ConsumeRate * float64(time.Second)).Round(time.Second)
			s += fmt.Sprintf(" (at the %.0f msg/s the consumers took, about %v more: publish less with --rate or --messages, or wait longer with --drain)", r.ConsumeRate, need)
		}
		problems = append(problems, s)
	}
	if r.Duplicates > 0 && r.Redelivered() == 0 {
		problems = append(problems, fmt.Sprintf("%d duplicates without redelivery", r.Duplicates))
	}
	if r.OrderViolations > 0 {
		problems = append(problems, fmt.Sprintf("%d per-key order violations", r.OrderViolations))
	}
	if r.Invalid > 0 {
		problems = append(problems, fmt.Sprintf("%d corrupted messages", r.Invalid))
	}
	if len(problems) > 0 {
		return errors.New("verification failed: " + strings.Join(problems, ", "))
	}
	return nil
}

// Redelivered is the number of redelivered entries over all subscriptions.
func (r *Result) Redelivered() uint64 {
	var n uint64
	for _, s := range r.Subscriptions {
		n += s.Redelivered
	}
	return n
}

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

// cpuTimes are CPU seconds of thread groups.
type cpuTimes struct{ broker, pools, app, total float64 }

// threadCPU returns the CPU seconds of this process's broker threads,
// listener pools and consumer application (alive for the whole run;
// schedstat, in ns) and of the whole process, from /proc/self/stat, which
// keeps the time of threads that have exited (producers end when they
// are done).
func threadCPU() (ct cpuTimes) {
	if p, err := procfs.Self(); err == nil {
		if st, err := p.Stat(); err == nil {
			ct.total = st.CPUTime()
		}
	}
	threads, err := procfs.AllThreads(os.Getpid())
	if err != nil {
		return ct
	}
	for _, t := range threads {
		comm, err := t.Comm()
		if err != nil {
			continue
		}
		st, err := t.Schedstat()
		if err != nil {
			continue
		}
		s := float64(st.RunningNanoseconds) / 1e9
		if IsBrokerThread(comm) {
			ct.broker += s
		}
		if listenerThreads.MatchString(comm) {
			ct.pools += s
		}
		if appThreads.MatchString(comm) {
			ct.app += s
		}
	}
	return ct
}

func (a cpuTimes) sub(b cpuTimes) cpuTimes {
	return cpuTimes{a.broker - b.broker, a.pools - b.pools, a.app - b.app, a.total - b.total}
}

// deliveryClock samples each subscription's deliveries over time, for
// the consume rates.
type deliveryClock struct {
	at     []int64   // unix ns
	counts [][]int64 // per sample, per subscription
	done   chan struct{}
}

func watchDeliveries(cl *Client, stop <-chan struct{}) *deliveryClock {
	dc := &deliveryClock{done: make(chan struct{})}
	sample := func() bool {
		n := make([]int64, len(cl.subs))
		for i, s := range cl.subs {
			n[i] = s.distinct.Load()
		}
		dc.at, dc.counts = append(dc.at, time.Now().UnixNano()), append(dc.counts, n)
		return true
	}
	go func() {
		defer close(dc.done)
		every(10*time.Millisecond, stop, sample)
		sample() // the last deliveries can come after the last tick
	}()
	return dc
}

// rate is subscription sub's msg/s from the sample where it had a fifth
// of its final deliveries to the first where it had them all (10 ms
// samples: no clock read per delivery).
func (dc *deliveryClock) rate(sub int, final int64) float64 {
	from := -1
	for i, n := range dc.counts {
		if from < 0 && n[sub] >= final/5 {
			from = i
		}
		if n[sub] >= final {
			if d := float64(dc.at[i]-dc.at[max(from, 0)]) / 1e9; from >= 0 && d > 0 && final > dc.counts[from][sub] {
				return float64(final-dc.counts[from][sub]) / d
			}
			return 0
		}
	}
	return 0
}

// warmup notes the published count and the time once a fifth of the run
// has gone by.
type warmup struct {
	at        time.Time
	published int64
	done      chan struct{}
}

func watchWarmup(cl *Client, sc Scenario, start time.Time, stop <-chan struct{}) *warmup {
	w := &warmup{done: make(chan struct{})}
	go func() {
		defer close(w.done)
		every(2*time.Millisecond, stop, func() bool {
			n := cl.published.Load()
			if (sc.Messages > 0 && n >= sc.Messages/5) || (sc.Messages == 0 && time.Since(start) >= sc.Duration/5) {
				w.at, w.published = time.Now(), n
				return false
			}
			return true
		})
	}()
	return w
}

// every calls fn each period until stop is closed or fn returns false.
func every(period time.Duration, stop <-chan struct{}, fn func() bool) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if !fn() {
			return
		}
	}
}

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
		DurationS: l.elapsed.Seconds(), BrokerCPUs: l.cpu.broker, ProcessCPUs: l.cpu.total, ScenarioDetails: sc, PinnedCPUs: pinned, DrainWaitS: cfg.Drain.Seconds()}
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

// collect fills r with latencies, per-subscription deliveries and the
// broker's counters.
func collect(r *Result, sc Scenario, b *Broker, cl *Client, backlog []int64, clock *deliveryClock) {
	pub := newHist()
	for _, cc := range cl.conns {
		pub.Merge(cc.pubHist)
	}
	r.PublishP50ms, r.PublishP99ms = ms(pub, 50), ms(pub, 99)
	all := newHist()
	for i, scSub := range sc.Subscriptions {
		// A subscription is one dispatcher per topic.
		h := newHist()
		sr := SubResult{Name: scSub.Name, Type: cl.subs[i].typ.String(), Consumers: scSub.Consumers}
		for k := i; k < len(cl.subs); k += len(sc.Subscriptions) {
			s, d := cl.subs[k], b.subs[k]
			for _, ct := range cl.consThr {
				h.Merge(ct.e2e[k])
			}
			if cl.pools != nil {
				for _, t := range cl.pools.external {
					h.Merge(t.e2e[k])
				}
			}
			sr.Delivered += s.distinct.Load()
			sr.Duplicates += s.duplicates.Load()
			sr.OrderViolations += s.violations.Load()
			sr.Invalid += s.invalid.Load()
			sr.Undelivered += max(cl.publishedTo(k)-s.distinct.Load(), 0)
			sr.Backlog += backlog[k]
			sr.Redelivered += d.Redelivered.Load()
			sr.ConsumeRate += clock.rate(k, s.distinct.Load())
			r.MonitorWaits += d.Monitor.Waits()
			r.FlowTasks += d.FlowTasks.Load()
			r.Reads += d.cursor.Reads.Load()
		}
		all.Merge(h)
		sr.E2EP50ms, sr.E2EP99ms = ms(h, 50), ms(h, 99)
		r.ConsumeRate += sr.ConsumeRate
		r.Subscriptions = append(r.Subscriptions, sr)
		r.Delivered += sr.Delivered
		r.Duplicates += sr.Duplicates
		r.OrderViolations += sr.OrderViolations
		r.Invalid += sr.Invalid
		r.Undelivered += sr.Undelivered
		r.Backlog += sr.Backlog
	}
	r.E2EP50ms, r.E2EP99ms = ms(all, 50), ms(all, 99)
	collectRates(r, sc, b, cl)
}

// collectRates works out the per-message and per-read figures.
func collectRates(r *Result, sc Scenario, b *Broker, cl *Client) {
	published := r.Published
	var entries uint64
	for _, d := range b.subs {
		entries += d.cursor.Entries.Load()
	}
	if r.Reads > 0 {
		r.EntriesPerRead = float64(entries) / float64(r.Reads)
	}
	for _, l := range b.loops {
		r.BrokerWakeups += l.Wakeups.Load()
	}
	if published > 0 {
		r.CPUPerMsgUs = r.BrokerCPUs * 1e6 / float64(published)
		r.WakeupsPerMsg = float64(r.BrokerWakeups) / float64(published)
	}
	if mc := cl.multi; mc != nil && r.Delivered > 0 {
		n := float64(r.Delivered)
		r.AppCPUPerMsgUs = r.AppCPUs * 1e6 / n
		r.BatchReceiveTimeouts = mc.batchTimeouts.Load()
		r.EmptyBatchReceives = mc.emptyBatches.Load()
		r.TimerTasksPerMsg = float64(mc.timerTasks.Load()) / n
		r.TimerWakeCallsPerMsg = float64(mc.timerWakes.Load()) / n
	}
	for _, s := range r.Subscriptions {
		r.WorstAppE2EP99ms = max(r.WorstAppE2EP99ms, s.E2EP99ms)
	}
	if t := b.throttle; t != nil {
		r.PublishBytesPerS = r.PublishRate * float64(sc.PayloadSize+bodyHeader+4)
		r.RateLimitBytesPerS = float64(sc.PublishRateLimit)
		if r.RateLimitBytesPerS > 0 {
			r.RateOverLimit = r.PublishBytesPerS / r.RateLimitBytesPerS
		}
		r.AutoReadOff, r.AutoReadOffBySend, r.ThrottleChecks = t.ReadOff.Load(), t.ReadOffSelf.Load(), t.Ticks.Load()
		r.PublishFirstP50ms, r.PublishFirstP99ms, r.PublishLastP50ms, r.PublishLastP99ms = cl.latencyWindows()
	}
	if cl.pools != nil && cl.multi == nil && r.Delivered > 0 {
		n := float64(r.Delivered)
		r.ListenerHandoffsPerMsg = float64(cl.pools.handoffs.Load()) / n
		r.ListenerWakeCallsPerMsg = float64(cl.pools.wakes.Load()) / n
		r.PoolsCPUPerMsgUs = r.PoolsCPUs * 1e6 / n
	}
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

func ms(h *hdrhistogram.Histogram, q float64) float64 {
	if h.TotalCount() == 0 {
		return 0
	}
	return float64(h.ValueAtQuantile(q)) / 1000
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
