package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"runtime/metrics"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/goccy/go-yaml"
	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/analysis"
	"github.com/offcpu/offcpu/collector"
	"github.com/offcpu/offcpu/otlp"
)

// agentFlags are record's continuous-mode flags.
type agentFlags struct {
	continuous bool
	interval   time.Duration
	outputDir  string
	keep       int
	config     string
	rules      string
	headers    []string
	otlp       otlp.Config
	shutdown   time.Duration
	debugAddr  string
	memLimit   string
	queueBytes string
}

// agentConfig is the --config file, read at the start and on SIGHUP; what
// it sets replaces the flags' values.
type agentConfig struct {
	OTLP      *otlp.Config `yaml:"otlp"`
	OutputDir *string      `yaml:"output_dir"`
	Keep      *int         `yaml:"keep"`
	Rules     *string      `yaml:"rules"`
}

func (a *agentFlags) register(cmd interface {
	BoolVar(*bool, string, bool, string)
	DurationVar(*time.Duration, string, time.Duration, string)
	StringVar(*string, string, string, string)
	IntVar(*int, string, int, string)
	StringSliceVar(*[]string, string, []string, string)
}) {
	cmd.BoolVar(&a.continuous, "continuous", false, "record until stopped, one profile per --interval, to --output-dir and/or an OTLP collector (--otlp-endpoint)")
	cmd.DurationVar(&a.interval, "interval", 10*time.Second, "continuous: length of each profile")
	cmd.StringVar(&a.outputDir, "output-dir", "", "continuous: write each interval's pprof files here (offcpu-TIME-SEQ.pb.gz, .wakeups.pb.gz)")
	cmd.IntVar(&a.keep, "keep", 360, "continuous: intervals kept in --output-dir, the oldest removed (0: all)")
	cmd.StringVar(&a.config, "config", "", "continuous: YAML file with otlp:, output_dir:, keep:, rules:; re-read on SIGHUP")
	cmd.StringVar(&a.rules, "rules", "", "continuous: rules file for the category and verdict attributes (default: the built-in rules)")
	cmd.StringVar(&a.otlp.Endpoint, "otlp-endpoint", "", "continuous: send each interval to this OTLP collector (host:port, or a URL with --otlp-protocol http); without it, OTEL_EXPORTER_OTLP_ENDPOINT and the other OTEL_EXPORTER_OTLP_* variables")
	cmd.StringVar(&a.otlp.Protocol, "otlp-protocol", "grpc", "continuous: grpc or http")
	cmd.StringSliceVar(&a.headers, "otlp-header", nil, "continuous: header KEY=VALUE sent with each export (repeatable)")
	cmd.BoolVar(&a.otlp.Insecure, "otlp-insecure", false, "continuous: send without TLS")
	cmd.StringVar(&a.otlp.CAFile, "otlp-ca", "", "continuous: PEM file of the CA that signed the collector's certificate")
	cmd.IntVar(&a.otlp.QueueSize, "otlp-queue", 60, "continuous: intervals waiting to be sent; one that finds the queue full is dropped (counted)")
	cmd.IntVar(&a.otlp.MaxMessageBytes, "otlp-max-message", otlp.DefaultMaxMessageBytes, "continuous: an interval larger than this many bytes is sent in several messages (a gRPC receiver takes 4 MiB unless told otherwise)")
	cmd.DurationVar(&a.otlp.RetryFor, "otlp-retry", 5*time.Minute, "continuous: how long an interval is retried before it is dropped (counted)")
	cmd.StringVar(&a.debugAddr, "debug-addr", "", "continuous: serve the agent's own Go profiles (/debug/pprof/) on this address, e.g. 127.0.0.1:6060")
	cmd.StringVar(&a.memLimit, "memory-limit", "256MiB", "continuous: the agent's Go memory limit (as GOMEMLIMIT, which wins when set; 0: none): garbage is collected sooner near it")
	cmd.StringVar(&a.queueBytes, "otlp-queue-bytes", "32MiB", "continuous: bytes of encoded intervals waiting to be sent; one that would pass it is dropped (counted)")
	cmd.DurationVar(&a.shutdown, "shutdown-timeout", 10*time.Second, "continuous: on SIGTERM or Ctrl-C, how long queued intervals may still be sent")
}

// settings are what the flags and the --config file say, resolved.
type settings struct {
	otlp      *otlp.Config      // nil: no export
	resource  map[string]string // OTEL_RESOURCE_ATTRIBUTES
	outputDir string
	keep      int
	rules     *analysis.Rules
}

