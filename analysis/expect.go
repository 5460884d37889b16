package analysis

import (
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/parser"

	"github.com/offcpu/offcpu/schema"
)

// Expectations state how each wait site of a recorded program must be
// judged, each with the reason (a source line, an accounting) that makes
// it so: a test of the rules against programs whose waits are known.
type Expectations struct {
	Source  string // the file
	Program string
	// MinAgreement: percent of the covered time whose verdict (and
	// category, where given) must agree.
	MinAgreement float64
	// MinSite: percent of the judged time an uncovered site may not reach.
	MinSite float64
	Expect  []Expectation
}

// Expectation is one site's expected judgement; the first that matches a
// stack decides.
type Expectation struct {
	At       string `json:"at"` // file:line
	Site     string `json:"site"`
	Thread   string `json:"thread,omitempty"`
	Verdict  string `json:"verdict"` // idle or blocked
	Category string `json:"category,omitempty"`
	Why      string `json:"why"`
	site     *regexp.Regexp
	thread   *regexp.Regexp
}

type expectFile struct {
	Program      string   `yaml:"program"`
	MinAgreement *float64 `yaml:"min_agreement"`
	MinSite      *float64 `yaml:"min_site"`
	Expect       []struct {
		Site     string `yaml:"site"`
		Thread   string `yaml:"thread"`
		Verdict  string `yaml:"verdict"`
		Category string `yaml:"category"`
		Why      string `yaml:"why"`
	} `yaml:"expect"`
}

// Defaults: nearly all of the time agrees, and no site of 1% goes
// unstated.
const (
	defaultMinAgreement = 95
	defaultMinSite      = 1
)

var yamlPos = regexp.MustCompile(`^\[(\d+):\d+\] (.*)$`)

// LoadExpectations reads an expectations file; categories are checked
// against r.
func LoadExpectations(path string, r *Rules) (*Expectations, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading expectations: %w", err)
	}
	return ParseExpectations(path, b, r)
}

// ParseExpectations parses an expectations file named name; errors name
// the file and line. r (nil: none) gives the categories an expectation
// may name.
func ParseExpectations(name string, b []byte, r *Rules) (*Expectations, error) {
	var f expectFile
	if err := yaml.UnmarshalWithOptions(b, &f, yaml.Strict()); err != nil {
		msg := oneLine(yaml.FormatError(err, false, false))
		if m := yamlPos.FindStringSubmatch(msg); m != nil { // "[9:5] unknown field": file:line as the other errors
			return nil, fmt.Errorf("%s:%s: %s", name, m[1], m[2])
		}
		return nil, fmt.Errorf("%s: %s", name, msg)
	}
	file, err := parser.ParseBytes(b, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %s", name, oneLine(err.Error()))
	}
	p := &ruleParser{name: name, file: file}
	e := &Expectations{Source: name, Program: f.Program, MinAgreement: defaultMinAgreement, MinSite: defaultMinSite}
	for _, pc := range []struct {
		key string
		v   *float64
		to  *float64
	}{{"min_agreement", f.MinAgreement, &e.MinAgreement}, {"min_site", f.MinSite, &e.MinSite}} {
		if pc.v == nil {
			continue
		}
		if *pc.v < 0 || *pc.v > 100 {
			return nil, fmt.Errorf("%s: %s %v: give a percent from 0 to 100", p.at("$."+pc.key), pc.key, *pc.v)
		}
		*pc.to = *pc.v
	}
	if len(f.Expect) == 0 {
		return nil, fmt.Errorf("%s: no expectations: list the sites under expect", p.at("$.expect"))
	}
	for i, fe := range f.Expect {
		base := fmt.Sprintf("$.expect[%d]", i)
		x := Expectation{At: p.at(base), Site: fe.Site, Thread: fe.Thread, Verdict: fe.Verdict, Category: fe.Category, Why: strings.TrimSpace(fe.Why)}
		switch {
		case fe.Site == "":
			return nil, fmt.Errorf("%s: expectation without a site (a regexp on the folded stack)", x.At)
		case fe.Verdict == "":
			return nil, fmt.Errorf("%s: expectation without a verdict (idle or blocked)", x.At)
		case fe.Verdict != "idle" && fe.Verdict != "blocked":
			return nil, fmt.Errorf("%s: unknown verdict %q (idle or blocked)", p.at(base+".verdict"), fe.Verdict)
		case x.Why == "":
			return nil, fmt.Errorf("%s: expectation without a why (the source line or accounting that makes it so)", x.At)
		}
		if x.site, err = p.compile(base+".site", fe.Site); err != nil {
			return nil, err
		}
		if fe.Thread != "" {
			if x.thread, err = p.compile(base+".thread", fe.Thread); err != nil {
				return nil, err
			}
		}
		if fe.Category != "" && r != nil {
			i := slices.IndexFunc(r.Categories, func(c Category) bool { return c.Name == fe.Category })
			if i < 0 {
				return nil, fmt.Errorf("%s: unknown category %q: the rules know %s", p.at(base+".category"), fe.Category, strings.Join(categoryNames(r), ", "))
			}
			// Its idleness is the verdict: one that contradicts it never agrees.
			if got := idleWord(r.Categories[i].Idle); got != fe.Verdict {
				return nil, fmt.Errorf("%s: category %s is %s, the verdict says %s", p.at(base+".category"), fe.Category, got, fe.Verdict)
			}
		}
		e.Expect = append(e.Expect, x)
	}
	return e, nil
}

