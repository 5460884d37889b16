// Package agent is the loop of a continuous recording (offcpu record
// --continuous): it cuts an interval every period, exports it over OTLP
// and writes it to a directory, re-reads its configuration on request,
// and keeps its own memory in bounds. The CLI turns flags into Settings.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"sort"
	"strings"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/collector"
	"github.com/offcpu/offcpu/internal/output"
	"github.com/offcpu/offcpu/otlp"
)

// Settings are what the flags and the configuration file say, resolved.
type Settings struct {
	OTLP      *otlp.Config      // nil: no export
	Resource  map[string]string // OTEL_RESOURCE_ATTRIBUTES
	OutputDir string
	Keep      int // intervals kept in OutputDir (0: all)
	Rules     otlp.Categorizer
}

// Agent handles each interval of a continuous recording.
type Agent struct {
	stderr    io.Writer
	quiet     bool
	set       *Settings
	exporter  *otlp.Exporter
	conv      *otlp.Converter
	procs     *otlp.ProcessCache
	intervals int
	written   int
	failed    int    // intervals not written to OutputDir
	memLimit  uint64 // the Go memory limit in force (0: none)
	// allocsAtGiveBack: the heap's allocations at the last giveBack.
	allocsAtGiveBack uint64
	// Flight: the flight recorder's dumps (nil: none).
	Flight *Flight
}

// New makes an agent; version is the scope version of what it exports,
// memLimit the Go memory limit in force (TuneMemory).
func New(stderr io.Writer, quiet bool, set *Settings, version string, memLimit uint64) (*Agent, error) {
	host, _ := os.Hostname()
	a := &Agent{stderr: stderr, quiet: quiet, set: set, procs: otlp.NewProcessCache(), memLimit: memLimit}
	a.conv = &otlp.Converter{Host: host, Rules: set.Rules, Processes: a.procs.Get, Version: version, Resource: set.Resource}
	if set.OTLP != nil {
		e, err := otlp.NewExporter(*set.OTLP)
		if err != nil {
			return nil, err
		}
		a.exporter = e
		a.conv.MaxBytes = set.OTLP.MessageLimit()
	}
	return a, nil
}

// Reload applies a re-read configuration. The recording itself (targets,
// filters) is not changed: that needs a restart.
func (a *Agent) Reload(set *Settings) error {
	switch {
	case set.OTLP != nil && a.exporter != nil:
		if err := a.exporter.Reconfigure(*set.OTLP); err != nil {
			return err
		}
	case set.OTLP != nil:
		e, err := otlp.NewExporter(*set.OTLP)
		if err != nil {
			return err
		}
		a.exporter = e
	case a.exporter != nil:
		return errors.New("the new configuration has no OTLP endpoint: keeping the old one (restart to stop exporting)")
	}
	a.set = set
	a.conv.Rules, a.conv.Resource = set.Rules, set.Resource
	if set.OTLP != nil {
		a.conv.MaxBytes = set.OTLP.MessageLimit()
	}
	return nil
}

// TimelinesAttribute is the resource attribute of an interval's export
// that lists the flight recorder's timelines written during it.
const TimelinesAttribute = "offcpu.timeline.files"

// Handle exports and writes one interval.
func (a *Agent) Handle(iv *collector.Interval) {
	a.intervals++
	if a.Flight != nil {
		a.Flight.observe(iv.Profile, a.conv.Rules)
	}
	var notes []string
	// Exported first: the messages are encoded and their objects freed
	// before the pprof files are written, which adds the encoder's tables
	// to the profile in memory.
	if a.exporter != nil {
		notes = append(notes, a.export(iv)...)
	}
	if a.set.OutputDir != "" {
		if err := a.WriteInterval(iv); err != nil {
			a.failed++
			notes = append(notes, "not written: "+err.Error())
		} else {
			a.written++
		}
	}
	if !a.quiet {
		fmt.Fprintf(a.stderr, "offcpu: %s; %s\n", iv, strings.Join(notes, "; "))
	}
}

