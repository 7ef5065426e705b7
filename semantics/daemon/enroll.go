package daemon

// Runner identity lifecycle on the daemon (§20–22, §224–225):
//
//   - Enrollment: on a connection without a client certificate, after the
//     hello, CertificateRequestV1{token, csr} is the only legal request.
//     The token is consumed atomically in the authority, the CSR checked,
//     and a certificate bound to a fresh RunnerId is returned
//     (CertificateIssuedV1); the connection is then closed. Anything else
//     (registration without a verified certificate included) is refused.
//   - Renewal: a registered transport sends CertificateRequestV1{csr} with
//     an empty token; the certificate keeps the transport's RunnerId.
//   - Expiry: a transport is closed with CloseAuthenticationFailure when the
//     certificate it registered with expires.
//   - Revocation: every RevocationPoll the daemon asks the authority
//     (CheckCredentials) about the credentials of its live transports and
//     closes those of disabled runners (CloseRunnerDisabled) or revoked
//     certificates (CloseAuthenticationFailure). A revocation made through
//     any daemon sharing the authority, or the CLI, thus reaches every
//     daemon within RevocationPoll plus one authority round trip. With an
//     authority that delivers events (authority.Watcher: PostgreSQL) the
//     check is event-driven instead (revocation.go): a disable or a
//     revoked certificate re-checks that runner's transports at once, and
//     the full poll only runs every RevocationFallbackPoll.

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// DefaultRevocationPoll is how often a daemon re-checks the credentials of
// its live transports against the authority.
const DefaultRevocationPoll = 2 * time.Second

// IdentityConfig configures enrollment, renewal and revocation.
type IdentityConfig struct {
	// Issuer signs enrolled and renewed agent certificates (the runner CA).
	// Nil means CertificateRequestV1 is refused (RetryUnsupported).
	// Enrollment also needs the listeners to accept connections without a
	// client certificate (trust.ServerFiles.RequireClientCert false, with
	// ClientCAFile set: tls.VerifyClientCertIfGiven).
	Issuer *trust.Issuer
	// RevocationPoll is the period of the revocation check; 0 means
	// DefaultRevocationPoll, negative disables it (revocation then reaches
	// only the daemon it was made on, through DisableRunner).
	RevocationPoll time.Duration
}

// credential is what a registered transport authenticated with.
type credential struct {
	serial   string
	notAfter time.Time
	cn       string
}

// noteCredential remembers the leaf a transport registered with and arms
// the expiry close. Called from onRegister.
func (c *conn) noteCredential(leaf *x509.Certificate) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cred = credential{serial: trust.SerialString(leaf), notAfter: leaf.NotAfter, cn: leaf.Subject.CommonName}
	if c.expiryTimer != nil {
		c.expiryTimer.Stop()
	}
	left := leaf.NotAfter.Sub(c.d.now())
	c.expiryTimer = time.AfterFunc(max(left, 0), func() {
		c.d.idst.expiredRejected.Add(1)
		c.emitAudit(telemetry.EventAuthFailure, wire.ErrCodeForbidden, telemetry.ReasonCertificateExpired, telemetry.CertSerial(leaf))
		c.closeNow(wire.CloseAuthenticationFailure, trust.MsgCredentialExpired)
	})
}

// audit writes an identity lifecycle record (identity.enrolled, .renewed,
// .superseded_revoked; never a token, key or payload). Security failures
// are typed audit events instead (emitAudit).
func (c *conn) audit(event, msg string, args ...any) {
	runner, sess, _, _ := c.ident()
	base := []any{"event", event, "transport", c.transport.String(), "remote", c.bc.RemoteAddr().String()}
	if runner != (wire.RunnerId{}) {
		base = append(base, "runner", runner.String(), "session", sess.String())
	}
	c.d.log.Warn(msg, append(base, args...)...)
}

// checkCredentialRevoked reports whether the leaf's serial was revoked
// (registration of a revoked certificate is refused, §225).
func (c *conn) checkCredentialRevoked(runner wire.RunnerId, serial string) (bool, error) {
	ids := authority.IdentitiesOf(c.d.auth)
	if ids == nil {
		return false, nil
	}
	ctx, cancel := c.authCtx()
	defer cancel()
	rv, err := ids.CheckCredentials(ctx, []authority.Credential{{Runner: runner, Serial: serial}})
	if err != nil {
		return false, err
	}
	for _, r := range rv {
		if !r.RunnerDisabled {
			return true, nil
		}
	}
	return false, nil
}