func categoryNames(r *Rules) []string {
	var out []string
	for _, c := range r.Categories {
		out = append(out, c.Name)
	}
	return out
}

// matches: the expectation's site, and thread if given, match.
func (x *Expectation) matches(s *Stack, folded string) bool {
	return x.site.MatchString(folded) && (x.thread == nil || x.thread.MatchString(s.Thread))
}

// ExpectReport is how a recording's judged waits met expectations.
type ExpectReport struct {
	Source       string  `json:"source"`
	Program      string  `json:"program,omitempty"`
	MinAgreement float64 `json:"min_agreement"`
	MinSite      float64 `json:"min_site"`
	// Judged: off-CPU time not waiting for a CPU; Covered: of it, what an
	// expectation matched; Agreeing: of that, what was judged as expected.
	JudgedNs   int64     `json:"judged_ns"`
	CoveredNs  int64     `json:"covered_ns"`
	AgreeingNs int64     `json:"agreeing_ns"`
	Agreement  float64   `json:"agreement"` // percent of the covered time
	Confusion  Confusion `json:"confusion"`
	// Expectations in file order, with their time.
	Expectations []ExpectResult `json:"expectations"`
	Mismatches   []Mismatch     `json:"mismatches"` // by time, largest first
	// Uncovered: the sites no expectation matched that reach MinSite;
	// the others are only summed.
	Uncovered        []UncoveredSite `json:"uncovered"`
	UncoveredNs      int64           `json:"uncovered_ns"`
	SmallUncovered   int             `json:"small_uncovered_sites"`
	SmallUncoveredNs int64           `json:"small_uncovered_ns"`
	Failures         []string        `json:"failures"`
	Warnings         []string        `json:"warnings"`
}

// Confusion is the covered time by expected and got verdict.
type Confusion struct {
	IdleAsIdle       int64 `json:"idle_as_idle_ns"`
	IdleAsBlocked    int64 `json:"idle_as_blocked_ns"`
	BlockedAsIdle    int64 `json:"blocked_as_idle_ns"`
	BlockedAsBlocked int64 `json:"blocked_as_blocked_ns"`
}

func (c *Confusion) cell(expIdle, gotIdle bool) *int64 {
	switch {
	case expIdle && gotIdle:
		return &c.IdleAsIdle
	case expIdle:
		return &c.IdleAsBlocked
	case gotIdle:
		return &c.BlockedAsIdle
	}
	return &c.BlockedAsBlocked
}

// ExpectResult is one expectation's matched and agreeing time.
type ExpectResult struct {
	Expectation
	TimeNs     int64   `json:"time_ns"`
	AgreeingNs int64   `json:"agreeing_ns"`
	Agreement  float64 `json:"agreement"` // percent of its time
}

// Mismatch is the time an expectation matched but the rules judged
// otherwise, by what they said and which rule said it.
type Mismatch struct {
	At          string `json:"at"` // the expectation's file:line
	Site        string `json:"site"`
	Expected    string `json:"expected"` // verdict, and category if given
	GotVerdict  string `json:"got_verdict"`
	GotCategory string `json:"got_category"`
	DecidedBy   string `json:"decided_by"` // Rules.Decided
	TimeNs      int64  `json:"time_ns"`
	Example     string `json:"example"` // its largest stack, folded
}

