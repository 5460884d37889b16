package analysis

import (
	_ "embed"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"

	"github.com/offcpu/offcpu/runtimes/registry"
	"github.com/offcpu/offcpu/schema"
)

//go:embed default_rules.yaml
var defaultRules []byte

// DefaultRules returns the built-in rules file's text.
func DefaultRules() []byte { return append([]byte(nil), defaultRules...) }

type rulesFile struct {
	// Replace: this file replaces the built-in rules instead of extending
	// them.
	Replace    bool `yaml:"replace"`
	Categories []struct {
		Name        string `yaml:"name"`
		Description string `yaml:"description"`
		Idle        bool   `yaml:"idle"`
	} `yaml:"categories"`
	Rules []fileRule `yaml:"rules"`
	// Verdicts judge a wait by its waker; the first that matches decides
	// where it disagrees with the rules (see Rules.Categorize).
	Verdicts    []fileRule `yaml:"verdicts"`
	Application struct {
		Not        []string `yaml:"not"`
		NotModules []string `yaml:"not_modules"`
	} `yaml:"application"`
}

type fileRule struct {
	Category     string   `yaml:"category"`
	Frames       []string `yaml:"frames"`
	AllFrames    []string `yaml:"all_frames"`
	InnermostApp string   `yaml:"innermost_app"`
	Threads      string   `yaml:"threads"`
	Kernel       bool     `yaml:"kernel"`
	Kinds        []string `yaml:"kinds"`
	States       []string `yaml:"states"`
	// Reasons: a goroutine's wait reason, as Go's runtime names it.
	Reasons []string `yaml:"reasons"`
	// The waker's side: any frame of the waker's stack matches, the
	// wake-up's class (block-io, net-rx, timer, futex...), or who the
	// waker was relative to the waiter (WakerRelations).
	WakerFrames  []string `yaml:"waker_frames"`
	WakerClasses []string `yaml:"waker_classes"`
	Waker        []string `yaml:"waker"`
	// InRequest: the waiter serves another program and this wait is away
	// from its input waits (Stack.InRequest); WakerDispatching: the waker
	// passed on input from its top of loop (Stack.WakerDispatching).
	InRequest        bool `yaml:"in_request"`
	WakerDispatching bool `yaml:"waker_dispatching"`
	// WakerPassedOn: a peer idle at the same place passed the wake-up on,
	// handing no work (Stack.WakerPassedOn).
	WakerPassedOn bool `yaml:"waker_passed_on"`
	// InTrace: the wait carries a request's trace link, a span or trace id
	// the program put on it (Stack.InTrace): inside that request.
	InTrace bool `yaml:"in_trace"`
	// CalledFromApp false: the frame frames matched has no application
	// frame of a language runtime (JavaScript, Python, Java) among its
	// callers: a loop at the top of its thread, not a synchronous wait
	// that code made.
	CalledFromApp *bool `yaml:"called_from_app"`
	// CallsApp false: nor does it call one (the wait is not in code the
	// loop ran for an event).
	CallsApp *bool `yaml:"calls_app"`
	// Loop: where the wait lies in its thread's loop (Stack.Loop): top,
	// beneath, or unknown (the analysis could not tell).
	Loop []string `yaml:"loop"`
}

// WakerRelations are who can end an off-CPU interval, relative to the
// waiter: a thread of its process, of another process of the same program
// (prefork servers, database backends), of another program (a client, a
// shell), an interrupt, nobody the recorder saw, or unknown (a profile
// recorded before wakers' processes were).
var WakerRelations = []string{"same-process", "same-program", "other-program", "interrupt", "none", "unknown"}

// Category is one cause of off-CPU time. An idle category is waiting for
// work (an event loop in epoll_wait, a pool thread waiting for a task), not
// blocking: its time never counts as blocked.
type Category struct {
	Name        string
	Description string
	Idle        bool
}

// Rules attributes stacks to categories.
type Rules struct {
	Categories []Category
	idle       []string // names of the idle categories
	rules      []rule
	verdicts   []rule
	notApp     []*regexp.Regexp
	notModules []*regexp.Regexp
	// Categories by what the rules read of a stack: goroutine profiles
	// hold many rows that differ by goroutine alone.
	cats hashCache[[2]uint64, []string] // by a 128-bit hash of what rules read (ruleKey): no copy of the stacks kept
	apps hashCache[[2]uint64, bool]     // IsApp by a hash of the frame's name and module
}

