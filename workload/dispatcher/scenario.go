package dispatcher

import (
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
)

// Scenario describes a benchmark run, built in or from a YAML file.
type Scenario struct {
	Name          string         `yaml:"name" json:"name"`
	Description   string         `yaml:"description" json:"description,omitempty"`
	Producers     int            `yaml:"producers" json:"producers"`
	Subscriptions []Subscription `yaml:"subscriptions" json:"subscriptions"`
	PayloadSize   int            `yaml:"payload_size" json:"payload_size"`
	KeySpace      int            `yaml:"key_space" json:"key_space"`
	// Rate is the total publish rate in msg/s; 0 publishes as fast as
	// possible.
	Rate     float64       `yaml:"rate" json:"rate"`
	Messages int64         `yaml:"messages" json:"messages,omitempty"`
	Duration time.Duration `yaml:"duration" json:"duration,omitempty"`

	ReceiverQueue   int           `yaml:"receiver_queue" json:"receiver_queue"`
	MaxPending      int           `yaml:"max_pending" json:"max_pending"`
	BrokerIOThreads int           `yaml:"broker_io_threads" json:"broker_io_threads"`
	TopicWorkers    int           `yaml:"topic_workers" json:"topic_workers"`
	ClientIOThreads int           `yaml:"client_io_threads" json:"client_io_threads"`
	ProducerThreads int           `yaml:"producer_threads" json:"producer_threads"`
	ConsumerThreads int           `yaml:"consumer_threads" json:"consumer_threads"`
	Churn           time.Duration `yaml:"churn" json:"churn,omitempty"` // a consumer leaves and rejoins this often
	// SendOnReadThread: the thread that completes a read sends its
	// entries (dispatcherDispatchMessagesInSubscriptionThread false, Pulsar
	// 5.0's default); otherwise the topic worker does.
	SendOnReadThread bool `yaml:"send_on_read_thread" json:"send_on_read_thread,omitempty"`

	// Change is the seed change the scenario measures (Changes()):
	// --variant picks its side; other changes run their candidate.
	Change string `yaml:"change" json:"change"`
	// Listener: consumers receive through a MessageListener on the
	// client's internal and listener pools (numIoThreads and
	// numListenerThreads, both 1 by default in Pulsar's client).
	Listener        bool `yaml:"listener" json:"listener,omitempty"`
	InternalThreads int  `yaml:"internal_threads" json:"internal_threads,omitempty"`
	ListenerThreads int  `yaml:"listener_threads" json:"listener_threads,omitempty"`
	// Topics are the partitions of a partitioned topic: producers are
	// spread over them, and with more than one every consumer is a
	// multi-topic consumer over all of them (needs listener).
	Topics int `yaml:"topics" json:"topics,omitempty"`
	// Publish throttling (bytes/s; 0: none): the broker's rate
	// (brokerPublisherThrottlingMaxByteRate) and each topic's, checked
	// every throttling_tick (brokerPublisherThrottlingTickTimeMillis, 1ms).
	// With a limit, producers send as Pulsar's client does: their
	// connection's IO loop writes, without blocking the producer thread.
	PublishRateLimit      int64         `yaml:"publish_rate_limit" json:"publish_rate_limit,omitempty"`
	TopicPublishRateLimit int64         `yaml:"topic_publish_rate_limit" json:"topic_publish_rate_limit,omitempty"`
	ThrottlingTick        time.Duration `yaml:"throttling_tick" json:"throttling_tick,omitempty"`
}

// throttled reports whether the scenario limits the publish rate.
func (s Scenario) throttled() bool { return s.PublishRateLimit > 0 || s.TopicPublishRateLimit > 0 }

// AnalyzedThreads is the thread-name pattern the scenario's story is
// about: the broker's threads, the client's listener pools, or the
// consumer application's threads.
func (s Scenario) AnalyzedThreads() string {
	switch s.Change {
	case ChangeListener:
		return ListenerThreads
	case ChangeBatch:
		return AppThreads
	}
	return BrokerThreads
}

