package analysis

import (
	"fmt"
	"slices"
	"strings"

	"github.com/offcpu/offcpu/schema"
)

// A thread that loops has a top: the wait where it sits between work
// items. markLoops finds it from the thread's own waits, with no function
// name: the waits a thread makes over and over (a loop's, not a one-shot
// goroutine's), that no other such wait of it encloses (a wait beneath
// another one's innermost application frame is made while handling what
// that wait brought), and, where some of them are woken by another program
// or the network (a server's reads), those, the outermost first. Every
// other wait of a server thread, and every wait beneath the top of any
// thread, is beneath a work item.
//
// A loop unit is a thread or a goroutine. (Goroutines of one start
// function are not pooled: a wrapper that starts every goroutine of a
// program would make one unit of its loops.)
type loopKey struct {
	pid, tid, goid int64
}

type loopSite struct {
	path    []string // user frames, root first, to the innermost application frame
	ns, n   int64
	woken   int64 // waits some recorded waker ended
	input   int64 // of them, by another program or the network
	ids     map[int64]bool
	example *Stack
	top     bool
}

type loopUnit struct {
	sites  map[string]*loopSite
	ns, n  int64
	tops   []*loopSite
	server bool // its top is a wait for input: it serves another program
}

// loopMinShare: a site holding less of its unit's waits and time than
// this takes no part in finding the top (a start-up wait, a rare path).
const loopMinShare = 0.01

func markLoops(stacks []Stack, r *Rules) {
	x := NewLoopIndex(r)
	for i := range stacks {
		x.Observe(&stacks[i])
	}
	for i := range stacks {
		x.Mark(&stacks[i])
	}
}

// LoopIndex is markLoops in two passes, for readers that keep no stacks
// (OTLP's converter): Observe every off-CPU stack of a recording, then
// Mark each.
type LoopIndex struct {
	r     *Rules
	units map[loopKey]*loopUnit
	found bool
}

// NewLoopIndex returns an empty index judged with r's application frames.
func NewLoopIndex(r *Rules) *LoopIndex { return &LoopIndex{r: r, units: map[loopKey]*loopUnit{}} }

// LoopIndex lets a reader that takes the rules as an interface find the
// tops of loop (otlp.Categorizer).
func (r *Rules) LoopIndex() interface {
	Observe(*schema.Stack)
	Mark(*schema.Stack)
} {
	return NewLoopIndex(r)
}

func (x *LoopIndex) unitOf(s *Stack) *loopUnit {
	k := loopKey{pid: s.PID, tid: s.TID}
	if s.Goid > 0 {
		k = loopKey{pid: s.PID, goid: s.Goid}
	}
	u := x.units[k]
	if u == nil {
		u = &loopUnit{sites: map[string]*loopSite{}}
		x.units[k] = u
	}
	return u
}

func loopWait(s *Stack) bool {
	return s.Kind == KindOffCPU && !s.WaitsForCPU() && (s.TID != 0 || s.Goid > 0)
}

// Observe notes a wait of s's unit at s's site.
func (x *LoopIndex) Observe(s *Stack) {
	if !loopWait(s) {
		return
	}
	u := x.unitOf(s)
	path := appPath(s, x.r)
	pk := strings.Join(path, ";")
	site := u.sites[pk]
	if site == nil {
		site = &loopSite{path: path}
		u.sites[pk] = site
	}
	n := max(s.Count, 1)
	site.ns += s.Value
	site.n += n
	if rel := s.WakerRelation(); rel != "none" && rel != "unknown" || s.Reason == "IO wait" {
		site.woken += n
		if rel == "other-program" || s.Class == "net-rx" || s.Reason == "IO wait" {
			site.input += n
		}
	}
	u.ns += s.Value
	u.n += n
}

