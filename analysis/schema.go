package analysis

import "github.com/offcpu/offcpu/schema"

// The profile model is schema's; analysis reads it under these names.
type (
	Stack = schema.Stack
	Frame = schema.Frame
	Data  = schema.Data
)

const (
	KindOffCPU    = schema.KindOffCPU
	KindWakeup    = schema.KindWakeup
	KindCPU       = schema.KindCPU
	StateRunQueue = schema.StateRunQueue
)

// Load reads profiles and folded stacks (see schema.Load).
func Load(unit schema.FoldedUnit, paths ...string) (*Data, error) { return schema.Load(unit, paths...) }
