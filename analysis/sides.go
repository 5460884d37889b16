package analysis

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/offcpu/offcpu/schema"
)

// Run is one benchmark run: its metrics and profiles.
type Run struct {
	Name     string             `json:"name"`
	Metrics  map[string]float64 `json:"metrics"`
	Profiles []string           `json:"profiles,omitempty"`
	Failed   bool               `json:"failed,omitempty"`
	// Profiled runs are perturbed by the recorder: their metrics are
	// compared only when a side has no unprofiled run.
	Profiled bool `json:"profiled,omitempty"`
	// What the metrics file says to compare first, and never
	// (schema.MetricKeyOrder, schema.MetricNotCompared).
	KeyMetrics  []string `json:"key_metrics,omitempty"`
	NotCompared []string `json:"not_compared,omitempty"`
}

// RunInfo is a run directory's run.json, written by offcpu bench.
type RunInfo struct {
	Profiled bool   `json:"profiled"`
	Failed   bool   `json:"failed"`
	Error    string `json:"error,omitempty"`
}

// Side is the baseline or the candidate: one or more runs.
type Side struct {
	Name string `json:"name"`
	Runs []Run  `json:"runs"`
}

// LoadSide reads run directories (metrics.json and offcpu*.pb.gz, as
// offcpu bench writes them), metrics JSON files and profile files.
// A run whose metrics say "failed": true is kept but not compared.
func LoadSide(name string, paths []string) (*Side, error) {
	s := &Side{Name: name}
	var loose []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		switch {
		case st.IsDir():
			r := Run{Name: filepath.Base(p)}
			if m := filepath.Join(p, schema.MetricsFile); fileExists(m) {
				if err := r.readMetrics(m); err != nil {
					return nil, err
				}
			}
			if b, err := os.ReadFile(filepath.Join(p, schema.RunInfoFile)); err == nil {
				var info RunInfo
				if err := json.Unmarshal(b, &info); err != nil {
					return nil, fmt.Errorf("%s/%s: %v", p, schema.RunInfoFile, err)
				}
				r.Profiled, r.Failed = info.Profiled, r.Failed || info.Failed
			}
			for _, f := range schema.RunProfiles {
				if fileExists(filepath.Join(p, f)) {
					r.Profiles = append(r.Profiles, filepath.Join(p, f))
				}
			}
			if r.Metrics == nil && r.Profiles == nil {
				return nil, fmt.Errorf("%s holds neither metrics.json nor offcpu.pb.gz", p)
			}
			s.Runs = append(s.Runs, r)
		case strings.HasSuffix(p, ".json"):
			r := Run{Name: filepath.Base(p)}
			if err := r.readMetrics(p); err != nil {
				return nil, err
			}
			s.Runs = append(s.Runs, r)
		default:
			loose = append(loose, p)
		}
	}
	if len(loose) > 0 {
		s.Runs = append(s.Runs, Run{Name: "profiles", Profiles: loose})
	}
	if len(s.Runs) == 0 {
		return nil, fmt.Errorf("%s: no runs given", name)
	}
	return s, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// readMetrics keeps the numeric top-level fields of a metrics file, its
// "failed" flag and the lists that order its comparison.
func (r *Run) readMetrics(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("reading metrics: %w", err)
	}
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("%s is not a JSON object of metrics: %v", path, err)
	}
	r.Metrics = map[string]float64{}
	for k, v := range raw {
		switch x := v.(type) {
		case float64:
			r.Metrics[k] = x
		case bool:
			if k == "failed" {
				r.Failed = r.Failed || x
			}
		case []any:
			var names []string
			for _, n := range x {
				if s, ok := n.(string); ok {
					names = append(names, s)
				}
			}
			switch k {
			case schema.MetricKeyOrder:
				r.KeyMetrics = names
			case schema.MetricNotCompared:
				r.NotCompared = names
			}
		}
	}
	return nil
}

// sideProfile analyzes a side's profiled runs together, and each alone;
// secs is their wall time where the runs report it.
func sideProfile(s *Side, r *Rules, o Options) (all *Report, each []*Report, secs float64, err error) {
	var files []string
	var messages int64
	o.Top = 1 << 30 // keep every function for the diff
	for _, run := range s.Runs {
		if run.Failed || len(run.Profiles) == 0 {
			continue
		}
		files = append(files, run.Profiles...)
		messages += int64(run.Metrics[schema.MetricMessages])
		secs += run.Metrics[schema.MetricWall]
		d, err := Load(schema.FoldedMicroseconds, run.Profiles...)
		if err != nil {
			return nil, nil, 0, err
		}
		one := o
		if one.Messages == 0 {
			one.Messages = int64(run.Metrics[schema.MetricMessages])
		}
		each = append(each, Analyze(d, r, one))
	}
	if len(each) == 0 {
		return nil, nil, 0, nil
	}
	d, err := Load(schema.FoldedMicroseconds, files...)
	if err != nil {
		return nil, nil, 0, err
	}
	if o.Messages == 0 {
		o.Messages = messages
	}
	return Analyze(d, r, o), each, secs, nil
}
