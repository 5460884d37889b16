package dispatcher

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testBroker starts a broker with one subscription and no clients.
func testBroker(t *testing.T, variant string, typ SubType) (*Broker, *Dispatcher) {
	t.Helper()
	v, err := LookupVariant(variant)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewBroker(BrokerConfig{IOThreads: 2, Variant: v, Subscriptions: []SubscriptionConfig{{Name: "s", Type: typ}}})
	if err != nil {
		t.Fatal(err)
	}
	b.Start()
	t.Cleanup(b.Stop)
	return b, b.subs[0]
}

// quiesce waits until every task queued on the broker's threads ran.
func quiesce(b *Broker) {
	for round := 0; round < 3; round++ {
		var wg sync.WaitGroup
		for _, l := range b.loops {
			wg.Add(1)
			l.Execute(nil, wg.Done)
		}
		for _, e := range append([]*Executor{b.mlWorker}, b.workers...) {
			wg.Add(1)
			e.Execute(wg.Done)
		}
		wg.Wait()
	}
}

// memberPermits is what the total must equal when nothing is in flight.
func memberPermits(d *Dispatcher) int64 {
	var sum int64
	for _, c := range d.Consumers() {
		sum += c.permits.Load()
	}
	return sum
}

func forVariants(t *testing.T, f func(t *testing.T, variant string)) {
	for _, v := range []string{"baseline", "candidate"} {
		t.Run(v, func(t *testing.T) { f(t, v) })
	}
}

func TestFlowRacingRemoval(t *testing.T) {
	forVariants(t, func(t *testing.T, variant string) {
		b, d := testBroker(t, variant, Shared)
		stay := newConsumer(1, "stay", nil)
		d.AddConsumer(stay)
		stay.flowPermits(nil, 100)
		quiesce(b)
		for i := 0; i < 300; i++ {
			c := newConsumer(uint32(10+i), "racer", nil)
			d.AddConsumer(c)
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); c.flowPermits(nil, 50); c.flowPermits(nil, 7) }()
			go func() { defer wg.Done(); d.RemoveConsumer(c) }()
			wg.Wait()
			if tp := d.TotalPermits(); tp < 0 && variant == "candidate" {
				t.Fatalf("round %d: total permits went negative: %d", i, tp)
			}
		}
		quiesce(b)
		got, want := d.TotalPermits(), memberPermits(d)
		// Neither side loses a Flow racing the removal: the baseline
		// debits only applied Flows, the candidate stops accounting first.
		if got != want {
			t.Errorf("total permits %d, members hold %d", got, want)
		}
	})
}

func TestReplacementConsumerSameIdentity(t *testing.T) {
	forVariants(t, func(t *testing.T, variant string) {
		b, d := testBroker(t, variant, Shared)
		old := newConsumer(7, "consumer-7", nil)
		d.AddConsumer(old)
		old.flowPermits(nil, 40)
		quiesce(b)
		d.RemoveConsumer(old)
		repl := newConsumer(7, "consumer-7", nil)
		d.AddConsumer(repl)
		repl.flowPermits(nil, 30)
		old.flowPermits(nil, 500) // a late Flow of the removed consumer
		quiesce(b)
		if got := d.TotalPermits(); got != 30 {
			t.Errorf("total permits %d, want 30 (only the replacement's)", got)
		}
	})
}

func TestBlockedConsumerPermits(t *testing.T) {
	forVariants(t, func(t *testing.T, variant string) {
		b, d := testBroker(t, variant, Shared)
		c := newConsumer(1, "c", nil)
		d.AddConsumer(c)
		c.blocked.Store(true)
		c.flowPermits(nil, 25)
		quiesce(b)
		if d.TotalPermits() != 0 || c.Permits() != 0 {
			t.Fatalf("blocked consumer's Flow counted: total %d consumer %d", d.TotalPermits(), c.Permits())
		}
		// An acknowledgement that brings unacked below half unblocks it.
		c.pendingAcks[1] = 0
		c.unacked.Store(1)
		ack := []byte{0, 0, 0, 0, 0, 0, 0, 1}
		d.acknowledge(nil, c, ack)
		quiesce(b)
		if d.TotalPermits() != 25 || c.Permits() != 25 {
			t.Errorf("after unblocking: total %d consumer %d, want 25 and 25", d.TotalPermits(), c.Permits())
		}
	})
}