// onCertificateRequest serves enrollment (before registration) and renewal
// (after it). It runs before session.Check.
func (c *conn) onCertificateRequest(env *wire.Envelope, m *agentwire.CertificateRequestV1) {
	st := c.getState()
	switch {
	case st == session.Negotiated && m.Token != "":
		c.enroll(env, m)
	case st == session.Negotiated:
		c.violation(env.MessageID, wire.ErrCodeNotRegistered, "a certificate renewal needs a registered session; enrollment needs a token")
	case (st == session.Registered || st == session.Active || st == session.Draining) && m.Token == "":
		c.renew(env, m)
	case st == session.Connected:
		c.violation(env.MessageID, wire.ErrCodeNotRegistered, "send TransportHelloV1 first")
	default:
		c.violation(env.MessageID, wire.ErrCodeInvalidState, "an enrollment token is accepted only before registration")
	}
}

func (c *conn) enroll(env *wire.Envelope, m *agentwire.CertificateRequestV1) {
	d := c.d
	issuer := d.cfg.Identity.Issuer
	ids := authority.IdentitiesOf(d.auth)
	// One enrollment per connection, whatever its outcome.
	defer c.closeAfter(wire.CloseNormal, "enrollment finished")
	fail := func(code wire.ProtocolErrorCode, retry wire.RetryClass, msg string, args ...any) {
		reason := telemetry.ReasonEnrollmentRefused
		if code == wire.ErrCodeInvalidValue {
			reason = telemetry.ReasonValidationFailed // the CSR
		}
		if code != wire.ErrCodeInternal {
			c.emitAudit(telemetry.EventAuthFailure, code, reason, telemetry.ErrorText(errors.New(msg)))
		}
		c.logger().Warn("enrollment rejected", append([]any{"reason", msg, "remote", c.bc.RemoteAddr().String()}, args...)...)
		c.replyErr(env, code, retry, msg)
	}
	if issuer == nil || ids == nil {
		fail(wire.ErrCodeForbidden, wire.RetryUnsupported, "enrollment is not enabled on this daemon (no issuing CA configured)")
		return
	}
	if err := trust.CheckEnrollmentToken(m.Token); err != nil {
		fail(wire.ErrCodeForbidden, wire.RetryNever, trust.ErrBadEnrollmentToken.Error())
		return
	}
	tokenID := trust.EnrollmentTokenID(m.Token)
	csr, err := trust.ParseCSR(m.CSR)
	if err != nil {
		fail(wire.ErrCodeInvalidValue, wire.RetryNever, csrRefusal(err), "token_id", tokenID, "err", err)
		return
	}
	runner := wire.NewRunnerId()
	ctx, cancel := c.authCtx()
	defer cancel()
	tok, err := ids.ConsumeEnrollmentToken(ctx, trust.HashEnrollmentToken(m.Token), runner, d.now())
	if msg, refused := tokenRefusal(err); refused {
		fail(wire.ErrCodeForbidden, wire.RetryNever, msg, "token_id", tokenID)
		return
	}
	if err != nil {
		fail(wire.ErrCodeInternal, wire.RetryBackoff, msgAuthorityUnavailable, "token_id", tokenID)
		return
	}
	cn := tok.Name
	if cn == "" {
		cn = "forgeyard runner " + runner.String()
	}
	if !c.issue(env, ctx, csr, runner, cn, "identity.enrolled", "runner enrolled", "token_id", tokenID, "name", tok.Name) {
		return
	}
	d.idst.enrolled.Add(1)
}

