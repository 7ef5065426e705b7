package daemon

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/admin"
	agentwire "forgeyard.dev/transport/wire/agent"
	wcas "forgeyard.dev/transport/wire/cas"
	wlogs "forgeyard.dev/transport/wire/logs"
	"forgeyard.dev/transport/wire/registry"
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
	done        chan struct{}
	challenge   [agentwire.ChallengeSize]byte

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
	phases      map[wire.JobAttemptId]agentwire.AttemptPhase // last reported, work goroutine only
	hbTimer     *time.Timer
	cred        credential  // enroll.go: the certificate registered with
	expiryTimer *time.Timer // enroll.go: closes the transport when it expires
	closeOnce   sync.Once
	closeErr    error

	rl  connRates       // per-connection message rates (ratelimit.go)
	adm admissionTicket // admission slots held (admission.go), under d.hard.mu

	// work carries, in arrival order, the control messages whose handling
	// may wait on the authority (lease answers, renewals, completions,
	// data-plane requests, phase reports), so that the read goroutine keeps
	// answering heartbeats while the authority is slow (a loaded database,
	// a loaded machine). Created by the read goroutine on first use;
	// workDone is closed when the work goroutine has returned.
	work     chan func()
	workDone chan struct{}
}

// workQueue bounds the messages queued for the work goroutine; when it is
// full the read goroutine waits (back-pressure on the agent's control
// stream, as when handling was inline).
const workQueue = 64

// ordered runs f on the conn's work goroutine after every function queued
// before it. Read goroutine only. It returns without running f when the
// transport closes first.
func (c *conn) ordered(f func()) {
	if c.work == nil {
		c.work, c.workDone = make(chan func(), workQueue), make(chan struct{})
		go func() {
			defer close(c.workDone)
			for f := range c.work {
				if c.getState() >= session.Closing {
					continue // drain: the transport is going away
				}
				f()
			}
		}()
	}
	select {
	case c.work <- f:
	case <-c.sc.Done():
	}
}

// stopWork ends the work goroutine after the queued functions (skipped if
// the transport is closing) and waits for it. Read goroutine only, after
// the last ordered call.
func (c *conn) stopWork() {
	if c.work != nil {
		close(c.work)
		<-c.workDone
	}
}

func (d *Daemon) newConn(bc semantics.BackendConn) (*conn, error) {
	sc, err := semantics.NewConn(bc, semantics.Config{Limits: d.cfg.Limits, Logger: d.log, Metrics: d.cfg.Metrics})
	if err != nil {
		return nil, err
	}
	c := &conn{d: d, bc: bc, sc: sc, transport: wire.NewTransportSessionId(), connectedAt: d.now(), done: make(chan struct{})}
	if _, err := rand.Read(c.challenge[:]); err != nil {
		return nil, err
	}
	d.mu.Lock()
	if d.shutdown {
		d.mu.Unlock()
		return nil, ErrShutdown
	}
	d.conns[c.transport] = c
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
		State: c.state.String(), Fenced: c.fenced, LastHeartbeat: c.lastHB, ConnectedAt: c.connectedAt}
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
	stop := context.AfterFunc(ctx, func() { c.closeNow(wire.CloseShutdown, "daemon stopping") })
	defer func() {
		regTimer.Stop()
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
	go c.serveStreams(dctx, casSess)
	go c.serveUniStreams(dctx)
	_ = c.ch.Run(c.handle, c.bad)
	c.closeNow(wire.CloseProtocolError, "control stream ended")
	c.stopWork()
	<-c.sc.Done()
	c.closeErr = c.sc.Err()
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
	c.mu.Unlock()
	d.mu.Lock()
	delete(d.conns, c.transport)
	if d.bySession[c.session] == c {
		delete(d.bySession, c.session)
	}
	d.mu.Unlock()
	c.releaseAdmission()
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
		c.onCertificateRequest(env, m) // enrollment or renewal (enroll.go)
		return
	}
	if code := session.Check(st, c.role, t); code != 0 {
		c.ch.SetOutcome(telemetry.OutcomeRejected)
		c.violation(env.MessageID, code, fmt.Sprintf("%s not allowed in state %s for role %s", nameOf(t), st, c.role))
		return
	}
	switch m := env.Payload.(type) {
	case *agentwire.TransportHelloV1:
		c.onHello(env, m)
	case *agentwire.RegisterAgentV1:
		c.onRegister(env, m)
	case *agentwire.AgentResyncV1:
		c.onResync(env, m)
	// Heartbeats are answered here, at once; everything that may wait on
	// the authority runs in arrival order on the work goroutine (ordered),
	// so a slow authority call never holds a heartbeat back (§180–181).
	case *agentwire.HeartbeatV1:
		c.onHeartbeat(env, m)
	case *agentwire.LeaseAcceptedV1:
		c.ordered(func() { c.onLeaseAnswer(env, m.Lease, m.Attempt, true, 0, "") })
	case *agentwire.LeaseRejectedV1:
		c.ordered(func() { c.onLeaseAnswer(env, m.Lease, m.Attempt, false, m.Reason, m.Message) })
	case *agentwire.LeaseRenewV1:
		c.ordered(func() { c.onRenew(env, m) })
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
	case *agentwire.CapabilityUpdateV1, *admin.AdminAckV1, *agentwire.CancelAckV1:
		// Capability snapshots are the scheduler's business; admin acks and
		// late cancel acks (their Call already timed out) need no answer.
	case *wire.WireErrorV1:
		c.logger().Debug("agent reported an error", "code", m.Code, "retry", m.Retry)
	default:
		c.replyErr(env, wire.ErrCodeUnknownMessage, wire.RetryUnsupported, nameOf(t)+" is not served on the control stream")
	}
}

