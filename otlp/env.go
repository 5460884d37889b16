package otlp

import (
	"fmt"
	neturl "net/url"
	"strings"
)

// FromEnv reads the OpenTelemetry exporter environment, as the
// specification's "OTLP Exporter Configuration" has it: the profiles
// signal's variables (OTEL_EXPORTER_OTLP_PROFILES_*) before the general
// ones (OTEL_EXPORTER_OTLP_*). ok is false when no endpoint is set. A
// general endpoint is a base URL: for http/protobuf the signal's path is
// appended; a signal's own endpoint is used as given. The protocol
// defaults to http/protobuf, as the specification's does; a gRPC
// endpoint's scheme says whether TLS is used (http: clear text).
func FromEnv(getenv func(string) string) (c Config, ok bool, err error) {
	get := func(name string) (string, bool) {
		if v := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_PROFILES_" + name)); v != "" {
			return v, true
		}
		return strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_" + name)), false
	}
	endpoint, signal := get("ENDPOINT")
	if endpoint == "" {
		return Config{}, false, nil
	}
	protocol, _ := get("PROTOCOL")
	switch protocol {
	case "", "http/protobuf":
		c.Protocol = "http"
	case "grpc":
		c.Protocol = "grpc"
	default:
		return Config{}, false, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: offcpu sends grpc or http/protobuf", protocol)
	}
	u, perr := neturl.Parse(endpoint)
	if perr != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return Config{}, false, fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT %q: give a URL such as http://collector:4318", endpoint)
	}
	c.Insecure = u.Scheme == "http"
	if insecure, _ := get("INSECURE"); strings.EqualFold(insecure, "true") {
		c.Insecure = true
	}
	switch {
	case c.Protocol == "grpc":
		c.Endpoint = u.Host
	case signal:
		c.Endpoint = u.String()
	default:
		u.Path = strings.TrimSuffix(u.Path, "/") + HTTPPath
		c.Endpoint = u.String()
	}
	if h, _ := get("HEADERS"); h != "" {
		if c.Headers, err = ParseKeyValues(h); err != nil {
			return Config{}, false, fmt.Errorf("OTEL_EXPORTER_OTLP_HEADERS: %v", err)
		}
	}
	c.CAFile, _ = get("CERTIFICATE")
	return c, true, nil
}

// ParseKeyValues reads the W3C Baggage-like lists the OpenTelemetry
// environment uses (OTEL_EXPORTER_OTLP_HEADERS, OTEL_RESOURCE_ATTRIBUTES):
// key=value pairs separated by commas, values percent-encoded.
func ParseKeyValues(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if strings.TrimSpace(kv) == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("%q: write key=value pairs separated by commas", kv)
		}
		dv, err := neturl.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("%q: %v", kv, err)
		}
		out[k] = dv
	}
	return out, nil
}