func (c *conn) renew(env *wire.Envelope, m *agentwire.CertificateRequestV1) {
	d := c.d
	issuer := d.cfg.Identity.Issuer
	if issuer == nil || authority.IdentitiesOf(d.auth) == nil {
		c.replyErr(env, wire.ErrCodeForbidden, wire.RetryUnsupported, "certificate renewal is not enabled on this daemon (no issuing CA configured)")
		return
	}
	runner, _, _, _ := c.ident()
	c.mu.Lock()
	old := c.cred
	c.mu.Unlock()
	csr, err := trust.ParseCSR(m.CSR)
	if err != nil {
		c.emitAudit(telemetry.EventAuthFailure, wire.ErrCodeInvalidValue, telemetry.ReasonValidationFailed, telemetry.ErrorText(err))
		c.logger().Info("certificate renewal request refused", "err", err)
		c.replyErr(env, wire.ErrCodeInvalidValue, wire.RetryNever, csrRefusal(err))
		return
	}
	ctx, cancel := c.authCtx()
	defer cancel()
	st, err := d.auth.RunnerStatus(ctx, runner)
	if err != nil {
		c.replyErr(env, wire.ErrCodeInternal, wire.RetryBackoff, msgAuthorityUnavailable)
		return
	}
	if !st.Enabled {
		c.emitAudit(telemetry.EventRunnerRevoked, wire.ErrCodeRunnerDisabled, telemetry.ReasonRevoked)
		c.replyErr(env, wire.ErrCodeRunnerDisabled, wire.RetryNever, trust.MsgRunnerDisabled)
		c.closeAfter(wire.CloseRunnerDisabled, trust.MsgRunnerDisabled)
		return
	}
	if revoked, err := c.checkCredentialRevoked(runner, old.serial); err == nil && revoked {
		c.emitAudit(telemetry.EventRunnerRevoked, wire.ErrCodeForbidden, telemetry.ReasonRevoked, telemetry.SerialHex(old.serial))
		c.replyErr(env, wire.ErrCodeForbidden, wire.RetryNever, trust.MsgCredentialRevoked)
		c.closeAfter(wire.CloseAuthenticationFailure, trust.MsgCredentialRevoked)
		return
	}
	cn := old.cn
	if cn == "" {
		cn = "forgeyard runner " + runner.String()
	}
	if c.issue(env, ctx, csr, runner, cn, "identity.renewed", "certificate renewed", "old_serial", old.serial) {
		d.idst.renewed.Add(1)
	}
}

// retireSuperseded revokes the runner's older issued certificates once it
// has registered with a newer one (§21): a renewed agent no longer needs
// them, and a copy of an old key must not stay usable until its expiry.
// Nothing happens until the new certificate is used — a renewal answer
// lost on the way leaves the old certificate valid — nor for
// certificates this daemon did not issue (not recorded). Runs on the
// connection's work goroutine, after the registration was answered.
func (c *conn) retireSuperseded(runner wire.RunnerId, serial string) {
	ids := authority.IdentitiesOf(c.d.auth)
	if ids == nil {
		return
	}
	ctx, cancel := c.authCtx()
	defer cancel()
	certs, err := ids.Certificates(ctx, runner)
	if err != nil {
		c.logger().Warn("cannot list the runner's certificates to retire superseded ones", "err", err)
		return
	}
	var current *authority.IssuedCertificate
	for i := range certs {
		if certs[i].Serial == serial {
			current = &certs[i]
		}
	}
	if current == nil {
		return // not issued by a daemon of this authority
	}
	now := c.d.now()
	for _, old := range certs {
		if old.Revoked || !old.IssuedAt.Before(current.IssuedAt) || !old.NotAfter.After(now) {
			continue
		}
		if err := ids.RevokeCertificate(ctx, old.Serial, "superseded by "+serial, now); err != nil {
			c.logger().Warn("cannot revoke a superseded certificate", "serial", old.Serial, "err", err)
			continue
		}
		c.d.idst.superseded.Add(1)
		c.audit("identity.superseded_revoked", "superseded certificate revoked", "serial", old.Serial, "by_serial", serial)
	}
}

// issue signs, records and sends a certificate; it reports success.
func (c *conn) issue(env *wire.Envelope, ctx context.Context, csr *x509.CertificateRequest, runner wire.RunnerId, cn, event, msg string, args ...any) bool {
	d := c.d
	chain, leaf, err := d.cfg.Identity.Issuer.Issue(csr, runner, cn)
	if err != nil {
		d.log.Error("cannot issue a runner certificate", "runner", runner.String(), "err", err)
		c.replyErr(env, wire.ErrCodeInternal, wire.RetryBackoff, "the daemon cannot issue certificates right now")
		return false
	}
	if err := authority.IdentitiesOf(d.auth).RecordCertificate(ctx, authority.IssuedCertificate{Serial: trust.SerialString(leaf),
		Runner: runner, NotAfter: leaf.NotAfter, IssuedAt: d.now()}); err != nil {
		c.replyErr(env, wire.ErrCodeInternal, wire.RetryBackoff, msgAuthorityUnavailable)
		return false
	}
	c.audit(event, msg, append([]any{"issued_runner", runner.String(), "serial", trust.SerialString(leaf),
		"not_after", leaf.NotAfter.UTC().Format(time.RFC3339)}, args...)...)
	c.reply(env, &agentwire.CertificateIssuedV1{Runner: runner, CertChain: chain, NotAfterMs: uint64(leaf.NotAfter.UnixMilli())})
	return true
}

// revocationLoop closes transports whose runner was disabled or whose
// certificate was revoked in the authority, by any daemon.
func (d *Daemon) revocationLoop(period time.Duration) {
	defer d.wg.Done()
	d.every(period, d.checkRevocations)
}