type rule struct {
	at           string // where it was written: file:line
	hits         *atomic.Int64
	category     string
	frames       []*regexp.Regexp
	allFrames    []*regexp.Regexp
	innermostApp *regexp.Regexp
	threads      *regexp.Regexp
	kernel       bool
	kinds        map[string]bool
	states       map[string]bool
	reasons      []*regexp.Regexp
	wakerFrames  []*regexp.Regexp
	wakerClasses map[string]bool
	waker        map[string]bool
	inRequest    bool
	dispatching  bool
	inTrace      bool
	passedOn     bool
	fromApp      *bool
	callsApp     *bool
	loop         map[string]bool
	isApp        func(Frame) bool
}

// LoadRules reads a rules file; "" means the built-in rules. A file
// extends the built-in rules (its rules and verdicts are tried first, its
// categories and application patterns are added) unless it says
// "replace: true".
func LoadRules(path string) (*Rules, error) {
	if path == "" {
		return ParseRules("default rules", defaultRules)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading rules: %w", err)
	}
	return ParseRules(path, b)
}

// ParseRules parses a rules file, extending the built-in rules unless it
// replaces them; errors name the file, line and reason.
func ParseRules(name string, b []byte) (*Rules, error) {
	f, p, err := readRules(name, b)
	if err != nil {
		return nil, err
	}
	if f.Replace || name == "default rules" {
		return p.build(f, nil)
	}
	df, dp, err := readRules("default rules", defaultRules)
	if err != nil {
		return nil, err
	}
	base, err := dp.build(df, nil)
	if err != nil {
		return nil, err
	}
	return p.build(f, base)
}

func readRules(name string, b []byte) (*rulesFile, *ruleParser, error) {
	var f rulesFile
	if err := yaml.UnmarshalWithOptions(b, &f, yaml.Strict()); err != nil {
		return nil, nil, fmt.Errorf("%s: %s", name, oneLine(yaml.FormatError(err, false, false)))
	}
	file, err := parser.ParseBytes(b, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %s", name, oneLine(err.Error()))
	}
	return &f, &ruleParser{name: name, file: file}, nil
}

// build compiles a file's rules on top of base (nil: on nothing): its
// categories added or redefined, its rules and verdicts before base's.
func (p *ruleParser) build(f *rulesFile, base *Rules) (*Rules, error) {
	r := &Rules{}
	known := map[string]bool{}
	if base != nil {
		r.Categories = append(r.Categories, base.Categories...)
		for _, c := range base.Categories {
			known[c.Name] = true
		}
	}
	for i, c := range f.Categories {
		if c.Name == "" {
			return nil, fmt.Errorf("%s: category without a name", p.at(fmt.Sprintf("$.categories[%d]", i)))
		}
		cat := Category{Name: c.Name, Description: c.Description, Idle: c.Idle}
		if j := slices.IndexFunc(r.Categories, func(x Category) bool { return x.Name == c.Name }); j >= 0 {
			r.Categories[j] = cat
		} else {
			r.Categories = append(r.Categories, cat)
		}
		known[c.Name] = true
	}
	if !known["other"] {
		r.Categories = append(r.Categories, Category{Name: "other", Description: "matched by no rule"})
		known["other"] = true
	}
	for _, c := range r.Categories {
		if c.Idle {
			r.idle = append(r.idle, c.Name)
		}
	}
	for i, fr := range f.Rules {
		ru, err := p.rule(fmt.Sprintf("$.rules[%d]", i), fr, known)
		if err != nil {
			return nil, err
		}
		r.rules = append(r.rules, ru)
	}
	for i, fr := range f.Verdicts {
		ru, err := p.rule(fmt.Sprintf("$.verdicts[%d]", i), fr, known)
		if err != nil {
			return nil, err
		}
		r.verdicts = append(r.verdicts, ru)
	}
	var err error
	if r.notApp, err = p.compileAll("$.application.not", f.Application.Not); err != nil {
		return nil, err
	}
	if r.notModules, err = p.compileAll("$.application.not_modules", f.Application.NotModules); err != nil {
		return nil, err
	}
	if base != nil {
		r.rules = append(r.rules, base.rules...)
		r.verdicts = append(r.verdicts, base.verdicts...)
		r.notApp = append(r.notApp, base.notApp...)
		r.notModules = append(r.notModules, base.notModules...)
	} else {
		// A runtime's own code is never the application: its caller is.
		for _, rt := range registry.All {
			for _, m := range rt.Modules {
				r.notModules = append(r.notModules, regexp.MustCompile(m))
			}
		}
	}
	for i := range r.rules {
		r.rules[i].isApp = r.IsApp
	}
	for i := range r.verdicts {
		r.verdicts[i].isApp = r.IsApp
	}
	return r, nil
}

