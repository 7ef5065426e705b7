package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"forgeyard.dev/transport/wire"
)

// SpanName is the name of a transport span (§210). Use only the constants.
type SpanName string

// Span names (§210), stable: dashboards and trace queries select on them.
const (
	SpanConnect    SpanName = "transport.connect"   // dial or accept, up to a usable connection
	SpanHandshake  SpanName = "transport.handshake" // TransportHello → HelloAck
	SpanNegotiate  SpanName = "protocol.negotiate"  // version and feature negotiation
	SpanRegister   SpanName = "agent.register"      // RegisterAgent → RegistrationAccepted/Rejected
	SpanDispatch   SpanName = "lease.dispatch"      // daemon: LeaseOffer sent → answer received
	SpanLeaseAck   SpanName = "lease.ack"           // agent: LeaseOffer received → answer sent
	SpanComplete   SpanName = "attempt.complete"    // AttemptCompletion → CompletionAck
	SpanCasStream  SpanName = "cas.stream"          // one CAS object stream
	SpanLogStream  SpanName = "log.stream"          // one attempt's log stream
	SpanResync     SpanName = "reconnect.resync"    // AgentResync → ResyncResponse
	SpanCancel     SpanName = "attempt.cancel"      // daemon: CancelAttempt sent → CancelAck (beyond §210's list)
	instrumentName          = "forgeyard.dev/transport/semantics/telemetry"
)

// SpanNames lists every span name, in §210 order.
var SpanNames = []SpanName{SpanConnect, SpanHandshake, SpanNegotiate, SpanRegister, SpanDispatch,
	SpanLeaseAck, SpanComplete, SpanCasStream, SpanLogStream, SpanResync}

// TracingConfig configures Tracing. The zero value disables tracing: spans
// are non-recording, but trace context still propagates (Inject/Extract of
// a remote parent keep working), so a daemon without an exporter does not
// break an agent's trace.
type TracingConfig struct {
	// ServiceName is recorded as the service.name resource attribute
	// ("forgeyard-daemon", "forgeyard-agent"). Empty means "forgeyard".
	ServiceName string
	// Exporter receives ended spans; nil turns tracing off. OTLP export is
	// off by default: the command layer builds an OTLP exporter (e.g.
	// otlptracehttp.New with the configured endpoint) and passes it here.
	Exporter sdktrace.SpanExporter
	// Sampler; nil means ParentBased(AlwaysSample): a trace the peer
	// sampled is sampled here too.
	Sampler sdktrace.Sampler
	// Resource, when set, replaces the resource built from ServiceName
	// (the command layer adds service.version and OTEL_RESOURCE_ATTRIBUTES).
	Resource *resource.Resource
	// Synchronous exports each span as it ends (tests, debugging) instead
	// of batching.
	Synchronous bool
}

// Tracing starts the transport spans (§210). Its methods are safe for
// concurrent use; a nil *Tracing starts non-recording spans.
type Tracing struct {
	tracer trace.Tracer
	sdk    *sdktrace.TracerProvider // nil when disabled
}

// NewTracing returns a Tracing with its own tracer provider (it does not
// touch the otel global provider).
func NewTracing(cfg TracingConfig) *Tracing {
	if cfg.Exporter == nil {
		return &Tracing{tracer: noop.NewTracerProvider().Tracer(instrumentName)}
	}
	name := cfg.ServiceName
	if name == "" {
		name = "forgeyard"
	}
	sampler := cfg.Sampler
	if sampler == nil {
		sampler = sdktrace.ParentBased(sdktrace.AlwaysSample())
	}
	res := cfg.Resource
	if res == nil {
		res = serviceResource(name)
	}
	proc := sdktrace.NewBatchSpanProcessor(cfg.Exporter)
	if cfg.Synchronous {
		proc = sdktrace.NewSimpleSpanProcessor(cfg.Exporter)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(proc),
		sdktrace.WithSampler(sampler),
		sdktrace.WithResource(res),
	)
	return &Tracing{tracer: tp.Tracer(instrumentName), sdk: tp}
}

// Tracer returns the underlying tracer (for spans outside §210).
func (t *Tracing) Tracer() trace.Tracer {
	if t == nil {
		return noop.NewTracerProvider().Tracer(instrumentName)
	}
	return t.tracer
}

