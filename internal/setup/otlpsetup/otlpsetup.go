// Package otlpsetup builds a command's tracing from its [telemetry]
// section: the OTLP/HTTP exporter when telemetry.otlp_endpoint is set.
// The daemon and the agent use it; the relay has no tracing and does not
// link the exporter.
package otlpsetup

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

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

// FlushTimeout bounds Flush: the collector may be gone at exit.
const FlushTimeout = 5 * time.Second

// Flush shuts t down, exporting the last spans, waiting at most
// FlushTimeout. Commands defer it right after Tracing.
func Flush(t *telemetry.Tracing) {
	ctx, cancel := context.WithTimeout(context.Background(), FlushTimeout)
	defer cancel()
	_ = t.Shutdown(ctx)
}
