package analysis

import (
	"math"
	"strings"
	"testing"
)

// A crossed threshold fires only when the change is significant; times
// take units; shares change in percentage points.
func TestGates(t *testing.T) {
	conds, err := ParseFailOn([]string{"app_blocked>+5ms,share:io<-10pp", "runqueue>+20%"})
	if err != nil {
		t.Fatal(err)
	}
	if conds[0].Value != 5e6 || conds[0].Unit != UnitNs || conds[1].Name != "share:io" || conds[1].Unit != "pp" || conds[2].Unit != "%" {
		t.Fatalf("parsed %+v", conds)
	}
	dr := &DiffReport{Figures: []MetricDiff{
		// +8 ms a run in 4 of 4 pairs, steady: significant.
		compare(FigAppBlocked, []float64{10e6, 11e6, 12e6, 10.5e6}, []float64{18e6, 19.2e6, 20e6, 18.4e6}),
		// -30 pp, but one run each: crossed, not significant.
		compare("share:io", []float64{90}, []float64{60}),
		// +50%, noisy: not significant.
		compare(FigRunQueue, []float64{10e6, 30e6, 5e6}, []float64{25e6, 12e6, 20e6}),
	}}
	dr.Figures[0].Unit, dr.Figures[1].Unit, dr.Figures[2].Unit = UnitNs, UnitPct, UnitNs
	g, err := dr.Gates(conds, 0.05)
	if err != nil {
		t.Fatal(err)
	}
	if !g[0].Fired || math.Abs(g[0].Change-8.025e6) > 1 {
		t.Errorf("app_blocked>+5ms on a steady +8 ms: %+v", g[0])
	}
	if g[1].Fired || !strings.Contains(g[1].Says, "not significant") {
		t.Errorf("share:io<-10pp from one run a side fired: %+v", g[1])
	}
	if g[2].Fired || g[2].Change < 20 {
		t.Errorf("runqueue>+20%% on noise: %+v", g[2])
	}
	if _, err := dr.Gates([]FailOn{{Name: "share:io", Unit: UnitNs, Value: 1}}, 0.05); err == nil {
		t.Error("a time threshold on a share accepted")
	}
}
