package analysis

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/offcpu/offcpu/schema"
)

// RunFiles turns arguments (profile files, or run directories as offcpu
// bench writes them) into the profiles to read and the metrics files
// beside them.
func RunFiles(args []string) (profiles, metrics []string, err error) {
	for _, a := range args {
		st, err := os.Stat(a)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %v", a, errors.Unwrap(err))
		}
		if !st.IsDir() {
			profiles = append(profiles, a)
			continue
		}
		found := false
		for _, name := range schema.RunProfiles {
			if p := filepath.Join(a, name); fileExists(p) {
				profiles = append(profiles, p)
				found = true
			}
		}
		if m := filepath.Join(a, schema.MetricsFile); fileExists(m) {
			metrics = append(metrics, m)
		}
		if !found {
			return nil, nil, fmt.Errorf("%s holds no %s: not a profiled run directory", a, schema.ProfileFile)
		}
	}
	return profiles, metrics, nil
}

// Published sums the messages published by the runs of these metrics
// files (schema.MetricMessages; 0 where absent or unreadable).
func Published(metrics []string) int64 {
	var n int64
	for _, path := range metrics {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		var m map[string]any
		if json.Unmarshal(b, &m) == nil {
			if v, ok := m[schema.MetricMessages].(float64); ok {
				n += int64(v)
			}
		}
	}
	return n
}

// SidePaths expands a comma-separated list of paths and globs for
// LoadSide; a directory of run directories (offcpu bench's runs/) stands
// for the runs in it.
func SidePaths(list string) ([]string, error) {
	var paths []string
	for _, p := range strings.Split(list, ",") {
		if p == "" {
			continue
		}
		matches, err := filepath.Glob(p)
		if err != nil || len(matches) == 0 {
			return nil, fmt.Errorf("%s: no such file or directory", p)
		}
		sort.Strings(matches)
		for _, m := range matches {
			paths = append(paths, runsIn(m)...)
		}
	}
	return paths, nil
}

func isRunDir(p string) bool {
	return fileExists(filepath.Join(p, schema.MetricsFile)) || fileExists(filepath.Join(p, schema.ProfileFile))
}

// runsIn is the run directories in p, or p itself.
func runsIn(p string) []string {
	st, err := os.Stat(p)
	if err != nil || !st.IsDir() || isRunDir(p) {
		return []string{p}
	}
	entries, err := os.ReadDir(p)
	if err != nil {
		return []string{p}
	}
	var out []string
	for _, e := range entries {
		if sub := filepath.Join(p, e.Name()); e.IsDir() && isRunDir(sub) {
			out = append(out, sub)
		}
	}
	if len(out) == 0 {
		return []string{p}
	}
	return out
}