// StoryFunctions are the functions whose on-CPU time the scenario's
// change is about (the bench reports them per message).
func (s Scenario) StoryFunctions() []string {
	switch s.Change {
	case ChangeListener:
		return []string{"listenerBaseline.triggerListener", "listenerCandidate.triggerListener", "callMessageListenerBaseline", "callMessageListener"}
	case ChangeBatch:
		return []string{"pendingBatchReceiveTask", "doPendingBatchReceiveTask", "batchReceiveAsync", "receiveAsync"}
	case ChangeThrottle:
		return []string{"handleSend", "throttleOnSend", "setAutoRead", "checkPublishThrottlingRate", "disableProducerRead", "refreshPublishRate"}
	}
	return []string{"internalConsumerFlow", "readMoreEntries", "wakeup"}
}

// StoryWakeups names the wake-ups (waker's thread group → woken's) the
// scenario's change is about: its report shows them however little they
// moved.
func (s Scenario) StoryWakeups() []string {
	switch s.Change {
	case ChangeBatch:
		return []string{"pulsar-timer → pulsar-intern-N"}
	case ChangeThrottle:
		return []string{"broker-rate-mon → broker-io-N"}
	}
	return nil
}

// Subscription is one application of a scenario.
type Subscription struct {
	Name      string `yaml:"name" json:"name"`
	Type      string `yaml:"type" json:"type"` // Shared or Key_Shared
	Consumers int    `yaml:"consumers" json:"consumers"`
}

// seedHostIOThreads is seed 000's broker topology: Pulsar's numIOThreads
// defaults to 2 × the hardware threads (ServiceConfiguration), 32 on the
// seed's 16-thread host, so each of the 20 consumer connections has a loop
// of its own. Seed 000's scenarios also send on the thread that completes
// a read, as Pulsar 5.0 does by default (its parent, #26717, batches add
// hand-overs, a 5.0 feature).
const seedHostIOThreads = 32

