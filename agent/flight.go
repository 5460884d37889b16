package agent

import (
	"compress/gzip"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/collector"
	"github.com/offcpu/offcpu/internal/output"
	"github.com/offcpu/offcpu/otlp"
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
	// Judge gives the waits their verdicts (nil: by the last interval's
	// profile, which the agent hands over as it cuts).
	Judge func(*schema.Timeline)
	// Signal asks for a timeline (SIGUSR2).
	Signal <-chan os.Signal

	asks    chan chan string
	dumped  map[string]bool // requests written already, by trace and span
	scanned uint64          // CLOCK_MONOTONIC ns of the last trigger scan
	// written: timelines written since the last interval's export.
	written []string
	// busy: a timeline is being written; results: each one written.
	busy    bool
	results chan *dump

	// last: the last interval's off-CPU profile and the rules, which
	// judge a dump's waits (the interval being recorded is not cut yet).
	mu    sync.Mutex
	last  *profile.Profile
	rules *analysis.Rules
}

// observe keeps an interval's profile to judge the next dumps by.
func (f *Flight) observe(p *profile.Profile, r otlp.Categorizer) {
	rules, _ := r.(*analysis.Rules)
	f.mu.Lock()
	defer f.mu.Unlock()
	if p != nil {
		f.last, f.rules = p, rules
	}
}

// judge gives t's waits the category and verdict their stacks had in the
// last interval; it says why not where it cannot.
func (f *Flight) judge(t *schema.Timeline) string {
	if f.Judge != nil {
		f.Judge(t)
		return ""
	}
	f.mu.Lock()
	p, r := f.last, f.rules
	f.mu.Unlock()
	if p == nil || r == nil {
		return "; no verdicts: no interval cut yet"
	}
	d, err := schema.FromProfile(p)
	if err != nil {
		return "; no verdicts: " + err.Error()
	}
	analysis.JudgeTimeline(t, d, r)
	return ""
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
		f.results = make(chan *dump, 1)
		f.dumped = map[string]bool{}
	}
}

// dump is one timeline being written beside the agent's loop.
type dump struct {
	name     string
	from, to uint64
	ask      chan string // a socket's ask, answered with the path
	// trigger: what the triggers caught (empty: asked for).
	trigger   string
	firstEnd  uint64
	path, msg string
	err       error
}

// start writes d beside the loop, one at a time: a cut waits only while
// the timeline is built from the maps, not while it is encoded. A second
// ask while one is written is answered at once.
func (f *Flight) start(sess *collector.Session, d *dump) []string {
	if f.busy {
		if d.ask != nil {
			d.ask <- "error: a timeline is being written: ask again"
		}
		return []string{"flight recorder: a timeline is being written; " + d.name + " not written"}
	}
	f.busy = true
	go func() {
		d.path, d.msg, d.err = f.write(sess, d.name, d.from, d.to)
		f.results <- d
	}()
	return nil
}

// write builds and writes the timeline of [from, to] (0, 0: all it
// keeps) as Dir/timeline-NAME.pftrace.gz; msg says what it held.
func (f *Flight) write(sess *collector.Session, name string, from, to uint64) (path, msg string, err error) {
	began := time.Now()
	kept, _, _ := sess.FlightKept()
	defer roomFor(kept)()
	t, err := sess.FlightTimeline(from, to)
	if err != nil {
		return "", "", err
	}
	judged := f.judge(t)
	// Gzipped: a tenth of the size (Perfetto's UI and trace_processor
	// read it so).
	path = filepath.Join(f.Dir, "timeline-"+name+".pftrace.gz")
	err = output.WriteFile(path, func(w io.Writer) error {
		zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed) // a third of the default's CPU, a little larger
		if err := timeline.WritePerfetto(zw, t, timeline.Options{Name: "offcpu flight recorder"}); err != nil {
			return err
		}
		return zw.Close()
	})
	_, ring, over := sess.FlightKept()
	msg = fmt.Sprintf("%d waits over %v, written in %v; since the start %d lost by the kernel's ring, %d dropped beyond --flight-recorder-bytes%s",
		len(t.Waits), time.Duration(t.End-t.Start).Round(time.Millisecond), time.Since(began).Round(time.Millisecond), ring, over, judged)
	return path, msg, err
}

// dumpBytesPerWait is what a dump holds of a wait while it is built and
// written: its schema.Wait, its share of stacks and labels.
const dumpBytesPerWait = 160

// roomFor raises the Go memory limit, if one is set, by what a dump of n
// waits holds, until the returned func restores it: over the limit the
// collector would take half the CPU (its limiter's cap) from the stream's
// reader, which must keep emptying the kernel's ring meanwhile.
func roomFor(n int) func() {
	old := debug.SetMemoryLimit(-1)
	if old == math.MaxInt64 || n == 0 {
		return func() {}
	}
	debug.SetMemoryLimit(old + int64(n)*dumpBytesPerWait)
	return func() { debug.SetMemoryLimit(old) }
}

// finish reports a written timeline, in the agent's loop.
func (f *Flight) finish(d *dump) []string {
	f.busy = false
	if d.err != nil {
		if d.ask != nil {
			d.ask <- "error: " + d.err.Error()
		}
		return []string{"flight recorder: " + d.name + ": " + d.err.Error()}
	}
	f.written = append(f.written, d.path)
	if d.ask != nil {
		d.ask <- d.path
	}
	if d.trigger != "" {
		return []string{fmt.Sprintf("trigger: %s: wrote %s (%s) %v after the first one's last wait", d.trigger, d.path, d.msg,
			time.Duration(monotonicNow()-d.firstEnd).Round(time.Millisecond))}
	}
	return []string{fmt.Sprintf("flight recorder: wrote %s (%s)", d.path, d.msg)}
}

// check writes one timeline of the requests the triggers caught since
// the last scan (each request once), named by the first one's trace and
// span, from 100ms before the first began.
func (f *Flight) check(sess *collector.Session, now uint64) []string {
	if f.busy {
		return nil // scanned again once it is written
	}
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
	return f.start(sess, &dump{name: sanitize(name), from: from - min(from, uint64(100*time.Millisecond)), to: now,
		trigger: fmt.Sprintf("%d slow requests (the longest %v)", len(caught), longest.Round(time.Microsecond)), firstEnd: first.End})
}

// serve runs one round of the flight recorder in the agent's loop: a
// signal or a socket's ask, or a trigger scan (tick). It returns what
// to say.
func (f *Flight) serve(sess *collector.Session, sig bool, ask chan string, tick bool) []string {
	switch {
	case sig || ask != nil:
		return f.start(sess, &dump{name: time.Now().UTC().Format("20060102T150405.000Z"), ask: ask})
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
