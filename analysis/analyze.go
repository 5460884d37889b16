// Package analysis attributes off-CPU time to causes with ordered rules,
// summarizes wake-ups, and compares a baseline with a candidate.
package analysis

import (
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/offcpu/offcpu/schema"
)

// Options narrows an analysis.
type Options struct {
	// Threads keeps only stacks whose thread (for wake-ups: the woken
	// thread) matches, such as ^(broker-io|ml-worker|topic-worker).
	Threads *regexp.Regexp
	// Processes keeps only stacks of processes whose name matches
	// (wake-ups: the woken thread's process); SkipProcesses drops those
	// whose name matches (a benchmark's harness); PIDs, when set, keeps
	// only these processes.
	Processes, SkipProcesses *regexp.Regexp
	PIDs                     map[int64]bool
	// Messages, when known, gives wake-ups per message.
	Messages int64
	// Top is the number of stacks and functions listed (default 10).
	Top int
	// KeyMetrics are the workload's metrics a diff compares first, in
	// this order; NotCompared are its counts that are not measurements
	// (a diff checks them elsewhere or not at all).
	KeyMetrics, NotCompared []string
}

// CategoryResult is one category's blocked time.
type CategoryResult struct {
	Name        string  `json:"name"`
	Description string  `json:"description"`
	Ns          int64   `json:"ns"`       // all off-CPU time in the category
	AppNs       int64   `json:"app_ns"`   // of it, with an application frame
	Share       float64 `json:"share"`    // AppNs / app_blocked_ns
	FirstNs     int64   `json:"first_ns"` // app time whose first matching rule is this one
	Idle        bool    `json:"idle,omitempty"`
	// TopFunction: the innermost application function with the most of
	// this category's app time.
	TopFunction   string `json:"top_function,omitempty"`
	TopFunctionNs int64  `json:"top_function_ns,omitempty"`
}

// ProcessResult is one process's time (by process name).
type ProcessResult struct {
	Name         string `json:"name"`
	OffCPUNs     int64  `json:"offcpu_ns"`
	AppBlockedNs int64  `json:"app_blocked_ns"`
	IdleNs       int64  `json:"idle_ns"`
	RunQueueNs   int64  `json:"runqueue_ns"`
	CPUNs        int64  `json:"cpu_ns,omitempty"`
}

// GroupResult is one thread group (names with digits collapsed).
type GroupResult struct {
	Name         string           `json:"name"`
	OffCPUNs     int64            `json:"offcpu_ns"`
	AppBlockedNs int64            `json:"app_blocked_ns"`
	RunQueueNs   int64            `json:"runqueue_ns"` // of OffCPUNs, waiting for a CPU
	CPUNs        int64            `json:"cpu_ns,omitempty"`
	Categories   map[string]int64 `json:"categories"` // app ns per category
}

// TargetWakeups are the wake-ups of one woken thread group.
type TargetWakeups struct {
	Group   string           `json:"group"`
	Total   int64            `json:"total"`
	ByClass map[string]int64 `json:"by_class"`
}

// WakeupResult summarizes wake-ups.
type WakeupResult struct {
	Total           int64            `json:"total"`
	ByClass         map[string]int64 `json:"by_class"`
	ByWakerFunction []Count          `json:"by_waker_function"`
	ByTargetGroup   []TargetWakeups  `json:"by_target_group"`
	// ByPair counts wake-ups by "waker group → woken group".
	ByPair            map[string]int64 `json:"by_pair"`
	PerMessage        float64          `json:"per_message,omitempty"`
	EventfdPerMessage float64          `json:"eventfd_per_message,omitempty"`
}

// BlockedOn is blocked time with an application frame by what ended it:
// the waiting threads' group and first category, and the waker's group
// (or the interrupt and its class) with its innermost named application
// frame.
type BlockedOn struct {
	Waiters       string `json:"waiters"`
	Category      string `json:"category"`
	Waker         string `json:"waker"`
	WakerFunction string `json:"waker_function,omitempty"`
	Ns            int64  `json:"ns"`
}