func (a *agentFlags) resolve() (*settings, error) {
	cfg := a.otlp
	cfg.Headers = map[string]string{}
	for _, h := range a.headers {
		k, v, ok := strings.Cut(h, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--otlp-header %q: write KEY=VALUE", h)
		}
		cfg.Headers[k] = v
	}
	s := &settings{outputDir: a.outputDir, keep: a.keep}
	qb, err := parseBytes("--otlp-queue-bytes", a.queueBytes)
	if err != nil {
		return nil, err
	}
	rulesPath := a.rules
	if a.config != "" {
		if err := a.applyConfig(&cfg, s, &rulesPath); err != nil {
			return nil, err
		}
	}
	if cfg.Endpoint == "" {
		// The OpenTelemetry environment, where no flag or --config says.
		env, ok, err := otlp.FromEnv(os.Getenv)
		if err != nil {
			return nil, err
		}
		if ok {
			cfg = env
		}
	}
	if cfg.Endpoint != "" {
		if cfg.QueueBytes == 0 {
			cfg.QueueBytes = int(min(qb, 1<<40))
		}
		if err := cfg.Check(); err != nil {
			return nil, err
		}
		s.otlp = &cfg
	}
	if ra := os.Getenv("OTEL_RESOURCE_ATTRIBUTES"); ra != "" {
		var err error
		if s.resource, err = otlp.ParseKeyValues(ra); err != nil {
			return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %v", err)
		}
	}
	if s.otlp == nil && s.outputDir == "" {
		return nil, errors.New("--continuous needs somewhere to send the profiles: --output-dir DIR and/or --otlp-endpoint HOST:PORT (or OTEL_EXPORTER_OTLP_ENDPOINT)")
	}
	if s.keep < 0 {
		return nil, fmt.Errorf("--keep %d: give 0 (keep all) or more", s.keep)
	}
	if s.outputDir != "" {
		if err := os.MkdirAll(s.outputDir, 0o755); err != nil {
			return nil, fmt.Errorf("--output-dir: %w", err)
		}
		if err := checkWritable(filepath.Join(s.outputDir, ".offcpu-check")); err != nil {
			return nil, err
		}
	}
	if s.rules, err = analysis.LoadRules(rulesPath); err != nil {
		return nil, err
	}
	return s, nil
}

// applyConfig reads the --config file over what the flags say.
func (a *agentFlags) applyConfig(cfg *otlp.Config, s *settings, rulesPath *string) error {
	b, err := os.ReadFile(a.config)
	if err != nil {
		return fmt.Errorf("reading --config: %w", err)
	}
	var c agentConfig
	if err := yaml.UnmarshalWithOptions(b, &c, yaml.Strict()); err != nil {
		return fmt.Errorf("%s: %s", a.config, yaml.FormatError(err, false, true))
	}
	if c.OTLP != nil {
		if c.OTLP.Protocol == "" {
			c.OTLP.Protocol = cfg.Protocol
		}
		*cfg = *c.OTLP
	}
	if c.OutputDir != nil {
		s.outputDir = *c.OutputDir
	}
	if c.Keep != nil {
		s.keep = *c.Keep
	}
	if c.Rules != nil {
		*rulesPath = *c.Rules
	}
	return nil
}

// parseBytes reads a size as GOMEMLIMIT writes it ("160MiB") or in SI
// units ("200MB"); a plain number is bytes.
func parseBytes(flag, v string) (uint64, error) {
	n, err := humanize.ParseBytes(v)
	if err != nil {
		return 0, fmt.Errorf("%s %q: give a size such as 160MiB", flag, v)
	}
	return n, nil
}

// giveBackAfter: what the cuts allocate before the agent gives its free
// heap back to the system (a collection of the live heap: ~1% of a CPU
// at 10 s intervals on a busy node, where every cut passes it; an idle
// node's cuts take several to).
const giveBackAfter = 32 << 20

// giveBack returns the heap the last cuts used to the system once they
// have allocated giveBackAfter, so that the agent's footprint between
// cuts is what it keeps.
func (a *agent) giveBack() {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	if n := s[0].Value.Uint64(); n-a.allocsAtGiveBack >= giveBackAfter {
		a.allocsAtGiveBack = n
		debug.FreeOSMemory()
	}
}

// agentGCPercent: an interval's objects are garbage by the next, so the
// heap may grow a quarter of its live size before a collection (GOGC=25),
// not its whole size, unless GOGC says otherwise.
const agentGCPercent = 25

// tuneMemory applies --memory-limit unless GOMEMLIMIT is set, and the
// agent's GOGC unless GOGC is; it returns the limit in force (0: none).
func tuneMemory(v string) (uint64, error) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(agentGCPercent)
	}
	if os.Getenv("GOMEMLIMIT") != "" {
		return uint64(max(debug.SetMemoryLimit(-1), 0)), nil
	}
	n, err := parseBytes("--memory-limit", v)
	if err != nil || n == 0 {
		return 0, err
	}
	debug.SetMemoryLimit(int64(min(n, 1<<62)))
	return n, nil
}

