package analysis

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeRun(t *testing.T, dir string, metrics map[string]any, withProfile bool) string {
	t.Helper()
	os.MkdirAll(dir, 0o755)
	b, _ := json.Marshal(metrics)
	os.WriteFile(filepath.Join(dir, "metrics.json"), b, 0o644)
	if withProfile {
		fixture(t, dir) // writes offcpu.pb.gz and offcpu.wakeups.pb.gz into dir
	}
	return dir
}

func TestDiffStatistics(t *testing.T) {
	dir := t.TempDir()
	var bp, cp []string
	for i, v := range []float64{102, 100, 101} { // not sorted: the report keeps run order
		bp = append(bp, writeRun(t, filepath.Join(dir, "b", string(rune('1'+i))), map[string]any{"publish_rate": v, "published": 1000, "pid": 7}, i == 0))
	}
	for i, v := range []float64{90, 91, 92} {
		cp = append(cp, writeRun(t, filepath.Join(dir, "c", string(rune('1'+i))), map[string]any{"publish_rate": v, "published": 1000}, false))
	}
	// A failed run is kept out of the statistics.
	cp = append(cp, writeRun(t, filepath.Join(dir, "c", "4"), map[string]any{"publish_rate": 1.0, "failed": true}, false))
	base, err := LoadSide("baseline", bp)
	if err != nil {
		t.Fatal(err)
	}
	cand, err := LoadSide("candidate", cp)
	if err != nil {
		t.Fatal(err)
	}
	rules, _ := LoadRules("")
	dr, err := Diff(base, cand, rules, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(dr.Metrics) != 1 {
		t.Fatalf("metrics %+v, want publish_rate only (pid and counts are skipped)", dr.Metrics)
	}
	m := dr.Metrics[0]
	// By hand: means 101 and 91, change -9.90%; the U test of two fully
	// separated samples of 3 gives the exact two-sided p = 2/C(6,3) = 0.1.
	if math.Abs(m.ChangePct-(-9.900990)) > 1e-4 || math.Abs(m.P-0.1) > 1e-9 || m.Separation != "below" || len(m.Cand) != 3 {
		t.Errorf("publish_rate diff %+v", m)
	}
	if m.BaseMin != 100 || m.BaseMax != 102 || m.CandMin != 90 || m.CandMax != 92 {
		t.Errorf("ranges %+v", m)
	}
	if m.Base[0] != 102 || m.Base[1] != 100 || m.Base[2] != 101 {
		t.Errorf("runs reordered: %v, want 102, 100, 101", m.Base)
	}
	if !strings.Contains(strings.Join(dr.Statements, "\n"), "every candidate run below every baseline run") {
		t.Errorf("statements %q", dr.Statements)
	}
	conds, err := ParseFailOn([]string{"publish_rate<-3%"})
	if err != nil {
		t.Fatal(err)
	}
	// The paired test on log ratios finds the steady 10% drop significant.
	if g, err := dr.Gates(conds, 0.05); err != nil || len(g) != 1 || !g[0].Fired {
		t.Errorf("fail-on publish_rate<-3%%: %+v %v", g, err)
	}
	conds, _ = ParseFailOn([]string{"publish_rate<-20%"})
	if g, _ := dr.Gates(conds, 0.05); len(g) != 1 || g[0].Fired {
		t.Errorf("fail-on publish_rate<-20%% held: %+v", g)
	}
	conds, _ = ParseFailOn([]string{"nosuch>+1%"})
	if _, err := dr.Gates(conds, 0.05); err == nil {
		t.Error("unknown fail-on name accepted")
	}
	if _, err := ParseFailOn([]string{"monitor-wait more than 10"}); err == nil {
		t.Error("bad fail-on accepted")
	}
	// Four against four, separated: p = 2/C(8,4) = 0.0286.
	m4 := compare("x", []float64{1, 2, 3, 4}, []float64{5, 6, 7, 8})
	if math.Abs(m4.P-2.0/70) > 1e-9 || m4.Separation != "above" {
		t.Errorf("4 vs 4: %+v", m4)
	}
}

func TestDiffProfiles(t *testing.T) {
	dir := t.TempDir()
	b := writeRun(t, filepath.Join(dir, "base"), map[string]any{"publish_rate": 100.0, "published": 1000}, true)
	c := writeRun(t, filepath.Join(dir, "cand"), map[string]any{"publish_rate": 95.0, "published": 1000}, true)
	base, _ := LoadSide("baseline", []string{b})
	cand, _ := LoadSide("candidate", []string{c})
	rules, _ := LoadRules("")
	dr, err := Diff(base, cand, rules, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cat := range dr.Categories {
		if cat.Base != cat.Cand {
			t.Errorf("identical profiles differ in %s: %+v", cat.Name, cat)
		}
	}
	var buf bytes.Buffer
	if err := dr.Write(&buf, "markdown"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"### Measurements", "| publish_rate | 100.0 | 95.0 | -5.0% |", "| monitor-wait | 4.00 s | 4.00 s | +0.0% |", "internalConsumerFlow"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, buf.String())
		}
	}
}

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
