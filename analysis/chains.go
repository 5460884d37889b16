package analysis

import (
	"fmt"
	"sort"
	"strings"

	"github.com/offcpu/offcpu/schema"
)

// ChainHop is a thread group a blocked wait was traced through, and what
// it was doing then: its own wait's category and innermost application
// frame, or "running" when it held the waiter up on a CPU.
type ChainHop struct {
	Group    string `json:"group"`
	Category string `json:"category"`
	Frame    string `json:"frame,omitempty"`
}

// RootCause is blocked time followed along its wakers to where it ends:
// the waiters' group, the path from the thread they waited on to the
// root, and the time.
type RootCause struct {
	Waiters string     `json:"waiters"`
	Path    []ChainHop `json:"path"`
	Ns      int64      `json:"ns"`
	Share   float64    `json:"share"` // of the waiters' blocked time with an application frame
}

const (
	chainDepth = 6  // hops a path is followed before it ends in [deeper]
	chainPaths = 16 // paths kept per stack; the rest are merged into [other paths]
)

// chainer follows blocked time along the recorder's wait links: a wait's
// waker, and (WakerWaitNs) how long that waker was itself off a CPU in its
// own wait, which is found among the waker's stacks and followed in turn,
// in proportion to their times. Each stack's paths are worked out once.
type chainer struct {
	r     *Rules
	waits map[chainKey][]*Stack // a thread's off-CPU stacks by their frames
	memo  map[*Stack][]share
	hops  map[*Stack]ChainHop
	// firsts: first categories of stacks, and of unrecorded wakers'
	// waits by thread group and frames (the rules are costly to run).
	firsts    map[*Stack]string
	unrecHops map[[2]string]ChainHop
	busy      map[*Stack]bool // being worked out: a wait reached again is a cycle
}

// share is a path from a stack's waker to a root, and the fraction of the
// stack's time that ends there.
type share struct {
	path []ChainHop
	frac float64
}

// chainKey is one thread's (tid) or one goroutine's (goid) wait.
type chainKey struct {
	pid, tid, goid int64
	frames         string
}

func framesKey(fr []Frame) string {
	var b strings.Builder
	for _, f := range fr {
		b.WriteString(f.Name)
		b.WriteByte(';')
	}
	return b.String()
}

// markPassedOn marks the thread waits whose waker, of the same process,
// had been waiting at the very same place through most of them and was
// idle there most of the time (waiting for work): a release it made on its
// way out of that wait handed the waiter nothing (a queue whose internal
// lock wakes the next idle worker), and the waiter still waits for work.
// A lock's convoy does not qualify: its waiters' waits there are blocked.
func markPassedOn(stacks []Stack, r *Rules) {
	waits := map[chainKey][]*Stack{}
	for i := range stacks {
		if s := &stacks[i]; s.Kind == KindOffCPU && s.TID != 0 && s.Goid == 0 {
			k := chainKey{s.PID, s.TID, 0, framesKey(s.Frames)}
			waits[k] = append(waits[k], s)
		}
	}
	idleAt := map[chainKey]bool{}
	for i := range stacks {
		s := &stacks[i]
		if s.Kind != KindOffCPU || s.TID == 0 || s.Goid != 0 || s.WaitsForCPU() || s.WakerPID != s.PID || s.WakerTID == 0 ||
			s.WakerTID == s.TID || 2*s.WakerWaitNs < s.Value || !schema.SamePlace(s.WakerWaitFrames, s.Frames) {
			continue
		}
		k := chainKey{s.WakerPID, s.WakerTID, 0, framesKey(s.WakerWaitFrames)}
		idle, ok := idleAt[k]
		if !ok {
			var all, idleNs int64
			for _, w := range waits[k] {
				if w.WaitsForCPU() {
					continue
				}
				all += w.Value
				if r.IsIdle(r.Categorize(w)[0]) {
					idleNs += w.Value
				}
			}
			idle = all > 0 && 2*idleNs > all
			idleAt[k] = idle
		}
		s.WakerPassedOn = idle
	}
}