// UncoveredSite is a site no expectation matched: a thread group's user
// frames.
type UncoveredSite struct {
	Thread string  `json:"thread"` // schema.ThreadGroup
	Frames string  `json:"frames"` // user frames, root first
	TimeNs int64   `json:"time_ns"`
	Share  float64 `json:"share"` // percent of the judged time
	// GotCategory holds most of its time; IdleNs of it was judged idle.
	GotCategory string `json:"got_category"`
	IdleNs      int64  `json:"idle_ns"`
	Example     string `json:"example"`
}

// Failed tells whether the expectations were not met.
func (rep *ExpectReport) Failed() bool { return len(rep.Failures) > 0 }

// CheckExpectations judges d's off-CPU waits with r and compares each with
// the first expectation that matches it.
func CheckExpectations(d *Data, r *Rules, e *Expectations) *ExpectReport {
	Judge(d.Stacks, r) // verdicts read what it marks
	c := newExpectCheck(r, e)
	for i := range d.Stacks {
		if s := &d.Stacks[i]; s.Kind == KindOffCPU && !s.WaitsForCPU() && s.Value > 0 {
			c.add(s)
		}
	}
	c.finish()
	return c.rep
}

// expectCheck sums one check's stacks into its report.
type expectCheck struct {
	r       *Rules
	e       *Expectations
	rep     *ExpectReport
	mism    map[mismatchKey]*Mismatch
	mismEx  map[mismatchKey]int64 // the example's time
	sites   map[[2]string]*uncoveredAcc
	decided map[[2]uint64]string // Decided runs every rule: once per rule input
	// matched: the expectation (-1: none) of a folded stack and thread,
	// the regexps run once for each (goroutines repeat them by the thousand).
	matched map[[2]string]int
}

type mismatchKey struct {
	exp           int
	cat, decision string
}

// uncoveredAcc is an uncovered site's time by category as it is summed.
type uncoveredAcc struct {
	UncoveredSite
	cats    map[string]int64
	example int64
}

func newExpectCheck(r *Rules, e *Expectations) *expectCheck {
	// Empty lists, not nulls, in JSON.
	rep := &ExpectReport{Source: e.Source, Program: e.Program, MinAgreement: e.MinAgreement, MinSite: e.MinSite,
		Mismatches: []Mismatch{}, Uncovered: []UncoveredSite{}, Failures: []string{}, Warnings: []string{}}
	for _, x := range e.Expect {
		rep.Expectations = append(rep.Expectations, ExpectResult{Expectation: x})
	}
	return &expectCheck{r: r, e: e, rep: rep, matched: map[[2]string]int{}, mism: map[mismatchKey]*Mismatch{}, mismEx: map[mismatchKey]int64{},
		sites: map[[2]string]*uncoveredAcc{}, decided: map[[2]uint64]string{}}
}

// add judges one off-CPU wait and sums it where its expectation says.
func (c *expectCheck) add(s *Stack) {
	rep := c.rep
	cat := c.r.Categorize(s)[0]
	gotIdle := c.r.IsIdle(cat)
	rep.JudgedNs += s.Value
	folded := s.Folded()
	xi, ok := c.matched[[2]string{folded, s.Thread}]
	if !ok {
		xi = slices.IndexFunc(c.e.Expect, func(x Expectation) bool { return x.matches(s, folded) })
		c.matched[[2]string{folded, s.Thread}] = xi
	}
	if xi < 0 {
		c.uncovered(s, cat, gotIdle, folded)
		return
	}
	x := &c.e.Expect[xi]
	res := &rep.Expectations[xi]
	rep.CoveredNs += s.Value
	res.TimeNs += s.Value
	expIdle := x.Verdict == "idle"
	*rep.Confusion.cell(expIdle, gotIdle) += s.Value
	if expIdle == gotIdle && (x.Category == "" || x.Category == cat) {
		rep.AgreeingNs += s.Value
		res.AgreeingNs += s.Value
		return
	}
	c.mismatch(s, xi, cat, gotIdle, folded)
}

// uncovered sums a wait no expectation matched under its site.
func (c *expectCheck) uncovered(s *Stack, cat string, gotIdle bool, folded string) {
	k := [2]string{schema.ThreadGroup(s.Thread), userFrames(s)}
	a := c.sites[k]
	if a == nil {
		a = &uncoveredAcc{UncoveredSite: UncoveredSite{Thread: k[0], Frames: k[1]}, cats: map[string]int64{}}
		c.sites[k] = a
	}
	a.TimeNs += s.Value
	a.cats[cat] += s.Value
	if gotIdle {
		a.IdleNs += s.Value
	}
	if s.Value > a.example {
		a.example, a.Example = s.Value, folded
	}
	c.rep.UncoveredNs += s.Value
}

