package analysis

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A continuous recording's directory is read as its intervals: those in
// the asked range, each analysed for the spread of the merged figures.
func TestIntervals(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "real", "python.pb.gz"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, name := range []string{"offcpu-20261203T100000.000Z-000001.pb.gz", "offcpu-20261203T100010.000Z-000002.pb.gz",
		"offcpu-20261203T100020.000Z-000003.pb.gz", "unrelated.pb.gz"} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if !IsIntervalDir(dir) {
		t.Fatal("not recognised as a directory of intervals")
	}
	from := time.Date(2026, 12, 3, 10, 0, 5, 0, time.UTC)
	ivs, err := IntervalFiles(dir, from, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ivs) != 2 || ivs[0].Seq != 2 || ivs[1].Seq != 3 || !ivs[0].Start.Equal(from.Add(5*time.Second)) {
		t.Fatalf("intervals from 10:00:05: %+v, want the 2nd and 3rd", ivs)
	}
	rules, err := LoadRules("")
	if err != nil {
		t.Fatal(err)
	}
	figs, err := AnalyzeIntervals(ivs, rules, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(figs) != 2 || figs[0].AppBlockedNs == 0 || figs[0].AppBlockedNs != figs[1].AppBlockedNs || figs[0].Top == "" {
		t.Fatalf("figures %+v: want two equal intervals with blocked time and a largest cause", figs)
	}
	rep := &Report{Intervals: figs}
	if s := rep.intervalsStatement(); !strings.Contains(s, "2 intervals from 10:00:10 to 10:00:20") {
		t.Errorf("statement %q", s)
	}
}
