package daemon

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/admin"
	agentwire "forgeyard.dev/transport/wire/agent"
	wcas "forgeyard.dev/transport/wire/cas"
	"forgeyard.dev/transport/wire/device"
	"forgeyard.dev/transport/wire/health"
	wlogs "forgeyard.dev/transport/wire/logs"
	"forgeyard.dev/transport/wire/registry"
	"forgeyard.dev/transport/wire/signing"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
)

const (
	stateDraining = session.Draining
	stateActive   = session.Active
	// closeGrace bounds how long a final message (rejection, fence, goaway)
	// is given to reach the peer before the connection is closed.
	maxCloseGrace = 2 * time.Second
)

// conn is one transport: its control stream and session state.
type conn struct {
	d           *Daemon
	bc          semantics.BackendConn
	sc          *semantics.Conn
	ch          *control.Channel
	transport   wire.TransportSessionId
	connectedAt time.Time
	tlsResumed  bool // the TLS session was resumed from a ticket (set once)
	// revChecked: a revocation check that completed included this
	// transport (only the revocation loop touches it: enroll.go).
	revChecked bool
	done       chan struct{}
	challenge  [agentwire.ChallengeSize]byte

	// Set during the handshake on the read goroutine, then read-only.
	role         agentwire.PeerRole
	negotiated   wire.ProtocolVersion
	helloSession wire.AgentSessionId
	runner       wire.RunnerId
	session      wire.AgentSessionId
	epoch        uint64
	agentVersion string
	features     wire.FeatureSet // negotiated in the hello

	mu          sync.Mutex
	state       session.State
	fenced      bool
	fencedBy    wire.TransportSessionId
	violations  int
	dataWaits   int       // data-plane requests being answered (data.go)
	closedAt    time.Time // wall clock at teardown (data.go's log sweep)
	lastHB      time.Time
	hbInterval  time.Duration                                // given at registration (the heartbeat budget); guarded by mu
	phases      map[wire.JobAttemptId]agentwire.AttemptPhase // last reported, work goroutine only
	hbTimer     *time.Timer
	regTimer    *time.Timer // closes a transport not registered in time; dropped at registration
	cred        credential  // enroll.go: the certificate registered with
	expiryTimer *time.Timer // enroll.go: closes the transport when it expires
	closeOnce   sync.Once
	closeErr    error

	// sendRole is the peer's role once the hello named it, roleUnknown
	// before: every envelope written to the peer passes CheckSend (send.go).
	sendRole atomic.Int64

	rl  connRates       // per-connection message rates (ratelimit.go)
	adm admissionTicket // admission slots held (admission.go), under d.hard.mu

	// work carries, in arrival order, the control messages whose handling
	// may wait on the authority (lease answers, renewals, completions,
	// data-plane requests, phase reports), so that the read goroutine keeps
	// answering heartbeats while the authority is slow (a loaded database,
	// a loaded machine). Pushed by the read goroutine only (or by the
	// goroutine it waits for, onOwnStack); its goroutine runs only while
	// messages are queued.
	work lazyQueue
	// inv carries the inventory's authority writes in order (inventory.go
	// inventoryLater), apart from work so that they do not queue ahead of
	// lease answers and completions; read goroutine only.
	inv lazyQueue
}

// workQueue bounds the messages queued for the work goroutine; when it is
// full the read goroutine waits (back-pressure on the agent's control
// stream, as when handling was inline).
const workQueue = 64

// ordered runs f on the conn's work goroutine after every function queued
// before it. Read goroutine only. It returns without running f when the
// transport closes first, and f is skipped if the transport is closing
// when its turn comes (drain: the transport is going away).
func (c *conn) ordered(f func()) {
	c.work.push(workQueue, func() {
		if c.getState() < session.Closing {
			f()
		}
	}, c.sc.Done())
}

// stopWork waits for the functions queued for the work goroutine (skipped
// if the transport is closing). Read goroutine only, after the last
// ordered call.
func (c *conn) stopWork() { c.work.wait() }