// Mark sets where s lies in its unit's loop (Stack.Loop), and what
// MarkInRequest guessed from the input waits alone follows from it.
func (x *LoopIndex) Mark(s *Stack) {
	if !loopWait(s) {
		return
	}
	if !x.found {
		for _, u := range x.units {
			u.findTops()
		}
		x.found = true
	}
	u := x.unitOf(s)
	site := u.sites[strings.Join(appPath(s, x.r), ";")]
	if site == nil {
		return // not observed
	}
	s.Loop, s.LoopWhy = u.place(site)
	switch {
	case len(site.path) == 0:
		// No application frame: the runtime's or a library's own wait (a
		// Go thread looking for a goroutine to run), inside no request of
		// this thread's, whatever else it serves.
		s.InRequest, s.InRequestWhy = false, ""
	case s.Loop == schema.LoopTop:
		s.InRequest, s.InRequestWhy = false, ""
	case s.Loop == schema.LoopBeneath:
		s.InRequest, s.InRequestWhy = true, s.LoopWhy
	}
}

// appPath is a stack's user frames, root first, down to its innermost
// application frame; nil without one.
func appPath(s *Stack, r *Rules) []string {
	var out []string
	last := -1
	for _, f := range s.Frames {
		if f.Kernel {
			continue
		}
		out = append(out, f.Name)
		if r.IsApp(f) {
			last = len(out)
		}
	}
	if last < 0 {
		return nil
	}
	return out[:last]
}

// loopNest: a wait this many application frames or fewer below a loop's
// own frame is at the loop's level (a library call that waits: a sleep,
// a buffered reader's fill); one deeper was made for a work item.
const loopNest = 2

// beneath: path goes through all of top's and deeper into application
// code than loopNest frames.
func beneath(path, top []string) bool {
	return len(top) > 0 && len(path) > len(top)+loopNest && slices.Equal(path[:len(top)], top)
}

func (u *loopUnit) findTops() {
	var cands []*loopSite
	for _, s := range u.sites {
		// A loop's wait recurs; a one-shot goroutine's does not.
		if len(s.path) == 0 || s.n < 2 ||
			(float64(s.n) < loopMinShare*float64(u.n) && float64(s.ns) < loopMinShare*float64(u.ns)) {
			continue
		}
		cands = append(cands, s)
	}
	var outer []*loopSite
	for _, s := range cands {
		if !slices.ContainsFunc(cands, func(o *loopSite) bool { return beneath(s.path, o.path) }) {
			outer = append(outer, s)
		}
	}
	depth := -1
	for _, s := range outer {
		if s.isInput() && (depth < 0 || len(s.path) < depth) {
			depth = len(s.path)
		}
	}
	for _, s := range outer {
		if depth < 0 || (s.isInput() && len(s.path) == depth) {
			s.top = true
			u.tops = append(u.tops, s)
		}
	}
	u.server = depth >= 0
	slices.SortFunc(u.tops, func(a, b *loopSite) int { return int(b.n - a.n) })
}

// isInput: most of the waits there that a recorded waker ended were
// ended by another program or the network.
func (s *loopSite) isInput() bool { return s.input > 0 && 2*s.input >= s.woken }

// place says where a site lies in its unit's loop, and why.
func (u *loopUnit) place(s *loopSite) (string, string) {
	if len(u.tops) == 0 {
		return "", ""
	}
	top := u.tops[0]
	desc := func(t *loopSite) string {
		what := "its most frequent recurring wait that no other encloses"
		if u.server {
			what = "its outermost recurring wait for input (another program or the network woke it)"
		}
		return fmt.Sprintf("%s (%d waits, %s): %s", t.path[len(t.path)-1], t.n, Secs(t.ns), what)
	}
	if s.top {
		return schema.LoopTop, "at its thread's top of loop, " + desc(s)
	}
	for _, t := range u.tops {
		if beneath(s.path, t.path) {
			return schema.LoopBeneath, "beneath its thread's top of loop, " + desc(t) + ": a wait made while handling what the top brought"
		}
	}
	if u.server {
		return schema.LoopBeneath, "away from its thread's top of loop, " + desc(top) + ": a thread serving another program, inside a request"
	}
	return "", ""
}
