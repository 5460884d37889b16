package otlp

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/pdata/pprofile/pprofileotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Config says where and how profiles are sent.
type Config struct {
	// Endpoint: host:port for gRPC (default port 4317); for HTTP a URL or
	// host:port (default path /v1development/profiles, port 4318).
	Endpoint string `yaml:"endpoint"`
	Protocol string `yaml:"protocol"` // grpc (default) or http
	// Headers are sent with every export (authentication tokens, tenant).
	Headers map[string]string `yaml:"headers"`
	// Insecure sends in clear text; otherwise TLS, verified against the
	// system's roots or CAFile.
	Insecure bool   `yaml:"insecure"`
	CAFile   string `yaml:"ca_file"`
	// Timeout bounds one attempt (default 10s).
	Timeout time.Duration `yaml:"timeout"`
	// QueueSize is how many intervals wait to be sent (default 60); an
	// interval that finds the queue full is dropped, and counted.
	QueueSize int `yaml:"queue_size"`
	// RetryFor is how long an interval is retried before it is dropped
	// (default 5m); retries back off from 1s to 30s.
	RetryFor time.Duration `yaml:"retry_for"`
	// QueueBytes bounds the encoded size of what waits (default 32 MiB):
	// with the collector away, the queue is what grows. An interval that
	// would pass it is dropped, and counted.
	QueueBytes int `yaml:"queue_bytes"`
	// MaxMessageBytes: an interval larger than this is sent in several
	// messages (default 4,000,000: a gRPC receiver refuses more than
	// 4 MiB unless configured otherwise).
	MaxMessageBytes int `yaml:"max_message_bytes"`
}

// DefaultMaxMessageBytes keeps a message under gRPC's default 4 MiB limit.
const DefaultMaxMessageBytes = 4_000_000

// DefaultQueueBytes bounds the export queue's memory.
const DefaultQueueBytes = 32 << 20

// HTTPPath is where an OTLP receiver takes profiles over HTTP.
const HTTPPath = "/v1development/profiles"

func (c Config) withDefaults() Config {
	if c.Protocol == "" {
		c.Protocol = "grpc"
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Second
	}
	if c.QueueSize == 0 {
		c.QueueSize = 60
	}
	if c.RetryFor == 0 {
		c.RetryFor = 5 * time.Minute
	}
	if c.QueueBytes == 0 {
		c.QueueBytes = DefaultQueueBytes
	}
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = DefaultMaxMessageBytes
	}
	return c
}

// MessageLimit is the largest message to send, in bytes.
func (c Config) MessageLimit() int { return c.withDefaults().MaxMessageBytes }

// Check validates a configuration without connecting.
func (c Config) Check() error {
	c = c.withDefaults()
	if c.Endpoint == "" {
		return errors.New("no OTLP endpoint: give --otlp-endpoint host:port")
	}
	if c.Protocol != "grpc" && c.Protocol != "http" {
		return fmt.Errorf("OTLP protocol %q: use grpc or http", c.Protocol)
	}
	if c.QueueSize < 1 || c.Timeout < 0 || c.RetryFor < 0 {
		return errors.New("OTLP queue size must be at least 1, timeout and retry time not negative")
	}
	if c.MaxMessageBytes < 64<<10 {
		return fmt.Errorf("OTLP maximum message size %d: give at least 65536 bytes", c.MaxMessageBytes)
	}
	if c.CAFile != "" {
		if _, err := os.ReadFile(c.CAFile); err != nil {
			return fmt.Errorf("OTLP CA file: %w", err)
		}
	}
	return nil
}

// Stats counts what an exporter did; Dropped* are intervals (and their
// samples) that were never delivered.
type Stats struct {
	Queued, Sent, Dropped      uint64
	Messages                   uint64 // messages delivered: a large interval takes several
	SentSamples, DroppedSample uint64
	Retries                    uint64
	Pending                    int    // in the queue or being sent now
	PendingBytes               int    // their encoded size
	LastError                  string // the last failed attempt's error
}

// item is one interval's messages, encoded: the queue holds a tenth of
// what the messages' objects take.
type item struct {
	parts   [][]byte
	bytes   int
	samples int
	since   time.Time
}

