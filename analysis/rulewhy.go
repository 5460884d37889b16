package analysis

import (
	"fmt"
	"regexp"
	"strings"
)

// why names the frame through which a matching rule matched.
func (ru *rule) why(s *Stack) string {
	for _, re := range append(append(append([]*regexp.Regexp{}, ru.frames...), ru.allFrames...), ru.wakerFrames...) {
		if f := matchFrame(s.Frames, []*regexp.Regexp{re}, ru.kernel); f != nil {
			return fmt.Sprintf(": frame %s matches %q", f.Name, re.String())
		}
	}
	switch {
	case ru.wakerClasses != nil:
		return ": by the wake-up class " + s.Class
	case ru.dispatching:
		return ": the waker passed on input from its top of loop (a hand-off)"
	case ru.passedOn:
		return ": its waker had been waiting at this same place, idle, through most of it, and passed the wake-up on (no work handed over)"
	case ru.inTrace:
		return ": it carries its request's trace link (" + s.TraceLink() + ")"
	case ru.loop != nil && s.LoopWhy != "":
		return ": " + s.LoopWhy
	case ru.inRequest && s.InRequestWhy != "":
		return ": " + s.InRequestWhy
	case ru.inRequest:
		return ": a thread serving another program, waiting away from its input waits (inside a request)"
	case ru.waker != nil:
		return ": by who the waker was"
	case ru.states != nil:
		return ": by the thread state " + s.State
	case ru.threads != nil:
		return ": by the thread name " + s.Thread
	case ru.innermostApp != nil:
		return ": by the innermost application frame"
	}
	return ""
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
	if s.LoopWhy != "" {
		out = append(out, "loop: "+s.LoopWhy)
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
	out = append(out, r.explainWaker(s)...)
	if cs := r.Categorize(s); cs[0] != first {
		out = append(out, fmt.Sprintf("the waker disagrees with the waiter's frames (%s is %s, %s is %s): the waker wins", first, idleWord(r.IsIdle(first)), cs[0], idleWord(r.IsIdle(cs[0]))))
		first = cs[0]
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

func idleWord(idle bool) string {
	if idle {
		return "idle"
	}
	return "blocked"
}

// explainWaker tells who ended the wait and which verdict its side
// gives.
func (r *Rules) explainWaker(s *Stack) []string {
	if s.Kind != KindOffCPU || s.WaitsForCPU() {
		return nil
	}
	rel := s.WakerRelation()
	if rel == "none" {
		return []string{"waker: none recorded (not woken inside the window, or wake-ups off)"}
	}
	who := fmt.Sprintf("waker: %s (%s", s.Waker, rel)
	if s.Class != "" {
		who += ", wake-up class " + s.Class
	}
	who += ")"
	out := []string{who}
	if len(s.WakerFrames) > 0 {
		out = append(out, "waker stack: "+(&Stack{Frames: s.WakerFrames}).Folded())
	}
	v := r.verdict(s, r.InnermostApp(s))
	if v == nil {
		return append(out, "no verdict matches the waker")
	}
	return append(out, fmt.Sprintf("verdict %s (%s, %s)%s", v.at, v.category, idleWord(r.IsIdle(v.category)), v.why(&Stack{Frames: s.WakerFrames, Class: s.Class, State: s.State, InRequestWhy: s.InRequestWhy, LoopWhy: s.LoopWhy, Links: s.Links})))
}
