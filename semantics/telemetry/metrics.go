package telemetry

import (
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// *Metrics is the observer of semantics.Conn (semantics.Config.Metrics)
// and of control.Channel (control.Config.Metrics).
var (
	_ semantics.Observer        = (*Metrics)(nil)
	_ semantics.MessageObserver = (*Metrics)(nil)
)

// Namespace prefixes every metric name (§207).
const Namespace = "forgeyard"

// Label values that stand for anything outside a label's closed set.
const (
	// LabelOther is the backend label for a backend name this package does
	// not know (a misspelling, an identifier passed by mistake, ...).
	LabelOther = "other"
	// LabelUnknown is the family, kind or code label for a value this build
	// does not define.
	LabelUnknown = "unknown"
)

// Backends are the backend label values: the backends, and the endpoint
// schemes the agent's fallback dialing names (config.Endpoint.Scheme:
// HTTP CONNECT upgrade, relayed). Any other name is reported as LabelOther
// so a careless caller cannot create a series per address or id.
var Backends = []string{"quic", "webtransport", "yamux", "memory",
	"yamux+upgrade", "relay+quic", "relay+webtransport", "relay+yamux", "relay+yamux+upgrade"}

// Outcome is the outcome label of forgeyard_transport_messages_total (§208:
// success/error, never a MessageId). It is semantics.Outcome, so control
// channels report it without importing this package; the label is its
// String ("ok", "error", "rejected", "duplicate"; "unknown" outside the set).
type Outcome = semantics.Outcome

// Outcomes.
const (
	OutcomeOK        = semantics.OutcomeOK        // handled
	OutcomeError     = semantics.OutcomeError     // failed to decode, validate or apply
	OutcomeRejected  = semantics.OutcomeRejected  // refused by policy (role, state, rate)
	OutcomeDuplicate = semantics.OutcomeDuplicate // a retry of an already handled MessageId
	numOutcomes      = semantics.NumOutcomes
)

// RegistrationFailure is the reason label of
// forgeyard_transport_registration_failures_total.
type RegistrationFailure uint8

// Registration failure reasons.
const (
	RegFailOther      RegistrationFailure = iota // anything else
	RegFailVersion                               // no common protocol version or below policy minimum
	RegFailIdentity                              // certificate, key proof or RunnerId mismatch
	RegFailRevoked                               // runner disabled or revoked
	RegFailOverloaded                            // admission control, draining, rate limit
	RegFailTimeout                               // handshake or registration deadline
	RegFailMalformed                             // hello or registration failed to decode/validate
	numRegFail
)

var regFailNames = [numRegFail]string{"other", "version", "identity", "revoked", "overloaded", "timeout", "malformed"}

// String returns the reason's metric label; values out of range report as RegFailOther's label.
func (r RegistrationFailure) String() string {
	if r < numRegFail {
		return regFailNames[r]
	}
	return regFailNames[RegFailOther]
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (r RegistrationFailure) LogValue() slog.Value { return slog.StringValue(r.String()) }

// RegistrationFailureOf maps a RegistrationRejectedV1 code to its reason.
func RegistrationFailureOf(code wire.ProtocolErrorCode) RegistrationFailure {
	switch code {
	case wire.ErrCodeUnsupportedVersion:
		return RegFailVersion
	case wire.ErrCodeForbidden, wire.ErrCodeRoleForbidden, wire.ErrCodeStaleSession:
		return RegFailIdentity
	case wire.ErrCodeRunnerDisabled:
		return RegFailRevoked
	case wire.ErrCodeOverloaded, wire.ErrCodeDraining, wire.ErrCodeRateLimited:
		return RegFailOverloaded
	case wire.ErrCodeTimeout:
		return RegFailTimeout
	case wire.ErrCodeMalformed, wire.ErrCodeInvalidValue, wire.ErrCodeUnknownMessage, wire.ErrCodeFrameTooLarge:
		return RegFailMalformed
	}
	return RegFailOther
}

// Queue names a queue whose depth is exported as a gauge. It is
// semantics.WriteClass, the write scheduler's classes, so a Conn reports
// its queue depth without importing this package.
type Queue = semantics.WriteClass

// Queues (§207).
const (
	QueueControl = semantics.ClassControl // forgeyard_transport_control_queue_bytes
	QueueLog     = semantics.ClassLog     // forgeyard_transport_log_queue_bytes
	QueueCas     = semantics.ClassCAS     // forgeyard_transport_cas_queue_bytes
	numQueues    = semantics.NumWriteClasses
)

// LatencyBuckets are the bucket upper bounds, in seconds, of every latency
// histogram: 250 µs to 30 s, covering a loopback round trip up to a
// reconnect-delayed delivery.
var LatencyBuckets = []float64{0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}

// Metrics holds the transport metrics (§207–209) on a private registry.
//
// Every method is safe for concurrent use and is a no-op on a nil *Metrics,
// so a daemon or agent can hold a nil pointer when metrics are off. Label
// values come only from closed sets (backend names, wire.Family,
// wire.StreamKind, wire.ProtocolErrorCode, Outcome, RegistrationFailure):
// no method accepts an identifier, so no series is created per message,
// runner, session or address (§208).
type Metrics struct {
	reg *prometheus.Registry

	connActive   *prometheus.GaugeVec
	connTotal    *prometheus.CounterVec
	reconnects   *prometheus.CounterVec
	tlsResumed   *prometheus.CounterVec
	handshake    *prometheus.HistogramVec
	regFailures  *prometheus.CounterVec
	hsFailures   *prometheus.CounterVec
	bytesIn      *prometheus.CounterVec
	bytesOut     *prometheus.CounterVec
	streams      *prometheus.GaugeVec
	queues       [numQueues]prometheus.Gauge
	protoErrors  *prometheus.CounterVec
	fenced       prometheus.Counter
	messages     *prometheus.CounterVec
	offerToAck   prometheus.Histogram
	cancelDeliv  prometheus.Histogram
	heartbeatRTT prometheus.Histogram
	complAck     prometheus.Histogram
	fallbacks    *prometheus.CounterVec

	logBytes, logFrames           *prometheus.CounterVec
	logDropped                    prometheus.Counter
	logPending                    prometheus.Gauge
	casBytes, casObjects, casResm *prometheus.CounterVec
	dataErrors, dataDeleted       *prometheus.CounterVec
	dataHeld                      *prometheus.GaugeVec
	depOnce                       sync.Once // the daemon's dependency gauges, registered on first use
	authorityUp, objstoreUp       prometheus.Gauge
	casVerifyFail                 *prometheus.CounterVec

	certOnce sync.Once
	certs    *CertificateCollector // WatchCertificate's, registered on first use

	// Pre-resolved children for the closed label sets (no map lookup or
	// label hashing on the hot path).
	bIn, bOut [wire.NumStreamKinds + 1]prometheus.Counter
	sActive   [wire.NumStreamKinds + 1]prometheus.Gauge
	msgs      [wire.NumFamilies + 1][numOutcomes]prometheus.Counter
}

// NewMetrics returns Metrics registered on a new private registry, with
// every series of the closed label sets pre-created at zero (so a scrape
// shows the full shape before the first event).
func NewMetrics() *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	hist := func(name, help string) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: LatencyBuckets})
		m.reg.MustRegister(h)
		return h
	}
	counterVec := func(name, help string, labels ...string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, labels)
		m.reg.MustRegister(c)
		return c
	}
	gaugeVec := func(name, help string, labels ...string) *prometheus.GaugeVec {
		g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help}, labels)
		m.reg.MustRegister(g)
		return g
	}
	gauge := func(name, help string) prometheus.Gauge {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help})
		m.reg.MustRegister(g)
		return g
	}

	m.connActive = gaugeVec("transport_connections_active", "Transport connections currently open, by backend (§207 quic_connections_active, every backend).", "backend")
	m.connTotal = counterVec("transport_connections_total", "Transport connections opened, by backend.", "backend")
	m.reconnects = counterVec("transport_reconnects_total", "Reconnections of a known agent session, by backend.", "backend")
	m.tlsResumed = counterVec("transport_tls_resumed_total", "Registered transports whose TLS session was resumed from a session ticket (no certificate signatures), by backend.", "backend")
	m.handshake = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: "transport_handshake_duration_seconds",
		Help: "Time from dial/accept to registration accepted, by backend.", Buckets: LatencyBuckets}, []string{"backend"})
	m.reg.MustRegister(m.handshake)
	m.regFailures = counterVec("transport_registration_failures_total", "Rejected or failed registrations, by reason.", "reason")
	m.hsFailures = counterVec("transport_handshake_failures_total", "Incoming connections whose TLS handshake failed (client certificate rejected or missing, peer's alert, not TLS, timeout), by backend and reason.", "backend", "reason")
	m.bytesIn = counterVec("transport_received_bytes_total", "Bytes received on streams, by stream kind.", "kind")
	m.bytesOut = counterVec("transport_sent_bytes_total", "Bytes sent on streams, by stream kind.", "kind")
	m.streams = gaugeVec("transport_streams_active", "Streams currently open, by stream kind.", "kind")
	m.queues[QueueControl] = gauge("transport_control_queue_bytes", "Bytes of cancel, lease and control writes queued in the connections' write schedulers, not yet handed to the backend.")
	m.queues[QueueLog] = gauge("transport_log_queue_bytes", "Bytes of log-stream writes queued in the connections' write schedulers (waiting behind higher priorities).")
	m.queues[QueueCas] = gauge("transport_cas_queue_bytes", "Bytes of CAS-stream writes queued in the connections' write schedulers (waiting behind higher priorities).")
	m.protoErrors = counterVec("transport_protocol_errors_total", "Protocol errors sent or received, by ProtocolErrorCode.", "code")
	m.fenced = prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "transport_session_fenced_total",
		Help: "Transports fenced by a newer registration of their agent session."})
	m.reg.MustRegister(m.fenced)
	m.messages = counterVec("transport_messages_total", "Messages handled, by family and outcome (§208).", "family", "outcome")
	m.offerToAck = hist("lease_offer_to_ack_seconds", "LeaseOffer sent to LeaseAccepted/Rejected received (§209).")
	m.cancelDeliv = hist("cancel_delivery_seconds", "CancelAttempt sent to CancelAck received (§209).")
	m.heartbeatRTT = hist("heartbeat_rtt_seconds", "Heartbeat sent to HeartbeatAck received (§209).")
	m.complAck = hist("completion_ack_seconds", "AttemptCompletion received/sent to CompletionAck written/received (§209).")
	m.fallbacks = counterVec("transport_fallback_events_total", "Connections established on a fallback backend, by from/to backend.", "from", "to")

	m.logBytes = counterVec("log_bytes_total", "Log bytes: accepted by the agent's log writers (side=agent) or appended to the daemon's log sink (side=daemon).", "side")
	m.logFrames = counterVec("log_frames_total", "Log frames (chunks of one attempt's output): sealed by the agent's writers (side=agent) or appended by the daemon (side=daemon).", "side")
	m.logDropped = prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: "log_dropped_bytes_total",
		Help: "Log bytes the agent dropped (over the spool cap, or refused by the daemon)."})
	m.reg.MustRegister(m.logDropped)
	m.logPending = gauge("log_spool_bytes", "Log bytes the agent holds unacknowledged (memory and spool), over all attempts.")
	m.casBytes = counterVec("cas_bytes_total", "CAS object bytes transferred, by direction (upload: agent to daemon; download: daemon to agent).", "direction")
	m.dataErrors = counterVec("data_store_errors_total", "Failed writes and reads of the daemon's log and CAS stores, by store (logs, cas) and cause (no_space, io_error).", "store", "cause")
	m.dataDeleted = counterVec("data_retention_deleted_bytes_total", "Bytes of logs and CAS objects deleted by retention, by store (logs, cas, partial).", "store")
	m.dataHeld = gaugeVec("data_retention_held_bytes", "Bytes of logs and CAS objects held in the stores at the last retention run, by store (logs, cas).", "store")
	m.casObjects = counterVec("cas_objects_total", "CAS objects transferred and verified, by direction.", "direction")
	m.casResm = counterVec("cas_resumes_total", "CAS transfers that continued a kept prefix instead of starting over, by direction.", "direction")
	m.casVerifyFail = counterVec("cas_verification_failures_total", "CAS objects whose received bytes did not match their digest, by direction.", "direction")

	// Pre-create the closed label sets.
	for _, st := range []string{"logs", "cas"} {
		for _, cause := range []string{"no_space", "io_error"} {
			m.dataErrors.WithLabelValues(st, cause)
		}
		m.dataHeld.WithLabelValues(st)
	}
	for _, st := range []string{"logs", "cas", "partial"} {
		m.dataDeleted.WithLabelValues(st)
	}
	for _, b := range append(Backends, LabelOther) {
		m.connActive.WithLabelValues(b)
		m.connTotal.WithLabelValues(b)
		m.reconnects.WithLabelValues(b)
		m.tlsResumed.WithLabelValues(b)
		m.handshake.WithLabelValues(b)
	}
	for _, side := range []string{SideAgent, SideDaemon} {
		m.logBytes.WithLabelValues(side)
		m.logFrames.WithLabelValues(side)
	}
	for _, dir := range []string{DirUpload, DirDownload} {
		m.casBytes.WithLabelValues(dir)
		m.casObjects.WithLabelValues(dir)
		m.casResm.WithLabelValues(dir)
		m.casVerifyFail.WithLabelValues(dir)
	}
	for _, b := range []string{"quic", "webtransport", "yamux"} { // the listeners' backends
		for _, r := range HandshakeFailureReasons {
			m.hsFailures.WithLabelValues(b, r)
		}
	}
	for r := RegistrationFailure(0); r < numRegFail; r++ {
		m.regFailures.WithLabelValues(r.String())
	}
	for k := 0; k <= wire.NumStreamKinds; k++ {
		l := kindLabel(wire.StreamKind(k))
		m.bIn[k] = m.bytesIn.WithLabelValues(l)
		m.bOut[k] = m.bytesOut.WithLabelValues(l)
		m.sActive[k] = m.streams.WithLabelValues(l)
	}
	for c := wire.ProtocolErrorCode(1); c.Known(); c++ {
		m.protoErrors.WithLabelValues(c.String())
	}
	m.protoErrors.WithLabelValues(LabelUnknown)
	for f := 0; f <= wire.NumFamilies; f++ {
		for o := Outcome(0); o < numOutcomes; o++ {
			m.msgs[f][o] = m.messages.WithLabelValues(familyLabel(wire.Family(f)), o.String())
		}
	}
	return m
}

