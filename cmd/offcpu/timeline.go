package main

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"strings"

	"os"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/collector"
	"github.com/offcpu/offcpu/schema"
	"github.com/offcpu/offcpu/timeline"
)

// timelineFlags: record's every-wait stream and where it goes.
type timelineFlags struct {
	path   string
	ringMB int
}

// options turns the stream on in opts, or says why it cannot be.
func (t *timelineFlags) options(opts *collector.Options, continuous bool) error {
	if t.path == "" {
		return nil
	}
	if continuous {
		return fmt.Errorf("--timeline writes one window: with --continuous, keep the last seconds with --flight-recorder 10s")
	}
	if err := checkWritable(t.path); err != nil {
		return err
	}
	r := t.ringMB << 20
	if t.ringMB < 1 || r&(r-1) != 0 {
		return fmt.Errorf("--timeline-ring %d: give a power of two of MiB (1, 2, 4, ... 1024)", t.ringMB)
	}
	opts.Stream, opts.StreamRing = true, r
	return nil
}

// write judges each wait by the recording's own profile and writes the
// timeline: Perfetto's protobuf, or Chrome's JSON trace events for a
// name ending in .json.
func (t *timelineFlags) write(tl *schema.Timeline, prof *profile.Profile, rulesPath string) error {
	if t.path == "" || tl == nil {
		return nil
	}
	rules, err := analysis.LoadRules(rulesPath)
	if err != nil {
		return err
	}
	if data, err := schema.FromProfile(prof); err == nil {
		analysis.JudgeTimeline(tl, data, rules)
	}
	return writeFile(t.path, func(w io.Writer) error { return writeTimeline(w, t.path, tl) })
}

// writeTimeline writes a timeline as its file's name says: Chrome JSON
// trace events for .json, Perfetto's protobuf otherwise; gzipped for
// .gz (Perfetto's UI and trace_processor read both gzipped).
func writeTimeline(w io.Writer, path string, tl *schema.Timeline) error {
	name := path
	if strings.HasSuffix(path, ".gz") {
		zw := gzip.NewWriter(w)
		defer zw.Close()
		w, name = zw, strings.TrimSuffix(path, ".gz")
	}
	if strings.HasSuffix(name, ".json") {
		return timeline.WriteJSON(w, tl)
	}
	return timeline.WritePerfetto(w, tl, timeline.Options{Name: "offcpu"})
}

// summary is the timeline's line of record's summary.
func (t *timelineFlags) summary(w io.Writer, st collector.Stats) {
	if t.path == "" {
		return
	}
	fmt.Fprintf(w, "timeline: %d waits in order, %d lost (ring full: raise --timeline-ring), written to %s\n", st.StreamWaits, st.StreamLost, t.path)
}

// readTimeline reads a timeline record --timeline wrote, gzipped or not.
func readTimeline(path string) (*schema.Timeline, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		r = zr
	}
	t, err := timeline.ReadPerfetto(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}
