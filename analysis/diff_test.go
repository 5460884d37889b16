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