// Registry returns the private registry, for callers that add their own
// collectors (e.g. prometheus/collectors.NewGoCollector).
func (m *Metrics) Registry() *prometheus.Registry {
	if m == nil {
		return nil
	}
	return m.reg
}

// Handler serves the registry in the Prometheus exposition formats
// (GET /metrics). A nil *Metrics serves 404.
func (m *Metrics) Handler() http.Handler {
	if m == nil {
		return http.NotFoundHandler()
	}
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// backendLabel maps a backend name to its closed label set.
func backendLabel(name string) string {
	for _, b := range Backends {
		if name == b {
			return b
		}
	}
	return LabelOther
}

func kindLabel(k wire.StreamKind) string {
	if k.Valid() {
		return k.String()
	}
	return LabelUnknown
}

func familyLabel(f wire.Family) string {
	if f < wire.NumFamilies {
		return f.String()
	}
	return LabelUnknown
}

func kindIndex(k wire.StreamKind) int {
	if k.Valid() {
		return int(k)
	}
	return wire.NumStreamKinds
}

// ConnOpened counts a transport connection of backend ("quic",
// "webtransport", "yamux", "memory"; anything else counts as "other").
func (m *Metrics) ConnOpened(backend string) {
	if m == nil {
		return
	}
	b := backendLabel(backend)
	m.connActive.WithLabelValues(b).Inc()
	m.connTotal.WithLabelValues(b).Inc()
}

// ConnClosed ends a connection counted by ConnOpened with the same backend.
func (m *Metrics) ConnClosed(backend string) {
	if m == nil {
		return
	}
	m.connActive.WithLabelValues(backendLabel(backend)).Dec()
}

// HandshakeFailed counts an incoming connection whose TLS handshake failed
// on backend, for reason (one of HandshakeFailureReasons; anything else
// counts as "other"). The series of the listener backends (quic,
// webtransport, yamux) exist from the start.
func (m *Metrics) HandshakeFailed(backend, reason string) {
	if m == nil {
		return
	}
	r := "other"
	for _, x := range HandshakeFailureReasons {
		if reason == x {
			r = x
			break
		}
	}
	m.hsFailures.WithLabelValues(backendLabel(backend), r).Inc()
}

// Reconnected counts a reconnection of a known agent session.
func (m *Metrics) Reconnected(backend string) {
	if m == nil {
		return
	}
	m.reconnects.WithLabelValues(backendLabel(backend)).Inc()
}

// TLSResumed counts a registered transport whose TLS session was resumed.
func (m *Metrics) TLSResumed(backend string) {
	if m == nil {
		return
	}
	m.tlsResumed.WithLabelValues(backendLabel(backend)).Inc()
}

// ObserveHandshake records the time from dial/accept to an accepted
// registration. Negative durations count as zero.
func (m *Metrics) ObserveHandshake(backend string, d time.Duration) {
	if m == nil {
		return
	}
	m.handshake.WithLabelValues(backendLabel(backend)).Observe(seconds(d))
}

// RegistrationFailed counts a failed or rejected registration.
func (m *Metrics) RegistrationFailed(reason RegistrationFailure) {
	if m == nil {
		return
	}
	m.regFailures.WithLabelValues(reason.String()).Inc()
}

// BytesIn counts n bytes received on a stream of kind k (n ≤ 0 is ignored).
func (m *Metrics) BytesIn(k wire.StreamKind, n int) {
	if m == nil || n <= 0 {
		return
	}
	m.bIn[kindIndex(k)].Add(float64(n))
}

// BytesOut counts n bytes sent on a stream of kind k (n ≤ 0 is ignored).
func (m *Metrics) BytesOut(k wire.StreamKind, n int) {
	if m == nil || n <= 0 {
		return
	}
	m.bOut[kindIndex(k)].Add(float64(n))
}

// StreamOpened counts an open stream of kind k.
func (m *Metrics) StreamOpened(k wire.StreamKind) {
	if m == nil {
		return
	}
	m.sActive[kindIndex(k)].Inc()
}

// StreamClosed ends a stream counted by StreamOpened with the same kind.
func (m *Metrics) StreamClosed(k wire.StreamKind) {
	if m == nil {
		return
	}
	m.sActive[kindIndex(k)].Dec()
}

// QueueAdd adds delta (negative to remove) to queue q's depth; use it when
// several connections share one gauge.
func (m *Metrics) QueueAdd(q Queue, delta int) {
	if m == nil || q >= numQueues {
		return
	}
	m.queues[q].Add(float64(delta))
}

// SetQueueDepth sets queue q's depth (for a single sampled queue).
func (m *Metrics) SetQueueDepth(q Queue, depth int) {
	if m == nil || q >= numQueues {
		return
	}
	m.queues[q].Set(float64(depth))
}

// ProtocolError counts a protocol error by its stable code; codes this
// build does not define count as "unknown".
func (m *Metrics) ProtocolError(code wire.ProtocolErrorCode) {
	if m == nil {
		return
	}
	l := LabelUnknown
	if code.Known() {
		l = code.String()
	}
	m.protoErrors.WithLabelValues(l).Inc()
}

// SessionFenced counts a transport fenced by a newer registration.
func (m *Metrics) SessionFenced() {
	if m == nil {
		return
	}
	m.fenced.Inc()
}

// MessageHandled counts one message of family f with outcome o.
func (m *Metrics) MessageHandled(f wire.Family, o Outcome) {
	if m == nil {
		return
	}
	fi := int(f)
	if f >= wire.NumFamilies {
		fi = wire.NumFamilies
	}
	if o >= numOutcomes {
		o = OutcomeError
	}
	m.msgs[fi][o].Inc()
}

// MessageTypeHandled is MessageHandled for a message type id.
func (m *Metrics) MessageTypeHandled(t wire.MessageTypeId, o Outcome) {
	m.MessageHandled(t.Family(), o)
}

// ObserveLeaseOfferToAck records LeaseOffer → answer latency.
func (m *Metrics) ObserveLeaseOfferToAck(d time.Duration) {
	if m == nil {
		return
	}
	m.offerToAck.Observe(seconds(d))
}

// ObserveCancelDelivery records CancelAttempt → CancelAck latency.
func (m *Metrics) ObserveCancelDelivery(d time.Duration) {
	if m == nil {
		return
	}
	m.cancelDeliv.Observe(seconds(d))
}

// ObserveHeartbeatRTT records a heartbeat round trip.
func (m *Metrics) ObserveHeartbeatRTT(d time.Duration) {
	if m == nil {
		return
	}
	m.heartbeatRTT.Observe(seconds(d))
}

// ObserveCompletionAck records AttemptCompletion → CompletionAck latency.
func (m *Metrics) ObserveCompletionAck(d time.Duration) {
	if m == nil {
		return
	}
	m.complAck.Observe(seconds(d))
}

// Fallback counts a connection established on backend to after backend from
// failed or lost the race (e.g. "quic" → "yamux").
func (m *Metrics) Fallback(from, to string) {
	if m == nil {
		return
	}
	m.fallbacks.WithLabelValues(backendLabel(from), backendLabel(to)).Inc()
}

func seconds(d time.Duration) float64 {
	if d < 0 {
		return 0
	}
	return d.Seconds()
}

// Side labels of the log metrics, and CAS directions.
const (
	SideAgent   = "agent"
	SideDaemon  = "daemon"
	DirUpload   = "upload"   // agent → daemon (outputs)
	DirDownload = "download" // daemon → agent (payloads)
)

func sideLabel(daemon bool) string {
	if daemon {
		return SideDaemon
	}
	return SideAgent
}

func dirLabel(upload bool) string {
	if upload {
		return DirUpload
	}
	return DirDownload
}

// LogAccepted counts frames and bytes of log data: on the agent
// (daemon=false) accepted by a log writer, on the daemon appended to the
// sink.
func (m *Metrics) LogAccepted(daemon bool, frames, bytes int) {
	if m == nil {
		return
	}
	l := sideLabel(daemon)
	if frames > 0 {
		m.logFrames.WithLabelValues(l).Add(float64(frames))
	}
	if bytes > 0 {
		m.logBytes.WithLabelValues(l).Add(float64(bytes))
	}
}

// LogDropped counts n log bytes the agent dropped.
func (m *Metrics) LogDropped(n int) {
	if m == nil || n <= 0 {
		return
	}
	m.logDropped.Add(float64(n))
}

// LogSpoolAdd adds delta (negative to release) to the agent's
// unacknowledged log bytes.
func (m *Metrics) LogSpoolAdd(delta int) {
	if m == nil || delta == 0 {
		return
	}
	m.logPending.Add(float64(delta))
}

// CasTransferred counts n object bytes moved in a direction (upload:
// agent → daemon).
func (m *Metrics) CasTransferred(upload bool, n int64) {
	if m == nil || n <= 0 {
		return
	}
	m.casBytes.WithLabelValues(dirLabel(upload)).Add(float64(n))
}

// CasVerified counts an object transferred and verified.
func (m *Metrics) CasVerified(upload bool) {
	if m == nil {
		return
	}
	m.casObjects.WithLabelValues(dirLabel(upload)).Inc()
}

// CasResumed counts a transfer that continued a kept prefix.
func (m *Metrics) CasResumed(upload bool) {
	if m == nil {
		return
	}
	m.casResm.WithLabelValues(dirLabel(upload)).Inc()
}

// CasVerificationFailed counts an object whose bytes did not match its
// digest.
func (m *Metrics) CasVerificationFailed(upload bool) {
	if m == nil {
		return
	}
	m.casVerifyFail.WithLabelValues(dirLabel(upload)).Inc()
}

// DataStoreError counts a failed operation of a data store ("logs" or
// "cas") by cause ("no_space", "io_error").
func (m *Metrics) DataStoreError(store, cause string) {
	if m == nil {
		return
	}
	m.dataErrors.WithLabelValues(store, cause).Inc()
}

// RetentionDeleted counts bytes retention deleted from store ("logs",
// "cas", "partial").
func (m *Metrics) RetentionDeleted(store string, n int64) {
	if m == nil {
		return
	}
	m.dataDeleted.WithLabelValues(store).Add(float64(n))
}

// depGauges registers forgeyard_authority_up and forgeyard_objstore_up
// on first use: only a daemon probes dependencies, and an agent's scrape
// must not show authority metrics.
func (m *Metrics) depGauges() {
	m.depOnce.Do(func() {
		m.authorityUp = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: "authority_up",
			Help: "1 when the daemon's last probe of its authority (database) answered, else 0 (also before the first probe)."})
		m.objstoreUp = prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: "objstore_up",
			Help: "1 when the daemon's last probe of its object store (content store) answered, else 0 (also before the first probe, or with none configured)."})
		m.reg.MustRegister(m.authorityUp, m.objstoreUp)
	})
}

// AuthorityUp sets forgeyard_authority_up from the last authority probe
// (both dependency gauges are registered at the first call).
func (m *Metrics) AuthorityUp(up bool) {
	if m == nil {
		return
	}
	m.depGauges()
	m.authorityUp.Set(b2f(up))
}

// ObjectStoreUp sets forgeyard_objstore_up from the last object store
// probe (both dependency gauges are registered at the first call).
func (m *Metrics) ObjectStoreUp(up bool) {
	if m == nil {
		return
	}
	m.depGauges()
	m.objstoreUp.Set(b2f(up))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// RetentionHeld sets the bytes store ("logs", "cas") held at the last
// retention run.
func (m *Metrics) RetentionHeld(store string, n int64) {
	if m == nil {
		return
	}
	m.dataHeld.WithLabelValues(store).Set(float64(n))
}
