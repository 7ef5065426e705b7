package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/oklog/ulid/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/registry"
)

func TestSpanNames(t *testing.T) {
	want := []string{"transport.connect", "transport.handshake", "protocol.negotiate", "agent.register",
		"lease.dispatch", "lease.ack", "attempt.complete", "cas.stream", "log.stream", "reconnect.resync"}
	if len(telemetry.SpanNames) != len(want) {
		t.Fatalf("%d span names, want %d", len(telemetry.SpanNames), len(want))
	}
	exp := tracetest.NewInMemoryExporter()
	tr := telemetry.NewTracing(telemetry.TracingConfig{ServiceName: "test", Exporter: exp, Synchronous: true})
	defer tr.Shutdown(context.Background())
	for i, n := range telemetry.SpanNames {
		if string(n) != want[i] {
			t.Errorf("SpanNames[%d] = %q, want %q", i, n, want[i])
		}
		_, s := tr.Start(context.Background(), n)
		s.End()
	}
	spans := exp.GetSpans()
	if len(spans) != len(want) {
		t.Fatalf("exported %d spans, want %d", len(spans), len(want))
	}
	for i, s := range spans {
		if s.Name != want[i] {
			t.Errorf("exported span %d named %q, want %q", i, s.Name, want[i])
		}
	}
}

func sample[T wire.Message](t *testing.T) T {
	t.Helper()
	for _, m := range agentwire.Samples() {
		if v, ok := m.(T); ok {
			return v
		}
	}
	var zero T
	t.Fatalf("no sample %T", zero)
	return zero
}

// roundTrip encodes an envelope carrying ctx's trace context and decodes it
// with the default registry, as a peer would receive it.
func roundTrip(t *testing.T, ctx context.Context, m wire.Message) *wire.Envelope {
	t.Helper()
	env := &wire.Envelope{Protocol: wire.V(1, 0), MessageID: wire.MessageId{ULID: ulid.Make()}, SentAtMs: 1, Payload: m}
	telemetry.InjectEnvelope(ctx, env)
	if !env.HasTrace {
		t.Fatal("InjectEnvelope did not set the trace field under a live span")
	}
	b := env.AppendPostcard(nil)
	got, err := wire.DecodeEnvelope(b, registry.Default)
	if err != nil {
		t.Fatalf("decode %T: %v", m, err)
	}
	if !got.HasTrace || got.Trace != env.Trace {
		t.Fatalf("trace field lost on the wire: sent %+v got %v %+v", env.Trace, got.HasTrace, got.Trace)
	}
	sc := trace.SpanContextFromContext(ctx)
	if want := fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID()); got.Trace.Traceparent() != want {
		t.Fatalf("traceparent %q, want %q", got.Trace.Traceparent(), want)
	}
	return got
}

