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
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/goccy/go-yaml"

	"github.com/offcpu/offcpu/agent"
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
	// The flight recorder: how long it keeps, in how many bytes at most,
	// where and when it writes timelines.
	flight       time.Duration
	flightBytes  string
	flightDir    string
	flightSocket string
	triggers     []string
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
	cmd.DurationVar(&a.flight, "flight-recorder", 0, "continuous: keep every wait of the last this long (e.g. 10s) and write it as a Perfetto timeline on SIGUSR2, on a connection to --flight-socket, or when a --timeline-trigger request is slow")
	cmd.StringVar(&a.flightBytes, "flight-recorder-bytes", "64MiB", "continuous: memory the flight recorder's waits may take (packed, some 35 bytes each), the oldest dropped first (counted as lost)")
	cmd.StringVar(&a.flightDir, "flight-dir", "", "continuous: where the flight recorder writes timeline-TIME.pftrace.gz or timeline-TRACE-SPAN.pftrace.gz (default: --output-dir, else the current directory)")
	cmd.StringVar(&a.flightSocket, "flight-socket", "", "continuous: a unix socket; each connection has the flight recorder write a timeline, and reads back its path")
	cmd.StringSliceVar(&a.triggers, "timeline-trigger", nil, "continuous: write a request's timeline when its waits that carry LABEL=VALUE span more than DURATION, e.g. 'http.route=/checkout>200ms' (repeatable; needs --flight-recorder)")
	cmd.DurationVar(&a.shutdown, "shutdown-timeout", 10*time.Second, "continuous: on SIGTERM or Ctrl-C, how long queued intervals may still be sent")
}

func (a *agentFlags) resolve() (*agent.Settings, error) {
	cfg := a.otlp
	cfg.Headers = map[string]string{}
	for _, h := range a.headers {
		k, v, ok := strings.Cut(h, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--otlp-header %q: write KEY=VALUE", h)
		}
		cfg.Headers[k] = v
	}
	s := &agent.Settings{OutputDir: a.outputDir, Keep: a.keep}
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
		s.OTLP = &cfg
	}
	if ra := os.Getenv("OTEL_RESOURCE_ATTRIBUTES"); ra != "" {
		var err error
		if s.Resource, err = otlp.ParseKeyValues(ra); err != nil {
			return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %v", err)
		}
	}
	if s.OTLP == nil && s.OutputDir == "" {
		return nil, errors.New("--continuous needs somewhere to send the profiles: --output-dir DIR and/or --otlp-endpoint HOST:PORT (or OTEL_EXPORTER_OTLP_ENDPOINT)")
	}
	if s.Keep < 0 {
		return nil, fmt.Errorf("--keep %d: give 0 (keep all) or more", s.Keep)
	}
	if s.OutputDir != "" {
		if err := os.MkdirAll(s.OutputDir, 0o755); err != nil {
			return nil, fmt.Errorf("--output-dir: %w", err)
		}
		if err := checkWritable(filepath.Join(s.OutputDir, ".offcpu-check")); err != nil {
			return nil, err
		}
	}
	rules, err := analysis.LoadRules(rulesPath)
	if err != nil {
		return nil, err
	}
	s.Rules = rules
	return s, nil
}