// markChainWaits marks the goroutine waits that their waker spent mostly
// blocked itself (the waker held this one up while it waited for a lock,
// a commit, another goroutine): such a wait is part of a wait chain, not
// a wait for work, whatever its own reason says. Repeated so that a
// chain of such waits is marked from its blocked end.
func markChainWaits(stacks []Stack, r *Rules) {
	waits := map[chainKey][]*Stack{}
	for i := range stacks {
		s := &stacks[i]
		if s.Kind == KindOffCPU && s.Goid > 0 {
			k := chainKey{s.PID, 0, s.Goid, framesKey(s.Frames)}
			waits[k] = append(waits[k], s)
		}
	}
	cats := map[*Stack]string{} // the rules are costly: each stack's first category, until it is marked
	category := func(w *Stack) string {
		c, ok := cats[w]
		if !ok {
			c = r.Categorize(w)[0]
			cats[w] = c
		}
		return c
	}
	for range chainDepth {
		changed := false
		for i := range stacks {
			s := &stacks[i]
			if s.Kind != KindOffCPU || s.Goid <= 0 || s.WakerGoid <= 0 || s.InRequest || s.WaitsForCPU() || 2*s.WakerWaitNs < s.Value {
				continue
			}
			var blocked, all int64
			cat := ""
			for _, w := range waits[chainKey{s.WakerPID, 0, s.WakerGoid, framesKey(s.WakerWaitFrames)}] {
				if w.WaitsForCPU() {
					continue
				}
				all += w.Value
				if c := category(w); !r.IsIdle(c) {
					blocked += w.Value
					cat = c
				}
			}
			if all > 0 && 2*blocked > all {
				s.InRequest, changed = true, true
				delete(cats, s)
				s.InRequestWhy = fmt.Sprintf("its waker %s was itself blocked (%s) through %.0f%% of it: a wait chain",
					s.Waker, cat, 100*float64(min(s.WakerWaitNs, s.Value))/float64(s.Value))
			}
		}
		if !changed {
			return
		}
	}
}

