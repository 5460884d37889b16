package analysis

import (
	"os"
	"path/filepath"
	"testing"
)

// A metrics file names its key metrics and its counts: a diff compares
// those first, in that order, and never the counts.
func TestKeyMetricsFromRunFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	var base, cand []string
	for i, v := range []string{"100", "101", "99"} {
		base = append(base, write("b"+v+".json", `{"aaa": 1, "zeta_rate": `+v+`, "alpha_ms": 5, "pid": `+v+`, "key_metrics": ["zeta_rate", "alpha_ms"], "not_compared": ["pid"]}`))
		cand = append(cand, write("c"+v+".json", `{"aaa": 1, "zeta_rate": `+[]string{"120", "121", "119"}[i]+`, "alpha_ms": 5, "pid": 7, "key_metrics": ["zeta_rate", "alpha_ms"], "not_compared": ["pid"]}`))
	}
	b, err := LoadSide("base", base)
	if err != nil {
		t.Fatal(err)
	}
	c, err := LoadSide("cand", cand)
	if err != nil {
		t.Fatal(err)
	}
	got := diffMetrics(b, c, Options{})
	var names []string
	for _, m := range got {
		names = append(names, m.Name)
	}
	if len(names) != 3 || names[0] != "zeta_rate" || names[1] != "alpha_ms" || names[2] != "aaa" {
		t.Errorf("metrics compared %v, want zeta_rate, alpha_ms (the files' order), then aaa; never pid", names)
	}
	if got[0].ChangePct < 19 || got[0].ChangePct > 21 {
		t.Errorf("zeta_rate change %.1f%%, want +20%%", got[0].ChangePct)
	}
}