// TopStack is one of the stacks with the most app-blocked time.
type TopStack struct {
	Thread     string   `json:"thread"`
	Ns         int64    `json:"ns"`
	Categories []string `json:"categories"`
	Stack      string   `json:"stack"` // folded, root first
}

// Report is what offcpu analyze prints.
type Report struct {
	Sources      []string `json:"sources"`
	ThreadFilter string   `json:"thread_filter,omitempty"`
	// ProcessFilter says which processes were analyzed, where not all.
	ProcessFilter string          `json:"process_filter,omitempty"`
	Processes     []ProcessResult `json:"processes,omitempty"`
	TotalOffCPUNs int64           `json:"total_offcpu_ns"`
	// RunQueueNs: of TotalOffCPUNs, waiting for a CPU (woken and not yet
	// running, or preempted): never blocked time.
	RunQueueNs   int64 `json:"runqueue_ns"`
	AppBlockedNs int64 `json:"app_blocked_ns"`
	// IdleNs is off-CPU time whose first matching category is idle
	// (IdleCategories): waiting for work, never counted as blocked.
	IdleNs         int64    `json:"idle_ns"`
	IdleCategories []string `json:"idle_categories"`
	CPUNs          int64    `json:"cpu_ns"`
	// Off-CPU time with a user stack, and the part whose user stack
	// reaches a thread start (clone3, start_thread, runtime.goexit...):
	// how much of the picture the stacks show whole.
	UserStackNs     int64            `json:"user_stack_ns"`
	WholeStackNs    int64            `json:"whole_user_stack_ns"`
	Categories      []CategoryResult `json:"categories"`
	ThreadGroups    []GroupResult    `json:"thread_groups"`
	Wakeups         WakeupResult     `json:"wakeups"`
	TopStacks       []TopStack       `json:"top_stacks"`
	TopAppFunctions []Count          `json:"top_app_functions"` // innermost app frame, app-blocked ns
	FunctionsCum    map[string]int64 `json:"-"`                 // app-blocked ns per function anywhere in the stack
	FunctionsFlat   map[string]int64 `json:"-"`                 // per innermost app frame
	WakerFunctions  map[string]int64 `json:"-"`
	Messages        int64            `json:"messages,omitempty"`
	// Goroutines: the stacks are goroutine waits (a goroutine profile);
	// groups are goroutines' start functions.
	Goroutines bool     `json:"goroutines,omitempty"`
	Statements []string `json:"statements"`
	// UnmatchedRules: rules of a user's rules file that matched nothing
	// (file:line and category), most often a misspelled pattern.
	UnmatchedRules []string `json:"unmatched_rules,omitempty"`
	// BlockedOn: what ended the blocked time, largest first (top entries).
	BlockedOn []BlockedOn `json:"blocked_on,omitempty"`
	// Chains: the blocked time followed along its wakers' own waits to
	// its root causes, largest first (top entries).
	Chains []RootCause `json:"chains,omitempty"`
}

// Analyze attributes the data's blocked time to the rules' categories.
func Analyze(d *Data, r *Rules, o Options) *Report {
	if o.Top == 0 {
		o.Top = 10
	}
	markChainWaits(d.Stacks, r)
	a := newAnalyzer(d, r, o)
	for i := range d.Stacks {
		s := &d.Stacks[i]
		switch s.Kind {
		case KindWakeup:
			a.wakeup(s)
		case KindCPU:
			a.cpu(s)
		default:
			a.offCPU(s)
		}
	}
	rep := a.report()
	if rep.BlockedOn != nil { // wakers were recorded
		rep.Chains = Chains(d.Stacks, r, a.wanted, o.Top)
	}
	if len(rep.Chains) > 0 && len(rep.Chains[0].Path) > 1 {
		rc := rep.Chains[0]
		rep.Statements = append(rep.Statements, fmt.Sprintf("The largest root cause of %s %s' blocked time: %s, %s (%.0f%% of it).",
			rc.Waiters, rep.unit(), pathString(rc.Path), Secs(rc.Ns), 100*rc.Share))
	}
	return rep
}

