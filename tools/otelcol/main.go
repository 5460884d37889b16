// Command offcpu-otelcol is an OpenTelemetry Collector built from the
// Collector's own modules at one release, for offcpu's export tests and
// for trying the export by hand: the OTLP receiver, the debug exporter,
// and a capture exporter that writes every profiles message it receives
// to a directory (one OTLP protobuf file each). It is a module of its own
// so that the offcpu binary does not carry the collector.
//
//	offcpu-otelcol --config collector.yaml --feature-gates=service.profilesSupport
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/confmap/provider/fileprovider"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/debugexporter"
	"go.opentelemetry.io/collector/exporter/exporterhelper/xexporterhelper"
	"go.opentelemetry.io/collector/exporter/xexporter"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/pdata/pprofile"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/service/telemetry/otelconftelemetry"
)

func main() {
	set := otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{Command: "offcpu-otelcol", Description: "OpenTelemetry Collector for offcpu's profiles", Version: "0.165.0"},
		Factories: components,
		ConfigProviderSettings: otelcol.ConfigProviderSettings{ResolverSettings: confmap.ResolverSettings{
			ProviderFactories: []confmap.ProviderFactory{fileprovider.NewFactory()},
			DefaultScheme:     "file",
		}},
	}
	if err := otelcol.NewCommand(set).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func components() (otelcol.Factories, error) {
	f := otelcol.Factories{Telemetry: otelconftelemetry.NewFactory()}
	var err error
	if f.Receivers, err = otelcol.MakeFactoryMap[receiver.Factory](otlpreceiver.NewFactory()); err != nil {
		return f, err
	}
	f.Exporters, err = otelcol.MakeFactoryMap[exporter.Factory](debugexporter.NewFactory(), newCaptureFactory())
	return f, err
}

// captureConfig: where the capture exporter writes what it receives.
type captureConfig struct {
	Directory string `mapstructure:"directory"`
}

func (c *captureConfig) Validate() error {
	if c.Directory == "" {
		return fmt.Errorf("capture: directory is required")
	}
	return nil
}

func newCaptureFactory() xexporter.Factory {
	return xexporter.NewFactory(component.MustNewType("capture"),
		func() component.Config { return &captureConfig{} },
		xexporter.WithProfiles(createCapture, component.StabilityLevelDevelopment))
}

func createCapture(ctx context.Context, set exporter.Settings, cfg component.Config) (xexporter.Profiles, error) {
	dir := cfg.(*captureConfig).Directory
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var n atomic.Int64
	var m pprofile.ProtoMarshaler
	push := func(_ context.Context, pd pprofile.Profiles) error {
		b, err := m.MarshalProfiles(pd)
		if err != nil {
			return err
		}
		// Named by arrival, and unique across restarts of the collector.
		path := filepath.Join(dir, fmt.Sprintf("%d-%06d.pb", time.Now().UnixNano(), n.Add(1)))
		if err := os.WriteFile(path+".tmp", b, 0o644); err != nil {
			return err
		}
		return os.Rename(path+".tmp", path)
	}
	return xexporterhelper.NewProfiles(ctx, set, cfg, push)
}
