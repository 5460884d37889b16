package main

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/schema"
)

// criticalPath writes the critical path of a request or of a thread's
// time range in a timeline (record --timeline).
func criticalPath(w io.Writer, f *analyzeFlags, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("--critical-path reads one timeline (offcpu record --timeline FILE)")
	}
	t, err := readTimeline(args[0])
	if err != nil {
		return err
	}
	thread, start, end, err := pathRange(t, f)
	if err != nil {
		return err
	}
	p, err := analysis.FollowCriticalPath(t, thread, start, end)
	if err != nil {
		return err
	}
	return analysis.WriteCriticalPath(w, t, p, f.format)
}

// pathRange is the thread and range --span, --trace or --tid with --from
// and --to pick.
func pathRange(t *schema.Timeline, f *analyzeFlags) (thread int32, start, end int64, err error) {
	if f.span != "" || f.trace != "" {
		return analysis.PathFor(t, f.span, f.trace)
	}
	if f.tid == 0 {
		return 0, 0, 0, fmt.Errorf("--critical-path needs a request: --span ID, --trace ID, or --tid N (with --from and --to)")
	}
	if thread = analysis.ThreadByTID(t, f.tid); thread < 0 {
		return 0, 0, 0, fmt.Errorf("thread %d has no wait in the timeline", f.tid)
	}
	start, end = t.Start, t.End
	if f.from != "" {
		if start, err = timelineTime(t, f.from); err != nil {
			return 0, 0, 0, fmt.Errorf("--from: %w", err)
		}
	}
	if f.to != "" {
		if end, err = timelineTime(t, f.to); err != nil {
			return 0, 0, 0, fmt.Errorf("--to: %w", err)
		}
	}
	return thread, start, end, nil
}

// timelineTime reads a time in a timeline: a duration from its start
// ("1.5s") or CLOCK_MONOTONIC nanoseconds (what a program's own clock
// prints).
func timelineTime(t *schema.Timeline, s string) (int64, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return t.Start + int64(d), nil
	}
	ns, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%q: give a duration from the timeline's start (1.5s) or CLOCK_MONOTONIC ns", s)
	}
	return ns, nil
}