// analyzer sums the stacks of one analysis.
type analyzer struct {
	r       *Rules
	o       Options
	rep     *Report
	cats    map[string]*CategoryResult
	groups  map[string]*GroupResult
	targets map[string]*TargetWakeups
	top     []TopStack
	on      map[BlockedOn]int64 // keyed with Ns 0
	procs   map[string]*ProcessResult
	// catFuncs: app ns per category and innermost application function.
	catFuncs map[string]map[string]int64
}

func newAnalyzer(d *Data, r *Rules, o Options) *analyzer {
	rep := &Report{Sources: d.Sources, Messages: o.Messages, FunctionsCum: map[string]int64{}, FunctionsFlat: map[string]int64{},
		WakerFunctions: map[string]int64{}, IdleCategories: r.IdleCategories()}
	rep.Wakeups.ByClass = map[string]int64{}
	rep.Wakeups.ByPair = map[string]int64{}
	if o.Threads != nil {
		rep.ThreadFilter = o.Threads.String()
	}
	rep.ProcessFilter = o.processFilter()
	a := &analyzer{r: r, o: o, rep: rep, cats: map[string]*CategoryResult{}, groups: map[string]*GroupResult{}, targets: map[string]*TargetWakeups{}, on: map[BlockedOn]int64{},
		procs: map[string]*ProcessResult{}, catFuncs: map[string]map[string]int64{}}
	for _, c := range r.Categories {
		a.cats[c.Name] = &CategoryResult{Name: c.Name, Description: c.Description, Idle: c.Idle}
	}
	return a
}

func (a *analyzer) group(thread string) *GroupResult {
	g := a.groups[schema.ThreadGroup(thread)]
	if g == nil {
		g = &GroupResult{Name: schema.ThreadGroup(thread), Categories: map[string]int64{}}
		a.groups[g.Name] = g
	}
	return g
}

// wanted: the stack's thread (for a wake-up, the woken thread) passes
// the filters.
func (a *analyzer) wanted(s *Stack) bool { return a.o.Wanted(s) }

// Wanted says whether the options keep a stack: its thread (for a
// wake-up, the woken thread) and that thread's process pass the filters.
func (o *Options) Wanted(s *Stack) bool {
	thread, proc, pid := s.Thread, s.Process, s.PID
	if s.Kind == KindWakeup {
		thread, proc, pid = s.Target, s.TargetProcess, s.TargetPID
	}
	if o.Threads != nil && !o.Threads.MatchString(thread) {
		return false
	}
	if o.PIDs != nil && !o.PIDs[pid] {
		return false
	}
	if o.Processes != nil && !o.Processes.MatchString(proc) {
		return false
	}
	return o.SkipProcesses == nil || proc == "" || !o.SkipProcesses.MatchString(proc)
}

