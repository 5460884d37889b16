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

// RegisterVariant makes a variant of the broker's Flow handling (change
// 000) selectable by name.
func RegisterVariant(v Variant) { registerSide(ChangeFlow, flowSide{v}) }

// LookupVariant returns the named variant of change 000.
func LookupVariant(name string) (Variant, error) {
	if s, ok := sides[ChangeFlow][name]; ok {
		return s.(flowSide).Variant, nil
	}
	return nil, fmt.Errorf("unknown variant %q (known: %s)", name, strings.Join(VariantNames(), ", "))
}

// side is one side of a change, by name: it puts its code into the
// variantSet of a run.
type side interface {
	Name() string
	Description() string
	install(vs *variantSet)
}

// sides: every change's sides, by change and name.
var sides = map[string]map[string]side{}

func registerSide(change string, s side) {
	if sides[change] == nil {
		sides[change] = map[string]side{}
	}
	sides[change][s.Name()] = s
}

type flowSide struct{ Variant }

func (s flowSide) install(vs *variantSet) { vs.broker = s.Variant }

type listenerSide struct{ listenerVariant }

func (s listenerSide) install(vs *variantSet) { vs.listener = s.listenerVariant }

type batchSide struct{ batchVariant }

func (s batchSide) install(vs *variantSet) { vs.batch = s.batchVariant }

type throttleSide struct{ throttleVariant }

func (s throttleSide) install(vs *variantSet) { vs.throttle = s.throttleVariant }

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

func registerListenerVariant(v listenerVariant) { registerSide(ChangeListener, listenerSide{v}) }

// changeOf: a scenario without a known change measures change 000.
func changeOf(change string) string {
	if sides[change] == nil {
		return ChangeFlow
	}
	return change
}

// ChangeVariants returns the names and descriptions of a change's sides.
func ChangeVariants(change string) [][2]string {
	var out [][2]string
	m := sides[changeOf(change)]
	for _, n := range sortedKeys(m) {
		out = append(out, [2]string{n, m[n].Description()})
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
// named name; the other changes run their candidates.
func resolveVariants(change, name string) (variantSet, error) {
	vs := variantSet{broker: candidate{}, listener: listenerCandidate{}, batch: batchCandidate{}, throttle: throttleCandidate{}}
	change = changeOf(change)
	s, ok := sides[change][name]
	if !ok {
		return vs, fmt.Errorf("unknown variant %q of change %s (known: %s)", name, change, strings.Join(sortedKeys(sides[change]), ", "))
	}
	s.install(&vs)
	return vs, nil
}

// CheckVariant reports whether name is a side of the scenario's change.
func (s Scenario) CheckVariant(name string) error {
	_, err := resolveVariants(s.Change, name)
	return err
}

// VariantNames lists the registered variants of change 000.
func VariantNames() []string { return sortedKeys(sides[ChangeFlow]) }

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
