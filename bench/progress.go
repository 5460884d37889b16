package bench

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress shows run i of n, side, elapsed and ETA: a bar on a terminal,
// plain lines otherwise.
type progress struct {
	w     io.Writer
	bar   *progressbar.ProgressBar
	total int
	start time.Time
}

func newProgress(w io.Writer, terminal bool, total int) *progress {
	p := &progress{w: w, total: total, start: time.Now()}
	if w != nil && terminal {
		p.bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionShowCount(),
			progressbar.OptionSetPredictTime(true), progressbar.OptionSetElapsedTime(true), progressbar.OptionSetWidth(30),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }))
	}
	return p
}

func (p *progress) step(n int, name string, profiled bool, start time.Time) {
	if p.w == nil {
		return
	}
	kind := "unprofiled"
	if profiled {
		kind = "profiled"
	}
	if p.bar != nil {
		p.bar.Describe(fmt.Sprintf("%s (%s)", name, kind))
		return
	}
	eta := "?"
	if n > 0 {
		per := time.Since(start) / time.Duration(n)
		eta = (per * time.Duration(p.total-n)).Round(time.Second).String()
	}
	fmt.Fprintf(p.w, "run %d of %d: %s (%s), elapsed %v, ETA %s\n", n+1, p.total, name, kind, time.Since(start).Round(time.Second), eta)
}

// grow adds runs to the plan.
func (p *progress) grow(n int) {
	p.total += n
	if p.bar != nil {
		p.bar.ChangeMax(p.total)
	}
}

func (p *progress) done(rec RunRecord) {
	if p.w == nil {
		return
	}
	if p.bar != nil {
		p.bar.Add(1)
	}
	if rec.Failed {
		if p.bar != nil {
			fmt.Fprintln(p.w)
		}
		fmt.Fprintf(p.w, "  %s failed: %s\n", rec.Name, rec.Error)
	}
}

func (p *progress) finish() {
	if p.bar != nil {
		p.bar.Finish()
	}
}
