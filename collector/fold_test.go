package collector

import (
	"testing"
	"time"
)

// The aggregation map is checked again before the keys, at the rate they
// came, fill half of what is left before the fold: a map filling in a
// second is checked four times before it would be full.
func TestNextFoldCheck(t *testing.T) {
	for _, c := range []struct {
		fill, rate float64
		want       time.Duration
	}{
		{0, 0, time.Second},               // nothing came: the slowest
		{0, 1, 250 * time.Millisecond},    // a map a second, empty
		{0.25, 1, 125 * time.Millisecond}, // a quarter left before the fold
		{0.45, 1, 25 * time.Millisecond},  // near it
		{0.49, 1, 20 * time.Millisecond},  // the floor
		{0.6, 1, 20 * time.Millisecond},   // past it (a fold that failed)
		{0, 0.01, time.Second},            // an idle node: the ceiling
		{0.1, 0.2, time.Second},           // 1 s at a fifth a second
		{0.1, 0.5, 400 * time.Millisecond},
	} {
		if got := nextFoldCheck(c.fill, c.rate); got != c.want {
			t.Errorf("nextFoldCheck(%v, %v) = %v, want %v", c.fill, c.rate, got, c.want)
		}
	}
}
