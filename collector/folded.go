package collector

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/schema"
)

// WriteFolded writes p in bcc's folded format, one line per stack:
//
//	THREAD;user frames root first;-;kernel frames root first VALUE
//
// VALUE is the first sample value divided by div (1000 turns offcpu's
// nanoseconds into the microseconds bcc prints). Identical lines are
// merged and lines are sorted, so the output is stable.
func WriteFolded(w io.Writer, p *profile.Profile, sampleIndex int, div int64) error {
	return writeFoldedBy(w, p, sampleIndex, div, FoldedStack)
}

// FoldedStack renders one sample as a folded line without its value.
func FoldedStack(s *profile.Sample) string {
	var user, kernel []string
	// Locations are leaf first; folded frames are root first.
	for i := len(s.Location) - 1; i >= 0; i-- {
		l := s.Location[i]
		for j := len(l.Line) - 1; j >= 0; j-- {
			name := frameName(l.Line[j])
			if l.Mapping != nil && l.Mapping.File == KernelMapping {
				kernel = append(kernel, name)
			} else {
				user = append(user, name)
			}
		}
	}
	parts := []string{threadOf(s)}
	parts = append(parts, user...)
	if len(kernel) > 0 {
		parts = append(parts, "-")
		parts = append(parts, kernel...)
	}
	return strings.Join(parts, ";")
}

// WriteFoldedPlain writes "THREAD;frames root first VALUE" lines with
// every frame in order, for profiles whose stacks carry their own
// separators (the offwake view).
func WriteFoldedPlain(w io.Writer, p *profile.Profile, sampleIndex int, div int64) error {
	return writeFoldedBy(w, p, sampleIndex, div, func(s *profile.Sample) string {
		parts := []string{threadOf(s)}
		for i := len(s.Location) - 1; i >= 0; i-- {
			l := s.Location[i]
			for j := len(l.Line) - 1; j >= 0; j-- {
				parts = append(parts, frameName(l.Line[j]))
			}
		}
		return strings.Join(parts, ";")
	})
}

// WriteWakeupsFolded writes the wake-up profile as
// "TARGET_THREAD;WAKER_THREAD;waker user frames;-;waker kernel frames COUNT".
func WriteWakeupsFolded(w io.Writer, p *profile.Profile) error {
	return writeFoldedBy(w, p, 0, 1, func(s *profile.Sample) string {
		target := "[unnamed]"
		if t := s.Label[LabelTarget]; len(t) > 0 {
			target = schema.FoldedFrame(t[0])
		}
		return target + ";" + FoldedStack(s)
	})
}

func writeFoldedBy(w io.Writer, p *profile.Profile, sampleIndex int, div int64, line func(*profile.Sample) string) error {
	if sampleIndex < 0 || sampleIndex >= len(p.SampleType) {
		return fmt.Errorf("sample index %d out of range", sampleIndex)
	}
	if div <= 0 {
		div = 1
	}
	sums := map[string]int64{}
	for _, s := range p.Sample {
		sums[line(s)] += s.Value[sampleIndex]
	}
	keys := make([]string, 0, len(sums))
	for k, v := range sums {
		if v != 0 { // samples of another type (on-CPU beside off-CPU)
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	bw := bufio.NewWriter(w)
	for _, k := range keys {
		v := sums[k] / div
		if v == 0 {
			v = 1 // keep short waits visible instead of rounding them away
		}
		if _, err := fmt.Fprintf(bw, "%s %d\n", k, v); err != nil {
			return err
		}
	}
	return bw.Flush()
}

func threadOf(s *profile.Sample) string {
	if t := s.Label[LabelThread]; len(t) > 0 && t[0] != "" {
		return schema.FoldedFrame(t[0])
	}
	return "[unnamed]"
}

func frameName(l profile.Line) string {
	if l.Function == nil {
		return "[unknown]"
	}
	return schema.FoldedFrame(l.Function.Name)
}
