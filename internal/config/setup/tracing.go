package setup

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics/telemetry"
)

// Tracing returns the tracing of a command named service
// ("forgeyard-daemon", "forgeyard-agent"): with telemetry.otlp_endpoint
// set, spans are batched and POSTed as OTLP/HTTP protobuf to
// <endpoint>/v1/traces; otherwise tracing is off (nil exporter: spans are
// non-recording, the peer's trace context still propagates). The caller
// calls Shutdown to flush at exit.
func Tracing(ctx context.Context, t config.Telemetry, service string) (*telemetry.Tracing, error) {
	if t.OTLPEndpoint == "" {
		return telemetry.NewTracing(telemetry.TracingConfig{ServiceName: service}), nil
	}
	u, err := url.Parse(t.OTLPEndpoint)
	if err != nil {
		return nil, fmt.Errorf("telemetry.otlp_endpoint: %w", err)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(u.String()))
	if err != nil {
		return nil, fmt.Errorf("telemetry.otlp_endpoint: %w", err)
	}
	return telemetry.NewTracing(telemetry.TracingConfig{ServiceName: service, Exporter: exp}), nil
}