func (d *Daemon) newConn(bc semantics.BackendConn) (*conn, error) {
	c := &conn{d: d, bc: bc, transport: wire.NewTransportSessionId(), connectedAt: d.now(), done: make(chan struct{}),
		tlsResumed: bc.ConnectionState().DidResume}
	c.sendRole.Store(roleUnknown)
	sc, err := semantics.NewConn(bc, semantics.Config{Limits: d.cfg.Bounds.Conn, Logger: d.log, Metrics: d.cfg.Metrics, SendCheck: c})
	if err != nil {
		return nil, err
	}
	c.sc = sc
	if _, err := rand.Read(c.challenge[:]); err != nil {
		return nil, err
	}
	d.mu.Lock()
	if d.shutdown {
		d.mu.Unlock()
		return nil, ErrShutdown
	}
	d.conns[c.transport] = c
	d.nConns.Add(1)
	if d.byBackend == nil {
		d.byBackend = map[string]int{}
	}
	d.byBackend[bc.Backend()]++
	d.mu.Unlock()
	return c, nil
}

func (c *conn) setState(s session.State) {
	c.mu.Lock()
	if s > c.state {
		c.state = s
	}
	c.mu.Unlock()
}

func (c *conn) getState() session.State {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

func (c *conn) active() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state == session.Active && !c.fenced
}

func (c *conn) registered() bool {
	s := c.getState()
	return s >= session.Registered && s <= session.Draining
}

// channel returns the control channel, nil before the control stream
// arrived. Other goroutines must use it instead of c.ch.
func (c *conn) channel() *control.Channel {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ch
}

// ident returns the registration identity; safe from any goroutine (the
// fields are written under c.mu on the conn's read goroutine).
func (c *conn) ident() (wire.RunnerId, wire.AgentSessionId, uint64, agentwire.PeerRole) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runner, c.session, c.epoch, c.role
}

func (c *conn) isFenced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fenced
}

func (c *conn) info() SessionInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	return SessionInfo{Runner: c.runner, Session: c.session, Transport: c.transport, Epoch: c.epoch, Role: c.role,
		Backend: c.bc.Backend(), Remote: c.bc.RemoteAddr().String(), Protocol: c.negotiated, Features: c.features, AgentVersion: c.agentVersion,
		State: c.state.String(), Fenced: c.fenced, LastHeartbeat: c.lastHB, HeartbeatInterval: c.hbInterval, ConnectedAt: c.connectedAt,
		TLSResumed: c.tlsResumed}
}

func (c *conn) logger() *slog.Logger {
	return c.d.log.With("transport", c.transport.String(), "remote", c.bc.RemoteAddr().String())
}

func (c *conn) serve(ctx context.Context) {
	d := c.d
	regTimer := time.AfterFunc(d.timing.RegistrationTimeout, func() {
		if c.getState() < session.Registered {
			c.logger().Info("registration timeout", "after", d.timing.RegistrationTimeout)
			c.closeNow(wire.CloseRegistrationTimeout, "not registered within "+d.timing.RegistrationTimeout.String())
		}
	})
	c.mu.Lock()
	c.regTimer = regTimer
	c.mu.Unlock()
	stop := context.AfterFunc(ctx, func() { c.closeNow(wire.CloseShutdown, "daemon stopping") })
	defer func() {
		c.stopRegTimer()
		stop()
		c.teardown()
	}()
	acceptCtx, cancel := context.WithTimeout(ctx, d.timing.RegistrationTimeout)
	st, err := c.sc.AcceptStream(acceptCtx)
	cancel()
	if err != nil {
		c.closeNow(wire.CloseRegistrationTimeout, "no control stream")
		<-c.sc.Done()
		c.closeErr = c.sc.Err()
		return
	}
	if st.Kind() != wire.StreamControl {
		st.CancelRead(semantics.StreamProtocolError)
		st.CancelWrite(semantics.StreamProtocolError)
		c.closeNow(wire.CloseProtocolError, "first stream must be the control stream")
		<-c.sc.Done()
		return
	}
	ch := control.New(st, control.Config{Now: d.now, Logger: d.log, WriteTimeout: d.timing.RequestTimeout, Metrics: d.cfg.Metrics})
	c.mu.Lock()
	c.ch = ch
	c.mu.Unlock()
	dctx := c.dataCtx()
	var casSess *cas.Session
	if d.casSrv != nil {
		casSess = d.casSrv.NewSession()
	}
	c.serveStreams(dctx, casSess)
	c.serveUniStreams(dctx)
	_ = c.ch.Run(c.handle, c.bad)
	c.closeNow(wire.CloseProtocolError, "control stream ended")
	c.stopWork()
	<-c.sc.Done()
	c.closeErr = c.sc.Err()
}