// UnmatchedRules lists the rules and verdicts of files other than the
// built-in one that matched no stack analyzed with these rules so far: a
// pattern that never matched is most often misspelled.
func (r *Rules) UnmatchedRules() []string {
	var out []string
	for _, ru := range append(append([]rule{}, r.rules...), r.verdicts...) {
		if !strings.HasPrefix(ru.at, "default rules") && ru.hits.Load() == 0 {
			out = append(out, fmt.Sprintf("%s (%s)", ru.at, ru.category))
		}
	}
	return out
}

// ruleParser names the line of a rules file an error is about.
type ruleParser struct {
	name string
	file *ast.File
}

// at is "name:line" of the YAML path, or the name.
func (p *ruleParser) at(path string) string {
	yp, err := yaml.PathString(path)
	if err != nil {
		return p.name
	}
	n, err := yp.FilterFile(p.file)
	if err != nil || n == nil {
		return p.name
	}
	return fmt.Sprintf("%s:%d", p.name, n.GetToken().Position.Line)
}

func (p *ruleParser) compile(path, expr string) (*regexp.Regexp, error) {
	re, err := regexp.Compile(expr)
	if err != nil {
		return nil, fmt.Errorf("%s: bad regexp %q: %v", p.at(path), expr, strings.TrimPrefix(err.Error(), "error parsing regexp: "))
	}
	return re, nil
}

func (p *ruleParser) compileAll(path string, exprs []string) ([]*regexp.Regexp, error) {
	var out []*regexp.Regexp
	for j, e := range exprs {
		re, err := p.compile(fmt.Sprintf("%s[%d]", path, j), e)
		if err != nil {
			return nil, err
		}
		out = append(out, re)
	}
	return out, nil
}

// rule checks and compiles one rule at YAML path base.
func (p *ruleParser) rule(base string, fr fileRule, known map[string]bool) (rule, error) {
	if !known[fr.Category] {
		return rule{}, fmt.Errorf("%s: unknown category %q: declare it under categories", p.at(base+".category"), fr.Category)
	}
	ru := rule{at: p.at(base), hits: new(atomic.Int64), category: fr.Category, kernel: fr.Kernel, kinds: map[string]bool{}, inRequest: fr.InRequest, dispatching: fr.WakerDispatching,
		inTrace: fr.InTrace, passedOn: fr.WakerPassedOn, fromApp: fr.CalledFromApp, callsApp: fr.CallsApp}
	if (ru.fromApp != nil || ru.callsApp != nil) && len(fr.Frames) == 0 {
		return rule{}, fmt.Errorf("%s: called_from_app and calls_app need frames: they test the callers and callees of the frame those match", p.at(base))
	}
	var err error
	if ru.frames, err = p.compileAll(base+".frames", fr.Frames); err != nil {
		return rule{}, err
	}
	if ru.allFrames, err = p.compileAll(base+".all_frames", fr.AllFrames); err != nil {
		return rule{}, err
	}
	if fr.InnermostApp != "" {
		if ru.innermostApp, err = p.compile(base+".innermost_app", fr.InnermostApp); err != nil {
			return rule{}, err
		}
	}
	if fr.Threads != "" {
		if ru.threads, err = p.compile(base+".threads", fr.Threads); err != nil {
			return rule{}, err
		}
	}
	if len(fr.Kinds) == 0 {
		ru.kinds[KindOffCPU] = true
	}
	for j, k := range fr.Kinds {
		if k != KindOffCPU && k != KindWakeup && k != KindCPU {
			return rule{}, fmt.Errorf("%s: unknown kind %q (offcpu, wakeup or cpu)", p.at(fmt.Sprintf("%s.kinds[%d]", base, j)), k)
		}
		ru.kinds[k] = true
	}
	for j, st := range fr.States {
		switch st {
		case "sleeping", "uninterruptible", "preempted", "other", StateRunQueue:
		default:
			return rule{}, fmt.Errorf("%s: unknown state %q (sleeping, uninterruptible, preempted, other, runqueue)", p.at(fmt.Sprintf("%s.states[%d]", base, j)), st)
		}
		if ru.states == nil {
			ru.states = map[string]bool{}
		}
		ru.states[st] = true
	}
	if ru.reasons, err = p.compileAll(base+".reasons", fr.Reasons); err != nil {
		return rule{}, err
	}
	if ru.wakerFrames, err = p.compileAll(base+".waker_frames", fr.WakerFrames); err != nil {
		return rule{}, err
	}
	if len(fr.WakerClasses) > 0 {
		ru.wakerClasses = map[string]bool{}
		for _, c := range fr.WakerClasses {
			ru.wakerClasses[c] = true
		}
	}
	for j, w := range fr.Waker {
		if !slices.Contains(WakerRelations, w) {
			return rule{}, fmt.Errorf("%s: unknown waker %q (%s)", p.at(fmt.Sprintf("%s.waker[%d]", base, j)), w, strings.Join(WakerRelations, ", "))
		}
		if ru.waker == nil {
			ru.waker = map[string]bool{}
		}
		ru.waker[w] = true
	}
	if ru.loop, err = p.loopPlaces(base, fr.Loop); err != nil {
		return rule{}, err
	}
	if len(ru.frames) == 0 && len(ru.allFrames) == 0 && ru.innermostApp == nil && ru.loop == nil && ru.threads == nil && ru.states == nil && len(ru.reasons) == 0 &&
		len(ru.wakerFrames) == 0 && ru.wakerClasses == nil && ru.waker == nil && !ru.inRequest && !ru.dispatching && !ru.inTrace && !ru.passedOn {
		return rule{}, fmt.Errorf("%s: rule for %s matches everything: give frames, all_frames, innermost_app, threads, states, reasons, loop or a waker condition", p.at(base), fr.Category)
	}
	return ru, nil
}

