// Package flamegraph renders interactive and differential flame graphs
// (SVG, or HTML with a table of top functions) from offcpu profiles, any
// pprof profile and folded stacks.
//
// Stacks are merged the way flamegraph.pl does: sorted, then walked once,
// a frame opening where a stack's prefix departs from the previous one
// and closing where it ends. No tree is built, so large inputs are fast.
package flamegraph

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/offcpu/offcpu/schema"
)

// Line is one stack, frames root first separated by ';'. Base is its
// value in the base profile of a differential graph.
type Line struct {
	Stack []byte
	Value int64
	Base  int64
}

// Profile is a set of stacks to draw.
type Profile struct {
	Lines []Line
	Unit  string // "ns", "us" or "count"
	diff  bool
}

// ParseFolded reads "frame;frame;... VALUE" lines, keeping every frame
// (thread names, "-" and "--" separators included). Frames after "-"
// (and the waker's, after "--") are drawn as kernel frames. The lines
// keep referring to b.
func ParseFolded(b []byte, unit string) (*Profile, error) {
	p := &Profile{Unit: unit, Lines: make([]Line, 0, bytes.Count(b, []byte{'\n'})+1)}
	err := schema.ScanFolded(b, func(stack []byte, v int64) error {
		if v > 0 {
			p.Lines = append(p.Lines, Line{Stack: stack, Value: v})
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// FromData takes one kind of stack (schema.KindOffCPU, KindCPU or
// KindWakeup) with the thread name as the root frame and "-" between
// user and kernel frames; wake-ups are rooted at the woken thread, then
// the waker.
func FromData(d *schema.Data, kind string) *Profile {
	unit := "ns"
	if kind == schema.KindWakeup {
		unit = "count"
	}
	p := &Profile{Unit: unit}
	for i := range d.Stacks {
		s := &d.Stacks[i]
		if s.Kind != kind || s.Value <= 0 {
			continue
		}
		line := s.Folded()
		if s.Thread == "" {
			line = "[all];" + line
		}
		if kind == schema.KindWakeup && s.Target != "" {
			line = clean(s.Target) + ";" + line
		}
		p.Lines = append(p.Lines, Line{Stack: []byte(strings.TrimSuffix(line, ";")), Value: s.Value})
	}
	return p
}

var clean = schema.FoldedFrame

// ErrNoSamples: the input holds nothing to draw.
var ErrNoSamples = errors.New("no samples")

// Select narrows and names what a flame graph shows.
type Select struct {
	// Threads keeps stacks whose root frame (the thread; for wake-ups the
	// woken thread) matches; nil keeps all.
	Threads *regexp.Regexp
	// FullNames keeps Go module paths in function names; by default they
	// read as go tool pprof shows them (dispatcher.(*Dispatcher).Run).
	FullNames bool
	// GroupThreads roots stacks at the thread group (broker-io-N) instead
	// of each thread, so one cause spread over a pool reads as one tower.
	GroupThreads bool
	// Keep, if set, keeps only the off-CPU stacks it accepts (pprof input),
	// e.g. analysis.Rules.AppBlocked: blocked time with an application
	// frame, without idle loops and pools or runnable threads.
	Keep func(*schema.Stack) bool
	// Judge, if set, sees all of a load's pprof stacks before Keep: what
	// Keep decides may rest on a thread's other waits (its top of loop).
	Judge func([]schema.Stack)
}

// apply drops the stacks of other threads and shortens names.
func (p *Profile) apply(sel Select) {
	out := p.Lines[:0]
	for _, l := range p.Lines {
		frames := strings.Split(string(l.Stack), ";")
		if sel.Threads != nil && !sel.Threads.MatchString(frames[0]) {
			continue
		}
		if sel.GroupThreads {
			frames[0] = schema.ThreadGroup(frames[0])
		}
		if !sel.FullNames {
			for i, f := range frames[1:] {
				frames[i+1] = schema.ShortFunc(f)
			}
		}
		l.Stack = []byte(strings.Join(frames, ";"))
		out = append(out, l)
	}
	p.Lines = out
}

// Load reads profiles or folded stacks. sampleType picks a pprof sample
// type: off_cpu (default), cpu or wakeups.
func Load(sampleType string, sel Select, paths ...string) (*Profile, error) {
	kind := schema.KindOffCPU
	switch sampleType {
	case "", schema.OffCPU, schema.KindOffCPU:
	case schema.CPU:
		kind = schema.KindCPU
	case schema.Wakeups, schema.KindWakeup:
		kind = schema.KindWakeup
	default:
		return nil, fmt.Errorf("--sample-type %q: use off_cpu, cpu or wakeups", sampleType)
	}
	out := &Profile{}
	var pprofs []string
	for _, path := range paths {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
		if schema.IsPprof(b) {
			pprofs = append(pprofs, path)
			continue
		}
		if bytes.IndexByte(b, 0) >= 0 {
			return nil, fmt.Errorf("%s is neither a pprof profile nor folded stacks", path)
		}
		p, err := ParseFolded(b, "us")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if err := out.merge(p); err != nil {
			return nil, err
		}
	}
	if len(pprofs) > 0 {
		d, err := schema.Load(schema.FoldedMicroseconds, pprofs...)
		if err != nil {
			return nil, err
		}
		if sel.Keep != nil && kind == schema.KindOffCPU {
			if sel.Judge != nil {
				sel.Judge(d.Stacks)
			}
			kept := d.Stacks[:0]
			for i := range d.Stacks {
				if sel.Keep(&d.Stacks[i]) {
					kept = append(kept, d.Stacks[i])
				}
			}
			d.Stacks = kept
		}
		p := FromData(d, kind)
		if len(p.Lines) == 0 {
			return nil, fmt.Errorf("%w of type %s in %s", ErrNoSamples, sampleType, strings.Join(pprofs, ", "))
		}
		if err := out.merge(p); err != nil {
			return nil, err
		}
	}
	if len(out.Lines) == 0 {
		return nil, fmt.Errorf("%w in %s", ErrNoSamples, strings.Join(paths, ", "))
	}
	out.apply(sel)
	if len(out.Lines) == 0 {
		return nil, fmt.Errorf("%w of threads matching %q in %s", ErrNoSamples, sel.Threads, strings.Join(paths, ", "))
	}
	return out, nil
}

func (p *Profile) merge(q *Profile) error {
	if p.Unit != "" && p.Unit != q.Unit {
		return fmt.Errorf("cannot merge folded stacks (µs) with pprof profiles (%s): give one kind", q.Unit)
	}
	p.Unit = q.Unit
	p.Lines = append(p.Lines, q.Lines...)
	return nil
}

// SetBase makes p a differential profile against base: each frame is
// coloured by the change of its value. With normalize, base values are
// scaled so both totals match.
func (p *Profile) SetBase(base *Profile, normalize bool) {
	var total, btotal int64
	for _, l := range p.Lines {
		total += l.Value
	}
	for _, l := range base.Lines {
		btotal += l.Value
	}
	scale := 1.0
	if normalize && btotal > 0 {
		scale = float64(total) / float64(btotal)
	}
	for _, l := range base.Lines {
		p.Lines = append(p.Lines, Line{Stack: l.Stack, Base: int64(float64(l.Value) * scale)})
	}
	p.diff = true
}

// sorted sorts the stacks in place, as flamegraph.pl does, so siblings
// are drawn in name order, and merges identical ones.
func (p *Profile) sorted() []Line {
	lines := p.Lines
	if !slices.IsSortedFunc(lines, compareLines) {
		lines = sortLines(lines)
	}
	out := lines[:0]
	for _, l := range lines {
		if n := len(out); n > 0 && bytes.Equal(out[n-1].Stack, l.Stack) {
			out[n-1].Value += l.Value
			out[n-1].Base += l.Base
			continue
		}
		out = append(out, l)
	}
	p.Lines = out
	return out
}

// FuncValue is a function's self value.
type FuncValue struct {
	Name  string
	Value int64
}

// TopFunctions sums the leaf (self) values by function, largest first.
func (p *Profile) TopFunctions(n int) []FuncValue {
	m := map[string]int64{}
	for _, l := range p.Lines {
		leaf := l.Stack
		if i := bytes.LastIndexByte(leaf, ';'); i >= 0 {
			leaf = leaf[i+1:]
		}
		if l.Value > 0 {
			m[string(leaf)] += l.Value
		}
	}
	out := make([]FuncValue, 0, len(m))
	for k, v := range m {
		out = append(out, FuncValue{k, v})
	}
	slices.SortFunc(out, func(a, b FuncValue) int {
		if a.Value != b.Value {
			return cmp.Compare(b.Value, a.Value)
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out[:min(n, len(out))]
}

func compareLines(a, b Line) int { return bytes.Compare(a.Stack, b.Stack) }

// sortLines sorts large inputs as two halves in parallel, then merges.
func sortLines(lines []Line) []Line {
	if len(lines) < 20000 || runtime.GOMAXPROCS(0) < 2 {
		slices.SortFunc(lines, compareLines)
		return lines
	}
	half := len(lines) / 2
	a, b := lines[:half], lines[half:]
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); slices.SortFunc(a, compareLines) }()
	slices.SortFunc(b, compareLines)
	wg.Wait()
	out := make([]Line, 0, len(lines))
	for len(a) > 0 && len(b) > 0 {
		if compareLines(a[0], b[0]) <= 0 {
			out, a = append(out, a[0]), a[1:]
		} else {
			out, b = append(out, b[0]), b[1:]
		}
	}
	return append(append(out, a...), b...)
}