// stopRegTimer stops the registration timeout and drops it, so that a
// registered connection does not keep it for its life.
func (c *conn) stopRegTimer() {
	c.mu.Lock()
	if c.regTimer != nil {
		c.regTimer.Stop()
		c.regTimer = nil
	}
	c.mu.Unlock()
}

func (c *conn) teardown() {
	d := c.d
	c.mu.Lock()
	c.state = session.Closed
	c.closedAt = time.Now()
	if c.hbTimer != nil {
		c.hbTimer.Stop()
	}
	if c.expiryTimer != nil {
		c.expiryTimer.Stop()
	}
	runner := c.runner
	c.mu.Unlock()
	d.mu.Lock()
	if _, ok := d.conns[c.transport]; ok {
		delete(d.conns, c.transport)
		d.nConns.Add(-1)
		if b := c.bc.Backend(); d.byBackend[b] <= 1 {
			delete(d.byBackend, b)
		} else {
			d.byBackend[b]--
		}
	}
	if rs := d.byRunner[runner]; rs != nil {
		if delete(rs, c); len(rs) == 0 {
			delete(d.byRunner, runner)
		}
	}
	if d.bySession[c.session] == c {
		delete(d.bySession, c.session)
	}
	d.mu.Unlock()
	c.releaseAdmission()
	c.noteGone() // inventory.go
	close(c.done)
	if h := d.cfg.Hooks.OnDisconnect; h != nil {
		h(c.info(), c.closeErr)
	}
}

// closeNow closes the transport with code.
func (c *conn) closeNow(code wire.CloseCode, reason string) {
	c.setState(session.Closing)
	c.closeOnce.Do(func() {
		_ = c.bc.CloseWithCode(code, reason)
	})
}

// closeAfter gives a final message a bounded time to reach the peer (a QUIC
// close discards unsent stream data), then closes with code. The peer
// usually closes first after reading the message.
func (c *conn) closeAfter(code wire.CloseCode, reason string) {
	c.setState(session.Closing)
	c.closeLater(code, reason)
}

// closeLater closes after the grace without changing the state (a fenced
// transport keeps being answered, and audited, until then).
func (c *conn) closeLater(code wire.CloseCode, reason string) {
	grace := min(c.d.timing.RequestTimeout, maxCloseGrace)
	go func() {
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-t.C:
		case <-c.sc.Done():
		}
		c.closeNow(code, reason)
	}()
}

func (c *conn) reply(req *wire.Envelope, m wire.Message) {
	if err := c.ch.Reply(req, m); err != nil {
		c.closeNow(wire.CloseInternalError, "write failed")
	}
}

func (c *conn) replyErr(req *wire.Envelope, code wire.ProtocolErrorCode, retry wire.RetryClass, msg string) {
	var id wire.MessageId
	if req != nil {
		id = req.MessageID
	}
	if err := c.ch.ReplyError(id, code, retry, msg); err != nil {
		c.closeNow(wire.CloseInternalError, "write failed")
	}
}