// Start starts span name as a child of the span (local or remote) in ctx.
// The caller ends the span; End(span, err) records an error status.
func (t *Tracing) Start(ctx context.Context, name SpanName, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	kind := trace.SpanKindInternal
	switch name {
	case SpanConnect, SpanHandshake, SpanRegister, SpanDispatch, SpanResync, SpanCancel:
		kind = trace.SpanKindClient
	case SpanLeaseAck:
		kind = trace.SpanKindServer
	}
	return t.Tracer().Start(ctx, string(name), trace.WithSpanKind(kind), trace.WithAttributes(attrs...))
}

// Shutdown flushes pending spans and stops the exporter. Safe on a nil or
// disabled Tracing; later spans are dropped.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.sdk == nil {
		return nil
	}
	return t.sdk.Shutdown(ctx)
}

// ForceFlush exports every ended span now.
func (t *Tracing) ForceFlush(ctx context.Context) error {
	if t == nil || t.sdk == nil {
		return nil
	}
	return t.sdk.ForceFlush(ctx)
}

// End ends span, first recording err (if non-nil) as its error status. The
// error text is recorded; callers must not pass errors that carry secrets.
func End(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, errText(err))
	}
	span.End()
}

func errText(err error) string {
	s := err.Error()
	if len(s) > 256 {
		s = s[:256]
	}
	return s
}

// AttrBackend is the backend attribute (closed set, as the metric label).
// Identifiers are fine as span attributes (one span per operation), never
// as metric labels.
func AttrBackend(b string) attribute.KeyValue {
	return attribute.String("forgeyard.backend", backendLabel(b))
}

// AttrRunner is the runner id attribute.
func AttrRunner(id wire.RunnerId) attribute.KeyValue {
	return attribute.String("forgeyard.runner", id.String())
}

// AttrLease is the lease id attribute.
func AttrLease(id wire.LeaseId) attribute.KeyValue {
	return attribute.String("forgeyard.lease", id.String())
}

// AttrAttempt is the job attempt id attribute.
func AttrAttempt(id wire.JobAttemptId) attribute.KeyValue {
	return attribute.String("forgeyard.attempt", id.String())
}

// AttrMessage is the message id attribute.
func AttrMessage(id wire.MessageId) attribute.KeyValue {
	return attribute.String("forgeyard.message", id.String())
}

// AttrProtocol is the negotiated protocol version attribute.
func AttrProtocol(v wire.ProtocolVersion) attribute.KeyValue {
	return attribute.String("forgeyard.protocol", v.String())
}

// Inject returns the W3C trace context of the span in ctx for the
// envelope's trace field (§211). ok is false when ctx holds no valid span
// context; the caller then leaves Envelope.HasTrace false.
func Inject(ctx context.Context) (wire.TraceContext, bool) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return wire.TraceContext{}, false
	}
	return wire.TraceContext{TraceID: sc.TraceID(), SpanID: sc.SpanID(), Flags: byte(sc.TraceFlags())}, true
}

// Extract returns ctx with tc as its remote parent span context. An invalid
// tc (zero trace or span id) returns ctx unchanged. Flags bits other than
// sampled are kept as received.
func Extract(ctx context.Context, tc wire.TraceContext) context.Context {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    tc.TraceID,
		SpanID:     tc.SpanID,
		TraceFlags: trace.TraceFlags(tc.Flags),
		Remote:     true,
	})
	if !sc.IsValid() {
		return ctx
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}

// InjectEnvelope sets env's trace field from ctx (HasTrace false when ctx
// has no span). Send it only when FeatureTraceContextV1 was negotiated.
func InjectEnvelope(ctx context.Context, env *wire.Envelope) {
	env.Trace, env.HasTrace = Inject(ctx)
}

// ExtractEnvelope returns ctx with env's trace context as remote parent,
// or ctx unchanged when env carries none.
func ExtractEnvelope(ctx context.Context, env *wire.Envelope) context.Context {
	if env == nil || !env.HasTrace {
		return ctx
	}
	return Extract(ctx, env.Trace)
}

func serviceResource(name string) *resource.Resource {
	return resource.NewSchemaless(attribute.String("service.name", name))
}
