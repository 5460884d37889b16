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

// VariantNames lists the registered variants.
func VariantNames() []string {
	var out []string
	for n := range variants {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

func init() {
	RegisterVariant(baseline{})
	RegisterVariant(candidate{})
}

// baseline: consumerFlow hands internalConsumerFlow to a round-robin IO
// loop (BrokerService.executor()), where it takes the dispatcher monitor.
type baseline struct{}

func (baseline) Name() string { return "baseline" }
func (baseline) Description() string {
	return "Flow permits applied by an executor task under the dispatcher monitor (before #26716)"
}

func (baseline) ConsumerFlow(d *Dispatcher, from *EventLoop, c *Consumer, n int64) {
	c.permits.Add(n)
	d.broker.executor().Execute(from, func() { d.internalConsumerFlow(c, n) })
}

func (baseline) AddConsumerAccounting(d *Dispatcher, c *Consumer) {}

func (baseline) RemoveConsumerAccounting(d *Dispatcher, c *Consumer) {
	d.totalPermits.Add(-c.permits.Load())
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
	d.readMoreEntriesAsync(from)
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
