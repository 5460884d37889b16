package dispatcher

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

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
	TimerWakesPerMsg     float64 `json:"timer_wakes_per_msg,omitempty"` // of the calls, those that woke the executor (FUTEX_WAKE's count)
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

	// What a diff compares first and never (KeyMetrics, NotCompared).
	KeyOrder         []string `json:"key_metrics"`
	NotComparedOrder []string `json:"not_compared"`
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
		r.TimerWakesPerMsg = float64(mc.timerWoke.Load()) / n
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

func ms(h *hdrhistogram.Histogram, q float64) float64 {
	if h.TotalCount() == 0 {
		return 0
	}
	return float64(h.ValueAtQuantile(q)) / 1000
}
