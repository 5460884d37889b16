package analysis

import (
	"cmp"
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
// A loop unit is a thread, or goroutines of one start function in a
// process that wait at a common site (a pool of connection goroutines
// loops as one; goroutines that a wrapper starts for unrelated loops
// share no site and stay apart).
type poolKey struct {
	pid, tid int64
	start    string
}

type loopSite struct {
	path  []string // user frames, root first, to the innermost application frame
	app   []bool   // which of them are application frames
	ns, n int64
	woken int64 // waits some recorded waker ended
	input int64 // of them, by another program or the network
	whole int64 // waits through the whole recording (nothing ended them)
	ids   int   // threads or goroutines that waited there
	top   bool
}

func (s *loopSite) add(o *loopSite) {
	s.ns += o.ns
	s.n += o.n
	s.woken += o.woken
	s.input += o.input
	s.whole += o.whole
	s.ids++
}

type loopUnit struct {
	sites  map[string]*loopSite
	ns, n  int64
	tops   []*loopSite
	server bool // its top is a wait for input: it serves another program
}

// loopPool is what was observed of one pool: each thread's or
// goroutine's waits by site, and, once found, the unit each belongs to.
type loopPool struct {
	byID   map[int64]map[string]*loopSite
	unitOf map[int64]*loopUnit
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
	pools map[poolKey]*loopPool
	found bool
}

// NewLoopIndex returns an empty index judged with r's application frames.
func NewLoopIndex(r *Rules) *LoopIndex { return &LoopIndex{r: r, pools: map[poolKey]*loopPool{}} }

// LoopIndex lets a reader that takes the rules as an interface find the
// tops of loop (otlp.Categorizer).
func (r *Rules) LoopIndex() interface {
	Observe(*schema.Stack)
	Mark(*schema.Stack)
} {
	return NewLoopIndex(r)
}

func poolOf(s *Stack) (poolKey, int64) {
	if s.Goid > 0 {
		return poolKey{pid: s.PID, start: s.Thread}, s.Goid
	}
	return poolKey{pid: s.PID, tid: s.TID}, s.TID
}

// loopWait: a wait of a thread or goroutine for something of its own. A
// wait for an interpreter's lock (the GIL, the GVL) is the runtime's
// scheduling, wherever the thread is in its loop: it is no loop's site.
func loopWait(s *Stack) bool {
	return s.Kind == KindOffCPU && !s.WaitsForCPU() && (s.TID != 0 || s.Goid > 0) && s.Reason != schema.ReasonGIL
}

// Observe notes a wait of s's thread or goroutine at s's site.
func (x *LoopIndex) Observe(s *Stack) {
	if !loopWait(s) {
		return
	}
	k, id := poolOf(s)
	p := x.pools[k]
	if p == nil {
		p = &loopPool{byID: map[int64]map[string]*loopSite{}}
		x.pools[k] = p
	}
	sites := p.byID[id]
	if sites == nil {
		sites = map[string]*loopSite{}
		p.byID[id] = sites
	}
	path, app := appPath(s, x.r)
	pk := strings.Join(path, ";")
	site := sites[pk]
	if site == nil {
		site = &loopSite{path: path, app: app}
		sites[pk] = site
	}
	n := max(s.Count, 1)
	site.ns += s.Value
	site.n += n
	if s.Interval == "whole" {
		site.whole += n
	}
	if s.Woken() {
		site.woken += n
		if s.WokenByInput() {
			site.input += n
		}
	}
}

// units groups a pool's threads or goroutines that share a site (other
// than the runtime's own, with no application frame) into units.
func (p *loopPool) units() {
	parent := map[int64]int64{}
	find := func(a int64) int64 {
		for parent[a] != a {
			parent[a] = parent[parent[a]]
			a = parent[a]
		}
		return a
	}
	first := map[string]int64{} // a site's first id
	for id := range p.byID {
		parent[id] = id
	}
	for id, sites := range p.byID {
		for pk, s := range sites {
			if len(s.path) == 0 {
				continue
			}
			if o, ok := first[pk]; ok {
				parent[find(id)] = find(o)
			} else {
				first[pk] = id
			}
		}
	}
	byRoot := map[int64]*loopUnit{}
	p.unitOf = map[int64]*loopUnit{}
	for id, sites := range p.byID {
		root := find(id)
		u := byRoot[root]
		if u == nil {
			u = &loopUnit{sites: map[string]*loopSite{}}
			byRoot[root] = u
		}
		p.unitOf[id] = u
		for pk, s := range sites {
			us := u.sites[pk]
			if us == nil {
				us = &loopSite{path: s.path, app: s.app}
				u.sites[pk] = us
			}
			us.add(s)
			u.ns += s.ns
			u.n += s.n
		}
	}
	for _, u := range byRoot {
		u.findTops()
	}
}

// Mark sets where s lies in its unit's loop (Stack.Loop), and what
// MarkInRequest guessed from the input waits alone follows from it.
func (x *LoopIndex) Mark(s *Stack) {
	if !loopWait(s) {
		return
	}
	if !x.found {
		for _, p := range x.pools {
			p.units()
		}
		x.found = true
	}
	k, id := poolOf(s)
	p := x.pools[k]
	if p == nil || p.unitOf[id] == nil {
		return // not observed
	}
	u := p.unitOf[id]
	path, _ := appPath(s, x.r)
	site := u.sites[strings.Join(path, ";")]
	if site == nil {
		return
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
// application frame, and which are application frames; nil without one.
func appPath(s *Stack, r *Rules) ([]string, []bool) {
	var out []string
	var app []bool
	last := -1
	for _, f := range s.Frames {
		if f.Kernel {
			continue
		}
		out = append(out, f.Name)
		app = append(app, r.IsApp(f))
		if app[len(app)-1] {
			last = len(out)
		}
	}
	if last < 0 {
		return nil, nil
	}
	return out[:last], app[:last]
}

// loopNest: a wait this many application frames or fewer below a loop's
// own frame is at the loop's level (a library call that waits: a sleep,
// a buffered reader's fill); one deeper was made for a work item.
const loopNest = 2

// beneath: s goes deeper into application code than loopNest frames
// below all of top's. Or, where the two share the loop's own frame but
// neither holds the other, a wait for a hand-off at the loop's level (a
// pool's wait for work inside a block given to its lock's synchronize)
// encloses a deeper wait for input beside it (a handler's downstream
// read) when the thread sits longer in the hand-off: that is where it
// waits between work items.
func beneath(s, top *loopSite) bool {
	c := 0
	for c < len(s.path) && c < len(top.path) && s.path[c] == top.path[c] {
		c++
	}
	if appFrames(s.app[c:]) <= loopNest {
		return false
	}
	if c == len(top.path) {
		return c > 0
	}
	return !top.isInput() && top.woken > 0 && (!s.isInput() || top.ns > s.ns) &&
		appFrames(top.app[:c]) > 0 && appFrames(top.app[c:]) <= loopNest
}

// beside: s and o part below a shared application frame, o at the
// loop's level there (loopNest application frames or fewer below it) and
// s deeper (a pool's wait for work inside its lock's block, beside a
// handler's wait under the same loop frame).
func beside(s, o *loopSite) bool {
	c := 0
	for c < len(s.path) && c < len(o.path) && s.path[c] == o.path[c] {
		c++
	}
	if c == len(s.path) || c == len(o.path) || appFrames(o.app[:c]) == 0 {
		return false
	}
	return appFrames(o.app[c:]) <= loopNest && appFrames(s.app[c:]) > loopNest
}

func appFrames(app []bool) int {
	n := 0
	for _, a := range app {
		if a {
			n++
		}
	}
	return n
}

func (u *loopUnit) findTops() {
	var cands []*loopSite
	for _, s := range u.sites {
		// A loop's wait recurs: more waits there than threads or
		// goroutines that made them (a one-shot goroutine's does not).
		if len(s.path) == 0 || s.n < 2*int64(s.ids) ||
			(float64(s.n) < loopMinShare*float64(u.n) && float64(s.ns) < loopMinShare*float64(u.ns)) {
			continue
		}
		cands = append(cands, s)
	}
	if len(cands) == 0 {
		// No wait recurs: where every thread of the unit sat through the
		// whole recording, nothing came for it there (a poll, a pool's
		// queue): that is its top, as far as the recording tells.
		for _, s := range u.sites {
			if len(s.path) > 0 && s.whole == s.n {
				s.top = true
				u.tops = append(u.tops, s)
			}
		}
		return
	}
	var outer []*loopSite
	for _, s := range cands {
		if !slices.ContainsFunc(cands, func(o *loopSite) bool { return beneath(s, o) }) {
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
	slices.SortFunc(u.tops, func(a, b *loopSite) int { return cmp.Compare(b.n, a.n) })
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
		if t.whole == t.n {
			what = "its only wait, through the whole recording: nothing came for it"
		} else if u.server {
			what = "its outermost recurring wait for input (another program or the network woke it)"
		}
		return fmt.Sprintf("%s (%d waits, %s): %s", t.path[len(t.path)-1], t.n, Secs(t.ns), what)
	}
	if s.top {
		return schema.LoopTop, "at its thread's top of loop, " + desc(s)
	}
	for _, t := range u.tops {
		if beneath(t, s) {
			// The top is beneath it: an outer loop's wait for its next
			// work item (a thread cache waiting for a connection).
			return schema.LoopTop, "enclosing its thread's top of loop, " + desc(t) + ": an outer loop's wait for its next work item"
		}
		if beneath(s, t) {
			return schema.LoopBeneath, "beneath its thread's top of loop, " + desc(t) + ": a wait made while handling what the top brought"
		}
	}
	for _, t := range u.tops {
		if beside(s, t) {
			return schema.LoopBeneath, "beside its thread's top of loop, " + desc(t) + ", deeper than the loop's own level: a wait made for a work item"
		}
	}
	if u.server {
		return schema.LoopBeneath, "away from its thread's top of loop, " + desc(top) + ": a thread serving another program, inside a request"
	}
	return "", ""
}
