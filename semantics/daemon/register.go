package daemon

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

func (c *conn) onHello(env *wire.Envelope, m *agentwire.TransportHelloV1) {
	d := c.d
	if !c.admitRegistration(env, m) {
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
	c.sendRole.Store(int64(m.Role))
	if m.HasAgentSession {
		c.helloSession = m.AgentSession
	}
	c.agentVersion = intern(m.AgentVersion)
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
			if i < len(cs.PeerCertificates) && bytes.Equal(cs.PeerCertificates[i].Raw, der) {
				// The TLS handshake parsed this one already, and the
				// connection keeps it: share it rather than hold a
				// second parse per agent (≈ 2.5 KiB each).
				certs[i] = cs.PeerCertificates[i]
				continue
			}
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

// abandoned reports whether c's connection ended during its registration
// (when: the step), counting and logging it: the agent gave up and
// registers again on another connection.
func (c *conn) abandoned(m *agentwire.RegisterAgentV1, when string) bool {
	if c.bc.Context().Err() == nil {
		return false
	}
	c.d.st.abandoned.Add(1)
	c.logger().Info("registration abandoned: the agent's connection ended "+when, "runner", m.Runner.String(),
		"session", m.Session.String(), "cause", context.Cause(c.bc.Context()))
	return true
}

// onRegister handles RegisterAgentV1: authenticate, record with the
// authority, fence older transports, accept.
func (c *conn) onRegister(env *wire.Envelope, m *agentwire.RegisterAgentV1) {
	_, sp := c.span(env, telemetry.SpanRegister, telemetry.AttrRunner(m.Runner))
	defer func() {
		if c.getState() < session.Registered {
			telemetry.End(sp, errRegistrationRefused)
			return
		}
		sp.End()
	}()
	leaf, ok := c.authenticate(env, m)
	if !ok {
		return
	}
	if c.abandoned(m, "before the authority recorded it") {
		return
	}
	grant, ok := c.recordRegistration(env, m)
	if !ok {
		return
	}
	// The agent may have given up meanwhile (its registration timeout, a
	// cut): the grant stands in the authority (the agent's next
	// registration fences it with a newer epoch), but this transport is
	// not registered, counted or announced, so the agent is registered
	// once, on the connection it is still on.
	if c.abandoned(m, "while the authority recorded it") {
		return
	}
	c.mu.Lock()
	c.runner, c.session, c.epoch = m.Runner, m.Session, grant.Epoch
	c.agentVersion = intern(m.AgentVersion)
	c.mu.Unlock()
	c.noteCredential(leaf)

	c.fenceOlder(m, grant.Epoch)
	c.accept(env, m, leaf, grant)
}

// authenticate is registration's authentication step: the hello's
// session, the certificate, the runner it names, the key proof and
// revocation. It rejects env and reports false when one fails.
func (c *conn) authenticate(env *wire.Envelope, m *agentwire.RegisterAgentV1) (*x509.Certificate, bool) {
	d := c.d
	if c.helloSession != (wire.AgentSessionId{}) && c.helloSession != m.Session {
		c.reject(env, wire.ErrCodeInvalidValue, wire.RetryNever, "session differs from the hello's agent_session", wire.CloseProtocolError)
		return nil, false
	}
	leaf, err := c.identity(m)
	if err != nil {
		msg := authRefusal(err) // the peer gets a fixed text; the log and audit get err
		if errors.Is(err, trust.ErrCertExpired) {
			d.idst.expiredRejected.Add(1)
		}
		c.logger().Info("registration certificate refused", "err", err)
		reason := telemetry.ReasonBadCertificate
		if errors.Is(err, trust.ErrCertExpired) {
			reason = telemetry.ReasonCertificateExpired
		}
		c.auditAuth(m, reason, telemetry.ErrorText(err))
		c.reject(env, wire.ErrCodeForbidden, wire.RetryNever, msg, wire.CloseAuthenticationFailure)
		return nil, false
	}
	runner, err := trust.RunnerIDFromCert(leaf)
	if err != nil || runner != m.Runner {
		c.auditAuth(m, telemetry.ReasonRunnerMismatch)
		c.reject(env, wire.ErrCodeForbidden, wire.RetryNever, "authentication failed: certificate does not name this runner", wire.CloseAuthenticationFailure)
		return nil, false
	}
	if err := session.VerifyKeyProof(leaf.PublicKey, m.KeyProof, c.challenge, c.transport, m.Session); err != nil {
		c.auditAuth(m, telemetry.ReasonKeyProofFailed)
		c.reject(env, wire.ErrCodeForbidden, wire.RetryNever, "authentication failed: key proof does not verify", wire.CloseAuthenticationFailure)
		return nil, false
	}
	if revoked, err := c.checkCredentialRevoked(m.Runner, trust.SerialString(leaf)); err != nil {
		c.ch.SetOutcome(d.authorityFailed("check_credentials", err, "runner", m.Runner.String()))
		c.reject(env, wire.ErrCodeInternal, wire.RetryBackoff, msgAuthorityUnavailable, wire.CloseInternalError)
		return nil, false
	} else if revoked {
		c.d.audit.Emit(context.Background(), telemetry.EventRunnerRevoked, telemetry.Runner(m.Runner), telemetry.Session(m.Session),
			telemetry.Transport(c.transport), telemetry.Remote(c.bc.RemoteAddr()), telemetry.Code(wire.ErrCodeForbidden),
			telemetry.Reason(telemetry.ReasonRevoked), telemetry.CertSerial(leaf))
		c.reject(env, wire.ErrCodeForbidden, wire.RetryNever, trust.MsgCredentialRevoked, wire.CloseAuthenticationFailure)
		return nil, false
	}
	return leaf, true
}

// recordRegistration is registration's authority step: the authority
// records the session and grants its epoch. It rejects env and reports
// false when the authority refuses or fails.
func (c *conn) recordRegistration(env *wire.Envelope, m *agentwire.RegisterAgentV1) (authority.SessionGrant, bool) {
	d := c.d
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
		return authority.SessionGrant{}, false
	case errors.Is(err, authority.ErrStaleSession):
		c.auditEvent(telemetry.EventSessionFenced, wire.ErrCodeStaleSession, telemetry.ReasonNewerRegistration)
		c.reject(env, wire.ErrCodeStaleSession, wire.RetryNever, "agent session ended or superseded; start a new session", wire.CloseProtocolError)
		return authority.SessionGrant{}, false
	case errors.Is(err, authority.ErrSessionOwnership):
		c.auditAuth(m, telemetry.ReasonRunnerMismatch)
		c.reject(env, wire.ErrCodeForbidden, wire.RetryNever, "agent session belongs to another runner", wire.CloseAuthenticationFailure)
		return authority.SessionGrant{}, false
	case err != nil:
		c.ch.SetOutcome(d.authorityFailed("register", err, "runner", m.Runner.String()))
		c.reject(env, wire.ErrCodeInternal, wire.RetryBackoff, msgAuthorityUnavailable, wire.CloseInternalError)
		return authority.SessionGrant{}, false
	}
	return grant, true
}

// fenceOlder is registration's fencing step (§15, §61): it indexes c under
// its runner and session and fences the runner's other registered
// transports with epoch.
func (c *conn) fenceOlder(m *agentwire.RegisterAgentV1, epoch uint64) {
	d := c.d
	// Fence older transports of this session on this daemon, and close
	// transports of superseded sessions of the same runner (§15, §61).
	d.mu.Lock()
	var fence []*conn
	for o := range d.byRunner[m.Runner] {
		if o != c && o.registered() {
			fence = append(fence, o)
		}
	}
	if _, live := d.conns[c.transport]; live { // not torn down meanwhile
		if d.byRunner[m.Runner] == nil {
			d.byRunner[m.Runner] = map[*conn]struct{}{}
		}
		d.byRunner[m.Runner][c] = struct{}{}
		d.bySession[m.Session] = c
	}
	d.mu.Unlock()
	for _, o := range fence {
		o.fence(c, epoch)
	}
}

// accept is registration's acceptance step: counting, the session's
// state and heartbeat interval, hooks and inventory, then
// RegistrationAcceptedV1 (and the server time when no resync follows).
func (c *conn) accept(env *wire.Envelope, m *agentwire.RegisterAgentV1, leaf *x509.Certificate, grant authority.SessionGrant) {
	d := c.d
	d.st.registrations.Add(1)
	if grant.Epoch > 1 {
		d.st.reconnects.Add(1)
	}
	if c.role != agentwire.RoleAgent && c.role != agentwire.RoleInternalWorker {
		c.setState(session.Active) // no leases to resync
	} else {
		c.setState(session.Registered)
	}
	c.stopRegTimer()
	c.registrationDone()
	t := d.timing
	hb := t.heartbeatInterval(d.registeredSessions())
	c.mu.Lock()
	c.hbInterval = hb
	c.mu.Unlock()
	c.resetLiveness()
	if h := d.cfg.Hooks.OnRegistered; h != nil {
		h(c.info())
	}
	d.peers.note(c, m.Capabilities) // peers.go: how signing workers advertise their keys
	if h := d.cfg.Hooks.OnCapabilities; h != nil {
		h(c.info(), m.Capabilities)
	}
	c.noteRegistered(m.Capabilities, m.CapabilityDigest) // inventory.go
	stagger := make([]uint32, len(t.FallbackStagger))
	for i, s := range t.FallbackStagger {
		stagger[i] = uint32(s.Milliseconds())
	}
	c.reply(env, &agentwire.RegistrationAcceptedV1{Session: m.Session, Epoch: grant.Epoch, TransportSession: c.transport,
		HeartbeatIntervalMs: ms32(hb), LeaseRenewIntervalMs: ms32(t.RenewInterval), MaxBackoffMs: ms32(t.MaxBackoff),
		AlternateEndpoints: d.cfg.AlternateEndpoints, FallbackStaggerMs: stagger, ServerTimeMs: uint64(d.now().UnixMilli())})
	if c.getState() == session.Active { // no resync follows (servertime.go)
		c.sendServerTime()
	}
	if authority.IdentitiesOf(d.auth) != nil {
		serial := trust.SerialString(leaf)
		c.ordered(func() { c.retireSuperseded(m.Runner, serial) })
	}
}

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
