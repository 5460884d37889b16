package analysis

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/offcpu/offcpu/schema"
)

// pathJSON is a critical path as --format json writes it.
type pathJSON struct {
	Thread   string        `json:"thread"`
	TID      int64         `json:"tid"`
	GoID     int64         `json:"goid,omitempty"`
	Start    int64         `json:"start_ns"`
	End      int64         `json:"end_ns"`
	Causes   []causeJSON   `json:"causes"`
	Segments []segmentJSON `json:"segments"`
}

type causeJSON struct {
	Thread   string `json:"thread"`
	TID      int64  `json:"tid"`
	GoID     int64  `json:"goid,omitempty"`
	Kind     string `json:"kind"`
	Ns       int64  `json:"ns"`
	Segments int    `json:"segments"`
	Stack    string `json:"stack,omitempty"`
	Verdict  string `json:"verdict,omitempty"`
}

type segmentJSON struct {
	Depth    int    `json:"depth"`
	Thread   string `json:"thread"`
	TID      int64  `json:"tid"`
	GoID     int64  `json:"goid,omitempty"`
	Kind     string `json:"kind"`
	Start    int64  `json:"start_ns"`
	End      int64  `json:"end_ns"`
	Stack    string `json:"stack,omitempty"`
	Waker    string `json:"waker,omitempty"`
	Class    string `json:"wakeup_class,omitempty"`
	Category string `json:"category,omitempty"`
	Verdict  string `json:"verdict,omitempty"`
	Why      string `json:"why,omitempty"`
}

// WriteCriticalPath writes a critical path as a text table (its causes,
// largest first, then its segments in order) or as JSON.
func WriteCriticalPath(w io.Writer, t *schema.Timeline, p *CriticalPath, format string) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(pathToJSON(t, p))
	case "text", "":
		return writePathText(w, t, p)
	}
	return fmt.Errorf("--format %q: give text or json", format)
}

func pathToJSON(t *schema.Timeline, p *CriticalPath) pathJSON {
	out := pathJSON{Thread: ThreadLabel(t, p.Thread), TID: t.Threads[p.Thread].TID, GoID: t.Threads[p.Thread].GoID, Start: p.Start, End: p.End,
		Causes: []causeJSON{}, Segments: []segmentJSON{}}
	for _, c := range p.Causes(t) {
		cj := causeJSON{Thread: ThreadLabel(t, c.Thread), TID: t.Threads[c.Thread].TID, GoID: t.Threads[c.Thread].GoID, Kind: c.Kind, Ns: c.Ns, Segments: c.Segments, Verdict: c.Verdict}
		if c.Stack > 0 {
			cj.Stack = schema.FoldFrames(t.Stacks[c.Stack])
		}
		out.Causes = append(out.Causes, cj)
	}
	for _, s := range p.Segments {
		sj := segmentJSON{Depth: s.Depth, Thread: ThreadLabel(t, s.Thread), TID: t.Threads[s.Thread].TID, GoID: t.Threads[s.Thread].GoID, Kind: s.Kind, Start: s.Start, End: s.End, Why: s.Why}
		if s.Wait >= 0 {
			wt := &t.Waits[s.Wait]
			sj.Class, sj.Category, sj.Verdict = wt.Class, wt.Category, wt.Verdict
			if s.Kind != SegRunnable && wt.Stack > 0 {
				sj.Stack = schema.FoldFrames(t.Stacks[wt.Stack])
			}
			if wt.Waker >= 0 {
				sj.Waker = ThreadLabel(t, wt.Waker)
			}
		}
		out.Segments = append(out.Segments, sj)
	}
	return out
}

func writePathText(w io.Writer, t *schema.Timeline, p *CriticalPath) error {
	ew := &errWriter{w: w}
	total := p.End - p.Start
	ew.printf("critical path of %s: %v, from %+v into the timeline\n", ThreadLabel(t, p.Thread), time.Duration(total), time.Duration(p.Start-t.Start))
	ew.printf("%7s %12s %9s  %-32s %s\n", "share", "time", "segments", "thread", "what")
	for _, c := range p.Causes(t) {
		what := c.Kind
		if c.Stack > 0 {
			what += ": " + StackLeaf(t, c.Stack)
		}
		if c.Verdict != "" {
			what += " [" + c.Verdict + "]"
		}
		ew.printf("%6.1f%% %12v %9d  %-32s %s\n", 100*float64(c.Ns)/float64(total), time.Duration(c.Ns), c.Segments, ThreadLabel(t, c.Thread), what)
	}
	ew.printf("\nsegments in order (indented: a waker's activity while the thread above waited on it):\n")
	for _, s := range p.Segments {
		what := s.Kind
		if s.Wait >= 0 && s.Kind != SegRunnable {
			wt := &t.Waits[s.Wait]
			what += ": " + StackLeaf(t, wt.Stack)
			if wt.Waker >= 0 {
				what += ", woken by " + ThreadLabel(t, wt.Waker)
			}
		}
		if s.Why != "" {
			what += " (" + s.Why + ")"
		}
		ew.printf("%12v %12v  %*s%s: %s\n", time.Duration(s.Start-p.Start), time.Duration(s.Duration()), 2*s.Depth, "", ThreadLabel(t, s.Thread), what)
	}
	return ew.err
}
