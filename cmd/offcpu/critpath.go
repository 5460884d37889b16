package main

import (
	"compress/gzip"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/schema"
	"github.com/offcpu/offcpu/timeline"
)

// criticalPath writes the critical path of a request or of a thread's
// time range in a timeline (record --timeline).
func criticalPath(w io.Writer, f *analyzeFlags, args []string) error {
	if len(args) != 1 {
		return fmt.Errorf("--critical-path reads one timeline (offcpu record --timeline FILE)")
	}
	if strings.HasSuffix(f.pathOut, ".json") {
		return fmt.Errorf("--timeline-out %s: the path's track is written to Perfetto traces (.pftrace, .pftrace.gz)", f.pathOut)
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
	if f.pathOut != "" {
		if err := writePathTimeline(f.pathOut, t, p); err != nil {
			return err
		}
	}
	return analysis.WriteCriticalPath(w, t, p, f.format)
}

// writePathTimeline writes the timeline again with the critical path as
// a track of its own: its segments as slices, each followed one holding
// what its waker did meanwhile.
func writePathTimeline(path string, t *schema.Timeline, p *analysis.CriticalPath) error {
	segs := make([]timeline.PathSlice, 0, len(p.Segments))
	for _, s := range p.Segments {
		name := s.Kind + ": " + analysis.ThreadLabel(t, s.Thread)
		if s.Wait >= 0 && s.Kind != analysis.SegRunnable {
			name += ": " + analysis.StackLeaf(t, t.Waits[s.Wait].Stack)
		}
		segs = append(segs, timeline.PathSlice{Start: s.Start, End: s.End, Depth: s.Depth, Name: name})
	}
	title := "critical path of " + analysis.ThreadLabel(t, p.Thread)
	return writeFile(path, func(w io.Writer) error {
		zw := io.Writer(w)
		var gz *gzip.Writer
		if strings.HasSuffix(path, ".gz") {
			gz = gzip.NewWriter(w)
			zw = gz
		}
		if err := timeline.WritePerfetto(zw, t, timeline.Options{Name: "offcpu"}); err != nil {
			return err
		}
		if err := timeline.AppendPathTrack(zw, title, segs); err != nil {
			return err
		}
		if gz != nil {
			return gz.Close()
		}
		return nil
	})
}

// pathRange is the thread and range --span, --trace or --tid with --from
// and --to pick.
func pathRange(t *schema.Timeline, f *analyzeFlags) (thread int32, start, end int64, err error) {
	if f.span != "" || f.trace != "" {
		return analysis.PathFor(t, f.span, f.trace)
	}
	switch {
	case f.tid == 0 && f.goid == 0:
		return 0, 0, 0, fmt.Errorf("--critical-path needs a request: --span ID, --trace ID, or --tid N or --goid N (with --from and --to)")
	case f.tid != 0 && f.goid != 0:
		return 0, 0, 0, fmt.Errorf("give --tid or --goid, not both")
	case f.goid != 0:
		if thread, err = analysis.GoroutineByID(t, f.goid); err != nil {
			return 0, 0, 0, err
		}
	default:
		if thread = analysis.ThreadByTID(t, f.tid); thread < 0 {
			return 0, 0, 0, fmt.Errorf("thread %d has no wait in the timeline", f.tid)
		}
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