// violation answers an illegal message and closes the transport after
// repeated violations.
func (c *conn) violation(id wire.MessageId, code wire.ProtocolErrorCode, msg string) {
	c.d.st.protoErrs.Add(1)
	retry := wire.RetryNever
	if code == wire.ErrCodeNotRegistered {
		retry = wire.RetryResync
	}
	_ = c.ch.ReplyError(id, code, retry, msg)
	c.mu.Lock()
	c.violations++
	n := c.violations
	c.mu.Unlock()
	if n >= maxViolations {
		c.logger().Warn("closing after repeated protocol violations", "violations", n)
		c.closeAfter(wire.CloseProtocolError, "repeated protocol violations")
	}
}

func (c *conn) bad(e *control.DecodeError) {
	if c.getState() < session.Registered {
		// Before registration every message is part of the authentication
		// handshake (hello, register with key proof).
		reason := telemetry.ReasonDecodeFailed
		if e.Code == wire.ErrCodeInvalidValue {
			reason = telemetry.ReasonValidationFailed
		}
		c.d.audit.Emit(context.Background(), telemetry.EventMalformedSecurity, telemetry.Transport(c.transport),
			telemetry.Remote(c.bc.RemoteAddr()), telemetry.Code(e.Code), telemetry.Reason(reason))
	}
	c.violation(e.MessageID, e.Code, "frame rejected: "+e.Code.String())
}

// onOwnStack runs f on a goroutine of its own and waits for it: the caller
// (the read goroutine) blocks exactly as if it ran f, but the stack f grows
// (x509 verification, the authority's SQL: tens of KiB) is freed when f
// returns instead of staying with the read goroutine for the connection's
// life. Stacks shrink only at garbage collection, which an idle daemon
// rarely runs, and the runtime sizes new goroutines' stacks by the average
// it last saw (issue 26 item 1: 10,000 idle agents' read goroutines).
func onOwnStack(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
}