func TestNegativeRemovalBalance(t *testing.T) {
	forVariants(t, func(t *testing.T, variant string) {
		b, d := testBroker(t, variant, Shared)
		a, c := newConsumer(1, "a", nil), newConsumer(2, "c", nil)
		d.AddConsumer(a)
		d.AddConsumer(c)
		a.flowPermits(nil, 10)
		c.flowPermits(nil, 10)
		quiesce(b)
		// c received 15 messages against 10 permits (batches overshoot).
		c.permits.Add(-15)
		d.totalPermits.Add(-15)
		d.RemoveConsumer(c)
		quiesce(b)
		if got := d.TotalPermits(); got != 10 {
			t.Errorf("total after removing a consumer at -5: %d, want 10", got)
		}
	})
}

// A Flow while another thread holds the dispatcher monitor: the baseline
// must wait for the monitor, the candidate must not.
func TestFlowWhileMonitorHeld(t *testing.T) {
	forVariants(t, func(t *testing.T, variant string) {
		b, d := testBroker(t, variant, Shared)
		c := newConsumer(1, "c", nil)
		d.AddConsumer(c)
		quiesce(b)
		d.Monitor.Enter()
		c.flowPermits(nil, 33)
		applied := false
		for i := 0; i < 100 && !applied; i++ {
			applied = d.TotalPermits() == 33
			time.Sleep(2 * time.Millisecond)
		}
		d.Monitor.Exit()
		quiesce(b)
		switch variant {
		case "baseline":
			if applied {
				t.Error("baseline applied a Flow while the monitor was held")
			}
		case "candidate":
			if !applied {
				t.Error("candidate's Flow waited for the dispatcher monitor")
			}
		}
		if d.TotalPermits() != 33 {
			t.Errorf("total %d after release, want 33", d.TotalPermits())
		}
	})
}

func TestAutoSplitSelector(t *testing.T) {
	var s autoSplitSelector
	cs := []*Consumer{newConsumer(1, "a", nil), newConsumer(2, "b", nil), newConsumer(3, "c", nil), newConsumer(4, "d", nil)}
	for _, c := range cs {
		s.add(c)
	}
	owned := map[*Consumer]int{}
	for h := uint32(0); h < hashRange; h++ {
		c := s.selectConsumer(h)
		if c == nil {
			t.Fatalf("hash %d has no consumer", h)
		}
		owned[c]++
	}
	for _, c := range cs {
		if owned[c] != hashRange/4 {
			t.Errorf("%s owns %d slots, want %d", c.Name, owned[c], hashRange/4)
		}
	}
	s.remove(cs[3])
	s.remove(cs[0])
	for h := uint32(0); h < hashRange; h += 97 {
		if c := s.selectConsumer(h); c == nil || c == cs[0] || c == cs[3] {
			t.Fatalf("hash %d → %v after removals", h, c)
		}
	}
	if StickyKeyHash(12345) >= hashRange {
		t.Error("hash out of range")
	}
}