// mismatch sums a wait judged against its expectation, by what the rules
// said and which rule said it.
func (c *expectCheck) mismatch(s *Stack, xi int, cat string, gotIdle bool, folded string) {
	h := ruleKey(s)
	dec, ok := c.decided[h]
	if !ok {
		dec = c.r.Decided(s)
		c.decided[h] = dec
	}
	k := mismatchKey{xi, cat, dec}
	m := c.mism[k]
	if m == nil {
		x := &c.e.Expect[xi]
		exp := x.Verdict
		if x.Category != "" {
			exp += " (" + x.Category + ")"
		}
		m = &Mismatch{At: x.At, Site: x.Site, Expected: exp, GotVerdict: idleWord(gotIdle), GotCategory: cat, DecidedBy: dec}
		c.mism[k] = m
	}
	m.TimeNs += s.Value
	if s.Value > c.mismEx[k] {
		c.mismEx[k], m.Example = s.Value, folded
	}
}

// finish orders what was summed and says what failed.
func (c *expectCheck) finish() {
	rep, e := c.rep, c.e
	rep.Agreement = pctf(rep.AgreeingNs, rep.CoveredNs)
	for i := range rep.Expectations {
		res := &rep.Expectations[i]
		res.Agreement = pctf(res.AgreeingNs, res.TimeNs)
		if res.TimeNs == 0 {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("%s: site %q matched no judged wait", res.At, res.Site))
		}
	}
	for _, m := range c.mism {
		rep.Mismatches = append(rep.Mismatches, *m)
	}
	sort.Slice(rep.Mismatches, func(i, j int) bool {
		a, b := rep.Mismatches[i], rep.Mismatches[j]
		if a.TimeNs != b.TimeNs {
			return a.TimeNs > b.TimeNs
		}
		return a.At+a.GotCategory+a.DecidedBy < b.At+b.GotCategory+b.DecidedBy
	})
	for _, a := range c.sites {
		a.Share = pctf(a.TimeNs, rep.JudgedNs)
		if a.Share < e.MinSite {
			rep.SmallUncovered++
			rep.SmallUncoveredNs += a.TimeNs
			continue
		}
		for cat, ns := range a.cats {
			if ns > a.cats[a.GotCategory] || ns == a.cats[a.GotCategory] && cat < a.GotCategory {
				a.GotCategory = cat
			}
		}
		rep.Uncovered = append(rep.Uncovered, a.UncoveredSite)
	}
	sort.Slice(rep.Uncovered, func(i, j int) bool {
		a, b := rep.Uncovered[i], rep.Uncovered[j]
		if a.TimeNs != b.TimeNs {
			return a.TimeNs > b.TimeNs
		}
		return a.Thread+";"+a.Frames < b.Thread+";"+b.Frames
	})
	rep.Failures = append(rep.Failures, c.failures()...)
}

// failures says why the check failed, if it did.
func (c *expectCheck) failures() []string {
	rep, e := c.rep, c.e
	var out []string
	switch {
	case rep.JudgedNs == 0:
		out = append(out, "no judged off-CPU time (every off-CPU stack waits for a CPU, or there is none)")
	case rep.CoveredNs == 0:
		out = append(out, "no judged wait matched an expectation")
	case rep.Agreement < e.MinAgreement:
		// Enough digits that the failure never reads "95.0% < 95%".
		digits := 1
		for digits < 4 && strconv.FormatFloat(rep.Agreement, 'f', digits, 64) == strconv.FormatFloat(e.MinAgreement, 'f', digits, 64) {
			digits++
		}
		out = append(out, fmt.Sprintf("agreement %.*f%% < %s%%", digits, rep.Agreement, trimFloat(e.MinAgreement)))
	}
	if n := len(rep.Uncovered); n > 0 {
		out = append(out, fmt.Sprintf("%d uncovered site%s ≥ %s%% of the judged time", n, plural(n), trimFloat(e.MinSite)))
	}
	return out
}

// userFrames is a stack's user frames, root first: a site's key, the
// same whatever kernel path its wait took.
func userFrames(s *Stack) string {
	var out []string
	for _, f := range s.Frames {
		if !f.Kernel {
			out = append(out, schema.FoldedFrame(f.Name))
		}
	}
	return strings.Join(out, ";")
}