// applyConfig reads the --config file over what the flags say.
func (a *agentFlags) applyConfig(cfg *otlp.Config, s *agent.Settings, rulesPath *string) error {
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
		s.OutputDir = *c.OutputDir
	}
	if c.Keep != nil {
		s.Keep = *c.Keep
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

// runContinuous records until stopped, cutting an interval every
// --interval.
// newAgent makes the agent the flags ask for, its flight recorder
// started; stop stops the flight recorder's signal.
func (af *agentFlags) newAgent(stderr io.Writer, quiet bool, opts *collector.Options) (ag *agent.Agent, stop func(), err error) {
	if af.interval < 100*time.Millisecond {
		return nil, nil, fmt.Errorf("--interval %v is too short: give at least 100ms", af.interval)
	}
	set, err := af.resolve()
	if err != nil {
		return nil, nil, err
	}
	limit, err := parseBytes("--memory-limit", af.memLimit)
	if err != nil {
		return nil, nil, err
	}
	flight, err := af.flightRecorder(opts, set.OutputDir)
	if err != nil {
		return nil, nil, err
	}
	if ag, err = agent.New(stderr, quiet, set, version, agent.TuneMemory(limit)); err != nil {
		return nil, nil, err
	}
	stop = func() {}
	if flight != nil {
		if stop, err = af.startFlight(ag, flight); err != nil {
			ag.Close(0)
			return nil, nil, err
		}
	}
	return ag, stop, nil
}

func runContinuous(stderr io.Writer, f *recordFlags, opts collector.Options, command []string) error {
	af := &f.agent
	ag, stopFlight, err := af.newAgent(stderr, f.quiet, &opts)
	if err != nil {
		return err
	}
	defer stopFlight()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	if af.debugAddr != "" {
		if err := serveDebug(af.debugAddr); err != nil {
			ag.Close(0)
			return err
		}
	}
	opts.Continuous = true
	opts.ExcludeSelf = true // its cuts would record themselves
	sess, err := collector.Start(ctx, opts)
	if err != nil {
		ag.Close(0)
		return err
	}
	child, cmdDone, err := startCommand(sess, command)
	if err != nil {
		ag.Close(0)
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
	cmdEnded, snapErr := ag.CutEvery(sess, af.interval, af.resolve, hup, ended)
	cancel()
	if snapErr != nil {
		cmdEnded = <-ended
	}
	_, stopErr := sess.Stop()
	if iv := sess.FinalInterval(); iv != nil {
		ag.Handle(iv)
	}
	ag.Close(af.shutdown)
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

func printAgentSummary(w io.Writer, st collector.Stats, ag *agent.Agent) {
	fmt.Fprintf(w, "offcpu: %d intervals over %v (%s): %d off-CPU intervals, %v off-CPU (%v waiting for a CPU), %d wake-ups; losses %d\n",
		ag.Intervals(), st.Duration.Round(time.Millisecond), st.Attach, st.Intervals, st.OffCPU.Round(time.Millisecond),
		st.RunQueue.Round(time.Millisecond), st.Wakeups, st.Lost())
	if st.StacksMissing > 0 {
		fmt.Fprintf(w, "offcpu: %d stacks were evicted while still needed: their intervals were kept without them\n", st.StacksMissing)
	}
	printRuntimes(w, st)
	ag.Summary(w)
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

// flightRecorder sets up the flight recorder the flags ask for (nil:
// none) and turns the stream on in opts.
func (a *agentFlags) flightRecorder(opts *collector.Options, outputDir string) (*agent.Flight, error) {
	if a.flight == 0 {
		if a.flightSocket != "" || len(a.triggers) > 0 || a.flightDir != "" {
			return nil, fmt.Errorf("--flight-socket, --flight-dir and --timeline-trigger need --flight-recorder DURATION")
		}
		return nil, nil
	}
	if a.flight < time.Second {
		return nil, fmt.Errorf("--flight-recorder %v: keep at least 1s", a.flight)
	}
	n, err := parseBytes("--flight-recorder-bytes", a.flightBytes)
	if err != nil {
		return nil, err
	}
	f := &agent.Flight{Dir: a.flightDir, Keep: a.flight}
	if f.Dir == "" {
		f.Dir = outputDir
	}
	if f.Dir == "" {
		f.Dir = "."
	}
	if err := checkWritable(filepath.Join(f.Dir, ".offcpu-check")); err != nil {
		return nil, err
	}
	for _, s := range a.triggers {
		tr, err := agent.ParseTrigger(s)
		if err != nil {
			return nil, fmt.Errorf("--timeline-trigger: %w", err)
		}
		f.Triggers = append(f.Triggers, tr)
	}
	opts.Stream, opts.StreamKeep, opts.StreamKeepBytes = true, a.flight, int(min(n, 1<<40))
	return f, nil
}

// startFlight hands the agent its flight recorder, asked by SIGUSR2 and
// on --flight-socket; stop stops the signal's delivery.
func (a *agentFlags) startFlight(ag *agent.Agent, flight *agent.Flight) (stop func(), err error) {
	usr2 := make(chan os.Signal, 1)
	signal.Notify(usr2, syscall.SIGUSR2)
	flight.Signal = usr2
	if a.flightSocket != "" {
		if err := flight.Listen(a.flightSocket); err != nil {
			signal.Stop(usr2)
			return nil, err
		}
	}
	ag.Flight = flight
	return func() { signal.Stop(usr2) }, nil
}