// agent handles each interval of a continuous recording.
type agent struct {
	stderr    io.Writer
	quiet     bool
	set       *settings
	exporter  *otlp.Exporter
	conv      *otlp.Converter
	procs     *otlp.ProcessCache
	intervals int
	written   int
	failed    int    // intervals not written to --output-dir
	memLimit  uint64 // the Go memory limit in force (0: none)
	// allocsAtGiveBack: the heap's allocations at the last giveBack.
	allocsAtGiveBack uint64
}

func newAgent(stderr io.Writer, quiet bool, set *settings) (*agent, error) {
	host, _ := os.Hostname()
	a := &agent{stderr: stderr, quiet: quiet, set: set, procs: otlp.NewProcessCache()}
	a.conv = &otlp.Converter{Host: host, Rules: set.rules, Processes: a.procs.Get, Version: version, Resource: set.resource}
	if set.otlp != nil {
		e, err := otlp.NewExporter(*set.otlp)
		if err != nil {
			return nil, err
		}
		a.exporter = e
		a.conv.MaxBytes = set.otlp.MessageLimit()
	}
	return a, nil
}

// reload applies a re-read configuration. The recording itself (targets,
// filters) is not changed: that needs a restart.
func (a *agent) reload(set *settings) error {
	switch {
	case set.otlp != nil && a.exporter != nil:
		if err := a.exporter.Reconfigure(*set.otlp); err != nil {
			return err
		}
	case set.otlp != nil:
		e, err := otlp.NewExporter(*set.otlp)
		if err != nil {
			return err
		}
		a.exporter = e
	case a.exporter != nil:
		return errors.New("the new configuration has no OTLP endpoint: keeping the old one (restart to stop exporting)")
	}
	a.set = set
	a.conv.Rules, a.conv.Resource = set.rules, set.resource
	if set.otlp != nil {
		a.conv.MaxBytes = set.otlp.MessageLimit()
	}
	return nil
}

