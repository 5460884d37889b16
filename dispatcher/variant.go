package dispatcher

import (
	"fmt"
	"sort"
	"strings"
)

// Variant is one build of the dispatch core: the code paths a seed change
// touches. New seed changes are added as variants by registering them.
type Variant interface {
	Name() string
	Description() string
	// ConsumerFlow applies a Flow of n permits that consumer c received on
	// the IO loop from (ServerCnx.handleFlow → Consumer.flowPermits): it
	// adds them to the consumer's permits and to the dispatcher's total.
	ConsumerFlow(d *Dispatcher, from *EventLoop, c *Consumer, n int64)
	// AddConsumerAccounting and RemoveConsumerAccounting run under the
	// dispatcher monitor when a consumer joins or leaves.
	AddConsumerAccounting(d *Dispatcher, c *Consumer)
	RemoveConsumerAccounting(d *Dispatcher, c *Consumer)
}

var variants = map[string]Variant{}

// RegisterVariant makes a variant selectable by name.
func RegisterVariant(v Variant) { variants[v.Name()] = v }

// LookupVariant returns the named variant.
func LookupVariant(name string) (Variant, error) {
	if v, ok := variants[name]; ok {
		return v, nil
	}
	return nil, fmt.Errorf("unknown variant %q (known: %s)", name, strings.Join(VariantNames(), ", "))
}

// The seed changes a scenario can measure (Scenario.Change): --variant
// picks the side of that change, and every other change runs its
// candidate, the code as it stands, the same on both sides.
const (
	ChangeFlow     = "000" // seed 000: the broker applies Flow permits (Variant)
	ChangeBatch    = "002" // seed 002: multi-topic consumers' batch receives (batchVariant)
	ChangeListener = "003" // seed 003: the client moves messages to a MessageListener (listenerVariant)
	ChangeThrottle = "004" // seed 004: publish throttling turns reading off (throttleVariant)
)

// Changes lists the changes a scenario may name.
func Changes() []string { return []string{ChangeFlow, ChangeBatch, ChangeListener, ChangeThrottle} }

// listenerVariant is how a consumer with a MessageListener moves messages
// from its receiver queue to the listener (seed 003).
type listenerVariant interface {
	Name() string
	Description() string
	// triggerListener runs on the consumer's internal executor after
	// messages arrive (and, in the baseline, after each listener call).
	triggerListener(lc *listenerConsumer)
}

var listenerVariants = map[string]listenerVariant{}

func registerListenerVariant(v listenerVariant) { listenerVariants[v.Name()] = v }

// ChangeVariants returns the names and descriptions of a change's sides.
func ChangeVariants(change string) [][2]string {
	var out [][2]string
	switch change {
	case ChangeListener:
		for _, n := range sortedKeys(listenerVariants) {
			out = append(out, [2]string{n, listenerVariants[n].Description()})
		}
	case ChangeBatch:
		for _, n := range sortedKeys(batchVariants) {
			out = append(out, [2]string{n, batchVariants[n].Description()})
		}
	case ChangeThrottle:
		for _, n := range sortedKeys(throttleVariants) {
			out = append(out, [2]string{n, throttleVariants[n].Description()})
		}
	default:
		for _, n := range VariantNames() {
			out = append(out, [2]string{n, variants[n].Description()})
		}
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// variantSet is the code a run executes: one side of each change.
type variantSet struct {
	broker   Variant
	listener listenerVariant
	batch    batchVariant
	throttle throttleVariant
}

// resolveVariants returns the variants of a run of change with the side
// named name.
func resolveVariants(change, name string) (variantSet, error) {
	vs := variantSet{broker: candidate{}, listener: listenerCandidate{}, batch: batchCandidate{}, throttle: throttleCandidate{}}
	unknown := func(known []string) error {
		return fmt.Errorf("unknown variant %q of change %s (known: %s)", name, change, strings.Join(known, ", "))
	}
	switch change {
	case ChangeListener:
		v, ok := listenerVariants[name]
		if !ok {
			return vs, unknown(sortedKeys(listenerVariants))
		}
		vs.listener = v
	case ChangeBatch:
		v, ok := batchVariants[name]
		if !ok {
			return vs, unknown(sortedKeys(batchVariants))
		}
		vs.batch = v
	case ChangeThrottle:
		v, ok := throttleVariants[name]
		if !ok {
			return vs, unknown(sortedKeys(throttleVariants))
		}
		vs.throttle = v
	default:
		v, err := LookupVariant(name)
		if err != nil {
			return vs, err
		}
		vs.broker = v
	}
	return vs, nil
}

// CheckVariant reports whether name is a side of the scenario's change.
func (s Scenario) CheckVariant(name string) error {
	_, err := resolveVariants(s.Change, name)
	return err
}

// VariantNames lists the registered variants.
func VariantNames() []string { return sortedKeys(variants) }

func init() {
	RegisterVariant(baseline{})
	RegisterVariant(candidate{})
	registerListenerVariant(listenerBaseline{})
	registerListenerVariant(listenerCandidate{})
}

// baseline: consumerFlow hands internalConsumerFlow to a round-robin IO
// loop (BrokerService.executor()), where it takes the dispatcher monitor.
type baseline struct{}

func (baseline) Name() string { return "baseline" }
func (baseline) Description() string {
	return "Flow permits applied by an executor task under the dispatcher monitor (before #26716)"
}

// The consumer's permits count a Flow at once, the total when its task
// runs; removal debits only what reached the total, so a Flow racing the
// removal loses nothing (SharedDispatcherPermitAccountingTest's
// testFlowCommandRaceWithConsumerRemovalDoesNotLosePermits, upstream).
func (baseline) ConsumerFlow(d *Dispatcher, from *EventLoop, c *Consumer, n int64) {
	c.flowMu.Lock()
	c.permits.Add(n)
	c.unapplied += n
	c.flowMu.Unlock()
	d.broker.executor().Execute(from, func() { d.internalConsumerFlow(c, n) })
}

func (baseline) AddConsumerAccounting(d *Dispatcher, c *Consumer) {}

func (baseline) RemoveConsumerAccounting(d *Dispatcher, c *Consumer) {
	c.flowMu.Lock()
	d.totalPermits.Add(-(c.permits.Load() - c.unapplied))
	c.flowMu.Unlock()
}

// candidate (seed 000, #26716): the Flow is applied on the receiving
// loop's thread under the consumer's own permit lock, then a coalesced
// readMoreEntriesAsync; no executor task, no dispatcher monitor.
type candidate struct{}

func (candidate) Name() string { return "candidate" }
func (candidate) Description() string {
	return "Flow permits applied on the receiving thread under the consumer's permit lock (#26716)"
}

func (candidate) ConsumerFlow(d *Dispatcher, from *EventLoop, c *Consumer, n int64) {
	d.consumerFlowAccounted(c, n)
	d.requestRead(from)
}

func (candidate) AddConsumerAccounting(d *Dispatcher, c *Consumer) {
	c.flowMu.Lock()
	c.accounted = true
	c.flowMu.Unlock()
}

func (candidate) RemoveConsumerAccounting(d *Dispatcher, c *Consumer) {
	c.flowMu.Lock()
	c.accounted = false
	d.totalPermits.Add(-c.permits.Load())
	c.flowMu.Unlock()
}