func TestEventLoopWakesOnlyWhenAsleep(t *testing.T) {
	l, err := NewEventLoop("test-loop")
	if err != nil {
		t.Fatal(err)
	}
	l.Start()
	defer l.Shutdown()
	done := make(chan struct{})
	l.Execute(nil, func() { close(done) })
	<-done
	time.Sleep(20 * time.Millisecond) // let it block in epoll_wait
	before := l.Wakeups.Load()
	var ran atomic.Int32
	step := make(chan struct{})
	l.Execute(nil, func() {
		// Handing work to itself, or from outside while awake, must not
		// write the eventfd.
		for i := 0; i < 10; i++ {
			l.Execute(l, func() { ran.Add(1) })
		}
		close(step)
		time.Sleep(5 * time.Millisecond)
	})
	<-step
	l.Execute(nil, func() { ran.Add(1) }) // loop is running: no write
	for ran.Load() < 11 {
		time.Sleep(time.Millisecond)
	}
	if got := l.Wakeups.Load() - before; got != 1 {
		t.Errorf("%d eventfd writes, want exactly 1 (for the loop that slept)", got)
	}
}

// Holders that sleep inside make the others park: every parked thread
// must be woken again (a lost wake-up hangs the test).
func TestMonitorExcludes(t *testing.T) {
	var m Monitor
	var inside atomic.Int32
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				m.Enter()
				if inside.Add(1) != 1 {
					t.Error("two holders")
				}
				if i%50 == 0 {
					time.Sleep(200 * time.Microsecond)
				}
				inside.Add(-1)
				m.Exit()
			}
		}()
	}
	wg.Wait()
	if m.Held() {
		t.Error("monitor held after all exits")
	}
	if m.Waits() == 0 {
		t.Error("no acquisition parked: the test did not reach the sleeping path")
	}
}

func smallRun(t *testing.T, scenario, variant string, mutate func(*Scenario)) *Result {
	t.Helper()
	sc, err := LoadScenario(scenario)
	if err != nil {
		t.Fatal(err)
	}
	sc.Producers = 40
	sc.Messages, sc.Duration = 20000, 0
	if sc.Rate > 0 {
		sc.Messages, sc.Duration, sc.Rate = 0, 1500*time.Millisecond, 8000
	}
	if sc.Change == ChangeBatch {
		// Its story needs the low rate: queues empty between messages.
		sc.Messages, sc.Duration, sc.Rate = 0, 2*time.Second, 500
	}
	if sc.throttled() {
		// Throttled to a few MB/s: a short run with little pending.
		sc.Messages, sc.Duration, sc.MaxPending = 0, 2*time.Second, 2
	}
	if mutate != nil {
		mutate(&sc)
	}
	r, err := Run(context.Background(), Config{Scenario: sc, Variant: variant, Drain: 15 * time.Second, Progress: stallWriter{t}})
	if err != nil {
		t.Fatalf("%s/%s: %v", scenario, variant, err)
	}
	if err := r.Verify(); err != nil {
		t.Errorf("%s/%s: %v (%+v)", scenario, variant, err, r.Subscriptions)
	}
	if r.Published == 0 || r.Delivered != r.Published*int64(len(r.Subscriptions)) {
		t.Errorf("%s/%s: published %d delivered %d over %d subscriptions", scenario, variant, r.Published, r.Delivered, len(r.Subscriptions))
	}
	for _, s := range r.Subscriptions {
		if s.Backlog < 0 || s.Backlog > r.Published {
			t.Errorf("%s/%s: subscription %s backlog %d outside [0, %d]", scenario, variant, s.Name, s.Backlog, r.Published)
		}
	}
	return r
}