// sender sends one encoded ExportProfilesServiceRequest; retry says
// whether a failure is worth another attempt.
type sender interface {
	send(ctx context.Context, body []byte) (retry bool, err error)
	close()
}

// Exporter sends profiles from a bounded queue on its own goroutine.
type Exporter struct {
	queue chan item
	done  chan struct{}
	stop  chan struct{}

	mu     sync.Mutex
	cfg    Config
	sender sender
	stats  Stats
}

// NewExporter checks cfg and starts sending. No connection is made
// until the first export.
func NewExporter(cfg Config) (*Exporter, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s, err := newSender(cfg)
	if err != nil {
		return nil, err
	}
	e := &Exporter{queue: make(chan item, cfg.QueueSize), done: make(chan struct{}), stop: make(chan struct{}), cfg: cfg, sender: s}
	go e.run()
	return e, nil
}

// Reconfigure switches to a new configuration (endpoint, headers, TLS,
// retry time) for the next attempts; the queue keeps its size.
func (e *Exporter) Reconfigure(cfg Config) error {
	if err := cfg.Check(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	s, err := newSender(cfg)
	if err != nil {
		return err
	}
	e.mu.Lock()
	old := e.sender
	e.cfg, e.sender = cfg, s
	e.mu.Unlock()
	old.close()
	return nil
}

// Enqueue encodes one interval's messages and queues them; it returns
// false, and counts the drop, when the queue is full (in intervals or in
// bytes) or a message cannot be encoded.
func (e *Exporter) Enqueue(parts []pprofile.Profiles, samples int) bool {
	it := item{samples: samples, since: time.Now()}
	for _, p := range parts {
		b, err := pprofileotlp.NewExportRequestFromProfiles(p).MarshalProto()
		if err != nil {
			return e.drop(samples, "encoding the profiles: "+err.Error())
		}
		it.parts = append(it.parts, b)
		it.bytes += len(b)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stats.Pending > 0 && e.stats.PendingBytes+it.bytes > e.cfg.QueueBytes {
		e.dropLocked(samples, fmt.Sprintf("queue full: %d bytes waiting, %d more would pass the queue's %d", e.stats.PendingBytes, it.bytes, e.cfg.QueueBytes))
		return false
	}
	select {
	case e.queue <- it:
		e.stats.Queued++
		e.stats.Pending++
		e.stats.PendingBytes += it.bytes
		return true
	default:
		e.dropLocked(samples, "queue full")
		return false
	}
}

func (e *Exporter) drop(samples int, why string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.dropLocked(samples, why)
	return false
}

func (e *Exporter) dropLocked(samples int, why string) {
	e.stats.Dropped++
	e.stats.DroppedSample += uint64(samples)
	e.stats.LastError = why
}

// Stats returns the counts so far.
func (e *Exporter) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stats
}

// Close sends what is queued until ctx ends; what is left is dropped and
// counted.
func (e *Exporter) Close(ctx context.Context) Stats {
	close(e.queue)
	select {
	case <-e.done:
	case <-ctx.Done():
		close(e.stop)
		<-e.done
	}
	e.mu.Lock()
	e.sender.close()
	e.mu.Unlock()
	return e.Stats()
}

func (e *Exporter) run() {
	defer close(e.done)
	for it := range e.queue {
		ok := e.deliver(it)
		e.mu.Lock()
		e.stats.Pending--
		e.stats.PendingBytes -= it.bytes
		if ok {
			e.stats.Sent++
			e.stats.SentSamples += uint64(it.samples)
		} else {
			e.stats.Dropped++
			e.stats.DroppedSample += uint64(it.samples)
		}
		e.mu.Unlock()
	}
}

// deliver sends an interval's messages in turn. An interval some of whose
// messages could not be sent counts as dropped.
func (e *Exporter) deliver(it item) bool {
	for _, p := range it.parts {
		if !e.deliverOne(p, it.since) {
			return false
		}
		e.mu.Lock()
		e.stats.Messages++
		e.mu.Unlock()
	}
	return true
}

// deliverOne tries until the message is taken, a failure is permanent,
// its interval's retry time is spent or the exporter is stopped.
func (e *Exporter) deliverOne(body []byte, since time.Time) bool {
	backoff := time.Second
	for {
		e.mu.Lock()
		s, cfg := e.sender, e.cfg
		e.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
		retry, err := s.send(ctx, body)
		cancel()
		if err == nil {
			return true
		}
		e.mu.Lock()
		e.stats.LastError = err.Error()
		e.mu.Unlock()
		if !retry || time.Since(since)+backoff > cfg.RetryFor {
			return false
		}
		select {
		case <-time.After(backoff):
		case <-e.stop:
			return false
		}
		e.mu.Lock()
		e.stats.Retries++
		e.mu.Unlock()
		backoff = min(2*backoff, 30*time.Second)
	}
}

func newSender(cfg Config) (sender, error) {
	var tlsCfg *tls.Config
	if !cfg.Insecure {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
		if cfg.CAFile != "" {
			pem, err := os.ReadFile(cfg.CAFile)
			if err != nil {
				return nil, fmt.Errorf("OTLP CA file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("OTLP CA file %s holds no PEM certificate", cfg.CAFile)
			}
			tlsCfg.RootCAs = pool
		}
	}
	if cfg.Protocol == "http" {
		return newHTTPSender(cfg, tlsCfg), nil
	}
	creds := insecure.NewCredentials()
	if tlsCfg != nil {
		creds = credentials.NewTLS(tlsCfg)
	}
	target := cfg.Endpoint
	if !strings.Contains(target, ":") {
		target += ":4317"
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("OTLP gRPC endpoint %s: %w", cfg.Endpoint, err)
	}
	return &grpcSender{conn: conn, md: metadata.New(cfg.Headers)}, nil
}

type grpcSender struct {
	conn *grpc.ClientConn
	md   metadata.MD
}

// exportMethod is the OTLP profiles service's one method.
const exportMethod = "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export"

// rawCodec passes messages already encoded (and the reply undecoded):
// protobuf on the wire either way.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

func (g *grpcSender) send(ctx context.Context, body []byte) (bool, error) {
	if len(g.md) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, g.md)
	}
	var reply []byte
	err := g.conn.Invoke(ctx, exportMethod, &body, &reply, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		switch status.Code(err) {
		case codes.Canceled, codes.DeadlineExceeded, codes.Aborted, codes.OutOfRange, codes.Unavailable, codes.DataLoss, codes.ResourceExhausted:
			return true, err
		}
		return false, err
	}
	resp := pprofileotlp.NewExportResponse()
	if err := resp.UnmarshalProto(reply); err != nil {
		return false, fmt.Errorf("reading the collector's reply: %w", err)
	}
	if ps := resp.PartialSuccess(); ps.RejectedProfiles() > 0 {
		return false, fmt.Errorf("collector rejected %d profiles: %s", ps.RejectedProfiles(), ps.ErrorMessage())
	}
	return false, nil
}

