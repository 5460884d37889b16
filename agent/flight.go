package agent

import (
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/offcpu/offcpu/collector"
	"github.com/offcpu/offcpu/internal/output"
	"github.com/offcpu/offcpu/schema"
	"github.com/offcpu/offcpu/timeline"
	"golang.org/x/sys/unix"
)

// Flight writes the flight recorder's timeline (the session's last Keep
// of waits) when asked, by a signal or a connection to its socket, and
// when a request is slower than a trigger.
type Flight struct {
	Dir      string
	Keep     time.Duration
	Triggers []Trigger
	// Judge gives the waits their verdicts (nil: none).
	Judge func(*schema.Timeline)
	// Signal asks for a timeline (SIGUSR2).
	Signal <-chan os.Signal

	asks    chan chan string
	dumped  map[string]bool // requests written already, by trace and span
	scanned uint64          // CLOCK_MONOTONIC ns of the last trigger scan
	// written: timelines written since the last interval's export.
	written []string
}

// Trigger writes a request's timeline when its waits with Label=Value
// span more than Over.
type Trigger struct {
	Label, Value string
	Over         time.Duration
}

// flightScan is how often the triggers look at the requests the flight
// recorder holds: a slow request's timeline is written within this and
// the time to write it.
const flightScan = 250 * time.Millisecond

var triggerRE = regexp.MustCompile(`^([^=]+)=(.*)>([0-9.]+[a-zµ]+)$`)

// ParseTrigger reads LABEL=VALUE>DURATION (http.route=/checkout>200ms).
func ParseTrigger(s string) (Trigger, error) {
	m := triggerRE.FindStringSubmatch(s)
	if m == nil {
		return Trigger{}, fmt.Errorf("trigger %q: write LABEL=VALUE>DURATION, e.g. http.route=/checkout>200ms", s)
	}
	d, err := time.ParseDuration(m[3])
	if err != nil || d <= 0 {
		return Trigger{}, fmt.Errorf("trigger %q: %q is not a duration", s, m[3])
	}
	return Trigger{Label: m[1], Value: m[2], Over: d}, nil
}

// Listen serves ask requests on a unix socket: each connection gets a
// timeline written and its path (or "error: ...") back as one line.
func (f *Flight) Listen(path string) error {
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("--flight-socket: %w", err)
	}
	f.ensure()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			reply := make(chan string, 1)
			f.asks <- reply
			fmt.Fprintln(c, <-reply)
			c.Close()
		}
	}()
	return nil
}

func (f *Flight) ensure() {
	if f.asks == nil {
		f.asks = make(chan chan string)
		f.dumped = map[string]bool{}
	}
}

// Dump writes the timeline of [from, to] (0, 0: all it keeps) to Dir
// as timeline-NAME.pftrace.gz and returns the path.
func (f *Flight) Dump(sess *collector.Session, name string, from, to uint64) (string, error) {
	t, err := sess.FlightTimeline(from, to)
	if err != nil {
		return "", err
	}
	if f.Judge != nil {
		f.Judge(t)
	}
	// Gzipped: a tenth of the size (Perfetto's UI and trace_processor
	// read it so).
	path := filepath.Join(f.Dir, "timeline-"+name+".pftrace.gz")
	err = output.WriteFile(path, func(w io.Writer) error {
		zw := gzip.NewWriter(w)
		if err := timeline.WritePerfetto(zw, t, timeline.Options{Name: "offcpu flight recorder"}); err != nil {
			return err
		}
		return zw.Close()
	})
	if err != nil {
		return "", err
	}
	f.written = append(f.written, path)
	return path, nil
}

// check writes one timeline of the requests the triggers caught since
// the last scan (each request once), named by the first one's trace and
// span, from 100ms before the first began.
func (f *Flight) check(sess *collector.Session, now uint64) []string {
	var caught []collector.FlightRequest
	var longest time.Duration
	for _, r := range sess.FlightRequests(f.scanned) {
		for _, tr := range f.Triggers {
			id := r.Labels[schema.LabelTraceID] + "-" + r.Labels[schema.LabelSpanID]
			if r.Labels[tr.Label] != tr.Value || time.Duration(r.End-r.Start) <= tr.Over || f.dumped[id] {
				continue
			}
			f.dumped[id] = true
			caught = append(caught, r)
			longest = max(longest, time.Duration(r.End-r.Start))
		}
	}
	f.scanned = now
	if len(caught) == 0 {
		return nil
	}
	first, from := caught[0], caught[0].Start
	for _, r := range caught {
		from = min(from, r.Start)
	}
	name := strings.Trim(first.Labels[schema.LabelTraceID]+"-"+first.Labels[schema.LabelSpanID], "-")
	if name == "" {
		name = fmt.Sprintf("request-%d", first.Start)
	}
	path, err := f.Dump(sess, sanitize(name), from-min(from, uint64(100*time.Millisecond)), now)
	if err != nil {
		return []string{"trigger: " + err.Error()}
	}
	return []string{fmt.Sprintf("trigger: %d slow requests (the longest %v): wrote %s %v after the first one's last wait", len(caught),
		longest.Round(time.Microsecond), path, time.Duration(monotonicNow()-first.End).Round(time.Millisecond))}
}

// serve runs one round of the flight recorder in the agent's loop: a
// signal or a socket's ask (the path written, or why not), or a trigger
// scan (tick). It returns what to say.
func (f *Flight) serve(sess *collector.Session, sig bool, ask chan string, tick bool) []string {
	switch {
	case sig || ask != nil:
		path, err := f.Dump(sess, time.Now().UTC().Format("20060102T150405.000Z"), 0, 0)
		msg := "wrote " + path
		if err != nil {
			msg = "error: " + err.Error()
		}
		if ask != nil {
			ask <- strings.TrimPrefix(msg, "wrote ")
		}
		return []string{"flight recorder: " + msg}
	case tick && len(f.Triggers) > 0:
		return f.check(sess, monotonicNow())
	}
	return nil
}

// takeWritten returns the timelines written since it was last called.
func (f *Flight) takeWritten() []string {
	w := f.written
	f.written = nil
	return w
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func sanitize(s string) string { return unsafeName.ReplaceAllString(s, "_") }

// monotonicNow is CLOCK_MONOTONIC in ns, the clock of the recorder's waits.
func monotonicNow() uint64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return uint64(ts.Nano())
}
