package analysis

import (
	"fmt"
	"hash/maphash"
	"slices"
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
	unrecHops map[unrecKey]ChainHop
	busy      map[*Stack]bool // being worked out: a wait reached again is a cycle
	// Paths are interned (merged and keyed without building their
	// strings): a hop by its text, a path by its first hop and the rest.
	hopIDs  map[ChainHop]int32
	hopText map[string]int32
	pathIDs map[[2]int32]int32
	// downs: the shares of one thread's waits at one place, merged by
	// path, as fractions of their time: the same for every wait they
	// woke (reused while none of them is being worked out: busyKeys).
	downs    map[chainKey][]share
	sums     map[chainKey]int64 // the waits' time
	keys     map[*Stack]chainKey
	busyKeys map[chainKey]int
}

// share is a path from a stack's waker to a root, and the fraction of the
// stack's time that ends there.
type share struct {
	path []ChainHop
	frac float64
	id   int32 // the path's (chainer.intern)
}

// unrecKey is a waker's wait not recorded: its thread group and frames.
type unrecKey struct {
	group  string
	frames uint64
}

// chainKey is one thread's (tid) or one goroutine's (goid) wait.
type chainKey struct {
	pid, tid, goid int64
	frames         uint64
}

func framesKey(fr []Frame) uint64 {
	var h maphash.Hash
	h.SetSeed(framesSeed)
	for _, f := range fr {
		h.WriteString(f.Name)
		h.WriteByte(';')
	}
	return h.Sum64()
}