func (c *conn) handle(env *wire.Envelope) {
	t := env.Payload.MessageType()
	c.mu.Lock()
	st, fenced := c.state, c.fenced
	c.mu.Unlock()
	if st >= session.Closing {
		return
	}
	if !c.admitMessage(env) {
		c.ch.SetOutcome(telemetry.OutcomeRejected)
		return
	}
	if fenced && t != wire.MsgError {
		c.ch.SetOutcome(telemetry.OutcomeRejected)
		c.clonedIdentity(env)
		return
	}
	if m, ok := env.Payload.(*agentwire.CertificateRequestV1); ok {
		onOwnStack(func() { c.onCertificateRequest(env, m) }) // enrollment or renewal (enroll.go)
		return
	}
	if code := session.Check(st, c.role, t); code != 0 {
		c.ch.SetOutcome(telemetry.OutcomeRejected)
		c.violation(env.MessageID, code, fmt.Sprintf("%s not allowed in state %s for role %s", nameOf(t), st, c.role))
		return
	}
	switch m := env.Payload.(type) {
	// Once per connection, and deep (certificate verification, the
	// authority): on a stack of their own (onOwnStack).
	case *agentwire.TransportHelloV1:
		onOwnStack(func() { c.onHello(env, m) })
	case *agentwire.RegisterAgentV1:
		onOwnStack(func() { c.onRegister(env, m) })
	case *agentwire.AgentResyncV1:
		onOwnStack(func() { c.onResync(env, m) })
	// Heartbeats are answered here, at once; everything that may wait on
	// the authority runs in arrival order on the work goroutine (ordered),
	// so a slow authority call never holds a heartbeat back (§180–181).
	case *agentwire.HeartbeatV1:
		c.onHeartbeat(env, m)
	// Their outcome (ok, or error when the authority fails) is known
	// after the authority call: counted then.
	case *agentwire.LeaseAcceptedV1:
		counted := c.ch.DeferOutcome(t)
		c.ordered(func() { counted(c.onLeaseAnswer(env, m.Lease, m.Attempt, true, 0, "")) })
	case *agentwire.LeaseRejectedV1:
		counted := c.ch.DeferOutcome(t)
		c.ordered(func() { counted(c.onLeaseAnswer(env, m.Lease, m.Attempt, false, m.Reason, m.Message)) })
	case *agentwire.LeaseRenewV1:
		counted := c.ch.DeferOutcome(t)
		c.ordered(func() { counted(c.onRenew(env, m)) })
	case *agentwire.AttemptCompletionV1:
		counted := c.ch.DeferOutcome(t) // ok, duplicate or rejected: known after the authority answers
		c.ordered(func() { counted(c.onCompletion(env, m)) })
	case *agentwire.PhaseChangeV1:
		c.ordered(func() {
			if p, ok := c.phases[m.Attempt]; !ok || p != m.Phase {
				if c.phases == nil {
					c.phases = map[wire.JobAttemptId]agentwire.AttemptPhase{}
				}
				if len(c.phases) < agentwire.MaxActiveAttempts {
					c.phases[m.Attempt] = m.Phase
				}
				c.phaseEvent(m.Attempt, m.Lease, m.Phase)
			}
		})
	case *wlogs.LogsFinalizedV1:
		c.ordered(func() { c.onLogsFinalized(env, m) })
	case *wcas.NeedObjectsV1:
		c.ordered(func() { c.onNeedObjects(env, m) })
	case *wcas.OutputsFinalizedV1:
		c.ordered(func() { c.onOutputsFinalized(env, m) })
	case *agentwire.CapabilityUpdateV1, *health.HealthSummaryV1, *health.ProbeRequestV1:
		// Capability snapshots and health reports: recorded in the
		// inventory and passed to Hooks.OnCapabilities (inventory.go).
		c.onInventoryMessage(env, m)
	case *admin.AdminAckV1, *agentwire.CancelAckV1:
		// Admin acks and late cancel acks (their Call already timed out)
		// need no answer.
	case *signing.SignResponseV1, *device.DiscoverResultV1, *device.ReserveResultV1, *device.InstallResultV1,
		*device.RunTestResultV1, *device.ResetResultV1:
		// Late answers of a signing worker or device agent (sign.go,
		// device.go): their Call already returned; nothing to answer.
	case *wire.WireErrorV1:
		c.logger().Debug("agent reported an error", "code", m.Code, "retry", m.Retry)
	default:
		c.replyErr(env, wire.ErrCodeUnknownMessage, wire.RetryUnsupported, nameOf(t)+" is not served on the control stream")
	}
}

func nameOf(t wire.MessageTypeId) string {
	if mi, ok := registry.Default.Lookup(t); ok {
		return mi.Name
	}
	return "message " + t.String()
}

// traced reports whether the agent negotiated FeatureTraceContextV1, so
// envelopes to it carry the trace context.
func (c *conn) traced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.features.Has(wire.FeatureTraceContextV1)
}

// span starts a daemon span continuing the trace context env carries.
func (c *conn) span(env *wire.Envelope, name telemetry.SpanName, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	ctx := telemetry.ExtractEnvelope(context.Background(), env)
	return c.d.cfg.Tracing.Start(ctx, name, append(attrs, telemetry.AttrBackend(c.bc.Backend()))...)
}

func ms32(d time.Duration) uint32 { return uint32(max(1, d.Milliseconds())) }

// authCtx bounds one authority call by the request timeout (and ends at
// Shutdown), so a stuck database cannot wedge the read loop forever.
func (c *conn) authCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.d.ctx, c.d.timing.RequestTimeout)
}

func (c *conn) ref() authority.SessionRef {
	return authority.SessionRef{Session: c.session, Epoch: c.epoch}
}

func (c *conn) fencedErr(env *wire.Envelope) {
	c.replyErr(env, wire.ErrCodeSessionFenced, wire.RetryImmediately, "transport fenced by a newer epoch; retry on the current transport")
}
