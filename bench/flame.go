package bench

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/flamegraph"
	"github.com/offcpu/offcpu/internal/output"
	"github.com/offcpu/offcpu/schema"
)

// flameKind is what the bench's flame graphs draw.
type flameKind struct {
	sampleType string
	what       string // "Blocked time with an application frame"
	blocked    bool
}

var (
	blockedFlames = flameKind{schema.OffCPU, "Blocked time with an application frame", true}
	cpuFlames     = flameKind{schema.CPU, "On-CPU samples", false}
)

// flamesFor is the kind of graph the profiled scenario's story needs.
func flamesFor(cfg *Config) flameKind {
	if st := cfg.workload.Story(); st != nil && st.CPU {
		return cpuFlames
	}
	return blockedFlames
}

// writeFlameGraphs draws each side's profiled runs and their diff: the
// story's kind for the bundled core; for commands, blocked time and
// on-CPU time both.
func writeFlameGraphs(cfg *Config, res *Result, o analysis.Options) error {
	kinds := []flameKind{flamesFor(cfg)}
	if cfg.workload.Story() == nil {
		kinds = []flameKind{blockedFlames, cpuFlames}
	}
	for i, kind := range kinds {
		prefix := ""
		if i > 0 {
			prefix = "cpu-"
		}
		if err := writeFlames(cfg, res, o, kind, prefix); err != nil {
			return err
		}
	}
	return nil
}

// writeFlames draws one kind of graph per side, and the candidate against
// the baseline.
func writeFlames(cfg *Config, res *Result, o analysis.Options, kind flameKind, prefix string) error {
	// Only the analyzed threads and processes; for off-CPU time only
	// blocked time with an application frame: the idle waits of loops and
	// executors would fill most of the width.
	sel := flamegraph.Select{GroupThreads: true, Keep: func(s *schema.Stack) bool { return o.Wanted(s) }}
	if kind.blocked && cfg.Rules != nil {
		sel.Keep = func(s *schema.Stack) bool { return o.Wanted(s) && cfg.Rules.AppBlocked(s) }
	}
	profiles := make([]*flamegraph.Profile, 2)
	for i, side := range cfg.Variants {
		files := profiledFiles(cfg, res, i)
		if len(files) == 0 {
			continue
		}
		p, err := flamegraph.Load(kind.sampleType, sel, files...)
		if errors.Is(err, flamegraph.ErrNoSamples) {
			res.flameNotes = append(res.flameNotes, fmt.Sprintf("%s: no %s, no graph", side, strings.ToLower(kind.what)))
			if i == 1 && profiles[0] != nil {
				// The candidate removed all of it: the diff shows that.
				profiles[1] = &flamegraph.Profile{Unit: profiles[0].Unit}
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("flame graph of %s: %w", side, err)
		}
		profiles[i] = p
		name := prefix + side + ".svg"
		title := kind.what + ": " + side
		if cfg.Threads != "" {
			title += " (threads " + cfg.Threads + ")"
		}
		if err := writeSVG(filepath.Join(cfg.Out, name), p, flamegraph.Options{Title: title}); err != nil {
			return err
		}
		res.flameLinks = append(res.flameLinks, flameLink{name, kind.what})
	}
	if profiles[0] == nil || profiles[1] == nil {
		return nil
	}
	// Drawn at the baseline's widths with the candidate as the after
	// profile, so a wait the candidate removed keeps its width, in blue.
	// A fresh copy: SetBase adds the other's stacks to the profile.
	base, err := flamegraph.Load(kind.sampleType, sel, profiledFiles(cfg, res, 0)...)
	if err != nil {
		return err
	}
	base.SetBase(profiles[1], false)
	title := fmt.Sprintf("%s: %s (widths) against %s (blue: less in %s, red: more)", kind.what, cfg.Variants[0], cfg.Variants[1], cfg.Variants[1])
	name := prefix + "diff.svg"
	if err := writeSVG(filepath.Join(cfg.Out, name), base, flamegraph.Options{Title: title, Diff: true, Negate: true}); err != nil {
		return err
	}
	res.flameLinks = append(res.flameLinks, flameLink{name, kind.what + ", " + cfg.Variants[1] + " against " + cfg.Variants[0]})
	return nil
}

// flameLink is a drawn graph and what it shows.
type flameLink struct{ file, what string }

// storyCPU compares, per story function, the analyzed threads' on-CPU
// time in it (inclusive) per published message, profiled run by run;
// values in µs per message.
func storyCPU(cfg *Config, res *Result) []analysis.MetricDiff {
	st := cfg.workload.Story()
	if st == nil {
		return nil
	}
	sel := flamegraph.Select{}
	if cfg.Threads != "" {
		sel.Threads = regexp.MustCompile(cfg.Threads)
	}
	var vals [2][][]float64 // side, function, run
	for side := range cfg.Variants {
		vals[side] = make([][]float64, len(st.Functions))
		for _, r := range res.Runs {
			msgs := r.Metrics[schema.MetricMessages]
			if r.Side != cfg.Variants[side] || !r.Profiled || r.Failed || msgs == 0 {
				continue
			}
			p, err := flamegraph.Load(schema.CPU, sel, filepath.Join(r.Dir, schema.ProfileFile))
			if err != nil {
				continue
			}
			for i, ns := range inclusive(p, st.Functions) {
				vals[side][i] = append(vals[side][i], ns/msgs/1000)
			}
		}
	}
	var out []analysis.MetricDiff
	for i, fn := range st.Functions {
		if len(vals[0][i]) == 0 || len(vals[1][i]) == 0 {
			return nil
		}
		out = append(out, analysis.Compare(fn, "", vals[0][i], vals[1][i]))
	}
	return out
}

// inclusive sums each function's time anywhere in the stacks (a frame
// ends with the name after a package or receiver: "pkg.F", "(*T).F").
func inclusive(p *flamegraph.Profile, fns []string) []float64 {
	out := make([]float64, len(fns))
	for _, l := range p.Lines {
		frames := strings.Split(string(l.Stack), ";")
		for i, fn := range fns {
			for _, f := range frames {
				if strings.HasSuffix(f, fn) && (len(f) == len(fn) || strings.ContainsAny(f[len(f)-len(fn)-1:len(f)-len(fn)], ".)")) {
					out[i] += float64(l.Value)
					break
				}
			}
		}
	}
	return out
}

func profiledFiles(cfg *Config, res *Result, side int) []string {
	var files []string
	for _, r := range res.Runs {
		if r.Side == cfg.Variants[side] && r.Profiled && !r.Failed {
			files = append(files, filepath.Join(r.Dir, schema.ProfileFile))
		}
	}
	return files
}

func writeSVG(path string, p *flamegraph.Profile, o flamegraph.Options) error {
	return output.WriteFile(path, func(w io.Writer) error { return flamegraph.Write(w, p, o) })
}