// export converts and queues an interval; it returns what to say of it.
func (a *Agent) export(iv *collector.Interval) []string {
	var notes []string
	var files []string
	if a.Flight != nil {
		if files = a.Flight.takeWritten(); len(files) > 0 {
			// The interval's export says where its timelines are.
			res := maps.Clone(a.conv.Resource)
			defer func(r map[string]string) { a.conv.Resource = r }(a.conv.Resource)
			if res == nil {
				res = map[string]string{}
			}
			res[TimelinesAttribute] = strings.Join(files, ",")
			a.conv.Resource = res
		}
	}
	parts, counts, err := a.conv.Convert(iv.Start, iv.Duration, iv.Profile, iv.Wakeups, iv.Goroutines)
	if counts.Samples == 0 && len(files) > 0 {
		// No sample, no resource to carry them: the next export names them.
		a.Flight.written = append(files, a.Flight.written...)
	}
	switch {
	case err != nil:
		notes = append(notes, "not exported: "+err.Error())
	case !a.exporter.Enqueue(parts, counts.Samples):
		notes = append(notes, "dropped: "+a.exporter.Stats().LastError)
	}
	st := a.exporter.Stats()
	notes = append(notes, fmt.Sprintf("exported %d (%d messages), pending %d, dropped %d", st.Sent, st.Messages, st.Pending, st.Dropped))
	if st.Pending > 0 && st.LastError != "" {
		notes = append(notes, "last error: "+st.LastError)
	}
	a.procs.Prune()
	return notes
}

// WriteInterval writes an interval's profiles to the output directory and
// removes the oldest beyond Keep.
func (a *Agent) WriteInterval(iv *collector.Interval) error {
	base := filepath.Join(a.set.OutputDir, fmt.Sprintf("offcpu-%s-%06d", iv.Start.UTC().Format("20060102T150405.000Z"), iv.Seq))
	if err := writeAtomic(base+".pb.gz", iv.Profile); err != nil {
		return err
	}
	for suffix, p := range map[string]*profile.Profile{".wakeups.pb.gz": iv.Wakeups, ".goroutines.pb.gz": iv.Goroutines} {
		if p != nil {
			if err := writeAtomic(base+suffix, p); err != nil {
				return err
			}
		}
	}
	if a.set.Keep == 0 {
		return nil
	}
	names, err := filepath.Glob(filepath.Join(a.set.OutputDir, "offcpu-*.pb.gz"))
	if err != nil {
		return err
	}
	var mains []string
	for _, n := range names {
		if !strings.HasSuffix(n, ".wakeups.pb.gz") && !strings.HasSuffix(n, ".goroutines.pb.gz") {
			mains = append(mains, n)
		}
	}
	sort.Strings(mains) // the start time leads the name
	for _, old := range mains[:max(0, len(mains)-a.set.Keep)] {
		os.Remove(old)
		os.Remove(strings.TrimSuffix(old, ".pb.gz") + ".wakeups.pb.gz")
		os.Remove(strings.TrimSuffix(old, ".pb.gz") + ".goroutines.pb.gz")
	}
	return nil
}

// writeAtomic writes p next to path and renames it there, so that a
// reader of the directory never sees half a file.
func writeAtomic(path string, p *profile.Profile) error {
	tmp := path + ".tmp"
	if err := output.WriteFile(tmp, p.Write); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// Close flushes the export queue within timeout.
func (a *Agent) Close(timeout time.Duration) {
	if a.exporter == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	a.exporter.Close(ctx)
}

// CutEvery cuts an interval every period and re-reads the configuration
// (resolve) on each hup until ended says the recording ends (whether the
// command did) or a cut fails.
func (a *Agent) CutEvery(sess *collector.Session, period time.Duration, resolve func() (*Settings, error), hup <-chan os.Signal, ended <-chan bool) (cmdEnded bool, err error) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	var sig <-chan os.Signal
	var asks chan chan string
	var scan <-chan time.Time
	var dumped chan *dump
	if f := a.Flight; f != nil {
		f.ensure()
		sig, asks, dumped = f.Signal, f.asks, f.results
		defer func() { // a timeline being written ends before the session
			if f.busy {
				a.say(f.finish(<-f.results))
			}
		}()
		t := time.NewTicker(flightScan)
		defer t.Stop()
		scan = t.C
	}
	for {
		select {
		case <-sig:
			a.say(a.Flight.serve(sess, true, nil, false))
		case ask := <-asks:
			a.say(a.Flight.serve(sess, false, ask, false))
		case <-scan:
			a.say(a.Flight.serve(sess, false, nil, true))
		case d := <-dumped:
			a.say(a.Flight.finish(d))
		case <-tick.C:
			iv, err := sess.Snapshot()
			if err != nil {
				return false, err
			}
			a.Handle(iv)
			iv = nil
			a.giveBack()
		case <-hup:
			set, err := resolve()
			if err == nil {
				err = a.Reload(set)
			}
			if err != nil {
				fmt.Fprintf(a.stderr, "offcpu: configuration not reloaded: %v\n", err)
			} else if !a.quiet {
				fmt.Fprintf(a.stderr, "offcpu: configuration reloaded\n")
			}
		case cmdEnded := <-ended:
			return cmdEnded, nil
		}
	}
}