func TestScenariosEndToEnd(t *testing.T) {
	for _, sc := range ScenarioNames() {
		for _, v := range []string{"baseline", "candidate"} {
			t.Run(sc+"/"+v, func(t *testing.T) {
				r := smallRun(t, sc, v, nil)
				switch r.ScenarioDetails.Change {
				case ChangeFlow:
					if v == "candidate" && r.FlowTasks != 0 {
						t.Errorf("candidate ran %d internalConsumerFlow tasks", r.FlowTasks)
					}
					if v == "baseline" && r.FlowTasks == 0 {
						t.Error("baseline ran no internalConsumerFlow task")
					}
				case ChangeListener:
					// Baseline: internal → external and back per message;
					// candidate: only internal → external.
					want := map[string]float64{"baseline": 2, "candidate": 1}[v]
					if r.ListenerHandoffsPerMsg != want {
						t.Errorf("%.3f hand-offs per message between the pools, want %.0f", r.ListenerHandoffsPerMsg, want)
					}
					if r.FlowTasks != 0 {
						t.Errorf("the broker ran %d internalConsumerFlow tasks: seed 003's runs use seed 000's candidate", r.FlowTasks)
					}
				case ChangeThrottle:
					// Reading is turned off by the connection's own
					// handleSend in the baseline; the candidate's monitor
					// turns it off on the others too.
					if r.AutoReadOff == 0 {
						t.Error("throttling never turned reading off")
					}
					if v == "baseline" && r.AutoReadOffBySend != r.AutoReadOff {
						t.Errorf("baseline: reading turned off %d times, %d by handleSend: the monitor must not turn it off", r.AutoReadOff, r.AutoReadOffBySend)
					}
					if v == "candidate" && r.AutoReadOffBySend >= r.AutoReadOff {
						t.Errorf("candidate: reading turned off %d times, all by handleSend: the monitor turned none off", r.AutoReadOff)
					}
					if r.RateOverLimit <= 1 {
						t.Errorf("published %.0f bytes/s under the limit of %.0f: every connection reading a message per second should overshoot it", r.PublishBytesPerS, r.RateLimitBytesPerS)
					}
				case ChangeBatch:
					// Low rates: the baseline's batch receive after each
					// message finds the queue empty and times out; the
					// candidate's only batch receives that time out empty
					// are each internal consumer's first.
					internal := uint64(0)
					for _, s := range r.ScenarioDetails.Subscriptions {
						internal += uint64(s.Consumers * r.ScenarioDetails.Topics)
					}
					if v == "baseline" && r.EmptyBatchReceives < uint64(r.Delivered/2) {
						t.Errorf("baseline: %d empty batch receives for %d messages, want at least half as many", r.EmptyBatchReceives, r.Delivered)
					}
					if v == "candidate" && r.EmptyBatchReceives > internal {
						t.Errorf("candidate: %d empty batch receives, more than the %d internal consumers' first", r.EmptyBatchReceives, internal)
					}
				}
			})
		}
	}
}

func TestKeySharedOrderWithChurn(t *testing.T) {
	forVariants(t, func(t *testing.T, variant string) {
		r := smallRun(t, "key-shared-500x20", variant, func(s *Scenario) {
			s.Churn = 15 * time.Millisecond
			s.Messages = 40000
			s.KeySpace = 2000 // hot keys, so hashes really move between consumers
		})
		if r.Redelivered() == 0 {
			t.Error("churn caused no redelivery: the test did not exercise joins and leaves")
		}
	})
}

func TestSharedDeliveryWithChurn(t *testing.T) {
	forVariants(t, func(t *testing.T, variant string) {
		smallRun(t, "shared-500x20", variant, func(s *Scenario) { s.Churn = 15 * time.Millisecond })
	})
}

// unorderedListener hands each message to the next listener thread, as a
// client that ignored keys would: the order check must catch it.
type unorderedListener struct{ next int }

func (*unorderedListener) Name() string        { return "unordered" }
func (*unorderedListener) Description() string { return "test: listener threads round robin" }
func (u *unorderedListener) triggerListener(lc *listenerConsumer) {
	for {
		d, ok := lc.poll()
		if !ok {
			return
		}
		u.next++
		t := lc.pools.external[u.next%len(lc.pools.external)]
		lc.handToListener(t, func() { lc.callMessageListener(t, d) })
	}
}