func (o *Options) processFilter() string {
	var parts []string
	if o.Processes != nil {
		parts = append(parts, "processes matching "+o.Processes.String())
	}
	if len(o.PIDs) > 0 {
		ids := make([]int64, 0, len(o.PIDs))
		for id := range o.PIDs {
			ids = append(ids, id)
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		parts = append(parts, fmt.Sprintf("pids %v", ids))
	}
	if o.SkipProcesses != nil {
		parts = append(parts, "not processes matching "+o.SkipProcesses.String())
	}
	return strings.Join(parts, ", ")
}

func (a *analyzer) process(name string) *ProcessResult {
	if name == "" { // profiles without process labels
		return &ProcessResult{}
	}
	p := a.procs[name]
	if p == nil {
		p = &ProcessResult{Name: name}
		a.procs[name] = p
	}
	return p
}

// wakeup counts a wake-up by class, waker function and woken group.
func (a *analyzer) wakeup(s *Stack) {
	if !a.wanted(s) {
		return
	}
	rep := a.rep
	rep.Wakeups.Total += s.Value
	rep.Wakeups.ByClass[s.Class] += s.Value
	rep.Wakeups.ByPair[schema.ThreadGroup(s.Thread)+" → "+schema.ThreadGroup(s.Target)] += s.Value
	fn := a.r.InnermostApp(s)
	if fn == "" {
		fn = schema.ThreadGroup(s.Thread)
		if !strings.HasPrefix(fn, "[") { // [interrupt], [softirq] are bracketed already
			fn = "[" + fn + "]"
		}
	}
	rep.WakerFunctions[fn] += s.Value
	tg := a.targets[schema.ThreadGroup(s.Target)]
	if tg == nil {
		tg = &TargetWakeups{Group: schema.ThreadGroup(s.Target), ByClass: map[string]int64{}}
		a.targets[tg.Group] = tg
	}
	tg.Total += s.Value
	tg.ByClass[s.Class] += s.Value
}

func (a *analyzer) cpu(s *Stack) {
	if a.wanted(s) {
		a.rep.CPUNs += s.Value
		a.group(s.Thread).CPUNs += s.Value
		a.process(s.Process).CPUNs += s.Value
	}
}

// offCPU attributes an off-CPU stack to its categories, and when it is
// application blocked time, to its functions and the top stacks.
func (a *analyzer) offCPU(s *Stack) {
	if !a.wanted(s) {
		return
	}
	if s.Goid != 0 {
		a.rep.Goroutines = true
	}
	rep, r, cats := a.rep, a.r, a.cats
	rep.TotalOffCPUNs += s.Value
	p := a.process(s.Process)
	p.OffCPUNs += s.Value
	if root, ok := outermostUser(s); ok {
		rep.UserStackNs += s.Value
		if schema.IsThreadStart(root) {
			rep.WholeStackNs += s.Value
		}
	}
	g := a.group(s.Thread)
	g.OffCPUNs += s.Value
	if s.WaitsForCPU() {
		rep.RunQueueNs += s.Value
		g.RunQueueNs += s.Value
		p.RunQueueNs += s.Value
	}
	cs := r.Categorize(s)
	inner := r.InnermostApp(s)
	idle := r.IsIdle(cs[0])
	app := inner != "" && !s.WaitsForCPU() && !idle // see AppBlocked
	for _, c := range cs {
		if cats[c] != nil {
			cats[c].Ns += s.Value
		}
	}
	if idle {
		rep.IdleNs += s.Value
		p.IdleNs += s.Value
	}
	if !app {
		return
	}
	rep.AppBlockedNs += s.Value
	g.AppBlockedNs += s.Value
	p.AppBlockedNs += s.Value
	for _, c := range cs {
		if cats[c] != nil {
			cats[c].AppNs += s.Value
		}
		g.Categories[c] += s.Value
		if a.catFuncs[c] == nil {
			a.catFuncs[c] = map[string]int64{}
		}
		a.catFuncs[c][inner] += s.Value
	}
	if cats[cs[0]] != nil {
		cats[cs[0]].FirstNs += s.Value
	}
	rep.FunctionsFlat[inner] += s.Value
	seen := map[string]bool{}
	for _, f := range s.Frames {
		if r.IsApp(f) && !seen[f.Name] {
			seen[f.Name] = true
			rep.FunctionsCum[f.Name] += s.Value
		}
	}
	a.top = append(a.top, TopStack{Thread: s.Thread, Ns: s.Value, Categories: cs, Stack: s.Folded()})
	a.on[a.blockedOn(s, cs[0])] += s.Value
}

// report orders what was summed and writes the statements.
func (a *analyzer) report() *Report {
	rep, o, top := a.rep, a.o, a.top
	for _, c := range a.r.Categories {
		cr := *a.cats[c.Name]
		if rep.AppBlockedNs > 0 {
			cr.Share = float64(cr.AppNs) / float64(rep.AppBlockedNs)
		}
		if top := TopCounts(a.catFuncs[c.Name], 1); len(top) > 0 {
			cr.TopFunction, cr.TopFunctionNs = top[0].Name, top[0].Value
		}
		rep.Categories = append(rep.Categories, cr)
	}
	for _, p := range a.procs {
		rep.Processes = append(rep.Processes, *p)
	}
	sort.Slice(rep.Processes, func(i, j int) bool {
		a, b := rep.Processes[i], rep.Processes[j]
		return a.OffCPUNs > b.OffCPUNs || (a.OffCPUNs == b.OffCPUNs && a.Name < b.Name)
	})
	for _, g := range a.groups {
		rep.ThreadGroups = append(rep.ThreadGroups, *g)
	}
	sort.Slice(rep.ThreadGroups, func(i, j int) bool {
		a, b := rep.ThreadGroups[i], rep.ThreadGroups[j]
		if a.OffCPUNs != b.OffCPUNs {
			return a.OffCPUNs > b.OffCPUNs
		}
		return a.Name < b.Name
	})
	for _, t := range a.targets {
		rep.Wakeups.ByTargetGroup = append(rep.Wakeups.ByTargetGroup, *t)
	}
	sort.Slice(rep.Wakeups.ByTargetGroup, func(i, j int) bool {
		a, b := rep.Wakeups.ByTargetGroup[i], rep.Wakeups.ByTargetGroup[j]
		return a.Total > b.Total || (a.Total == b.Total && a.Group < b.Group)
	})
	rep.Wakeups.ByWakerFunction = TopCounts(rep.WakerFunctions, o.Top)
	rep.TopAppFunctions = TopCounts(rep.FunctionsFlat, o.Top)
	known := false
	for k, ns := range a.on {
		k.Ns = ns
		rep.BlockedOn = append(rep.BlockedOn, k)
		known = known || k.Waker != noWaker
	}
	if !known {
		rep.BlockedOn = nil // recorded without wake-ups
	}
	sort.Slice(rep.BlockedOn, func(i, j int) bool {
		x, y := rep.BlockedOn[i], rep.BlockedOn[j]
		return x.Ns > y.Ns || (x.Ns == y.Ns && fmt.Sprint(x) < fmt.Sprint(y))
	})
	if len(rep.BlockedOn) > o.Top {
		rep.BlockedOn = rep.BlockedOn[:o.Top]
	}
	sort.Slice(top, func(i, j int) bool {
		return top[i].Ns > top[j].Ns || (top[i].Ns == top[j].Ns && top[i].Stack < top[j].Stack)
	})
	if len(top) > o.Top {
		top = top[:o.Top]
	}
	rep.TopStacks = top
	if o.Messages > 0 {
		rep.Wakeups.PerMessage = float64(rep.Wakeups.Total) / float64(o.Messages)
		rep.Wakeups.EventfdPerMessage = float64(rep.Wakeups.ByClass["eventfd"]) / float64(o.Messages)
	}
	rep.Statements = statements(rep)
	rep.UnmatchedRules = a.r.UnmatchedRules()
	return rep
}

// chainsTable lists the root causes of the blocked time.
func (rep *Report) chainsTable() *table {
	t := &table{head: []string{"waiting group", "root cause (path from the thread waited on)", "blocked", "share"}}
	for _, rc := range rep.Chains {
		t.add(rc.Waiters, pathString(rc.Path), Secs(rc.Ns), fmt.Sprintf("%.0f%%", 100*rc.Share))
	}
	return t
}

// WriteChains renders only the root causes, as text or markdown.
func (rep *Report) WriteChains(w io.Writer, format string) error {
	t := rep.chainsTable()
	if format == "markdown" || format == "md" {
		t.markdown(w)
		return nil
	}
	return t.text(w)
}

// noWaker: not woken inside the window, or recorded without wake-ups.
const noWaker = "[no waker recorded]"

// blockedOn is the key of a blocked stack's waker: who ended the wait,
// and in which of its named application frames (module+0x... addresses
// of stripped code say little; the next named frame out says more).
func (a *analyzer) blockedOn(s *Stack, category string) BlockedOn {
	k := BlockedOn{Waiters: schema.ThreadGroup(s.Thread), Category: category}
	switch s.WakerRelation() {
	case "none", "unknown":
		k.Waker = noWaker
		if s.Waker != "" {
			k.Waker = schema.ThreadGroup(s.Waker)
		}
		return k
	case "interrupt":
		k.Waker = s.Waker + " " + s.Class
		return k
	}
	k.Waker = schema.ThreadGroup(s.Waker)
	if s.WakerProcess != "" && s.WakerProcess != s.Process {
		k.Waker += " (" + s.WakerProcess + ")"
	}
	// The frame a verdict found (a lock release) says most.
	if v := a.r.verdict(s, a.r.InnermostApp(s)); v != nil && len(v.wakerFrames) > 0 {
		if f := matchFrame(s.WakerFrames, v.wakerFrames, false); f != nil {
			k.WakerFunction = f.Name
			return k
		}
	}
	// The waker's frames carry no module: its leafmost user frame, the one
	// that entered the kernel, is taken for a C library wrapper (kill,
	// write, send).
	syscall := -1
	for i, f := range s.WakerFrames {
		if !f.Kernel {
			syscall = i
		}
	}
	for i := len(s.WakerFrames) - 1; i >= 0; i-- {
		if f := s.WakerFrames[i]; i != syscall && a.r.IsApp(f) && !strings.Contains(f.Name, "+0x") {
			k.WakerFunction = f.Name
			break
		}
	}
	return k
}

// outermostUser returns the root-most user frame of an off-CPU stack;
// false when the stack has no user frame (kernel threads, markers).
func outermostUser(s *Stack) (string, bool) {
	if len(s.Frames) == 0 {
		return "", false
	}
	f := s.Frames[0]
	if f.Kernel || f.Name == "-" || strings.HasPrefix(f.Name, "[user stack") {
		return "", false
	}
	return f.Name, true
}

// Secs renders nanoseconds as seconds with sensible precision.
func Secs(ns int64) string {
	d := time.Duration(ns)
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.0f µs", float64(d)/1e3)
}

func statements(rep *Report) []string {
	var out []string
	if rep.AppBlockedNs == 0 {
		return []string{fmt.Sprintf("No blocked time with an application frame (%s off-CPU in all).", Secs(rep.TotalOffCPUNs))}
	}
	// The largest category by app time, other than "other".
	var best *CategoryResult
	for i := range rep.Categories {
		c := &rep.Categories[i]
		if c.Name != "other" && c.AppNs > 0 && (best == nil || c.AppNs > best.AppNs) {
			best = c
		}
	}
	if best != nil {
		where := ""
		var bestGroup string
		var bestNs int64
		for _, g := range rep.ThreadGroups {
			if g.Categories[best.Name] > bestNs {
				bestGroup, bestNs = g.Name, g.Categories[best.Name]
			}
		}
		if bestGroup != "" {
			where = fmt.Sprintf(" %s %s", bestGroup, rep.unit())
		}
		fn := ""
		if len(rep.TopAppFunctions) > 0 {
			fn = fmt.Sprintf(" (the most blocked application function: %s, %s)", schema.ShortFunc(rep.TopAppFunctions[0].Name), Secs(rep.TopAppFunctions[0].Value))
		}
		out = append(out, fmt.Sprintf("%s is %.0f%% of the blocked time with an application frame (%s of %s), mostly%s%s.",
			best.Name, 100*best.Share, Secs(best.AppNs), Secs(rep.AppBlockedNs), where, fn))
	}
	if len(rep.BlockedOn) > 0 {
		b := rep.BlockedOn[0]
		by := b.Waker + " " + rep.unit()
		if strings.HasPrefix(b.Waker, "[") {
			by = b.Waker
		}
		if b.WakerFunction != "" {
			by += " in " + schema.ShortFunc(b.WakerFunction)
		}
		out = append(out, fmt.Sprintf("%s %s blocked %s in %s, woken by %s (%.0f%% of the blocked time with an application frame).",
			b.Waiters, rep.unit(), Secs(b.Ns), b.Category, by, 100*float64(b.Ns)/float64(rep.AppBlockedNs)))
	}
	out = append(out, fmt.Sprintf("Blocked time with an application frame: %s of %s off-CPU.", Secs(rep.AppBlockedNs), Secs(rep.TotalOffCPUNs)))
	if rep.RunQueueNs > 0 {
		out = append(out, fmt.Sprintf("Waiting for a CPU (woken or preempted, not yet running; not blocked): %s, %s of the off-CPU time.", Secs(rep.RunQueueNs), pct(rep.RunQueueNs, rep.TotalOffCPUNs)))
	}
	if rep.Wakeups.Total > 0 {
		s := fmt.Sprintf("Wake-ups: %d, of them %d through an eventfd", rep.Wakeups.Total, rep.Wakeups.ByClass["eventfd"])
		if rep.Messages > 0 {
			s += fmt.Sprintf(" (%.3f eventfd wake-ups per message)", rep.Wakeups.EventfdPerMessage)
		}
		out = append(out, s+".")
	}
	return out
}

// Write renders the report as text, json or markdown.
func (rep *Report) Write(w io.Writer, format string) error {
	return write(w, format, rep, rep.writeText, rep.writeMarkdown)
}

// write renders v in one of the output formats.
func write(w io.Writer, format string, v any, text, markdown func(io.Writer) error) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "markdown", "md":
		return markdown(w)
	case "text", "":
		return text(w)
	}
	return fmt.Errorf("unknown format %q: use text, json or markdown", format)
}