// TestTraceSpansDaemonAndAgent: lease.dispatch (daemon) → lease.ack (agent)
// → attempt.complete (agent, then daemon) form one trace across two tracer
// providers, the context crossing real encoded envelopes both ways.
func TestTraceSpansDaemonAndAgent(t *testing.T) {
	bg := context.Background()
	dexp, aexp := tracetest.NewInMemoryExporter(), tracetest.NewInMemoryExporter()
	daemon := telemetry.NewTracing(telemetry.TracingConfig{ServiceName: "forgeyard-daemon", Exporter: dexp, Synchronous: true})
	agent := telemetry.NewTracing(telemetry.TracingConfig{ServiceName: "forgeyard-agent", Exporter: aexp, Synchronous: true})
	defer daemon.Shutdown(bg)
	defer agent.Shutdown(bg)

	offer := sample[*agentwire.LeaseOfferV1](t)
	accepted := sample[*agentwire.LeaseAcceptedV1](t)
	completion := sample[*agentwire.AttemptCompletionV1](t)

	// Daemon offers.
	dctx, dispatch := daemon.Start(bg, telemetry.SpanDispatch, telemetry.AttrLease(offer.Lease))
	onAgent := roundTrip(t, dctx, offer)

	// Agent answers under the daemon's span.
	actx, ack := agent.Start(telemetry.ExtractEnvelope(bg, onAgent), telemetry.SpanLeaseAck)
	onDaemon := roundTrip(t, actx, accepted)
	ack.End()
	if got := trace.SpanContextFromContext(telemetry.ExtractEnvelope(bg, onDaemon)); got.SpanID() != ack.SpanContext().SpanID() {
		t.Fatalf("answer carries span %s, want lease.ack %s", got.SpanID(), ack.SpanContext().SpanID())
	}
	dispatch.End()

	// Agent completes the attempt; the daemon handles the completion.
	cctx, acomplete := agent.Start(actx, telemetry.SpanComplete)
	onDaemon = roundTrip(t, cctx, completion)
	_, dcomplete := daemon.Start(telemetry.ExtractEnvelope(bg, onDaemon), telemetry.SpanComplete)
	telemetry.End(dcomplete, nil)
	telemetry.End(acomplete, errors.New("ack late"))

	dspans, aspans := dexp.GetSpans(), aexp.GetSpans()
	if len(dspans) != 2 || len(aspans) != 2 {
		t.Fatalf("daemon exported %d spans, agent %d; want 2 and 2", len(dspans), len(aspans))
	}
	byName := func(spans tracetest.SpanStubs, name string) tracetest.SpanStub {
		for _, s := range spans {
			if s.Name == name {
				return s
			}
		}
		t.Fatalf("no span %s", name)
		return tracetest.SpanStub{}
	}
	dDispatch, dComplete := byName(dspans, "lease.dispatch"), byName(dspans, "attempt.complete")
	aAck, aComplete := byName(aspans, "lease.ack"), byName(aspans, "attempt.complete")

	traceID := dDispatch.SpanContext.TraceID()
	for _, s := range []tracetest.SpanStub{dDispatch, dComplete, aAck, aComplete} {
		if s.SpanContext.TraceID() != traceID {
			t.Errorf("span %s in trace %s, want %s", s.Name, s.SpanContext.TraceID(), traceID)
		}
	}
	links := []struct {
		child, parent tracetest.SpanStub
		remote        bool
	}{
		{aAck, dDispatch, true},
		{aComplete, aAck, false},
		{dComplete, aComplete, true},
	}
	for _, l := range links {
		if l.child.Parent.SpanID() != l.parent.SpanContext.SpanID() {
			t.Errorf("%s (%s) parent %s, want %s %s", l.child.Name, svc(l.child), l.child.Parent.SpanID(), l.parent.Name, l.parent.SpanContext.SpanID())
		}
		if l.child.Parent.IsRemote() != l.remote {
			t.Errorf("%s parent remote=%v, want %v", l.child.Name, l.child.Parent.IsRemote(), l.remote)
		}
	}
	if dDispatch.Parent.IsValid() {
		t.Error("lease.dispatch has a parent; it should start the trace")
	}
	if svc(dDispatch) != "forgeyard-daemon" || svc(aAck) != "forgeyard-agent" {
		t.Errorf("service names %q, %q", svc(dDispatch), svc(aAck))
	}
	if dDispatch.SpanKind != trace.SpanKindClient || aAck.SpanKind != trace.SpanKindServer {
		t.Errorf("span kinds dispatch=%v ack=%v", dDispatch.SpanKind, aAck.SpanKind)
	}
	if !hasAttr(dDispatch.Attributes, "forgeyard.lease", offer.Lease.String()) {
		t.Errorf("lease.dispatch attributes %v lack the lease", dDispatch.Attributes)
	}
	if aComplete.Status.Code != codes.Error || aComplete.Status.Description != "ack late" {
		t.Errorf("End(span, err) status %+v", aComplete.Status)
	}
	if dComplete.Status.Code != codes.Unset {
		t.Errorf("End(span, nil) status %+v", dComplete.Status)
	}
}

func svc(s tracetest.SpanStub) string {
	for _, kv := range s.Resource.Attributes() {
		if kv.Key == "service.name" {
			return kv.Value.AsString()
		}
	}
	return ""
}

func hasAttr(attrs []attribute.KeyValue, k, v string) bool {
	for _, kv := range attrs {
		if string(kv.Key) == k && kv.Value.AsString() == v {
			return true
		}
	}
	return false
}