func pctf(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

func trimFloat(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// cut shortens a folded stack to about n characters, keeping its leaf end
// (where the wait is) and its thread.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	head := s
	if i := strings.IndexByte(s, ';'); i >= 0 && i < n/4 {
		head = s[:i]
	} else {
		head = s[:n/4]
	}
	tail := s[len(s)-(n-len(head)-5):]
	return head + ";...;" + tail
}

// Write prints the report as text.
func (rep *ExpectReport) Write(w io.Writer) error {
	ew := &errWriter{w: w}
	ew.printf("expectations: %s\n", rep.Source)
	if rep.Program != "" {
		ew.printf("program: %s\n", rep.Program)
	}
	ew.printf("judged off-CPU time: %s; covered by expectations: %s (%s)\n\n", Secs(rep.JudgedNs), Secs(rep.CoveredNs), pct(rep.CoveredNs, rep.JudgedNs))
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
	c := rep.Confusion
	cell := func(ns int64) string {
		if ns == 0 {
			return "0 s"
		}
		return Secs(ns) + " (" + pct(ns, rep.CoveredNs) + ")"
	}
	fmt.Fprintf(tw, "\tgot idle\tgot blocked\n")
	fmt.Fprintf(tw, "expected idle\t%s\t%s\n", cell(c.IdleAsIdle), cell(c.IdleAsBlocked))
	fmt.Fprintf(tw, "expected blocked\t%s\t%s\n", cell(c.BlockedAsIdle), cell(c.BlockedAsBlocked))
	tw.Flush()
	ew.printf("\nagreement: %.1f%% of the covered time (minimum %s%%)\n", rep.Agreement, trimFloat(rep.MinAgreement))
	ew.printf("\nexpectations:\n")
	tw = tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
	for _, x := range rep.Expectations {
		exp := x.Verdict
		if x.Category != "" {
			exp += " (" + x.Category + ")"
		}
		site := x.Site
		if x.Thread != "" {
			site += " thread " + x.Thread
		}
		agree := "-"
		if x.TimeNs > 0 {
			agree = fmt.Sprintf("%.1f%%", x.Agreement)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\tagreement %s\n", x.At, site, exp, Secs(x.TimeNs), agree)
	}
	tw.Flush()
	if len(rep.Mismatches) > 0 {
		ew.printf("\nmismatches (largest first):\n")
		for _, m := range rep.Mismatches {
			ew.printf("  %s (%s of the covered time): %s expects %s, got %s (%s), decided by %s\n      %s\n",
				Secs(m.TimeNs), pct(m.TimeNs, rep.CoveredNs), m.At, m.Expected, m.GotVerdict, m.GotCategory, m.DecidedBy, cut(m.Example, 200))
		}
	}
	if len(rep.Uncovered) > 0 {
		ew.printf("\nuncovered sites (≥ %s%% of the judged time: state them):\n", trimFloat(rep.MinSite))
		for _, u := range rep.Uncovered {
			frames := u.Frames
			if frames == "" {
				frames = "[kernel frames only]"
			}
			ew.printf("  %s (%.1f%%): thread %s, got %s (%s of it idle)\n      %s\n      e.g. %s\n",
				Secs(u.TimeNs), u.Share, u.Thread, u.GotCategory, pct(u.IdleNs, u.TimeNs), cut(frames, 200), cut(u.Example, 200))
		}
	}
	if rep.SmallUncovered > 0 {
		ew.printf("\n%d smaller uncovered site%s: %s (%s of the judged time)\n", rep.SmallUncovered, plural(rep.SmallUncovered), Secs(rep.SmallUncoveredNs), pct(rep.SmallUncoveredNs, rep.JudgedNs))
	}
	if len(rep.Warnings) > 0 {
		ew.printf("\n")
		for _, wn := range rep.Warnings {
			ew.printf("warning: %s\n", wn)
		}
	}
	if rep.Failed() {
		ew.printf("\nFAIL: %s\n", strings.Join(rep.Failures, "; "))
	} else {
		ew.printf("\nPASS: agreement %.1f%% ≥ %s%%, no uncovered site ≥ %s%%\n", rep.Agreement, trimFloat(rep.MinAgreement), trimFloat(rep.MinSite))
	}
	return ew.err
}

// errWriter keeps the first write error, so that Write checks it once.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(b []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(b)
	e.err = err
	return n, err
}

func (e *errWriter) printf(format string, args ...any) { fmt.Fprintf(e, format, args...) }
