package analysis

import (
	"sort"
	"strings"
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

// chainDepth bounds how many hops a wait is followed.
const chainDepth = 6

// chainer follows blocked time along the recorder's wait links: a wait's
// waker, and (WakerWaitNs) how long that waker was itself off a CPU in its
// own wait, which is found among the waker's stacks and followed in turn,
// in proportion to their times.
type chainer struct {
	r     *Rules
	waits map[chainKey][]*Stack // a thread's off-CPU stacks by their frames
	roots map[string]*RootCause
}

type chainKey struct {
	pid, tid int64
	frames   string
}

func framesKey(fr []Frame) string {
	var b strings.Builder
	for _, f := range fr {
		b.WriteString(f.Name)
		b.WriteByte(';')
	}
	return b.String()
}

// Chains traces the blocked time with an application frame of the stacks
// to its root causes, largest first (top n).
func Chains(stacks []Stack, r *Rules, wanted func(*Stack) bool, n int) []RootCause {
	c := &chainer{r: r, waits: map[chainKey][]*Stack{}, roots: map[string]*RootCause{}}
	for i := range stacks {
		s := &stacks[i]
		if s.Kind == KindOffCPU && s.TID != 0 {
			k := chainKey{s.PID, s.TID, framesKey(s.Frames)}
			c.waits[k] = append(c.waits[k], s)
		}
	}
	total := map[string]int64{}
	for i := range stacks {
		s := &stacks[i]
		if s.Kind != KindOffCPU || !wanted(s) || !r.AppBlocked(s) {
			continue
		}
		g := ThreadGroup(s.Thread)
		total[g] += s.Value
		c.follow(g, s, float64(s.Value), nil, map[int64]bool{s.TID: true})
	}
	var out []RootCause
	for _, rc := range c.roots {
		if t := total[rc.Waiters]; t > 0 {
			rc.Share = float64(rc.Ns) / float64(t)
		}
		out = append(out, *rc)
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

// follow attributes ns of s's time: the part its waker spent off a CPU
// in its own wait goes down that wait; the rest ends at the waker.
func (c *chainer) follow(waiters string, s *Stack, ns float64, path []ChainHop, seen map[int64]bool) {
	waker := ChainHop{Group: ThreadGroup(s.Waker), Category: "running"}
	switch s.WakerRelation() {
	case "none", "unknown":
		c.root(waiters, append(path, ChainHop{Group: noWaker, Category: c.first(s)}), ns)
		return
	case "interrupt":
		c.root(waiters, append(path, ChainHop{Group: s.Waker, Category: s.Class}), ns)
		return
	}
	chained := 0.0
	if s.Value > 0 {
		chained = ns * float64(min(s.WakerWaitNs, s.Value)) / float64(s.Value)
	}
	if direct := ns - chained; direct > 0 {
		c.root(waiters, append(path, waker), direct)
	}
	if chained <= 0 {
		return
	}
	waits := c.waits[chainKey{s.WakerPID, s.WakerTID, framesKey(s.WakerWaitFrames)}]
	var sum int64
	for _, w := range waits {
		sum += w.Value
	}
	if sum == 0 {
		// Not recorded (outside the recorded set): the chain ends in the
		// waker's wait as its stack reads.
		ws := &Stack{Kind: KindOffCPU, Thread: s.Waker, Frames: s.WakerWaitFrames, State: "sleeping"}
		c.root(waiters, append(path, ChainHop{Group: waker.Group, Category: c.first(ws), Frame: c.r.InnermostApp(ws)}), chained)
		return
	}
	if seen[s.WakerTID] || len(path)+1 >= chainDepth {
		// A cycle (a convoy: threads waiting on each other in turn), or
		// deep enough: the chain ends in the waker's wait, marked so.
		w := waits[0]
		for _, x := range waits {
			if x.Value > w.Value {
				w = x
			}
		}
		end := "[cycle]"
		if !seen[s.WakerTID] {
			end = "[deeper]"
		}
		c.root(waiters, append(path, ChainHop{Group: ThreadGroup(w.Thread), Category: c.first(w), Frame: c.r.InnermostApp(w)}, ChainHop{Group: end}), chained)
		return
	}
	seen[s.WakerTID] = true
	defer delete(seen, s.WakerTID)
	for _, w := range waits {
		part := chained * float64(w.Value) / float64(sum)
		hop := ChainHop{Group: ThreadGroup(w.Thread), Category: c.first(w), Frame: c.r.InnermostApp(w)}
		if w.WaitsForCPU() {
			c.root(waiters, append(path, hop), part)
			continue
		}
		c.follow(waiters, w, part, append(path, hop), seen)
	}
}

func (c *chainer) first(s *Stack) string { return c.r.Categorize(s)[0] }

func (c *chainer) root(waiters string, path []ChainHop, ns float64) {
	p := append([]ChainHop(nil), path...)
	k := waiters + "|" + pathString(p)
	rc := c.roots[k]
	if rc == nil {
		rc = &RootCause{Waiters: waiters, Path: p}
		c.roots[k] = rc
	}
	rc.Ns += int64(ns)
}

// pathString renders a path: group (category, frame) → ...
func pathString(p []ChainHop) string {
	var parts []string
	for _, h := range p {
		s := h.Group
		if h.Category != "" {
			s += " (" + h.Category
			if h.Frame != "" {
				s += ", " + ShortFunc(h.Frame)
			}
			s += ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " → ")
}
