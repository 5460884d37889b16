package analysis

import (
	"math"
	"testing"
)

// The paired comparison of interleaved runs: known log-ratio spread gives
// the textbook detectable change, (t(.975,4) + t(.8,4)) · sd / √5.
func TestPairedDetectableChange(t *testing.T) {
	base := []float64{100, 120, 90, 110, 105}
	ratios := []float64{0.04, 0.06, 0.05, 0.045, 0.055}
	cand := make([]float64, len(base))
	for i := range base {
		cand[i] = base[i] * math.Exp(ratios[i])
	}
	p, mdc := paired(base, cand)
	want := math.Expm1((2.7764 + 0.9410) * 0.0079057 / math.Sqrt(5))
	if math.Abs(mdc-want) > 1e-3 {
		t.Errorf("detectable change %.4f, want %.4f", mdc, want)
	}
	if p > 0.001 {
		t.Errorf("paired p = %.4f for a steady +5%%, want < 0.001", p)
	}
	// The unpaired U test cannot see it: the runs overlap.
	if m := compare("x", base, cand); m.P < 0.05 || m.MinDetectableChange != mdc {
		t.Errorf("U test p = %.3f (want ≥ 0.05), detectable %.4f", m.P, m.MinDetectableChange)
	}
	if _, mdc := paired(base[:2], cand[:2]); mdc != 0 {
		t.Error("two pairs gave a detectable change")
	}
}