// Chains traces the blocked time with an application frame of the stacks
// to its root causes, largest first (top n).
func Chains(stacks []Stack, r *Rules, wanted func(*Stack) bool, n int) []RootCause {
	c := &chainer{r: r, waits: map[chainKey][]*Stack{}, memo: map[*Stack][]share{}, hops: map[*Stack]ChainHop{}, busy: map[*Stack]bool{},
		firsts: map[*Stack]string{}, unrecHops: map[[2]string]ChainHop{}}
	for i := range stacks {
		s := &stacks[i]
		if s.Kind == KindOffCPU && (s.TID != 0 || s.Goid > 0) {
			k := chainKey{s.PID, s.TID, s.Goid, framesKey(s.Frames)}
			c.waits[k] = append(c.waits[k], s)
		}
	}
	total := map[string]int64{}
	roots := map[string]*RootCause{}
	for i := range stacks {
		s := &stacks[i]
		if s.Kind != KindOffCPU || !wanted(s) || !r.AppBlocked(s) {
			continue
		}
		g := schema.ThreadGroup(s.Thread)
		total[g] += s.Value
		for _, sh := range c.paths(s) {
			k := g + "|" + pathString(sh.path)
			rc := roots[k]
			if rc == nil {
				rc = &RootCause{Waiters: g, Path: sh.path}
				roots[k] = rc
			}
			rc.Ns += int64(sh.frac * float64(s.Value))
		}
	}
	var out []RootCause
	for _, rc := range roots {
		if t := total[rc.Waiters]; t > 0 {
			rc.Share = float64(rc.Ns) / float64(t)
		}
		if rc.Ns > 0 {
			out = append(out, *rc)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Ns != out[j].Ns {
			return out[i].Ns > out[j].Ns
		}
		return pathString(out[i].Path) < pathString(out[j].Path)
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}

// paths works out where s's time ends: the part its waker spent off a
// CPU in its own wait goes down that wait; the rest ends at the waker.
func (c *chainer) paths(s *Stack) []share {
	if p, ok := c.memo[s]; ok {
		return p
	}
	c.busy[s] = true
	defer delete(c.busy, s)
	var out []share
	add := func(frac float64, path ...ChainHop) {
		if frac > 0 {
			out = append(out, share{path, frac})
		}
	}
	switch {
	case s.Reason == schema.ReasonGIL && s.GILHolder != "":
		// A lock wait ends at the thread that held the interpreter's lock.
		h := ChainHop{Group: schema.ThreadGroup(s.GILHolder), Category: "holding the " + s.LockName()}
		for i := len(s.GILHolderFrames) - 1; i >= 0; i-- {
			if c.r.IsApp(s.GILHolderFrames[i]) {
				h.Frame = s.GILHolderFrames[i].Name
				break
			}
		}
		add(1, h)
		out = prune(out)
		c.memo[s] = out
		return out
	}
	switch s.WakerRelation() {
	case "none", "unknown":
		add(1, ChainHop{Group: noWaker, Category: c.first(s)})
	case "interrupt":
		add(1, ChainHop{Group: s.Waker, Category: s.Class})
	default:
		chained := 0.0
		if s.Value > 0 {
			chained = float64(min(s.WakerWaitNs, s.Value)) / float64(s.Value)
		}
		waker := ChainHop{Group: schema.ThreadGroup(s.Waker), Category: "running"}
		add(1-chained, waker)
		if chained > 0 {
			out = append(out, c.down(s, chained)...)
		}
	}
	out = prune(out)
	c.memo[s] = out
	return out
}

// down follows the waker's own wait of s: its stacks of that wait, each
// with its share of frac.
func (c *chainer) down(s *Stack, frac float64) []share {
	var waits []*Stack
	switch {
	case s.Goid != 0 && s.WakerGoid > 0: // -1: goroutines merged, not one goroutine's
		waits = c.waits[chainKey{s.WakerPID, 0, s.WakerGoid, framesKey(s.WakerWaitFrames)}]
	case s.Goid == 0 && s.WakerTID != 0: // 0: merged with other exited processes, not one thread's
		waits = c.waits[chainKey{s.WakerPID, s.WakerTID, 0, framesKey(s.WakerWaitFrames)}]
	}
	var sum int64
	for _, w := range waits {
		sum += w.Value
	}
	if sum == 0 {
		// Not recorded (outside the recorded set): the chain ends in the
		// waker's wait as its stack reads.
		k := [2]string{schema.ThreadGroup(s.Waker), framesKey(s.WakerWaitFrames)}
		h, ok := c.unrecHops[k]
		if !ok {
			ws := &Stack{Kind: KindOffCPU, Thread: s.Waker, Frames: s.WakerWaitFrames, State: "sleeping"}
			h = ChainHop{Group: k[0], Category: c.r.Categorize(ws)[0], Frame: c.r.InnermostApp(ws)}
			c.unrecHops[k] = h
		}
		return []share{{[]ChainHop{h}, frac}}
	}
	var out []share
	for _, w := range waits {
		f := frac * float64(w.Value) / float64(sum)
		hop := c.hop(w)
		switch {
		case w.WaitsForCPU():
			out = append(out, share{[]ChainHop{hop}, f})
		case c.busy[w]:
			// A convoy: threads waiting on each other in turn.
			out = append(out, share{[]ChainHop{hop, {Group: "[cycle]"}}, f})
		default:
			for _, sh := range c.paths(w) {
				p := append([]ChainHop{hop}, sh.path...)
				if len(p) > chainDepth {
					p = append(p[:chainDepth:chainDepth], ChainHop{Group: "[deeper]"})
				}
				out = append(out, share{p, f * sh.frac})
			}
		}
	}
	return out
}

// prune merges equal paths and keeps the chainPaths largest, folding the
// rest into one [other paths] share.
func prune(in []share) []share {
	byPath := map[string]*share{}
	var order []string
	for _, sh := range in {
		k := pathString(sh.path)
		if x, ok := byPath[k]; ok {
			x.frac += sh.frac
			continue
		}
		sh := sh
		byPath[k] = &sh
		order = append(order, k)
	}
	out := make([]share, 0, len(order))
	for _, k := range order {
		out = append(out, *byPath[k])
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].frac > out[j].frac })
	if len(out) > chainPaths {
		rest := 0.0
		for _, sh := range out[chainPaths:] {
			rest += sh.frac
		}
		out = append(out[:chainPaths], share{[]ChainHop{{Group: "[other paths]"}}, rest})
	}
	return out
}

func (c *chainer) first(s *Stack) string {
	f, ok := c.firsts[s]
	if !ok {
		f = c.r.Categorize(s)[0]
		c.firsts[s] = f
	}
	return f
}

// hop is what a thread was doing in one of its waits.
func (c *chainer) hop(w *Stack) ChainHop {
	h, ok := c.hops[w]
	if !ok {
		h = ChainHop{Group: schema.ThreadGroup(w.Thread), Category: c.first(w), Frame: c.r.InnermostApp(w)}
		c.hops[w] = h
	}
	return h
}

// pathString renders a path: group (category, frame) → ...
func pathString(p []ChainHop) string {
	var parts []string
	for _, h := range p {
		s := h.Group
		if h.Category != "" {
			s += " (" + h.Category
			if h.Frame != "" {
				s += ", " + schema.ShortFunc(h.Frame)
			}
			s += ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " → ")
}
