package bench

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/offcpu/offcpu/flamegraph"
)

func init() { flameGraphs = writeFlameGraphs }

// writeFlameGraphs draws each side's off-CPU time over its profiled runs,
// and the candidate coloured by its change from the baseline.
func writeFlameGraphs(cfg *Config, res *Result) error {
	flameLinks = nil
	profiles := make([]*flamegraph.Profile, 2)
	for i, side := range cfg.Variants {
		files := profiledFiles(cfg, res, i)
		if len(files) == 0 {
			continue
		}
		p, err := flamegraph.Load("off_cpu", files...)
		if err != nil {
			return fmt.Errorf("flame graph of %s: %w", side, err)
		}
		profiles[i] = p
		name := side + ".svg"
		if err := writeSVG(filepath.Join(cfg.Out, name), p, flamegraph.Options{Title: "Off-CPU time: " + side}); err != nil {
			return err
		}
		flameLinks = append(flameLinks, name)
	}
	if profiles[0] == nil || profiles[1] == nil {
		return nil
	}
	// Fresh copies: SetBase adds the base's stacks to the profile.
	cand, err := flamegraph.Load("off_cpu", profiledFiles(cfg, res, 1)...)
	if err != nil {
		return err
	}
	cand.SetBase(profiles[0], true)
	title := fmt.Sprintf("Off-CPU time: %s against %s (red grew, blue shrank; totals normalised)", cfg.Variants[1], cfg.Variants[0])
	if err := writeSVG(filepath.Join(cfg.Out, "diff.svg"), cand, flamegraph.Options{Title: title}); err != nil {
		return err
	}
	flameLinks = append(flameLinks, "diff.svg")
	return nil
}

func profiledFiles(cfg *Config, res *Result, side int) []string {
	var files []string
	for _, r := range res.Runs {
		if r.Side == cfg.Variants[side] && r.Profiled && !r.Failed {
			files = append(files, filepath.Join(r.Dir, "offcpu.pb.gz"))
		}
	}
	return files
}

func writeSVG(path string, p *flamegraph.Profile, o flamegraph.Options) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := flamegraph.Write(f, p, o); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}
