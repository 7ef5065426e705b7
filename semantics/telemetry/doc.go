// Package telemetry is the transport's observability: Prometheus metrics
// (§207–209), OpenTelemetry spans with W3C trace context carried in the
// envelope (§210–211), the health model (§213) and security audit events
// (§212, §279, §289).
//
// It imports wire only, so semantics/daemon, semantics/agent and the
// commands can all use it. Every type is inert until used and every method
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
// Embedding in the daemon through its existing daemon.Config.Hooks:
//
//	cfg.Hooks.OnRegistered = func(s daemon.SessionInfo) {
//		m.ConnOpened(s.Backend)
//		m.MessageHandled(wire.FamilyAgent, telemetry.OutcomeOK)
//	}
//	cfg.Hooks.OnDisconnect = func(s daemon.SessionInfo, err error) { m.ConnClosed(s.Backend) }
//	cfg.Hooks.OnLeaseAnswer = func(e daemon.LeaseAnswerEvent) {
//		m.MessageHandled(wire.FamilyAgent, telemetry.OutcomeOK) // OutcomeDuplicate when e.Duplicate
//	}
//	cfg.Hooks.OnCompletion = func(daemon.CompletionEvent) { m.MessageHandled(wire.FamilyAgent, telemetry.OutcomeOK) }
//
// and, for the latency histograms, a periodic copy of daemon.Stats
// (OfferToAccept, CompletionToAck, CancelDelivery) until the daemon calls
// ObserveLeaseOfferToAck / ObserveCompletionAck / ObserveCancelDelivery
// where it records those samples today. In the agent, through
// agent.Config.Hooks:
//
//	cfg.Hooks.OnConnected = func(st agent.Status) { m.ConnOpened(st.Backend); backend = st.Backend }
//	cfg.Hooks.OnDisconnected = func(error) { m.ConnClosed(backend) }
//
// (backend is the agent's last Status.Backend, kept by the caller).
//
// # Tracing
//
// [NewTracing] builds a private tracer provider; with no exporter in
// [TracingConfig] (the default) spans are non-recording but a remote parent
// still propagates. OTLP export is off by default: the command layer builds
// an exporter for the configured endpoint and passes it as
// TracingConfig.Exporter. Spans are started by name ([SpanName], §210); the
// trace context crosses the wire in the envelope's optional trace field:
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
// [Audit] writes the §279 events as slog records whose attributes are built
// only by typed constructors (Runner, Session, Transport, Remote, Code,
// Reason): there is no free-form field, so a payload, key or token cannot
// reach the audit log by construction (§212). The daemon's existing
// cloned-identity warning becomes:
//
//	audit.Emit(ctx, telemetry.EventClonedIdentity, telemetry.Runner(c.runner),
//		telemetry.Session(c.session), telemetry.Transport(c.transport),
//		telemetry.Remote(c.bc.RemoteAddr()), telemetry.Reason(telemetry.ReasonFencedTraffic))
package telemetry