func pct(a, b int64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(a)/float64(b))
}

func (rep *Report) writeText(w io.Writer) error {
	fmt.Fprintf(w, "off-CPU %s (waiting for a CPU %s), idle %s, blocked with an application frame %s", Secs(rep.TotalOffCPUNs), Secs(rep.RunQueueNs), Secs(rep.IdleNs), Secs(rep.AppBlockedNs))
	if rep.ThreadFilter != "" {
		fmt.Fprintf(w, " (threads matching %s)", rep.ThreadFilter)
	}
	fmt.Fprintln(w)
	if len(rep.IdleCategories) > 0 {
		fmt.Fprintf(w, "idle (waiting for work, never blocked): %s\n", strings.Join(rep.IdleCategories, ", "))
	}
	if rep.UserStackNs > 0 {
		fmt.Fprintf(w, "user stacks reaching a thread start: %s of the off-CPU time with a user stack\n", pct(rep.WholeStackNs, rep.UserStackNs))
	}
	for _, s := range rep.Statements {
		fmt.Fprintln(w, "  "+s)
	}
	for _, u := range rep.UnmatchedRules {
		fmt.Fprintf(w, "warning: rule %s matched no stack\n", u)
	}
	for _, t := range rep.tables() {
		if err := t.text(w); err != nil {
			return err
		}
	}
	fns := &table{head: []string{"waker function", "wake-ups"}}
	for _, c := range rep.Wakeups.ByWakerFunction {
		fns.add(schema.ShortFunc(c.Name), fmt.Sprint(c.Value))
	}
	if rep.Wakeups.Total > 0 {
		if err := fns.text(w); err != nil {
			return err
		}
	}
	app := &table{head: []string{"application function (innermost)", "blocked"}}
	for _, c := range rep.TopAppFunctions {
		app.add(schema.ShortFunc(c.Name), Secs(c.Value))
	}
	return app.text(w)
}

