// Package analysis attributes off-CPU time to causes with ordered rules,
// summarizes wake-ups, and compares a baseline with a candidate.
package analysis

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

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

// Analyze attributes the data's blocked time to the rules' categories.
func Analyze(d *Data, r *Rules, o Options) *Report {
	if o.Top == 0 {
		o.Top = 10
	}
	Judge(d.Stacks, r)
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
		rep.Wakeups.EventfdPerMessage = float64(rep.Wakeups.ByClass[schema.WakeEventfd]) / float64(o.Messages)
	}
	rep.Statements = statements(rep)
	rep.UnmatchedRules = a.r.UnmatchedRules()
	return rep
}

// noWaker: not woken inside the window, or recorded without wake-ups.
const noWaker = "[no waker recorded]"

// heldBy joins an interpreter lock's name to its holder's group: "GVL
// held by puma srv tp N".
const heldBy = " held by "

// blockedOn is the key of a blocked stack's waker: who ended the wait,
// and in which of its named application frames (module+0x... addresses
// of stripped code say little; the next named frame out says more).
func (a *analyzer) blockedOn(s *Stack, category string) BlockedOn {
	k := BlockedOn{Waiters: schema.ThreadGroup(s.Thread), Category: category}
	if s.Reason == schema.ReasonGIL && s.GILHolder != "" {
		// Whoever woke it, the thread it waited on held the GIL.
		k.Waker = s.LockName() + heldBy + schema.ThreadGroup(s.GILHolder)
		for i := len(s.GILHolderFrames) - 1; i >= 0; i-- {
			if f := s.GILHolderFrames[i]; a.r.IsApp(f) {
				k.WakerFunction = f.Name
				break
			}
		}
		return k
	}
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

// AppBlocked tells whether a stack counts as blocked time with an
// application frame: an application frame (not runtime, libc or event-loop
// machinery), not waiting for a CPU (runnable is not blocked) and not idle
// (its first matching category waits for work).
func (r *Rules) AppBlocked(s *Stack) bool {
	return !s.WaitsForCPU() && r.InnermostApp(s) != "" && !r.IsIdle(r.Categorize(s)[0])
}