// say prints the flight recorder's notes.
func (a *Agent) say(notes []string) {
	for _, n := range notes {
		if !a.quiet || strings.HasPrefix(n, "trigger") {
			fmt.Fprintf(a.stderr, "offcpu: %s\n", n)
		}
	}
}

// giveBackAfter: what the cuts allocate before the agent gives its free
// heap back to the system (a collection of the live heap: ~1% of a CPU
// at 10 s intervals on a busy node, where every cut passes it; an idle
// node's cuts take several to).
const giveBackAfter = 32 << 20

// giveBack returns the heap the last cuts used to the system once they
// have allocated giveBackAfter, so that the agent's footprint between
// cuts is what it keeps.
func (a *Agent) giveBack() {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	if n := s[0].Value.Uint64(); n-a.allocsAtGiveBack >= giveBackAfter {
		a.allocsAtGiveBack = n
		debug.FreeOSMemory()
	}
}

// gcPercent: an interval's objects are garbage by the next, so the heap
// may grow a quarter of its live size before a collection (GOGC=25), not
// its whole size, unless GOGC says otherwise.
const gcPercent = 25

// TuneMemory applies limit (bytes, 0: none) unless GOMEMLIMIT is set, and
// the agent's GOGC unless GOGC is; it returns the limit in force.
func TuneMemory(limit uint64) uint64 {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	if os.Getenv("GOMEMLIMIT") != "" {
		return uint64(max(debug.SetMemoryLimit(-1), 0))
	}
	if limit == 0 {
		return 0
	}
	debug.SetMemoryLimit(int64(min(limit, 1<<62)))
	return limit
}

// Summary prints what the agent did: intervals written and exported, its
// memory.
func (a *Agent) Summary(w io.Writer) {
	if a.set.OutputDir != "" {
		fmt.Fprintf(w, "offcpu: wrote %d intervals to %s (%d failed)\n", a.written, a.set.OutputDir, a.failed)
	}
	if a.exporter != nil {
		es := a.exporter.Stats()
		fmt.Fprintf(w, "offcpu: OTLP: %d intervals exported (%d samples, %d messages), %d dropped (%d samples), %d retries\n",
			es.Sent, es.SentSamples, es.Messages, es.Dropped, es.DroppedSample, es.Retries)
		if es.Dropped > 0 && es.LastError != "" {
			fmt.Fprintf(w, "offcpu: OTLP: last error: %s\n", es.LastError)
		}
	}
	fmt.Fprintf(w, "offcpu: memory: %s\n", memorySummary(a.memLimit))
}

// Intervals is how many intervals the agent handled.
func (a *Agent) Intervals() int { return a.intervals }

// memorySummary is the agent's own memory and collection: its peak RSS,
// the Go memory limit and the share of its CPU time the collector took.
func memorySummary(limit uint64) string {
	samples := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}, {Name: "/cpu/classes/total:cpu-seconds"}, {Name: "/cpu/classes/idle:cpu-seconds"}}
	metrics.Read(samples)
	out := "peak RSS " + peakRSS()
	if limit > 0 {
		out += fmt.Sprintf(", Go memory limit %s", humanize.IBytes(limit))
	}
	f := func(i int) float64 {
		if samples[i].Value.Kind() == metrics.KindFloat64 {
			return samples[i].Value.Float64()
		}
		return 0
	}
	if used := f(1) - f(2); used > 0 {
		out += fmt.Sprintf(", garbage collection %.0f%% of the agent's CPU", 100*f(0)/used)
	}
	return out
}

// peakRSS is VmHWM from /proc/self/status.
func peakRSS() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			var kb uint64
			if _, err := fmt.Sscan(v, &kb); err == nil {
				return humanize.IBytes(kb << 10)
			}
		}
	}
	return "unknown"
}