func TestListenerOrderCheckCatchesDisorder(t *testing.T) {
	registerListenerVariant(&unorderedListener{})
	defer delete(sides[ChangeListener], "unordered")
	sc, err := LoadScenario("listener-throughput")
	if err != nil {
		t.Fatal(err)
	}
	sc.Messages, sc.ListenerThreads = 20000, 4
	r, err := Run(context.Background(), Config{Scenario: sc, Variant: "unordered", Drain: 15 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range r.Subscriptions {
		if s.Type == "Key_Shared" && s.OrderViolations == 0 {
			t.Errorf("listener threads taken round robin gave no per-key order violation in %s", s.Name)
		}
	}
}

// stallWriter passes a run's stall report to the test log.
type stallWriter struct{ t *testing.T }

func (w stallWriter) Write(b []byte) (int, error) {
	if s := string(b); !strings.HasPrefix(strings.TrimSpace(s), "") || strings.Contains(s, "stall") || strings.Contains(s, "permits") {
		w.t.Log(strings.TrimRight(s, "\n"))
	}
	return len(b), nil
}

func TestPublishRateLimiter(t *testing.T) {
	r := newLimiter(1000)
	r.increment(600)
	if r.checkPublishRate() || r.isExceeded() {
		t.Fatal("600 of 1000 bytes: exceeded")
	}
	r.increment(600)
	if !r.checkPublishRate() || !r.isExceeded() {
		t.Fatal("1200 of 1000 bytes: not exceeded")
	}
	if r.checkPublishRate() {
		t.Error("a second check reported the rate newly exceeded")
	}
	r.resetPublishCount()
	if r.isExceeded() || r.bytes.Load() != 0 {
		t.Error("reset kept the count or the exceeded mark")
	}
	var none *publishRateLimiter
	none.increment(1 << 40)
	if none.checkPublishRate() || none.isExceeded() {
		t.Error("no limit was exceeded")
	}
}

// A topic's own limit throttles without a broker-wide one.
func TestTopicPublishRateLimit(t *testing.T) {
	forVariants(t, func(t *testing.T, variant string) {
		r := smallRun(t, "publish-throttle-100p", variant, func(s *Scenario) {
			s.PublishRateLimit, s.TopicPublishRateLimit = 0, 20_000
		})
		if r.AutoReadOff == 0 {
			t.Error("topic limits of 20,000 bytes/s never turned reading off")
		}
	})
}

// A Flow that arrives while a send is in progress asks for no read of its
// own (the send's end reads with its permits); one that arrives outside a
// send leads to a read.
func TestFlowReadRequestCoalescedIntoSend(t *testing.T) {
	b, d := testBroker(t, "candidate", Shared)
	c := newConsumer(1, "c", nil)
	d.AddConsumer(c)
	d.Monitor.Enter()
	d.sendInProgress.Store(true)
	c.flowPermits(nil, 10) // returns while the monitor is held: the candidate does not take it
	requested := d.readMoreEntriesRequested.Load()
	d.sendInProgress.Store(false)
	d.Monitor.Exit()
	if requested {
		t.Error("a Flow during a send queued a read request")
	}
	if d.TotalPermits() != 10 {
		t.Errorf("total permits %d, want 10", d.TotalPermits())
	}
	c.flowPermits(nil, 5)
	quiesce(b)
	d.Monitor.Enter()
	pending := d.havePendingRead
	d.Monitor.Exit()
	if !pending {
		t.Error("a Flow outside a send did not lead to a read")
	}
}

// Every built-in scenario, scaled as the bench scales them, survives a
// trip through a YAML file: bench starts runs from such files.
func TestScenarioYAMLRoundTrip(t *testing.T) {
	dir := t.TempDir()
	for _, name := range ScenarioNames() {
		sc, err := LoadScenario(name)
		if err != nil {
			t.Fatal(err)
		}
		if sc, err = sc.Scaled(Scale{Duration: 3 * time.Second, Rate: 500, Churn: -1}); err != nil {
			t.Fatal(err)
		}
		b, err := sc.YAML()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		path := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		back, err := LoadScenario(path)
		if err != nil {
			t.Fatalf("%s: reading it back: %v\n%s", name, err, b)
		}
		if !reflect.DeepEqual(back, sc) {
			t.Errorf("%s: read back as\n%+v\nwant\n%+v", name, back, sc)
		}
	}
}