func (c *conn) phaseEvent(attempt wire.JobAttemptId, lease wire.LeaseId, p agentwire.AttemptPhase) {
	if h := c.d.cfg.Hooks.OnPhase; h != nil {
		h(PhaseEvent{Runner: c.runner, Attempt: attempt, Lease: lease, Phase: p})
	}
}

func nameOf(t wire.MessageTypeId) string {
	if mi, ok := registry.Default.Lookup(t); ok {
		return mi.Name
	}
	return "message " + t.String()
}

// clonedIdentity handles traffic on a fenced transport: two live transports
// of one agent session interleave messages (§61–63). It audits (never the
// payload), answers SessionFenced and closes the old transport.
func (c *conn) clonedIdentity(env *wire.Envelope) {
	c.d.st.cloned.Add(1)
	holder := c.d.sessionConn(c.session)
	args := []any{"event", "transport.cloned_identity", "runner", c.runner.String(), "session", c.session.String(),
		"fenced_transport", c.transport.String(), "fenced_remote", c.bc.RemoteAddr().String(), "message_type", env.Payload.MessageType().String()}
	if holder != nil {
		args = append(args, "holder_transport", holder.transport.String(), "holder_remote", holder.bc.RemoteAddr().String())
	}
	c.d.log.Warn("fenced transport kept talking", args...)
	_ = c.ch.ReplyError(env.MessageID, wire.ErrCodeSessionFenced, wire.RetryNever, "this transport was fenced by a newer registration")
	c.closeAfter(wire.CloseSessionFenced, "fenced transport kept talking")
}

// ---- handshake ----

func (c *conn) onHello(env *wire.Envelope, m *agentwire.TransportHelloV1) {
	d := c.d
	if !c.admitRegistration(env) {
		return
	}
	hctx, sp := c.span(env, telemetry.SpanHandshake)
	defer sp.End()
	_, nsp := d.cfg.Tracing.Start(hctx, telemetry.SpanNegotiate)
	v, err := wire.Negotiate(d.proto, m.Versions)
	if err == nil {
		nsp.SetAttributes(telemetry.AttrProtocol(v))
	}
	telemetry.End(nsp, err)
	if err != nil {
		d.st.rejections.Add(1)
		d.cfg.Metrics.RegistrationFailed(telemetry.RegFailVersion)
		if _, nerr := wire.Negotiate(d.cfg.Protocol, m.Versions); nerr == nil {
			// Only the policy minimum refused it: a downgrade (§274).
			d.audit.Emit(context.Background(), telemetry.EventDowngradeRejected, telemetry.Transport(c.transport),
				telemetry.Remote(c.bc.RemoteAddr()), telemetry.Code(wire.ErrCodeUnsupportedVersion), telemetry.Reason(telemetry.ReasonVersionBelowMinimum))
		}
		c.logger().Info("version mismatch", "err", err)
		c.reply(env, &agentwire.RegistrationRejectedV1{Code: wire.ErrCodeUnsupportedVersion, Retry: wire.RetryUnsupported,
			Message: wire.TruncateUTF8(c.versionRefusal(m, err), agentwire.MaxRejectMessage), HasServerRange: true, ServerRange: d.proto})
		c.closeAfter(wire.CloseVersionMismatch, err.Error())
		return
	}
	c.mu.Lock()
	c.role, c.negotiated = m.Role, v
	if m.HasAgentSession {
		c.helloSession = m.AgentSession
	}
	c.agentVersion = m.AgentVersion
	c.features = d.cfg.Features.Intersect(m.Features)
	c.mu.Unlock()
	c.ch.SetProtocol(v)
	c.setState(session.Negotiated)
	c.reply(env, &agentwire.HelloAckV1{Negotiated: v, ServerRange: d.proto, Features: d.cfg.Features.Intersect(m.Features),
		TransportSession: c.transport, ServerTimeMs: uint64(d.now().UnixMilli()), Challenge: c.challenge})
}

