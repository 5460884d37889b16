package schema

import (
	"bufio"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/pprof/profile"
)

// KernelMapping is the File of the pprof mapping that holds kernel frames;
// folded output puts those frames after the "-" separator.
const KernelMapping = "[kernel.kallsyms]"

// Frames returns the frames of locs (leaf first, as pprof keeps them) root
// first, inlined ones expanded.
func Frames(locs []*profile.Location) []Frame { return AppendFrames(nil, locs) }

// AppendFrames appends the frames of locs to out, as Frames.
func AppendFrames(out []Frame, locs []*profile.Location) []Frame {
	for i := len(locs) - 1; i >= 0; i-- {
		l := locs[i]
		kernel := l.Mapping != nil && l.Mapping.File == KernelMapping
		module, runtime := "", ""
		if l.Mapping != nil && !kernel {
			module = filepath.Base(l.Mapping.File)
			runtime = RuntimeOfMapping(l.Mapping.File)
		}
		for j := len(l.Line) - 1; j >= 0; j-- {
			name := "[unknown]"
			if l.Line[j].Function != nil {
				name = l.Line[j].Function.Name
			}
			out = append(out, Frame{Name: name, Kernel: kernel, Module: module, Runtime: runtime})
		}
		if len(l.Line) == 0 {
			out = append(out, Frame{Name: fmt.Sprintf("0x%x", l.Address), Kernel: kernel, Module: module, Runtime: runtime})
		}
	}
	return out
}

// FoldFrames renders frames (root first) as a folded stack: user frames,
// then "-" and the kernel frames.
func FoldFrames(frames []Frame) string {
	var user, kernel []string
	for _, f := range frames {
		if f.Kernel {
			kernel = append(kernel, FoldedFrame(f.Name))
		} else {
			user = append(user, FoldedFrame(f.Name))
		}
	}
	if len(kernel) > 0 {
		user = append(append(user, "-"), kernel...)
	}
	return strings.Join(user, ";")
}

// FoldedSample renders one sample as a folded line without its value:
// THREAD;user frames root first;-;kernel frames root first.
func FoldedSample(s *profile.Sample) string {
	if f := FoldFrames(Frames(s.Location)); f != "" {
		return sampleThread(s) + ";" + f
	}
	return sampleThread(s)
}

// WriteFolded writes p's values of sampleType in bcc's folded format, one
// line per stack (FoldedSample), each value divided by div (1000 turns
// nanoseconds into the microseconds bcc prints). Identical lines are
// merged and lines are sorted, so the output is stable.
func WriteFolded(w io.Writer, p *profile.Profile, sampleType string, div int64) error {
	return writeFoldedBy(w, p, sampleType, div, FoldedSample)
}

// WriteFoldedPlain writes "THREAD;frames root first VALUE" lines with
// every frame in order, for profiles whose stacks carry their own
// separators (the offwake view).
func WriteFoldedPlain(w io.Writer, p *profile.Profile, sampleType string, div int64) error {
	return writeFoldedBy(w, p, sampleType, div, func(s *profile.Sample) string {
		parts := []string{sampleThread(s)}
		for _, f := range Frames(s.Location) {
			parts = append(parts, FoldedFrame(f.Name))
		}
		return strings.Join(parts, ";")
	})
}

// WriteWakeupsFolded writes a wake-up profile as
// "TARGET_THREAD;WAKER_THREAD;waker user frames;-;waker kernel frames COUNT".
func WriteWakeupsFolded(w io.Writer, p *profile.Profile) error {
	return writeFoldedBy(w, p, Wakeups, 1, func(s *profile.Sample) string {
		target := "[unnamed]"
		if t := s.Label[LabelTarget]; len(t) > 0 {
			target = FoldedFrame(t[0])
		}
		return target + ";" + FoldedSample(s)
	})
}

// SampleIndex is the index of sampleType among p's sample types.
func SampleIndex(p *profile.Profile, sampleType string) (int, error) {
	for i, st := range p.SampleType {
		if st.Type == sampleType {
			return i, nil
		}
	}
	return -1, fmt.Errorf("the profile has no %s samples", sampleType)
}

func writeFoldedBy(w io.Writer, p *profile.Profile, sampleType string, div int64, line func(*profile.Sample) string) error {
	idx, err := SampleIndex(p, sampleType)
	if err != nil {
		return err
	}
	if div <= 0 {
		div = 1
	}
	sums := map[string]int64{}
	for _, s := range p.Sample {
		sums[line(s)] += s.Value[idx]
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

func sampleThread(s *profile.Sample) string {
	if t := s.Label[LabelThread]; len(t) > 0 && t[0] != "" {
		return FoldedFrame(t[0])
	}
	return "[unnamed]"
}

// WriteGoroutinesFolded writes a goroutine profile as
// "PROCESS;[REASON];frames root first MICROSECONDS" (blocked time).
func WriteGoroutinesFolded(w io.Writer, p *profile.Profile) error {
	return writeFoldedBy(w, p, GoroutineBlocked, 1000, func(s *profile.Sample) string {
		parts := []string{"[unnamed]", "[unknown]"}
		if v := s.Label[LabelProcess]; len(v) > 0 {
			parts[0] = FoldedFrame(v[0])
		}
		if v := s.Label[LabelReason]; len(v) > 0 {
			parts[1] = FoldedFrame("[" + v[0] + "]")
		}
		for _, f := range Frames(s.Location) {
			parts = append(parts, FoldedFrame(f.Name))
		}
		return strings.Join(parts, ";")
	})
}