var builtin = map[string]Scenario{
	"key-shared-500x20": {
		Name:             "key-shared-500x20",
		Description:      "500 producers, 1 topic, one Key_Shared subscription of 20 consumers, 128-byte unbatched messages, random keys from 1,000,000, as fast as possible",
		Producers:        500,
		Subscriptions:    []Subscription{{Name: "sub-0", Type: "Key_Shared", Consumers: 20}},
		Messages:         350_000,
		BrokerIOThreads:  seedHostIOThreads,
		SendOnReadThread: true,
	},
	// The same at a fixed rate below the dispatcher's saturation here
	// (about 40,000 msg/s: beyond it a backlog builds): as fast as
	// possible, runs differ by ±15-20%, at a fixed rate the broker's CPU
	// per message much less, so a 5% change in it is visible.
	"key-shared-500x20-fixed": {
		Name:             "key-shared-500x20-fixed",
		Description:      "key-shared-500x20 at a fixed 30,000 msg/s, to measure the broker's CPU per message",
		Producers:        500,
		Subscriptions:    []Subscription{{Name: "sub-0", Type: "Key_Shared", Consumers: 20}},
		Rate:             30_000,
		Messages:         150_000,
		BrokerIOThreads:  seedHostIOThreads,
		SendOnReadThread: true,
	},
	// Seed 000 publishes 30,000 msg/s, which its 16-thread host sustains
	// below saturation. Here the broker has one CPU when pinned (offcpu
	// bench), and 30,000 msg/s to 5 applications saturates it: the rate is
	// scaled to 10,000 msg/s so that latency is measured below saturation.
	"telemetry-high-rate": {
		Name:        "telemetry-high-rate",
		Description: "500 producers, 5 Key_Shared subscriptions (applications) of 10 consumers, fixed total publish rate (seed 000: 30,000 msg/s on 16 hardware threads; 10,000 here)",
		Producers:   500,
		Subscriptions: []Subscription{{Name: "app-0", Type: "Key_Shared", Consumers: 10}, {Name: "app-1", Type: "Key_Shared", Consumers: 10},
			{Name: "app-2", Type: "Key_Shared", Consumers: 10}, {Name: "app-3", Type: "Key_Shared", Consumers: 10}, {Name: "app-4", Type: "Key_Shared", Consumers: 10}},
		Rate:             10_000,
		Duration:         5 * time.Second,
		BrokerIOThreads:  seedHostIOThreads,
		SendOnReadThread: true,
	},
	// Seed 003 (PR 15162): a consumer with a MessageListener, as
	// Pulsar's PerformanceConsumer runs it, behind producers publishing as
	// fast as they can. One Shared and one Key_Shared subscription of one
	// consumer each; Key_Shared messages spread over the listener threads
	// by key. The client has 1 internal and 2 listener threads (Pulsar's
	// defaults are 1 and 1; 2 lets keys run in parallel on this 2-CPU
	// machine).
	"listener-throughput": {
		Name:        "listener-throughput",
		Description: "20 producers as fast as possible; a Shared and a Key_Shared subscription (64 keys) of one consumer each with a MessageListener (seed 003)",
		Producers:   20,
		Subscriptions: []Subscription{{Name: "shared", Type: "Shared", Consumers: 1},
			{Name: "key-shared", Type: "Key_Shared", Consumers: 1}},
		KeySpace:        64,
		Messages:        200_000,
		Change:          ChangeListener,
		Listener:        true,
		InternalThreads: 1,
		ListenerThreads: 2,
	},
	// Seed 002 (PR 26966): IoT telemetry applications whose consumers
	// are multi-topic consumers at 10 msg/s each, so an internal
	// consumer's queue is empty after each message. The seed's 2,000
	// consumers at 20,000 msg/s are scaled to 200 (4 applications of 50,
	// over a topic of 4 partitions) at 2,000 msg/s received: on this
	// 2-CPU machine the applications then use about a fifth of a CPU, as
	// the seed's use 2.6 cores of a bigger host, below saturation.
	"telemetry-multitopic": {
		Name:        "telemetry-multitopic",
		Description: "40 producers at 500 msg/s over 4 partitions; 4 Key_Shared applications of 50 multi-topic consumers at 10 msg/s each, with listeners (seed 002)",
		Producers:   40,
		Subscriptions: []Subscription{{Name: "app-0", Type: "Key_Shared", Consumers: 50}, {Name: "app-1", Type: "Key_Shared", Consumers: 50},
			{Name: "app-2", Type: "Key_Shared", Consumers: 50}, {Name: "app-3", Type: "Key_Shared", Consumers: 50}},
		KeySpace:        100_000,
		Rate:            500,
		Duration:        10 * time.Second,
		Topics:          4,
		Change:          ChangeBatch,
		Listener:        true,
		InternalThreads: 1,
		ListenerThreads: 1,
	},
	// Seed 004 (PR 6550): a producer of 500,000-byte messages as fast as
	// it can to a 100-partition topic, against a broker-wide limit of
	// 10,000,000 bytes/s checked every 1 ms. Scaled to 50,000-byte
	// messages and 1,000,000 bytes/s: the message stays 50 times the
	// bytes a 1 ms tick allows and a twentieth of a second's, so one
	// message more per connection is what overshoots. One producer per
	// partition, each on its own connection, one producer thread (as
	// pulsar-perf -t 1), 4 messages pending per producer (pulsar-perf's
	// 1,000 would hold 5 GB here); one Shared subscription of one
	// multi-topic consumer.
	"publish-throttle-100p": {
		Name:             "publish-throttle-100p",
		Description:      "100 producers, one per partition of a 100-partition topic, 50,000-byte messages as fast as possible, broker-wide publish limit 1,000,000 bytes/s checked every 1 ms (seed 004)",
		Producers:        100,
		Subscriptions:    []Subscription{{Name: "sub-0", Type: "Shared", Consumers: 1}},
		PayloadSize:      50_000,
		Duration:         30 * time.Second,
		MaxPending:       4,
		ProducerThreads:  1,
		Topics:           100,
		Listener:         true,
		Change:           ChangeThrottle,
		PublishRateLimit: 1_000_000,
	},
	"shared-500x20": {
		Name:             "shared-500x20",
		Description:      "500 producers, 1 topic, one Shared subscription of 20 consumers, 128-byte unbatched messages, as fast as possible",
		Producers:        500,
		Subscriptions:    []Subscription{{Name: "sub-0", Type: "Shared", Consumers: 20}},
		Messages:         200_000,
		BrokerIOThreads:  seedHostIOThreads,
		SendOnReadThread: true,
	},
}

