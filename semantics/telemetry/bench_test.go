package telemetry_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
)

// The per-message hot path: no allocation, a few atomic adds.
func BenchmarkMetricsHotPath(b *testing.B) {
	m := telemetry.NewMetrics()
	b.ReportAllocs()
	for b.Loop() {
		m.MessageHandled(wire.FamilyAgent, telemetry.OutcomeOK)
		m.BytesOut(wire.StreamControl, 128)
		m.ObserveHeartbeatRTT(time.Millisecond)
	}
}

func BenchmarkInjectExtract(b *testing.B) {
	tr := telemetry.NewTracing(telemetry.TracingConfig{Exporter: tracetest.NewNoopExporter()})
	defer tr.Shutdown(context.Background())
	ctx, span := tr.Start(context.Background(), telemetry.SpanDispatch)
	defer span.End()
	b.ReportAllocs()
	for b.Loop() {
		tc, _ := telemetry.Inject(ctx)
		_ = telemetry.Extract(context.Background(), tc)
	}
}