// framesSeed: frames are told apart by a 64-bit hash of their names (a
// collision among a recording's stacks is about as likely as one in 10^9).
var framesSeed = maphash.MakeSeed()

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
		firsts: map[*Stack]string{}, unrecHops: map[unrecKey]ChainHop{},
		hopIDs: map[ChainHop]int32{}, hopText: map[string]int32{}, pathIDs: map[[2]int32]int32{},
		downs: map[chainKey][]share{}, sums: map[chainKey]int64{}, keys: map[*Stack]chainKey{}, busyKeys: map[chainKey]int{}}
	for i := range stacks {
		s := &stacks[i]
		if s.Kind == KindOffCPU && (s.TID != 0 || s.Goid > 0) {
			k := chainKey{s.PID, s.TID, s.Goid, framesKey(s.Frames)}
			c.waits[k] = append(c.waits[k], s)
			c.keys[s] = k
		}
	}
	type rootKey struct {
		waiters string
		path    int32
	}
	total := map[string]int64{}
	roots := map[rootKey]*RootCause{}
	for i := range stacks {
		s := &stacks[i]
		if s.Kind != KindOffCPU || !wanted(s) || !r.AppBlocked(s) {
			continue
		}
		g := schema.ThreadGroup(s.Thread)
		total[g] += s.Value
		for _, sh := range c.paths(s) {
			k := rootKey{g, sh.id}
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
	k, keyed := c.keys[s]
	if keyed {
		c.busyKeys[k]++
	}
	defer func() {
		delete(c.busy, s)
		if keyed {
			c.busyKeys[k]--
		}
	}()
	var out []share
	add := func(frac float64, path ...ChainHop) {
		if frac > 0 {
			out = append(out, share{path, frac, c.intern(path, -1)})
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
		out = c.prune(out)
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
	out = c.prune(out)
	c.memo[s] = out
	return out
}

// down follows the waker's own wait of s: its stacks of that wait, each
// with its share of frac.
func (c *chainer) down(s *Stack, frac float64) []share {
	var waits []*Stack
	var k chainKey
	switch {
	case s.Goid != 0 && s.WakerGoid > 0: // -1: goroutines merged, not one goroutine's
		k = chainKey{s.WakerPID, 0, s.WakerGoid, framesKey(s.WakerWaitFrames)}
	case s.Goid == 0 && s.WakerTID != 0: // 0: merged with other exited processes, not one thread's
		k = chainKey{s.WakerPID, s.WakerTID, 0, framesKey(s.WakerWaitFrames)}
	}
	waits = c.waits[k]
	sum, ok := c.sums[k]
	if !ok {
		for _, w := range waits {
			sum += w.Value
		}
		c.sums[k] = sum
	}
	if sum == 0 {
		// Not recorded (outside the recorded set): the chain ends in the
		// waker's wait as its stack reads.
		k := unrecKey{schema.ThreadGroup(s.Waker), framesKey(s.WakerWaitFrames)}
		h, ok := c.unrecHops[k]
		if !ok {
			ws := &Stack{Kind: KindOffCPU, Thread: s.Waker, Frames: s.WakerWaitFrames, State: "sleeping"}
			h = ChainHop{Group: k.group, Category: c.r.Categorize(ws)[0], Frame: c.r.InnermostApp(ws)}
			c.unrecHops[k] = h
		}
		return []share{{[]ChainHop{h}, frac, c.intern([]ChainHop{h}, -1)}}
	}
	whole, ok := c.downs[k]
	if !ok || c.busyKeys[k] > 0 {
		whole = c.downWaits(waits, sum)
		if c.busyKeys[k] == 0 {
			c.downs[k] = whole
		}
	}
	out := make([]share, len(whole))
	for i, sh := range whole {
		out[i] = share{sh.path, frac * sh.frac, sh.id}
	}
	return out
}

// downWaits are the shares of waits (sum: their time), merged by path, in
// the order first met.
func (c *chainer) downWaits(waits []*Stack, sum int64) []share {
	var out []share
	at := map[int32]int{}
	put := func(sh share) {
		if i, ok := at[sh.id]; ok {
			out[i].frac += sh.frac
			return
		}
		at[sh.id] = len(out)
		out = append(out, sh)
	}
	for _, w := range waits {
		f := float64(w.Value) / float64(sum)
		hop := c.hop(w)
		switch {
		case w.WaitsForCPU():
			put(share{[]ChainHop{hop}, f, c.intern([]ChainHop{hop}, -1)})
		case c.busy[w]:
			// A convoy: threads waiting on each other in turn.
			p := []ChainHop{hop, {Group: "[cycle]"}}
			put(share{p, f, c.intern(p, -1)})
		default:
			for _, sh := range c.paths(w) {
				id := c.intern([]ChainHop{hop}, sh.id)
				if _, ok := at[id]; ok {
					out[at[id]].frac += f * sh.frac
					continue
				}
				p := append([]ChainHop{hop}, sh.path...)
				if len(p) > chainDepth {
					p = append(p[:chainDepth:chainDepth], ChainHop{Group: "[deeper]"})
					id = c.intern(p, -1)
				}
				put(share{p, f * sh.frac, id})
			}
		}
	}
	return out
}

// intern is the id of path followed by the path rest (-1: none); paths
// whose text is the same (pathString) have the same id.
func (c *chainer) intern(path []ChainHop, rest int32) int32 {
	id := rest
	for i := len(path) - 1; i >= 0; i-- {
		h, ok := c.hopIDs[path[i]]
		if !ok {
			text := pathString(path[i : i+1])
			if h, ok = c.hopText[text]; !ok {
				h = int32(len(c.hopText))
				c.hopText[text] = h
			}
			c.hopIDs[path[i]] = h
		}
		k := [2]int32{h, id}
		if id, ok = c.pathIDs[k]; !ok {
			id = int32(len(c.pathIDs))
			c.pathIDs[k] = id
		}
	}
	return id
}

// prune merges equal paths and keeps the chainPaths largest, folding the
// rest into one [other paths] share.
func (c *chainer) prune(in []share) []share {
	out := make([]share, 0, len(in))
	var at map[int32]int // for many paths; a scan for a few
	if len(in) > 16 {
		at = make(map[int32]int, len(in))
	}
	for _, sh := range in {
		i := -1
		if at != nil {
			if j, ok := at[sh.id]; ok {
				i = j
			}
		} else {
			i = slices.IndexFunc(out, func(o share) bool { return o.id == sh.id })
		}
		if i >= 0 {
			out[i].frac += sh.frac
			continue
		}
		if at != nil {
			at[sh.id] = len(out)
		}
		out = append(out, sh)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].frac > out[j].frac })
	if len(out) > chainPaths {
		rest := 0.0
		for _, sh := range out[chainPaths:] {
			rest += sh.frac
		}
		other := []ChainHop{{Group: "[other paths]"}}
		out = append(out[:chainPaths], share{other, rest, c.intern(other, -1)})
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