// auditAuth records an authentication failure of registration m (§279).
func (c *conn) auditAuth(m *agentwire.RegisterAgentV1, reason telemetry.AuditReason, extra ...telemetry.AuditAttr) {
	c.d.audit.Emit(context.Background(), telemetry.EventAuthFailure, append([]telemetry.AuditAttr{telemetry.Runner(m.Runner), telemetry.Session(m.Session),
		telemetry.Transport(c.transport), telemetry.Remote(c.bc.RemoteAddr()), telemetry.Code(wire.ErrCodeForbidden),
		telemetry.Reason(reason)}, extra...)...)
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

// errRegistrationRefused is the status of an agent.register span whose
// registration was rejected (the reason is in the daemon's log and audit).
var errRegistrationRefused = errors.New("registration rejected")

// identity derives the proven runner and the leaf key for a registration.
func (c *conn) identity(m *agentwire.RegisterAgentV1) (*x509.Certificate, error) {
	now := c.d.now()
	cs := c.bc.ConnectionState()
	if len(m.CertChain) > 0 {
		certs := make([]*x509.Certificate, len(m.CertChain))
		for i, der := range m.CertChain {
			cert, err := x509.ParseCertificate(der)
			if err != nil {
				return nil, fmt.Errorf("cert_chain[%d]: %w", i, err)
			}
			certs[i] = cert
		}
		if len(cs.PeerCertificates) > 0 && !bytes.Equal(cs.PeerCertificates[0].Raw, m.CertChain[0]) {
			// A TLS peer whose certificate names no runner is an
			// intermediary (forgeyard-relay, ARCHITECTURE.md decision 10):
			// it carries the bytes, and the chain (verified against
			// RunnerCAs below) and the key proof alone prove the runner.
			if _, err := trust.RunnerIDFromCert(cs.PeerCertificates[0]); err == nil || c.d.cfg.RunnerCAs == nil {
				return nil, errors.New("cert_chain[0] is not the TLS client certificate")
			}
		}
		if c.d.cfg.RunnerCAs == nil {
			id, err := trust.VerifyPeer(cs, now)
			if err != nil {
				return nil, fmt.Errorf("no runner CA pool to verify cert_chain and no verified TLS peer: %w", err)
			}
			_ = id
			return certs[0], nil
		}
		inter := x509.NewCertPool()
		for _, ic := range certs[1:] {
			inter.AddCert(ic)
		}
		if _, err := certs[0].Verify(x509.VerifyOptions{Roots: c.d.cfg.RunnerCAs, Intermediates: inter, CurrentTime: now,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			return nil, err
		}
		return certs[0], nil
	}
	if _, err := trust.VerifyPeer(cs, now); err != nil {
		return nil, err
	}
	return cs.VerifiedChains[0][0], nil
}

func (c *conn) reject(env *wire.Envelope, code wire.ProtocolErrorCode, retry wire.RetryClass, msg string, close wire.CloseCode) {
	c.d.st.rejections.Add(1)
	c.d.cfg.Metrics.RegistrationFailed(telemetry.RegistrationFailureOf(code))
	c.logger().Info("registration rejected", "code", code, "reason", msg)
	c.reply(env, &agentwire.RegistrationRejectedV1{Code: code, Retry: retry, Message: wire.TruncateUTF8(msg, agentwire.MaxRejectMessage)})
	c.closeAfter(close, msg)
}

func (c *conn) onRegister(env *wire.Envelope, m *agentwire.RegisterAgentV1) {
	d := c.d
	_, sp := c.span(env, telemetry.SpanRegister, telemetry.AttrRunner(m.Runner))
	defer func() {
		if c.getState() < session.Registered {
			telemetry.End(sp, errRegistrationRefused)
			return
		}
		sp.End()
	}()
	if c.helloSession != (wire.AgentSessionId{}) && c.helloSession != m.Session {
		c.reject(env, wire.ErrCodeInvalidValue, wire.RetryNever, "session differs from the hello's agent_session", wire.CloseProtocolError)
		return
	}
	leaf, err := c.identity(m)
	if err != nil {
		msg := "authentication failed: " + err.Error()
		if errors.Is(err, trust.ErrCertExpired) {
			d.idst.expiredRejected.Add(1)
			msg = trust.MsgCredentialExpired + ": " + err.Error()
		}
		reason := telemetry.ReasonBadCertificate
		if errors.Is(err, trust.ErrCertExpired) {
			reason = telemetry.ReasonCertificateExpired
		}
		c.auditAuth(m, reason, telemetry.ErrorText(err))
		c.reject(env, wire.ErrCodeForbidden, wire.RetryNever, msg, wire.CloseAuthenticationFailure)
		return
	}
	runner, err := trust.RunnerIDFromCert(leaf)
	if err != nil || runner != m.Runner {
		c.auditAuth(m, telemetry.ReasonRunnerMismatch)
		c.reject(env, wire.ErrCodeForbidden, wire.RetryNever, "authentication failed: certificate does not name this runner", wire.CloseAuthenticationFailure)
		return
	}
	if err := session.VerifyKeyProof(leaf.PublicKey, m.KeyProof, c.challenge, c.transport, m.Session); err != nil {
		c.auditAuth(m, telemetry.ReasonKeyProofFailed)
		c.reject(env, wire.ErrCodeForbidden, wire.RetryNever, "authentication failed: key proof does not verify", wire.CloseAuthenticationFailure)
		return
	}
	if revoked, err := c.checkCredentialRevoked(m.Runner, trust.SerialString(leaf)); err != nil {
		c.reject(env, wire.ErrCodeInternal, wire.RetryBackoff, "authority unavailable", wire.CloseInternalError)
		return
	} else if revoked {
		c.d.audit.Emit(context.Background(), telemetry.EventRunnerRevoked, telemetry.Runner(m.Runner), telemetry.Session(m.Session),
			telemetry.Transport(c.transport), telemetry.Remote(c.bc.RemoteAddr()), telemetry.Code(wire.ErrCodeForbidden),
			telemetry.Reason(telemetry.ReasonRevoked), telemetry.CertSerial(leaf))
		c.reject(env, wire.ErrCodeForbidden, wire.RetryNever, trust.MsgCredentialRevoked, wire.CloseAuthenticationFailure)
		return
	}
	actx, acancel := c.authCtx()
	defer acancel()
	grant, err := d.auth.RegisterSession(actx, authority.Registration{Runner: m.Runner, Session: m.Session,
		Transport: c.transport, Daemon: d.cfg.ID, Remote: c.bc.RemoteAddr().String(), Now: d.now()})
	switch {
	case errors.Is(err, authority.ErrRunnerDisabled):
		d.audit.Emit(context.Background(), telemetry.EventRunnerRevoked, telemetry.Runner(m.Runner), telemetry.Session(m.Session),
			telemetry.Transport(c.transport), telemetry.Remote(c.bc.RemoteAddr()), telemetry.Code(wire.ErrCodeRunnerDisabled),
			telemetry.Reason(telemetry.ReasonRevoked))
		c.reject(env, wire.ErrCodeRunnerDisabled, wire.RetryNever, trust.MsgRunnerDisabled, wire.CloseRunnerDisabled)
		return
	case errors.Is(err, authority.ErrStaleSession):
		c.auditEvent(telemetry.EventSessionFenced, wire.ErrCodeStaleSession, telemetry.ReasonNewerRegistration)
		c.reject(env, wire.ErrCodeStaleSession, wire.RetryNever, "agent session ended or superseded; start a new session", wire.CloseProtocolError)
		return
	case errors.Is(err, authority.ErrSessionOwnership):
		c.auditAuth(m, telemetry.ReasonRunnerMismatch)
		c.reject(env, wire.ErrCodeForbidden, wire.RetryNever, "agent session belongs to another runner", wire.CloseAuthenticationFailure)
		return
	case err != nil:
		c.reject(env, wire.ErrCodeInternal, wire.RetryBackoff, "authority unavailable", wire.CloseInternalError)
		return
	}
	c.mu.Lock()
	c.runner, c.session, c.epoch = m.Runner, m.Session, grant.Epoch
	c.agentVersion = m.AgentVersion
	c.mu.Unlock()
	c.noteCredential(leaf)

	// Fence older transports of this session on this daemon, and close
	// transports of superseded sessions of the same runner (§15, §61).
	d.mu.Lock()
	var fence []*conn
	for _, o := range d.conns {
		if r, _, _, _ := o.ident(); o != c && r == m.Runner && o.registered() {
			fence = append(fence, o)
		}
	}
	d.bySession[m.Session] = c
	d.mu.Unlock()
	for _, o := range fence {
		o.fence(c, grant.Epoch)
	}

	d.st.registrations.Add(1)
	if grant.Epoch > 1 {
		d.st.reconnects.Add(1)
	}
	if c.role != agentwire.RoleAgent && c.role != agentwire.RoleInternalWorker {
		c.setState(session.Active) // no leases to resync
	} else {
		c.setState(session.Registered)
	}
	c.handshakeDone()
	c.resetLiveness()
	if h := d.cfg.Hooks.OnRegistered; h != nil {
		h(c.info())
	}
	t := d.timing
	stagger := make([]uint32, len(t.FallbackStagger))
	for i, s := range t.FallbackStagger {
		stagger[i] = uint32(s.Milliseconds())
	}
	c.reply(env, &agentwire.RegistrationAcceptedV1{Session: m.Session, Epoch: grant.Epoch, TransportSession: c.transport,
		HeartbeatIntervalMs: ms32(t.HeartbeatInterval), LeaseRenewIntervalMs: ms32(t.RenewInterval), MaxBackoffMs: ms32(t.MaxBackoff),
		AlternateEndpoints: d.cfg.AlternateEndpoints, FallbackStaggerMs: stagger, ServerTimeMs: uint64(d.now().UnixMilli())})
	if authority.IdentitiesOf(d.auth) != nil {
		serial := trust.SerialString(leaf)
		c.ordered(func() { c.retireSuperseded(m.Runner, serial) })
	}
}

func ms32(d time.Duration) uint32 { return uint32(max(1, d.Milliseconds())) }

// fence marks c as fenced by holder: SessionFencedV1, then close with
// CloseSessionFenced after a short grace in which further traffic is
// audited as a cloned identity.
func (c *conn) fence(holder *conn, epoch uint64) {
	c.mu.Lock()
	if c.fenced {
		c.mu.Unlock()
		return
	}
	c.fenced, c.fencedBy = true, holder.transport
	runner, sess := c.runner, c.session
	c.mu.Unlock()
	c.d.st.fenced.Add(1)
	c.d.cfg.Metrics.SessionFenced()
	c.d.audit.Emit(context.Background(), telemetry.EventSessionFenced, telemetry.Runner(runner), telemetry.Session(sess),
		telemetry.Transport(c.transport), telemetry.Remote(c.bc.RemoteAddr()), telemetry.Reason(telemetry.ReasonNewerRegistration))
	c.logger().Info("transport fenced", "runner", runner.String(), "session", sess.String(), "holder", holder.transport.String())
	if ch := c.channel(); ch != nil {
		_, _ = ch.SendMsg(&agentwire.SessionFencedV1{Session: sess, FencedTransport: c.transport,
			HolderTransport: holder.transport, HolderEpoch: epoch,
			HolderRemote:     wire.TruncateUTF8(holder.bc.RemoteAddr().String(), agentwire.MaxRemoteAddr),
			ResolvesWithinMs: ms32(c.d.timing.LeaseTTL)})
	}
	c.closeLater(wire.CloseSessionFenced, "a newer transport took over this agent session")
}

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

func (c *conn) onResync(env *wire.Envelope, m *agentwire.AgentResyncV1) {
	d := c.d
	_, sp := c.span(env, telemetry.SpanResync, telemetry.AttrRunner(c.runner))
	defer sp.End()
	if m.Session != c.session {
		c.violation(env.MessageID, wire.ErrCodeInvalidValue, "resync for another session")
		return
	}
	claims := make([]authority.AttemptClaim, len(m.ActiveAttempts))
	for i, a := range m.ActiveAttempts {
		claims[i] = authority.AttemptClaim{Attempt: a.Attempt, Lease: a.Lease}
	}
	now := d.now()
	actx, acancel := c.authCtx()
	defer acancel()
	decs, err := d.auth.Resync(actx, c.ref(), claims, now)
	switch {
	case errors.Is(err, authority.ErrFenced):
		c.fencedErr(env)
		return
	case errors.Is(err, authority.ErrStaleSession):
		c.replyErr(env, wire.ErrCodeStaleSession, wire.RetryNever, "agent session ended")
		c.closeAfter(wire.CloseSessionFenced, "agent session ended")
		return
	case err != nil:
		c.replyErr(env, wire.ErrCodeInternal, wire.RetryBackoff, "authority unavailable")
		return
	}
	resp := &agentwire.ResyncResponseV1{Results: make([]agentwire.ResyncResultV1, len(decs))}
	for i, dec := range decs {
		r := agentwire.ResyncResultV1{Attempt: dec.Attempt, Lease: dec.Lease}
		switch dec.Kind {
		case authority.DecisionContinue:
			r.Decision = agentwire.ResyncDecisionV1{Kind: agentwire.DecisionContinue, ExpiresAtMs: uint64(dec.ExpiresAt.UnixMilli()),
				TTLMs: ms32(dec.ExpiresAt.Sub(now))}
		case authority.DecisionCancel:
			r.Decision = agentwire.ResyncDecisionV1{Kind: agentwire.DecisionCancel, Reason: agentwire.CancellationReason(dec.CancelReason)}
		default:
			r.Decision = agentwire.ResyncDecisionV1{Kind: agentwire.DecisionStale}
		}
		resp.Results[i] = r
	}
	d.st.resyncs.Add(1)
	c.setState(session.Active)
	c.reply(env, resp)
	d.kickOffers(c.session)
	d.adoptOffers(c)
}

// ---- active session ----

func (c *conn) resetLiveness() {
	d := c.d
	limit := 3 * d.timing.HeartbeatInterval
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastHB = d.now()
	if c.hbTimer == nil {
		c.hbTimer = time.AfterFunc(limit, func() {
			c.logger().Info("no heartbeat for 3 intervals; closing", "limit", limit)
			c.closeNow(wire.CloseIdleTimeout, "no heartbeat for 3 intervals")
		})
		return
	}
	c.hbTimer.Reset(limit)
}

func (c *conn) onHeartbeat(env *wire.Envelope, m *agentwire.HeartbeatV1) {
	d := c.d
	if m.Session != c.session || m.Runner != c.runner {
		c.violation(env.MessageID, wire.ErrCodeInvalidValue, "heartbeat for another session")
		return
	}
	d.mu.Lock()
	last, seen := d.hbSeq[c.session]
	if seen && m.Seq <= last {
		d.mu.Unlock()
		d.st.hbDropped.Add(1)
		return // out-of-order or duplicate: dropped, never acted on (§235)
	}
	if !seen && len(d.hbSeq) >= maxSeqSessions {
		for k := range d.hbSeq { // bounded: forget an arbitrary old session
			if _, live := d.bySession[k]; !live {
				delete(d.hbSeq, k)
				break
			}
		}
	}
	d.hbSeq[c.session] = m.Seq
	d.mu.Unlock()
	c.resetLiveness()
	c.reply(env, &agentwire.HeartbeatAckV1{Seq: m.Seq, ServerTimeMs: uint64(d.now().UnixMilli())})
	// Heartbeats re-assert phases whose PhaseChangeV1 was lost; the set of
	// remembered attempts is the heartbeat's (≤ MaxActiveAttempts). In
	// order with the PhaseChangeV1 and completions received before it.
	c.ordered(func() {
		next := make(map[wire.JobAttemptId]agentwire.AttemptPhase, len(m.ActiveAttempts))
		for _, a := range m.ActiveAttempts {
			next[a.Attempt] = a.Phase
			if p, ok := c.phases[a.Attempt]; !ok || p != a.Phase {
				c.phaseEvent(a.Attempt, a.Lease, a.Phase)
			}
		}
		c.phases = next
	})
}

func (c *conn) sendOffer(of *offer) {
	l := of.lease
	_, _, epoch, _ := c.ident()
	if of.settled.Load() {
		return
	}
	if f := c.d.offerFilter.Load(); f != nil && !(*f)(l.ID) {
		return
	}
	if !of.sentAt.IsZero() && of.resent() {
		c.d.st.resends.Add(1)
	}
	out := control.Out{ID: of.msgID, Msg: &agentwire.LeaseOfferV1{Lease: l.ID, Attempt: l.Attempt, Job: l.Job, SpecID: l.Spec,
		ExpiresAtMs: uint64(l.ExpiresAt.UnixMilli()), TTLMs: ms32(l.TTL), PayloadRef: l.Payload, Session: l.Session, Epoch: epoch}}
	if of.hasTrace && c.traced() {
		out.Trace, out.HasTrace = of.trace, true
	}
	_, _ = c.channel().Send(out)
}

func (c *conn) onLeaseAnswer(env *wire.Envelope, lease wire.LeaseId, attempt wire.JobAttemptId, accepted bool, reason agentwire.LeaseRejectReason, msg string) {
	d := c.d
	_, sp := c.span(env, telemetry.SpanLeaseAck, telemetry.AttrLease(lease), telemetry.AttrAttempt(attempt))
	var spanErr error
	defer func() { telemetry.End(sp, spanErr) }()
	now := d.now()
	d.mu.Lock()
	of := d.offers[lease]
	d.mu.Unlock()
	if of != nil {
		// Recorded and settled as one step against settleFromAuthority.
		of.answering.Lock()
		defer of.answering.Unlock()
	}
	var err error
	if accepted {
		actx, acancel := c.authCtx()
		defer acancel()
		_, err = d.auth.AcceptLease(actx, lease, attempt, c.ref(), now)
		if errors.Is(err, authority.ErrStaleLease) {
			// The first answer was lost in a cut and the attempt already
			// completed on a later transport: the re-sent offer's answer
			// is late, not stale.
			actx, acancel := c.authCtx()
			defer acancel()
			if l, lerr := d.auth.Lease(actx, lease); lerr == nil && l.State == authority.LeaseCompleted &&
				l.Session == c.session && l.Attempt == attempt {
				err = nil
			}
		}
	} else {
		actx, acancel := c.authCtx()
		defer acancel()
		err = d.auth.RejectLease(actx, lease, attempt, c.ref(), now)
	}
	ev := LeaseAnswerEvent{Runner: c.runner, Session: c.session, Lease: lease, Attempt: attempt, Accepted: accepted, Reason: reason, Message: msg, Err: err}
	first := false
	// A fenced or failed recording is not an answer: the offer keeps being
	// re-sent on the session's current transport.
	definitive := err == nil || errors.Is(err, authority.ErrStaleLease) || errors.Is(err, authority.ErrStaleSession)
	if of != nil && definitive {
		first = of.finish(ev)
		if first && err == nil && accepted && !of.adopted {
			lat := time.Since(of.created())
			d.st.offerLat.add(lat)
			d.cfg.Metrics.ObserveLeaseOfferToAck(lat)
		}
	}
	switch {
	case err != nil:
	case !first:
		ev.Duplicate = true
		d.st.dupAns.Add(1)
	case accepted:
		d.st.leasesAccepted.Add(1)
	default:
		d.st.leasesRejected.Add(1)
	}
	if h := d.cfg.Hooks.OnLeaseAnswer; h != nil {
		h(ev)
	}
	spanErr = err
	if errors.Is(err, authority.ErrStaleLease) || errors.Is(err, authority.ErrStaleSession) {
		d.audit.Emit(context.Background(), telemetry.EventStaleLeaseReplay, telemetry.Runner(c.runner), telemetry.Session(c.session),
			telemetry.Transport(c.transport), telemetry.Remote(c.bc.RemoteAddr()), telemetry.Code(wire.ErrCodeStaleLease),
			telemetry.Reason(telemetry.ReasonLeaseSuperseded))
	}
	switch {
	case errors.Is(err, authority.ErrFenced):
		c.fencedErr(env)
	case errors.Is(err, authority.ErrStaleLease), errors.Is(err, authority.ErrStaleSession):
		c.replyErr(env, wire.ErrCodeStaleLease, wire.RetryNever, "lease no longer offered to this session")
	case err != nil:
		c.replyErr(env, wire.ErrCodeInternal, wire.RetryImmediately, "authority unavailable")
	}
}

func (c *conn) onRenew(env *wire.Envelope, m *agentwire.LeaseRenewV1) {
	d := c.d
	now := d.now()
	actx, acancel := c.authCtx()
	defer acancel()
	res, err := d.auth.RenewLease(actx, env.MessageID, m.Lease, m.Attempt, c.ref(), now)
	switch {
	case errors.Is(err, authority.ErrFenced):
		c.fencedErr(env)
		return
	case errors.Is(err, authority.ErrStaleSession):
		res = authority.RenewResult{Unknown: true}
	case err != nil:
		c.replyErr(env, wire.ErrCodeInternal, wire.RetryImmediately, "authority unavailable")
		return
	}
	d.st.renewals.Add(1)
	var out agentwire.RenewOutcomeV1
	switch {
	case res.Extended:
		out = agentwire.RenewOutcomeV1{Kind: agentwire.RenewExtended, ExpiresAtMs: uint64(res.ExpiresAt.UnixMilli()), TTLMs: ms32(res.ExpiresAt.Sub(now))}
		d.mu.Lock()
		delete(d.probing, m.Lease)
		d.mu.Unlock()
	case res.Revoked:
		out = agentwire.RenewOutcomeV1{Kind: agentwire.RenewRevoked, Reason: agentwire.CancellationReason(res.CancelReason)}
	default:
		out = agentwire.RenewOutcomeV1{Kind: agentwire.RenewUnknown}
		c.auditEvent(telemetry.EventStaleLeaseReplay, wire.ErrCodeStaleLease, telemetry.ReasonLeaseSuperseded)
	}
	c.reply(env, &agentwire.LeaseRenewAckV1{Lease: m.Lease, Attempt: m.Attempt, Outcome: out})
}

// onCompletion records a completion and answers it; it returns the
// message's outcome for forgeyard_transport_messages_total.
func (c *conn) onCompletion(env *wire.Envelope, m *agentwire.AttemptCompletionV1) telemetry.Outcome {
	d := c.d
	_, sp := c.span(env, telemetry.SpanComplete, telemetry.AttrLease(m.Lease), telemetry.AttrAttempt(m.Attempt))
	defer sp.End()
	start := time.Now()
	result := m.Result
	actx, acancel := c.authCtx()
	defer acancel()
	ack, err := d.auth.CompleteAttempt(actx, authority.Completion{MessageID: env.MessageID, Attempt: m.Attempt,
		Lease: m.Lease, Session: c.ref(), Result: EncodeResult(result), Outputs: m.Outputs, Now: d.now()})
	switch {
	case errors.Is(err, authority.ErrFenced):
		c.fencedErr(env)
		return telemetry.OutcomeRejected
	case err != nil:
		c.replyErr(env, wire.ErrCodeInternal, wire.RetryImmediately, "authority unavailable")
		return telemetry.OutcomeError
	}
	kind := agentwire.CompletionAckKind(ack)
	if int(kind) < len(d.st.completions) {
		d.st.completions[kind].Add(1)
	}
	// Sampled before the hook so hook observers (metrics) see it; the ack
	// write that follows is a buffered stream write.
	lat := time.Since(start)
	d.st.complLat.add(lat)
	d.cfg.Metrics.ObserveCompletionAck(lat)
	if kind == agentwire.AckStaleRejected {
		d.audit.Emit(context.Background(), telemetry.EventStaleLeaseReplay, telemetry.Runner(c.runner), telemetry.Session(c.session),
			telemetry.Transport(c.transport), telemetry.Remote(c.bc.RemoteAddr()), telemetry.Code(wire.ErrCodeStaleLease),
			telemetry.Reason(telemetry.ReasonLeaseSuperseded))
	}
	if h := d.cfg.Hooks.OnCompletion; h != nil {
		h(CompletionEvent{Runner: c.runner, Session: c.session, Transport: c.transport, MessageID: env.MessageID,
			Attempt: m.Attempt, Lease: m.Lease, Job: m.Job, Result: m.Result, Ack: kind})
	}
	c.reply(env, &agentwire.CompletionAckV1{Attempt: m.Attempt, Lease: m.Lease, Kind: kind})
	if kind == agentwire.AckAccepted || kind == agentwire.AckDuplicateAccepted {
		d.forgetAttemptLog(m.Attempt)
	}
	switch kind {
	case agentwire.AckAccepted:
		return telemetry.OutcomeOK
	case agentwire.AckDuplicateAccepted:
		return telemetry.OutcomeDuplicate
	}
	return telemetry.OutcomeRejected
}
