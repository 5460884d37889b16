package analysis

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/offcpu/offcpu/schema"
)

// IntervalFile is one interval of a continuous recording, as its
// --output-dir holds it: offcpu-TIME-SEQ.pb.gz and its wake-ups.
type IntervalFile struct {
	Start    time.Time
	Seq      int
	Profiles []string
}

var intervalName = regexp.MustCompile(`^offcpu-(\d{8}T\d{6}\.\d{3}Z)-(\d+)\.pb\.gz$`)

// IntervalFiles lists a directory's intervals, oldest first, those that
// started in [from, to) where given (zero: unbounded).
func IntervalFiles(dir string, from, to time.Time) ([]IntervalFile, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []IntervalFile
	for _, e := range entries {
		m := intervalName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		start, err := time.Parse("20060102T150405.000Z", m[1])
		if err != nil {
			continue
		}
		if (!from.IsZero() && start.Before(from)) || (!to.IsZero() && !start.Before(to)) {
			continue
		}
		seq, _ := strconv.Atoi(m[2])
		iv := IntervalFile{Start: start, Seq: seq, Profiles: []string{filepath.Join(dir, e.Name())}}
		if w := filepath.Join(dir, strings.TrimSuffix(e.Name(), ".pb.gz")+".wakeups.pb.gz"); fileExists(w) {
			iv.Profiles = append(iv.Profiles, w)
		}
		out = append(out, iv)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out, nil
}

// IsIntervalDir says whether p is a directory of intervals rather than a
// run directory.
func IsIntervalDir(p string) bool {
	st, err := os.Stat(p)
	if err != nil || !st.IsDir() || isRunDir(p) {
		return false
	}
	ivs, err := IntervalFiles(p, time.Time{}, time.Time{})
	return err == nil && len(ivs) > 0
}

// IntervalFigures are one interval's figures, beside a report of the
// intervals merged.
type IntervalFigures struct {
	Start        time.Time `json:"start"`
	OffCPUNs     int64     `json:"offcpu_ns"`
	AppBlockedNs int64     `json:"app_blocked_ns"`
	IdleNs       int64     `json:"idle_ns"`
	RunQueueNs   int64     `json:"runqueue_ns"`
	// Top: the largest blocking category, and its share of the blocked
	// time with an application frame.
	Top      string  `json:"top,omitempty"`
	TopShare float64 `json:"top_share,omitempty"`
}

// AddIntervals analyses each interval on its own and adds their figures
// and spread to rep, the report of them merged.
func (rep *Report) AddIntervals(ivs []IntervalFile, r *Rules, o Options) error {
	figs, err := AnalyzeIntervals(ivs, r, o)
	if err != nil {
		return err
	}
	rep.Intervals = figs
	if s := rep.intervalsStatement(); s != "" {
		rep.Statements = append(rep.Statements, s)
	}
	return nil
}

// AnalyzeIntervals analyses each interval on its own, for the spread of
// a merged report's figures.
func AnalyzeIntervals(ivs []IntervalFile, r *Rules, o Options) ([]IntervalFigures, error) {
	var out []IntervalFigures
	for _, iv := range ivs {
		d, err := Load(schema.FoldedMicroseconds, iv.Profiles...)
		if err != nil {
			return nil, fmt.Errorf("interval %s: %w", iv.Start.Format(time.RFC3339), err)
		}
		rep := Analyze(d, r, o)
		f := IntervalFigures{Start: iv.Start, OffCPUNs: rep.TotalOffCPUNs, AppBlockedNs: rep.AppBlockedNs, IdleNs: rep.IdleNs, RunQueueNs: rep.RunQueueNs}
		var topNs int64
		for _, c := range rep.Categories {
			if !c.Idle && c.Name != "runqueue" && c.FirstNs > topNs {
				f.Top, topNs = c.Name, c.FirstNs
			}
		}
		if rep.AppBlockedNs > 0 {
			f.TopShare = float64(topNs) / float64(rep.AppBlockedNs)
		}
		out = append(out, f)
	}
	return out, nil
}

// intervalsTable lists each interval's figures.
func (rep *Report) intervalsTable() *table {
	if len(rep.Intervals) < 2 {
		return nil
	}
	t := &table{head: []string{"interval", "off-CPU", "blocked with app frame", "idle", "waiting for CPU", "largest cause"}}
	for _, f := range rep.Intervals {
		top := ""
		if f.Top != "" {
			top = fmt.Sprintf("%s %.0f%%", f.Top, 100*f.TopShare)
		}
		t.rows = append(t.rows, []string{f.Start.UTC().Format("15:04:05"), Secs(f.OffCPUNs), Secs(f.AppBlockedNs), Secs(f.IdleNs), Secs(f.RunQueueNs), top})
	}
	return t
}

// intervalsStatement gives the spread of the intervals' blocked time.
func (rep *Report) intervalsStatement() string {
	if len(rep.Intervals) < 2 {
		return ""
	}
	v := make([]int64, len(rep.Intervals))
	for i, f := range rep.Intervals {
		v[i] = f.AppBlockedNs
	}
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	first, last := rep.Intervals[0].Start.UTC(), rep.Intervals[len(rep.Intervals)-1].Start.UTC()
	return fmt.Sprintf("%d intervals from %s to %s: blocked time with an application frame per interval median %s (%s–%s).",
		len(v), first.Format("15:04:05"), last.Format("15:04:05"), Secs(v[len(v)/2]), Secs(v[0]), Secs(v[len(v)-1]))
}