func TestInjectExtract(t *testing.T) {
	bg := context.Background()
	if _, ok := telemetry.Inject(bg); ok {
		t.Fatal("Inject reported a trace context for a context without a span")
	}
	env := &wire.Envelope{}
	telemetry.InjectEnvelope(bg, env)
	if env.HasTrace {
		t.Fatal("InjectEnvelope set HasTrace without a span")
	}
	if got := telemetry.ExtractEnvelope(bg, env); got != bg {
		t.Fatal("ExtractEnvelope changed the context for an envelope without trace")
	}
	if got := telemetry.ExtractEnvelope(bg, nil); got != bg {
		t.Fatal("ExtractEnvelope(nil) changed the context")
	}
	// Zero ids are invalid W3C context: ignored.
	if got := telemetry.Extract(bg, wire.TraceContext{Flags: 1}); got != bg {
		t.Fatal("Extract accepted an all-zero trace context")
	}
	if got := telemetry.Extract(bg, wire.TraceContext{TraceID: [16]byte{1}}); got != bg {
		t.Fatal("Extract accepted a zero span id")
	}

	for _, flags := range []uint8{0, 1} {
		tc := wire.TraceContext{TraceID: [16]byte{0xab, 1, 2}, SpanID: [8]byte{0xcd, 3}, Flags: flags}
		ctx := telemetry.Extract(bg, tc)
		sc := trace.SpanContextFromContext(ctx)
		if !sc.IsRemote() || [16]byte(sc.TraceID()) != tc.TraceID || [8]byte(sc.SpanID()) != tc.SpanID || sc.IsSampled() != (flags == 1) {
			t.Fatalf("Extract(%+v) = %+v", tc, sc)
		}
		back, ok := telemetry.Inject(ctx)
		if !ok || back != tc {
			t.Fatalf("Inject(Extract(%+v)) = %+v, %v", tc, back, ok)
		}
	}
}

// A daemon with tracing off (no exporter) still passes a peer's trace on:
// its spans are non-recording but carry the remote parent's context.
func TestDisabledTracingPropagates(t *testing.T) {
	off := telemetry.NewTracing(telemetry.TracingConfig{})
	tc := wire.TraceContext{TraceID: [16]byte{9, 9}, SpanID: [8]byte{7}, Flags: 1}
	ctx, span := off.Start(telemetry.Extract(context.Background(), tc), telemetry.SpanLeaseAck)
	defer span.End()
	if span.IsRecording() {
		t.Fatal("disabled tracing records spans")
	}
	got, ok := telemetry.Inject(ctx)
	if !ok || got.TraceID != tc.TraceID {
		t.Fatalf("disabled tracing lost the trace: %+v %v", got, ok)
	}
	if err := off.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	var nilTr *telemetry.Tracing
	_, s := nilTr.Start(context.Background(), telemetry.SpanConnect)
	s.End()
	if s.IsRecording() {
		t.Fatal("nil Tracing records spans")
	}
}

// A sampler decision made by the daemon (not sampled) is honoured by the
// agent's default ParentBased sampler.
func TestParentSamplingHonoured(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr := telemetry.NewTracing(telemetry.TracingConfig{Exporter: exp, Synchronous: true})
	defer tr.Shutdown(context.Background())
	tc := wire.TraceContext{TraceID: [16]byte{1}, SpanID: [8]byte{2}, Flags: 0}
	_, s := tr.Start(telemetry.Extract(context.Background(), tc), telemetry.SpanLeaseAck)
	s.End()
	if n := len(exp.GetSpans()); n != 0 {
		t.Fatalf("unsampled parent: %d spans exported", n)
	}
	// And a custom sampler is used.
	exp2 := tracetest.NewInMemoryExporter()
	never := telemetry.NewTracing(telemetry.TracingConfig{Exporter: exp2, Synchronous: true, Sampler: sdktrace.NeverSample()})
	defer never.Shutdown(context.Background())
	_, s = never.Start(context.Background(), telemetry.SpanConnect)
	s.End()
	if n := len(exp2.GetSpans()); n != 0 {
		t.Fatalf("NeverSample: %d spans exported", n)
	}
}

// The batching processor (the default) exports on ForceFlush.
func TestBatchedExportFlushes(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tr := telemetry.NewTracing(telemetry.TracingConfig{Exporter: exp})
	_, s := tr.Start(context.Background(), telemetry.SpanCasStream)
	s.End()
	if err := tr.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(exp.GetSpans()); n != 1 {
		t.Fatalf("after ForceFlush %d spans exported, want 1", n)
	}
	if err := tr.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}