// unit is what the report's stacks wait in: threads or goroutines.
func (rep *Report) unit() string {
	if rep.Goroutines {
		return "goroutines"
	}
	return "threads"
}

// tables are the report's category, thread group and woken group tables.
func (rep *Report) tables() []*table {
	cats := &table{head: []string{"category", "all", "with app frame", "share", "first match"},
		md: []string{"category", "off-CPU", "with an application frame", "share", "first match"}}
	for _, c := range rep.Categories {
		if c.Ns != 0 || c.AppNs != 0 {
			cats.add(c.label(), Secs(c.Ns), Secs(c.AppNs), pct(c.AppNs, rep.AppBlockedNs), pct(c.FirstNs, rep.AppBlockedNs))
		}
	}
	group := "thread group"
	if rep.Goroutines {
		group = "goroutines by start function"
	}
	groups := &table{head: []string{group, "off-CPU", "waiting for CPU", "with app frame", "on-CPU"},
		md: []string{group, "off-CPU", "of it waiting for a CPU", "blocked with an application frame", "on-CPU"}}
	for _, g := range rep.ThreadGroups {
		groups.add(g.Name, Secs(g.OffCPUNs), Secs(g.RunQueueNs), Secs(g.AppBlockedNs), Secs(g.CPUNs))
	}
	out := []*table{cats, groups}
	if len(rep.Chains) > 0 {
		out = append(out, rep.chainsTable())
	}
	if len(rep.BlockedOn) > 0 {
		on := &table{head: []string{"waiting group", "category", "woken by", "in", "blocked"}}
		for _, b := range rep.BlockedOn {
			on.add(b.Waiters, b.Category, b.Waker, schema.ShortFunc(b.WakerFunction), Secs(b.Ns))
		}
		out = append(out, on)
	}
	if rep.Wakeups.Total > 0 {
		// A column per class seen, most wake-ups first.
		classes := TopCounts(rep.Wakeups.ByClass, len(rep.Wakeups.ByClass))
		woken := &table{head: []string{"woken group", "wake-ups"}}
		for _, c := range classes {
			woken.head = append(woken.head, c.Name)
		}
		for _, t := range rep.Wakeups.ByTargetGroup {
			row := []string{t.Group, fmt.Sprint(t.Total)}
			for _, c := range classes {
				row = append(row, fmt.Sprint(t.ByClass[c.Name]))
			}
			woken.add(row...)
		}
		out = append(out, woken)
	}
	return out
}

