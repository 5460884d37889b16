package otlp

import (
	"reflect"
	"testing"
)

func TestFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		want Config
		ok   bool
		err  bool
	}{
		{name: "none", env: map[string]string{}},
		{name: "base URL, http/protobuf by default: the signal's path appended",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"},
			want: Config{Protocol: "http", Endpoint: "http://collector:4318" + HTTPPath, Insecure: true}, ok: true},
		{name: "the signal's own endpoint used as given, headers decoded, a CA",
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://other:4318", "OTEL_EXPORTER_OTLP_PROFILES_ENDPOINT": "https://gw.example/p",
				"OTEL_EXPORTER_OTLP_HEADERS": "x-scope-orgid=fleet, authorization=Bearer%20t0k", "OTEL_EXPORTER_OTLP_CERTIFICATE": "/etc/ca.pem"},
			want: Config{Protocol: "http", Endpoint: "https://gw.example/p", Headers: map[string]string{"x-scope-orgid": "fleet", "authorization": "Bearer t0k"}, CAFile: "/etc/ca.pem"}, ok: true},
		{name: "grpc: host and port, TLS from the scheme",
			env:  map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
			want: Config{Protocol: "grpc", Endpoint: "collector:4317"}, ok: true},
		{name: "http/json is refused", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, err: true},
		{name: "not a URL", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, err: true},
		{name: "bad headers", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_HEADERS": "novalue"}, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, ok, err := FromEnv(func(k string) string { return tc.env[k] })
			if (err != nil) != tc.err {
				t.Fatalf("error %v, want error %v", err, tc.err)
			}
			if ok != tc.ok || !reflect.DeepEqual(c, tc.want) {
				t.Errorf("got %+v (ok %v), want %+v (ok %v)", c, ok, tc.want, tc.ok)
			}
		})
	}
}
