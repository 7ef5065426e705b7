// Package telemetry is the transport's observability: Prometheus metrics
// (§207–209), OpenTelemetry spans with W3C trace context carried in the
// envelope (§210–211), the health model (§213) and security audit events
// (§212, §279, §289).
//
// It imports wire and the semantics contract only (never the reverse: the
// contract sees metrics through its observer interfaces,
// semantics.Observer and semantics.MessageObserver, which *Metrics
// implements), so semantics/daemon, semantics/agent and the commands can
// all use it. Every type is inert until used and every method
// is a no-op on a nil receiver, so embedding is optional.
//
// # Metrics
//
// [NewMetrics] registers every metric on a private prometheus.Registry;
// [Metrics.Handler] serves it at /metrics. Names are prefixed forgeyard_;
// labels come only from closed sets (backend, family, outcome, kind, code,
// reason, from/to), never from ids or addresses (§208). Callers use typed
// methods and never touch label strings:
//
//	m := telemetry.NewMetrics()
//	mux.Handle("/metrics", m.Handler())
//	m.ConnOpened("quic")
//	m.MessageHandled(wire.FamilyAgent, telemetry.OutcomeOK)
//	m.ObserveCancelDelivery(d)
//
// The engines feed the metrics themselves: pass the same *Metrics as
// daemon.Config.Metrics or agent.Config.Metrics and every connection
// (semantics.Config.Metrics, a semantics.Observer: bytes, streams,
// scheduler queue depths by semantics.WriteClass, which is [Queue]), every
// control stream (control.Config.Metrics, a semantics.MessageObserver:
// messages by family and semantics.Outcome, which is [Outcome]; protocol
// errors), the log writers and receiver (logs.Config.Metrics,
// logs.ReceiverConfig.Metrics) and the CAS server and clients
// (cas.*Config.Metrics) report into it, as do the daemon's latency samples,
// registration failures and fencing and the agent's heartbeat round trips.
// The commands add the per-backend connection gauges from the hooks:
//
//	cfg.Hooks.OnRegistered = func(s daemon.SessionInfo) { m.ConnOpened(s.Backend) }
//	cfg.Hooks.OnDisconnect = func(s daemon.SessionInfo, err error) { m.ConnClosed(s.Backend) }
//
// # Tracing
//
// [NewTracing] builds a private tracer provider; with no exporter in
// [TracingConfig] (the default) spans are non-recording but a remote parent
// still propagates. OTLP export is off by default: the command layer builds
// an exporter for the configured endpoint and passes it as
// TracingConfig.Exporter (the commands: [telemetry] otlp_endpoint). The
// daemon and agent engines start their spans when given
// daemon.Config.Tracing / agent.Config.Tracing ([SpanName], §210) and carry
// the trace context in the envelope's optional trace field
// (control.Out.Trace) when FeatureTraceContextV1 was negotiated:
//
//	ctx, span := tr.Start(ctx, telemetry.SpanDispatch, telemetry.AttrLease(lease))
//	telemetry.InjectEnvelope(ctx, env) // sender, when FeatureTraceContextV1 was negotiated
//	...
//	ctx = telemetry.ExtractEnvelope(ctx, env) // receiver
//	ctx, span = tr.Start(ctx, telemetry.SpanLeaseAck)
//
// # Health
//
// [DaemonHealth] and [AgentHealth] are JSON-serializable reports; the
// caller fills the facts (the agent from agent.Status: Connected, Endpoint,
// Backend, Protocol.String(), LastHeartbeatAck, len(Running), Draining) and
// calls Evaluate, which derives the status. [DaemonHealthHandler] and
// [AgentHealthHandler] serve them; WriteTable renders them for the CLI.
//
// # Audit
//
// [Audit] writes the §279 events (semantics/daemon emits each at the point
// it detects it) as slog records whose attributes are built
// only by typed constructors (Runner, Session, Transport, Remote, Code,
// Reason): there is no free-form field, so a payload, key or token cannot
// reach the audit log by construction (§212). For example, the daemon's
// fencing:
//
//	audit.Emit(ctx, telemetry.EventSessionFenced, telemetry.Runner(runner),
//		telemetry.Session(sess), telemetry.Transport(c.transport),
//		telemetry.Remote(c.bc.RemoteAddr()), telemetry.Reason(telemetry.ReasonNewerRegistration))
//
// (The cloned-identity record keeps its richer slog form with both
// transports' ids; it carries the same "event" attribute.)
package telemetry