// checkRevocations runs one revocation check over the live transports.
// While the authority's revocation revision has not moved since the last
// full check that completed (revocation.go), only the transports that
// registered since are checked: their registration may have checked their
// credential just before a revocation whose revision the last check read.
func (d *Daemon) checkRevocations() {
	rev, ok := d.revocationRevision()
	full := !ok || !d.revisionKnown || rev != d.lastRevision
	var conns []*conn
	d.mu.Lock()
	if full {
		conns = make([]*conn, 0, len(d.conns))
	}
	for _, c := range d.conns {
		if c.registered() && (full || !c.revChecked) {
			conns = append(conns, c)
		}
	}
	d.mu.Unlock()
	if !full {
		d.revocationSkips.Add(1)
	}
	if !d.checkRevocationsOf(conns) {
		return
	}
	for _, c := range conns {
		c.revChecked = true
	}
	if full {
		d.lastRevision, d.revisionKnown = rev, ok
	}
}

// checkRevocationsOf checks the credentials of conns against the authority
// and closes the revoked ones; false if the authority could not answer.
func (d *Daemon) checkRevocationsOf(conns []*conn) bool {
	if len(conns) == 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(d.ctx, d.timing.RequestTimeout)
	defer cancel()
	ids := authority.IdentitiesOf(d.auth)
	byCred := map[authority.Credential][]*conn{}
	var creds []authority.Credential
	for _, c := range conns {
		runner, _, _, _ := c.ident()
		c.mu.Lock()
		cr := authority.Credential{Runner: runner, Serial: c.cred.serial}
		c.mu.Unlock()
		if _, ok := byCred[cr]; !ok {
			creds = append(creds, cr)
		}
		byCred[cr] = append(byCred[cr], c)
	}
	var revs []authority.Revocation
	if ids != nil {
		for lo := 0; lo < len(creds); lo += authority.MaxCheckCredentials {
			rv, err := ids.CheckCredentials(ctx, creds[lo:min(lo+authority.MaxCheckCredentials, len(creds))])
			if err != nil {
				d.log.Warn("revocation check failed", "err", err)
				return false
			}
			revs = append(revs, rv...)
		}
	} else {
		for _, cr := range creds {
			st, err := d.auth.RunnerStatus(ctx, cr.Runner)
			if err != nil {
				d.log.Warn("revocation check failed", "err", err)
				return false
			}
			if !st.Enabled {
				revs = append(revs, authority.Revocation{Credential: cr, RunnerDisabled: true, Reason: st.Reason})
			}
		}
	}
	for _, r := range revs {
		for _, c := range byCred[r.Credential] {
			d.idst.revokedClosed.Add(1)
			if r.RunnerDisabled {
				c.emitAudit(telemetry.EventRunnerRevoked, wire.ErrCodeRunnerDisabled, telemetry.ReasonRevoked)
				c.closeNow(wire.CloseRunnerDisabled, fmt.Sprintf("%s (%s)", trust.MsgRunnerDisabled, r.Reason))
			} else {
				c.emitAudit(telemetry.EventRunnerRevoked, wire.ErrCodeForbidden, telemetry.ReasonRevoked, telemetry.SerialHex(r.Serial))
				c.closeNow(wire.CloseAuthenticationFailure, trust.MsgCredentialRevoked)
			}
		}
	}
	return true
}

type identityStats struct {
	enrolled, renewed, revokedClosed, expiredRejected, superseded atomic.Int64
}

// IdentityStats are the daemon's identity lifecycle counters.
type IdentityStats struct {
	Enrolled        int64 // certificates issued to new runners
	Renewed         int64 // certificates renewed for registered runners
	RevokedClosed   int64 // transports closed because their runner was disabled or certificate revoked
	ExpiredRejected int64 // registrations refused and transports closed for an expired certificate
	Superseded      int64 // older certificates revoked after the runner registered with a renewed one
	// RevocationSkipped counts periodic revocation checks that found the
	// authority's revocation revision unchanged and so checked only the
	// transports registered since the last one (SQLite; revocation.go).
	RevocationSkipped int64
}

// IdentityStats returns the identity lifecycle counters.
func (d *Daemon) IdentityStats() IdentityStats {
	return IdentityStats{Enrolled: d.idst.enrolled.Load(), Renewed: d.idst.renewed.Load(),
		RevokedClosed: d.idst.revokedClosed.Load(), ExpiredRejected: d.idst.expiredRejected.Load(), Superseded: d.idst.superseded.Load(),
		RevocationSkipped: d.revocationSkips.Load()}
}