func (g *grpcSender) close() { g.conn.Close() }

type httpSender struct {
	url     string
	client  *http.Client
	headers map[string]string
}

func newHTTPSender(cfg Config, tlsCfg *tls.Config) *httpSender {
	url := cfg.Endpoint
	if !strings.Contains(url, "://") {
		scheme := "https://"
		if cfg.Insecure {
			scheme = "http://"
		}
		host := url
		if !strings.Contains(host, ":") {
			host += ":4318"
		}
		url = scheme + host
	}
	if u, err := neturl.Parse(url); err == nil && (u.Path == "" || u.Path == "/") {
		u.Path = HTTPPath
		url = u.String()
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsCfg
	return &httpSender{url: url, client: &http.Client{Transport: tr}, headers: cfg.Headers}
}

func (h *httpSender) send(ctx context.Context, body []byte) (bool, error) {
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return false, err
	}
	hr.Header.Set("Content-Type", "application/x-protobuf")
	for k, v := range h.headers {
		hr.Header.Set(k, v)
	}
	resp, err := h.client.Do(hr)
	if err != nil {
		return true, err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 == 2 {
		return false, nil
	}
	err = fmt.Errorf("%s: %s %s", h.url, resp.Status, strings.TrimSpace(string(msg)))
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true, err
	}
	return false, err
}

func (h *httpSender) close() { h.client.CloseIdleConnections() }