// loopUnknown is the place of a wait the analysis found no loop for.
const loopUnknown = "unknown"

// loopPlaces checks a rule's loop places; nil when it gives none.
func (p *ruleParser) loopPlaces(base string, places []string) (map[string]bool, error) {
	var out map[string]bool
	for j, l := range places {
		if l != schema.LoopTop && l != schema.LoopBeneath && l != loopUnknown {
			return nil, fmt.Errorf("%s: unknown loop place %q (top, beneath or unknown)", p.at(fmt.Sprintf("%s.loop[%d]", base, j)), l)
		}
		if out == nil {
			out = map[string]bool{}
		}
		out[l] = true
	}
	return out, nil
}

// loopPlace is Stack.Loop, loopUnknown where the analysis could not tell.
func loopPlace(s *Stack) string {
	if s.Loop == "" {
		return loopUnknown
	}
	return s.Loop
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// InnermostApp returns the leafmost application frame, or "".
func (r *Rules) InnermostApp(s *Stack) string {
	for i := len(s.Frames) - 1; i >= 0; i-- {
		if r.IsApp(s.Frames[i]) {
			return s.Frames[i].Name
		}
	}
	return ""
}

// IsIdle reports whether a category is idle.
func (r *Rules) IsIdle(category string) bool {
	for _, c := range r.idle {
		if c == category {
			return true
		}
	}
	return false
}

// IdleCategories lists the idle categories.
func (r *Rules) IdleCategories() []string { return r.idle }

// categorize is Categorize without the cache.
func (r *Rules) categorize(s *Stack) []string {
	var out []string
	seen := map[string]bool{}
	inner := r.InnermostApp(s)
	for _, ru := range r.rules {
		if seen[ru.category] || !ru.matches(s, inner) {
			continue
		}
		ru.hits.Add(1)
		seen[ru.category] = true
		out = append(out, ru.category)
	}
	if len(out) == 0 {
		out = []string{"other"}
	}
	if v := r.verdict(s, inner); v != nil && v.category != out[0] && (r.IsIdle(v.category) != r.IsIdle(out[0]) || out[0] == "other") {
		out = append([]string{v.category}, slices.DeleteFunc(out, func(c string) bool { return c == v.category || c == "other" })...)
	}
	return out
}

// verdict is the first verdict rule that matches an off-CPU stack's
// waker side, or nil.
func (r *Rules) verdict(s *Stack, inner string) *rule {
	// An interpreter's lock wait is what the recorder said it was, whoever
	// handed the lock over.
	if s.Kind != KindOffCPU || s.WaitsForCPU() || s.Reason == schema.ReasonGIL {
		return nil
	}
	for i := range r.verdicts {
		// Beneath a work item a wait is blocked whatever ended it: the
		// waker says only what it waited for.
		if v := &r.verdicts[i]; (s.Loop != schema.LoopBeneath || !r.IsIdle(v.category)) && v.matches(s, inner) {
			v.hits.Add(1)
			return v
		}
	}
	return nil
}

func (ru *rule) matches(s *Stack, inner string) bool {
	if !ru.kinds[s.Kind] {
		return false
	}
	if ru.threads != nil && !ru.threads.MatchString(s.Thread) {
		return false
	}
	if ru.states != nil && !ru.states[s.State] {
		return false
	}
	if ru.innermostApp != nil && !ru.innermostApp.MatchString(inner) {
		return false
	}
	if len(ru.reasons) > 0 && !slices.ContainsFunc(ru.reasons, func(re *regexp.Regexp) bool { return re.MatchString(s.Reason) }) {
		return false
	}
	if ru.waker != nil && !ru.waker[s.WakerRelation()] {
		return false
	}
	if ru.loop != nil && !ru.loop[loopPlace(s)] {
		return false
	}
	if ru.inRequest && !s.InRequest {
		return false
	}
	if ru.dispatching && !s.WakerDispatching {
		return false
	}
	if ru.inTrace && !s.InTrace() {
		return false
	}
	if ru.passedOn && !s.WakerPassedOn {
		return false
	}
	if ru.wakerClasses != nil && !ru.wakerClasses[s.Class] {
		return false
	}
	if len(ru.wakerFrames) > 0 && matchFrame(s.WakerFrames, ru.wakerFrames, false) == nil {
		return false
	}
	if len(ru.frames) > 0 {
		f := matchFrame(s.Frames, ru.frames, ru.kernel)
		if f != nil && (ru.fromApp != nil || ru.callsApp != nil) && ru.isApp != nil {
			// The innermost match: a loop nested in code is the wait.
			f = matchLastFrame(s.Frames, ru.frames, ru.kernel)
			callers, callees := appAround(s.Frames, f, ru.isApp)
			if (ru.fromApp != nil && *ru.fromApp != callers) || (ru.callsApp != nil && *ru.callsApp != callees) {
				return false
			}
		}
		if f == nil {
			return false
		}
	}
	for _, re := range ru.allFrames {
		if matchFrame(s.Frames, []*regexp.Regexp{re}, ru.kernel) == nil {
			return false
		}
	}
	return true
}

// matchFrame returns the first frame (kernel ones only, with kernel) whose
// name, as written or normalised (NormalizeFrame), matches one of res.
func matchFrame(frames []Frame, res []*regexp.Regexp, kernel bool) *Frame {
	for i := range frames {
		f := &frames[i]
		if kernel && !f.Kernel {
			continue
		}
		h := hash128(f.Name)
		for _, re := range res {
			if frameMatches(re, f.Name, h) {
				return f
			}
		}
	}
	return nil
}

// matchLastFrame is matchFrame from the leaf.
func matchLastFrame(frames []Frame, res []*regexp.Regexp, kernel bool) *Frame {
	for i := len(frames) - 1; i >= 0; i-- {
		if f := matchFrame(frames[i:i+1], res, kernel); f != nil {
			return f
		}
	}
	return nil
}

// appAround: whether some caller of f (a frame of frames, root first),
// and some frame it calls, is an application frame a language runtime
// named.
func appAround(frames []Frame, f *Frame, isApp func(Frame) bool) (callers, callees bool) {
	after := false
	for i := range frames {
		if &frames[i] == f {
			after = true
			continue
		}
		if frames[i].Runtime != "" && isApp(frames[i]) {
			if after {
				callees = true
			} else {
				callers = true
			}
		}
	}
	return callers, callees
}

// Kernel functions renamed across releases: the name rules are written
// with on the right.
var kernelAliases = map[string]string{
	"anon_pipe_read":  "pipe_read",
	"anon_pipe_write": "pipe_write",
}

var compilerSuffix = regexp.MustCompile(`(\.(isra|constprop|part|cold|lto_priv|llvm)(\.\d+)?)+$`)

// NormalizeFrame is the name a rule also matches a frame by: without
// glibc's internal prefixes (__GI_, __libc_) and symbol versions
// (@GLIBC_2.3.2), without GCC's clone suffixes (.isra.0, .constprop.0,
// .part.0, .cold), and with kernel functions renamed across releases
// under their older name (anon_pipe_read: pipe_read).
func NormalizeFrame(name string) string {
	n := name
	if i := strings.IndexByte(n, '@'); i > 0 {
		n = n[:i]
	}
	if strings.IndexByte(n, '.') >= 0 { // the regexp is costly, and most names have no suffix
		n = compilerSuffix.ReplaceAllString(n, "")
	}
	for _, p := range []string{"__GI___", "__GI_", "__libc_"} {
		if strings.HasPrefix(n, p) && len(n) > len(p) {
			n = n[len(p):]
			if p == "__GI___" {
				n = "__" + n
			}
			break
		}
	}
	if a, ok := kernelAliases[n]; ok {
		n = a
	}
	return n
}