// ScenarioNames lists the built-in scenarios.
func ScenarioNames() []string {
	var out []string
	for n := range builtin {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// LoadScenario returns a built-in scenario by name, or reads a YAML file.
func LoadScenario(nameOrFile string) (Scenario, error) {
	if s, ok := builtin[nameOrFile]; ok {
		s.Subscriptions = append([]Subscription(nil), s.Subscriptions...)
		return s.withDefaults(), nil
	}
	data, err := os.ReadFile(nameOrFile)
	if err != nil {
		if os.IsNotExist(err) && !strings.ContainsAny(nameOrFile, "/.") {
			return Scenario{}, fmt.Errorf("unknown scenario %q (built in: %s; or give a YAML file)", nameOrFile, strings.Join(ScenarioNames(), ", "))
		}
		return Scenario{}, fmt.Errorf("reading scenario: %w", err)
	}
	var s Scenario
	if err := yaml.UnmarshalWithOptions(data, &s, yaml.Strict(), yaml.CustomUnmarshaler[time.Duration](func(d *time.Duration, b []byte) error {
		v, err := time.ParseDuration(strings.Trim(strings.TrimSpace(string(b)), `"'`))
		*d = v
		return err
	})); err != nil {
		return Scenario{}, fmt.Errorf("scenario %s: %s", nameOrFile, strings.ReplaceAll(yaml.FormatError(err, false, false), "\n", " "))
	}
	if s.Name == "" {
		s.Name = strings.TrimSuffix(strings.TrimSuffix(nameOrFile, ".yaml"), ".yml")
	}
	s = s.withDefaults()
	return s, s.Validate()
}

// YAML writes the scenario as a file LoadScenario reads back unchanged.
func (s Scenario) YAML() ([]byte, error) {
	return yaml.MarshalWithOptions(s, yaml.CustomMarshaler[time.Duration](func(d time.Duration) ([]byte, error) {
		return []byte(strconv.Quote(d.String())), nil
	}))
}

// Scale changes a scenario's size. Zero fields keep the scenario's;
// Rate and Churn keep it when negative (0 is a value for both).
type Scale struct {
	Messages  int64
	Duration  time.Duration
	Rate      float64
	Producers int
	Consumers int // per subscription
	Churn     time.Duration
}

// Scaled returns s changed by c, validated.
func (s Scenario) Scaled(c Scale) (Scenario, error) {
	if c.Messages < 0 || c.Duration < 0 || c.Producers < 0 || c.Consumers < 0 {
		return s, fmt.Errorf("--messages, --duration, --producers and --consumers must not be negative")
	}
	if c.Messages > 0 && c.Duration > 0 {
		return s, fmt.Errorf("give --messages or --duration, not both")
	}
	if c.Messages > 0 {
		s.Messages, s.Duration = c.Messages, 0
	}
	if c.Duration > 0 {
		s.Duration, s.Messages = c.Duration, 0
	}
	if c.Rate >= 0 {
		s.Rate = c.Rate
	}
	if c.Producers > 0 {
		s.Producers = c.Producers
	}
	if c.Consumers > 0 {
		s.Subscriptions = append([]Subscription(nil), s.Subscriptions...)
		for i := range s.Subscriptions {
			s.Subscriptions[i].Consumers = c.Consumers
		}
	}
	if c.Churn >= 0 {
		s.Churn = c.Churn
	}
	return s, s.Validate()
}

func (s Scenario) withDefaults() Scenario {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&s.PayloadSize, 128)
	def(&s.KeySpace, 1_000_000)
	def(&s.ReceiverQueue, 1000)
	def(&s.MaxPending, 100)
	def(&s.BrokerIOThreads, 4)
	def(&s.TopicWorkers, 1)
	def(&s.ClientIOThreads, 2)
	def(&s.ProducerThreads, 2)
	def(&s.ConsumerThreads, 4)
	def(&s.InternalThreads, 1)
	def(&s.ListenerThreads, 1)
	def(&s.Topics, 1)
	if s.ThrottlingTick == 0 {
		s.ThrottlingTick = time.Millisecond
	}
	if s.Change == "" {
		s.Change = ChangeFlow
	}
	if s.Messages == 0 && s.Duration == 0 {
		s.Messages = 200_000
	}
	return s
}

// Validate checks a scenario's values.
func (s Scenario) Validate() error {
	if s.Producers <= 0 {
		return fmt.Errorf("scenario %s: producers must be at least 1", s.Name)
	}
	if len(s.Subscriptions) == 0 {
		return fmt.Errorf("scenario %s: at least one subscription is needed", s.Name)
	}
	for _, sub := range s.Subscriptions {
		if _, err := parseSubType(sub.Type); err != nil {
			return fmt.Errorf("scenario %s, subscription %s: %w", s.Name, sub.Name, err)
		}
		if sub.Consumers <= 0 {
			return fmt.Errorf("scenario %s, subscription %s: consumers must be at least 1", s.Name, sub.Name)
		}
	}
	if s.PayloadSize < 0 || s.KeySpace <= 0 || s.ReceiverQueue < 2 || s.MaxPending <= 0 || s.Rate < 0 || s.Messages < 0 || s.Duration < 0 {
		return fmt.Errorf("scenario %s: payload_size, key_space, receiver_queue (>= 2), max_pending, rate, messages and duration must be positive", s.Name)
	}
	if !slices.Contains(Changes(), s.Change) {
		return fmt.Errorf("scenario %s: change %q: use one of %s", s.Name, s.Change, strings.Join(Changes(), ", "))
	}
	if s.Listener && (s.InternalThreads <= 0 || s.ListenerThreads <= 0) {
		return fmt.Errorf("scenario %s: internal_threads and listener_threads must be at least 1", s.Name)
	}
	if s.Topics < 1 || (s.Topics > 1 && !s.Listener) {
		return fmt.Errorf("scenario %s: topics must be at least 1, and more than 1 needs listener: true (multi-topic consumers deliver to a listener)", s.Name)
	}
	if s.PublishRateLimit < 0 || s.TopicPublishRateLimit < 0 || s.ThrottlingTick < 0 {
		return fmt.Errorf("scenario %s: publish_rate_limit, topic_publish_rate_limit and throttling_tick must not be negative", s.Name)
	}
	if s.Listener && s.Churn > 0 {
		return fmt.Errorf("scenario %s: churn is not modelled for consumers with a listener", s.Name)
	}
	return nil
}

func parseSubType(t string) (SubType, error) {
	switch strings.ToLower(strings.ReplaceAll(t, "-", "_")) {
	case "shared":
		return Shared, nil
	case "key_shared", "keyshared":
		return KeyShared, nil
	}
	return 0, fmt.Errorf("subscription type %q: use Shared or Key_Shared", t)
}