func (a *agent) handle(iv *collector.Interval) {
	a.intervals++
	var notes []string
	// Exported first: the messages are encoded and their objects freed
	// before the pprof files are written, which adds the encoder's tables
	// to the profile in memory.
	if a.exporter != nil {
		notes = append(notes, a.export(iv)...)
	}
	if a.set.outputDir != "" {
		if err := a.writeInterval(iv); err != nil {
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
func (a *agent) export(iv *collector.Interval) []string {
	var notes []string
	parts, counts, err := a.conv.Convert(iv.Start, iv.Duration, iv.Profile, iv.Wakeups)
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

// writeInterval writes an interval's profiles to the output directory and
// removes the oldest beyond --keep.
func (a *agent) writeInterval(iv *collector.Interval) error {
	base := filepath.Join(a.set.outputDir, fmt.Sprintf("offcpu-%s-%06d", iv.Start.UTC().Format("20060102T150405.000Z"), iv.Seq))
	if err := writeAtomic(base+".pb.gz", iv.Profile); err != nil {
		return err
	}
	if iv.Wakeups != nil {
		if err := writeAtomic(base+".wakeups.pb.gz", iv.Wakeups); err != nil {
			return err
		}
	}
	if a.set.keep == 0 {
		return nil
	}
	names, err := filepath.Glob(filepath.Join(a.set.outputDir, "offcpu-*.pb.gz"))
	if err != nil {
		return err
	}
	var mains []string
	for _, n := range names {
		if !strings.HasSuffix(n, ".wakeups.pb.gz") {
			mains = append(mains, n)
		}
	}
	sort.Strings(mains) // the start time leads the name
	for _, old := range mains[:max(0, len(mains)-a.set.keep)] {
		os.Remove(old)
		os.Remove(strings.TrimSuffix(old, ".pb.gz") + ".wakeups.pb.gz")
	}
	return nil
}

// writeAtomic writes p next to path and renames it there, so that a
// reader of the directory never sees half a file.
func writeAtomic(path string, p *profile.Profile) error {
	tmp := path + ".tmp"
	if err := writeProfile(tmp, p); err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

func (a *agent) close(timeout time.Duration) {
	if a.exporter == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	a.exporter.Close(ctx)
}

// runContinuous records until stopped, cutting an interval every
// --interval.
func runContinuous(stderr io.Writer, f *recordFlags, opts collector.Options, command []string) error {
	af := &f.agent
	if af.interval < 100*time.Millisecond {
		return fmt.Errorf("--interval %v is too short: give at least 100ms", af.interval)
	}
	set, err := af.resolve()
	if err != nil {
		return err
	}
	limit, err := tuneMemory(af.memLimit)
	if err != nil {
		return err
	}
	ag, err := newAgent(stderr, f.quiet, set)
	if err != nil {
		return err
	}
	ag.memLimit = limit
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	if af.debugAddr != "" {
		if err := serveDebug(af.debugAddr); err != nil {
			ag.close(0)
			return err
		}
	}
	opts.Continuous = true
	opts.ExcludeSelf = true // its cuts would record themselves
	sess, err := collector.Start(ctx, opts)
	if err != nil {
		ag.close(0)
		return err
	}
	child, cmdDone, err := startCommand(sess, command)
	if err != nil {
		ag.close(0)
		return err
	}
	if !f.quiet {
		fmt.Fprintf(stderr, "offcpu: recording %s continuously, a profile every %v; Ctrl-C or SIGTERM to stop, SIGHUP to re-read the configuration\n",
			describeTargets(f, command), af.interval)
	}
	for _, w := range sess.LoadWarnings() {
		fmt.Fprintf(stderr, "offcpu: warning: %s\n", w)
	}
	// The recording ends as a one-shot one does: Ctrl-C, SIGTERM,
	// --duration, the -p processes' exit or the command's.
	ended := make(chan bool, 1)
	go func() { _, cmdEnded := waitForEnd(ctx, f, cmdDone); ended <- cmdEnded }()
	cmdEnded, snapErr := ag.cutEvery(sess, af, hup, ended)
	cancel()
	if snapErr != nil {
		cmdEnded = <-ended
	}
	_, stopErr := sess.Stop()
	if iv := sess.FinalInterval(); iv != nil {
		ag.handle(iv)
	}
	ag.close(af.shutdown)
	if child != nil && !cmdEnded {
		child.Process.Signal(syscall.SIGTERM)
		<-cmdDone
	}
	if !f.quiet {
		printAgentSummary(stderr, sess.Stats(), ag)
	}
	if snapErr != nil {
		return fmt.Errorf("cutting an interval: %w (the intervals before it were delivered)", snapErr)
	}
	return stopErr
}

// cutEvery cuts an interval every --interval and re-reads the
// configuration on SIGHUP until ended says the recording ends (whether the
// command did) or a cut fails.
func (a *agent) cutEvery(sess *collector.Session, af *agentFlags, hup <-chan os.Signal, ended <-chan bool) (cmdEnded bool, err error) {
	tick := time.NewTicker(af.interval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			iv, err := sess.Snapshot()
			if err != nil {
				return false, err
			}
			a.handle(iv)
			iv = nil
			a.giveBack()
		case <-hup:
			set, err := af.resolve()
			if err == nil {
				err = a.reload(set)
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

func printAgentSummary(w io.Writer, st collector.Stats, ag *agent) {
	fmt.Fprintf(w, "offcpu: %d intervals over %v (%s): %d off-CPU intervals, %v off-CPU (%v waiting for a CPU), %d wake-ups; losses %d\n",
		ag.intervals, st.Duration.Round(time.Millisecond), st.Attach, st.Intervals, st.OffCPU.Round(time.Millisecond),
		st.RunQueue.Round(time.Millisecond), st.Wakeups, st.Lost())
	if st.StacksMissing > 0 {
		fmt.Fprintf(w, "offcpu: %d stacks were evicted while still needed: their intervals were kept without them\n", st.StacksMissing)
	}
	printRuntimes(w, st)
	if ag.set.outputDir != "" {
		fmt.Fprintf(w, "offcpu: wrote %d intervals to %s (%d failed)\n", ag.written, ag.set.outputDir, ag.failed)
	}
	if ag.exporter != nil {
		es := ag.exporter.Stats()
		fmt.Fprintf(w, "offcpu: OTLP: %d intervals exported (%d samples, %d messages), %d dropped (%d samples), %d retries\n",
			es.Sent, es.SentSamples, es.Messages, es.Dropped, es.DroppedSample, es.Retries)
		if es.Dropped > 0 && es.LastError != "" {
			fmt.Fprintf(w, "offcpu: OTLP: last error: %s\n", es.LastError)
		}
	}
	fmt.Fprintf(w, "offcpu: memory: %s\n", memorySummary(ag.memLimit))
}

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

// version is the scope version of exported profiles.
var version = "dev"

// serveDebug serves net/http/pprof's handlers on addr, so that the agent's
// own memory and CPU can be profiled while it runs.
func serveDebug(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--debug-addr: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	go http.Serve(ln, mux)
	return nil
}
