package analysis

import (
	_ "embed"
	"fmt"
	"os"
	"regexp"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
)

//go:embed default_rules.yaml
var defaultRules []byte

// DefaultRules returns the built-in rules file's text.
func DefaultRules() []byte { return append([]byte(nil), defaultRules...) }

type rulesFile struct {
	Categories []struct {
		Name        string `yaml:"name"`
		Description string `yaml:"description"`
		Idle        bool   `yaml:"idle"`
	} `yaml:"categories"`
	Rules       []fileRule `yaml:"rules"`
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
}

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
	notApp     []*regexp.Regexp
	notModules []*regexp.Regexp
}

type rule struct {
	category     string
	frames       []*regexp.Regexp
	allFrames    []*regexp.Regexp
	innermostApp *regexp.Regexp
	threads      *regexp.Regexp
	kernel       bool
	kinds        map[string]bool
	states       map[string]bool
}

// LoadRules reads a rules file; "" means the built-in rules.
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

// ParseRules parses a rules file; errors name the file, line and reason.
func ParseRules(name string, b []byte) (*Rules, error) {
	var f rulesFile
	if err := yaml.UnmarshalWithOptions(b, &f, yaml.Strict()); err != nil {
		return nil, fmt.Errorf("%s: %s", name, oneLine(yaml.FormatError(err, false, false)))
	}
	file, err := parser.ParseBytes(b, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %s", name, oneLine(err.Error()))
	}
	p := &ruleParser{name: name, file: file}
	r := &Rules{}
	known := map[string]bool{}
	for i, c := range f.Categories {
		if c.Name == "" {
			return nil, fmt.Errorf("%s: category without a name", p.at(fmt.Sprintf("$.categories[%d]", i)))
		}
		known[c.Name] = true
		r.Categories = append(r.Categories, Category{Name: c.Name, Description: c.Description, Idle: c.Idle})
		if c.Idle {
			r.idle = append(r.idle, c.Name)
		}
	}
	if !known["other"] {
		r.Categories = append(r.Categories, Category{Name: "other", Description: "matched by no rule"})
		known["other"] = true
	}
	for i, fr := range f.Rules {
		ru, err := p.rule(fmt.Sprintf("$.rules[%d]", i), fr, known)
		if err != nil {
			return nil, err
		}
		r.rules = append(r.rules, ru)
	}
	if r.notApp, err = p.compileAll("$.application.not", f.Application.Not); err != nil {
		return nil, err
	}
	if r.notModules, err = p.compileAll("$.application.not_modules", f.Application.NotModules); err != nil {
		return nil, err
	}
	return r, nil
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
	ru := rule{category: fr.Category, kernel: fr.Kernel, kinds: map[string]bool{}}
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
	if len(ru.frames) == 0 && len(ru.allFrames) == 0 && ru.innermostApp == nil && ru.threads == nil && ru.states == nil {
		return rule{}, fmt.Errorf("%s: rule for %s matches everything: give frames, all_frames, innermost_app, threads or states", p.at(base), fr.Category)
	}
	return ru, nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// IsApp reports whether a frame is application code.
func (r *Rules) IsApp(f Frame) bool {
	if f.Kernel {
		return false
	}
	if f.Module != "" {
		for _, re := range r.notModules {
			if re.MatchString(f.Module) {
				return false
			}
		}
	}
	for _, re := range r.notApp {
		if re.MatchString(f.Name) {
			return false
		}
	}
	return true
}

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

// Categorize returns every category whose rule matches, in rule order,
// or ["other"].
func (r *Rules) Categorize(s *Stack) []string {
	var out []string
	seen := map[string]bool{}
	inner := r.InnermostApp(s)
	for _, ru := range r.rules {
		if seen[ru.category] || !ru.matches(s, inner) {
			continue
		}
		seen[ru.category] = true
		out = append(out, ru.category)
	}
	if len(out) == 0 {
		out = []string{"other"}
	}
	return out
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
	frameOK := func(f Frame) bool { return !ru.kernel || f.Kernel }
	if len(ru.frames) > 0 {
		hit := false
		for _, f := range s.Frames {
			if !frameOK(f) {
				continue
			}
			for _, re := range ru.frames {
				if re.MatchString(f.Name) {
					hit = true
					break
				}
			}
			if hit {
				break
			}
		}
		if !hit {
			return false
		}
	}
	for _, re := range ru.allFrames {
		hit := false
		for _, f := range s.Frames {
			if frameOK(f) && re.MatchString(f.Name) {
				hit = true
				break
			}
		}
		if !hit {
			return false
		}
	}
	return true
}

// Explain tells, line by line, how the rules read a stack: which frames
// are application code, which rules match and through which frame, the
// first match, and whether the time counts as idle or blocked.
func (r *Rules) Explain(s *Stack) []string {
	var out []string
	var app []string
	for _, f := range s.Frames {
		if r.IsApp(f) {
			app = append(app, f.Name)
		}
	}
	inner := r.InnermostApp(s)
	if inner == "" {
		out = append(out, "application frames: none (every frame is kernel, runtime, libc or event-loop machinery: see application.not and not_modules)")
	} else {
		out = append(out, fmt.Sprintf("application frames: %s; innermost: %s", strings.Join(app, ", "), inner))
	}
	first := ""
	for i, ru := range r.rules {
		if !ru.matches(s, inner) {
			continue
		}
		why := ru.why(s)
		if first == "" {
			first = ru.category
		}
		out = append(out, fmt.Sprintf("rule %d (%s) matches%s", i+1, ru.category, why))
	}
	if first == "" {
		first = "other"
		out = append(out, "no rule matches: other")
	}
	verdict := "blocked time with an application frame"
	switch {
	case s.WaitsForCPU():
		verdict = s.State + ": runnable, waiting for a CPU, not blocked"
	case r.IsIdle(first):
		verdict = "idle: " + first + " waits for work and is never counted as blocked"
	case inner == "":
		verdict = "off-CPU without an application frame: not in the blocked figure"
	}
	out = append(out, fmt.Sprintf("first match: %s; counts as %s", first, verdict))
	return out
}

// why names the frame through which a matching rule matched.
func (ru *rule) why(s *Stack) string {
	for _, re := range append(append([]*regexp.Regexp{}, ru.frames...), ru.allFrames...) {
		for _, f := range s.Frames {
			if (!ru.kernel || f.Kernel) && re.MatchString(f.Name) {
				return fmt.Sprintf(": frame %s matches %q", f.Name, re.String())
			}
		}
	}
	switch {
	case ru.states != nil:
		return ": by the thread state " + s.State
	case ru.threads != nil:
		return ": by the thread name " + s.Thread
	case ru.innermostApp != nil:
		return ": by the innermost application frame"
	}
	return ""
}
