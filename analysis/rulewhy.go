package analysis

import (
	"fmt"
	"regexp"
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