func (rep *Report) writeMarkdown(w io.Writer) error {
	fmt.Fprintf(w, "Off-CPU time: %s (of it waiting for a CPU: %s); idle: %s; blocked time with an application frame: %s", Secs(rep.TotalOffCPUNs), Secs(rep.RunQueueNs), Secs(rep.IdleNs), Secs(rep.AppBlockedNs))
	if rep.ThreadFilter != "" {
		fmt.Fprintf(w, " (threads matching `%s`)", rep.ThreadFilter)
	}
	fmt.Fprint(w, ".")
	if rep.UserStackNs > 0 {
		fmt.Fprintf(w, " User stacks reaching a thread start: %s of the off-CPU time with a user stack.", pct(rep.WholeStackNs, rep.UserStackNs))
	}
	fmt.Fprint(w, "\n\n")
	if len(rep.IdleCategories) > 0 {
		fmt.Fprintf(w, "Idle categories (waiting for work, never counted as blocked): %s.\n\n", strings.Join(rep.IdleCategories, ", "))
	}
	for _, s := range rep.Statements {
		fmt.Fprintf(w, "- %s\n", s)
	}
	for _, u := range rep.UnmatchedRules {
		fmt.Fprintf(w, "- Warning: rule %s matched no stack.\n", u)
	}
	for _, t := range rep.tables() {
		t.markdown(w)
	}
	return nil
}

// AppBlocked tells whether a stack counts as blocked time with an
// application frame: an application frame (not runtime, libc or event-loop
// machinery), not waiting for a CPU (runnable is not blocked) and not idle
// (its first matching category waits for work).
func (r *Rules) AppBlocked(s *Stack) bool {
	return !s.WaitsForCPU() && r.InnermostApp(s) != "" && !r.IsIdle(r.Categorize(s)[0])
}

func (c CategoryResult) label() string {
	if c.Idle {
		return c.Name + " (idle)"
	}
	return c.Name
}

// Count is a name with a count or a time.
type Count struct {
	Name  string `json:"name"`
	Value int64  `json:"value"`
}

// TopCounts returns the n largest values of m, largest first (ties by name).
func TopCounts(m map[string]int64, n int) []Count {
	var out []Count
	for k, v := range m {
		out = append(out, Count{k, v})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Value != out[j].Value {
			return out[i].Value > out[j].Value
		}
		return out[i].Name < out[j].Name
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}
