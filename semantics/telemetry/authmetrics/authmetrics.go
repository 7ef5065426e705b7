// Package authmetrics instruments a daemon's authority.Authority: every
// call's latency (forgeyard_authority_operation_duration_seconds) and its
// errors by kind (forgeyard_authority_errors_total), on a telemetry.Metrics
// registry. It is a package of its own so that the agent and the relay,
// which link semantics/telemetry, do not link the authority.
package authmetrics

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
)

// Operations are the operation labels (forgeyard_authority_operation_duration_seconds
// and forgeyard_authority_errors_total): one per method of
// authority.Authority and authority.Identities.
var Operations = []string{
	"runner_status", "set_runner_enabled", "register_session", "check_epoch", "end_session",
	"create_lease", "lease", "accept_lease", "reject_lease", "renew_lease", "cancel_attempt",
	"complete_attempt", "resync", "session_leases", "expired_leases", "revoke_lease", "expire_lease",
	"completions", "prune_dedup",
	"create_enrollment_token", "consume_enrollment_token", "revoke_enrollment_token", "enrollment_tokens",
	"record_certificate", "revoke_certificate", "certificates", "check_credentials",
}

// Error kinds of forgeyard_authority_errors_total.
const (
	// Refused: a domain answer (authority.ErrStaleLease,
	// ErrFenced, ErrNotFound, ErrRunnerDisabled, ...): the store worked.
	Refused = "refused"
	// Canceled: the caller's context ended (shutdown, a dropped
	// connection).
	Canceled = "canceled"
	// Failed: anything else — the store is unavailable, a query
	// failed. Alert on this one.
	Failed = "failed"
)

var authorityRefusals = []error{
	authority.ErrRunnerDisabled, authority.ErrStaleSession, authority.ErrSessionOwnership, authority.ErrFenced,
	authority.ErrNotFound, authority.ErrStaleLease, authority.ErrConflict,
	authority.ErrTokenUnknown, authority.ErrTokenUsed, authority.ErrTokenExpired, authority.ErrTokenRevoked,
}

// ErrorKind classifies an authority error (nil: "").
func ErrorKind(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return Canceled
	}
	for _, r := range authorityRefusals {
		if errors.Is(err, r) {
			return Refused
		}
	}
	return Failed
}

type authorityMetrics struct {
	latency *prometheus.HistogramVec
	errs    *prometheus.CounterVec
}

func newAuthorityMetrics(reg *prometheus.Registry) *authorityMetrics {
	am := &authorityMetrics{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: telemetry.Namespace, Name: "authority_operation_duration_seconds",
			Help: "Latency of authority (SQLite/PostgreSQL store) operations, by operation, errors included.", Buckets: telemetry.LatencyBuckets}, []string{"operation"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: telemetry.Namespace, Name: "authority_errors_total",
			Help: "Authority operations that returned an error, by operation and kind: refused (a domain answer such as a stale lease), canceled (the caller gave up), failed (store unavailable or query failed)."},
			[]string{"operation", "kind"}),
	}
	reg.MustRegister(am.latency, am.errs)
	for _, op := range Operations {
		am.latency.WithLabelValues(op)
		for _, k := range []string{Refused, Canceled, Failed} {
			am.errs.WithLabelValues(op, k)
		}
	}
	return am
}

// registered remembers the Metrics of each registry, so Instrument can be
// called more than once (each wrapper shares the series).
var (
	regMu      sync.Mutex
	registered = map[*prometheus.Registry]*authorityMetrics{}
)

// Instrument returns a that records every call's latency and error in m's
// registry (the families are registered on first use, with a series per
// operation at zero). The result implements authority.Identities exactly
// when a does, so authority.IdentitiesOf keeps working. A nil m returns a
// unchanged.
func Instrument(m *telemetry.Metrics, a authority.Authority) authority.Authority {
	if m == nil || a == nil {
		return a
	}
	reg := m.Registry()
	regMu.Lock()
	am := registered[reg]
	if am == nil {
		am = newAuthorityMetrics(reg)
		registered[reg] = am
	}
	regMu.Unlock()
	ia := &instrumentedAuthority{a: a, m: am}
	if id := authority.IdentitiesOf(a); id != nil {
		return &instrumentedIdentities{instrumentedAuthority: ia, id: id}
	}
	return ia
}

type instrumentedAuthority struct {
	a authority.Authority
	m *authorityMetrics
}

func (ia *instrumentedAuthority) done(op string, start time.Time, err error) {
	ia.m.latency.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if k := ErrorKind(err); k != "" {
		ia.m.errs.WithLabelValues(op, k).Inc()
	}
}

func observe[T any](ia *instrumentedAuthority, op string, f func() (T, error)) (T, error) {
	start := time.Now()
	v, err := f()
	ia.done(op, start, err)
	return v, err
}

func observeErr(ia *instrumentedAuthority, op string, f func() error) error {
	start := time.Now()
	err := f()
	ia.done(op, start, err)
	return err
}

func (ia *instrumentedAuthority) RunnerStatus(ctx context.Context, runner wire.RunnerId) (authority.RunnerStatus, error) {
	return observe(ia, "runner_status", func() (authority.RunnerStatus, error) { return ia.a.RunnerStatus(ctx, runner) })
}

func (ia *instrumentedAuthority) SetRunnerEnabled(ctx context.Context, runner wire.RunnerId, enabled bool, reason string, now time.Time) error {
	return observeErr(ia, "set_runner_enabled", func() error { return ia.a.SetRunnerEnabled(ctx, runner, enabled, reason, now) })
}

func (ia *instrumentedAuthority) RegisterSession(ctx context.Context, r authority.Registration) (authority.SessionGrant, error) {
	return observe(ia, "register_session", func() (authority.SessionGrant, error) { return ia.a.RegisterSession(ctx, r) })
}

func (ia *instrumentedAuthority) CheckEpoch(ctx context.Context, session wire.AgentSessionId, epoch uint64) (authority.SessionHolder, error) {
	return observe(ia, "check_epoch", func() (authority.SessionHolder, error) { return ia.a.CheckEpoch(ctx, session, epoch) })
}

func (ia *instrumentedAuthority) EndSession(ctx context.Context, session wire.AgentSessionId, now time.Time) error {
	return observeErr(ia, "end_session", func() error { return ia.a.EndSession(ctx, session, now) })
}

func (ia *instrumentedAuthority) CreateLease(ctx context.Context, l authority.Lease) error {
	return observeErr(ia, "create_lease", func() error { return ia.a.CreateLease(ctx, l) })
}

func (ia *instrumentedAuthority) Lease(ctx context.Context, id wire.LeaseId) (authority.Lease, error) {
	return observe(ia, "lease", func() (authority.Lease, error) { return ia.a.Lease(ctx, id) })
}

func (ia *instrumentedAuthority) AcceptLease(ctx context.Context, id wire.LeaseId, attempt wire.JobAttemptId, session authority.SessionRef, now time.Time) (authority.Lease, error) {
	return observe(ia, "accept_lease", func() (authority.Lease, error) { return ia.a.AcceptLease(ctx, id, attempt, session, now) })
}

func (ia *instrumentedAuthority) RejectLease(ctx context.Context, id wire.LeaseId, attempt wire.JobAttemptId, session authority.SessionRef, now time.Time) error {
	return observeErr(ia, "reject_lease", func() error { return ia.a.RejectLease(ctx, id, attempt, session, now) })
}

func (ia *instrumentedAuthority) RenewLease(ctx context.Context, msg wire.MessageId, id wire.LeaseId, attempt wire.JobAttemptId, session authority.SessionRef, now time.Time) (authority.RenewResult, error) {
	return observe(ia, "renew_lease", func() (authority.RenewResult, error) {
		return ia.a.RenewLease(ctx, msg, id, attempt, session, now)
	})
}

func (ia *instrumentedAuthority) CancelAttempt(ctx context.Context, attempt wire.JobAttemptId, reason uint32, now time.Time) (authority.Lease, error) {
	return observe(ia, "cancel_attempt", func() (authority.Lease, error) { return ia.a.CancelAttempt(ctx, attempt, reason, now) })
}

func (ia *instrumentedAuthority) CompleteAttempt(ctx context.Context, c authority.Completion) (authority.AckKind, error) {
	return observe(ia, "complete_attempt", func() (authority.AckKind, error) { return ia.a.CompleteAttempt(ctx, c) })
}

func (ia *instrumentedAuthority) Resync(ctx context.Context, session authority.SessionRef, claims []authority.AttemptClaim, now time.Time) ([]authority.Decision, error) {
	return observe(ia, "resync", func() ([]authority.Decision, error) { return ia.a.Resync(ctx, session, claims, now) })
}

func (ia *instrumentedAuthority) SessionLeases(ctx context.Context, session wire.AgentSessionId, states ...authority.LeaseState) ([]authority.Lease, error) {
	return observe(ia, "session_leases", func() ([]authority.Lease, error) { return ia.a.SessionLeases(ctx, session, states...) })
}

func (ia *instrumentedAuthority) ExpiredLeases(ctx context.Context, before time.Time, limit int) ([]authority.Lease, error) {
	return observe(ia, "expired_leases", func() ([]authority.Lease, error) { return ia.a.ExpiredLeases(ctx, before, limit) })
}

func (ia *instrumentedAuthority) RevokeLease(ctx context.Context, id wire.LeaseId, reason string, now time.Time) error {
	return observeErr(ia, "revoke_lease", func() error { return ia.a.RevokeLease(ctx, id, reason, now) })
}

func (ia *instrumentedAuthority) ExpireLease(ctx context.Context, id wire.LeaseId, before time.Time) (bool, error) {
	return observe(ia, "expire_lease", func() (bool, error) { return ia.a.ExpireLease(ctx, id, before) })
}

func (ia *instrumentedAuthority) Completions(ctx context.Context, attempt wire.JobAttemptId) (int, error) {
	return observe(ia, "completions", func() (int, error) { return ia.a.Completions(ctx, attempt) })
}

func (ia *instrumentedAuthority) PruneDedup(ctx context.Context, before time.Time) (int, error) {
	return observe(ia, "prune_dedup", func() (int, error) { return ia.a.PruneDedup(ctx, before) })
}

// Close closes the wrapped authority (not timed).
func (ia *instrumentedAuthority) Close() error { return ia.a.Close() }

// Unwrap returns the wrapped authority.
func (ia *instrumentedAuthority) Unwrap() authority.Authority { return ia.a }

type instrumentedIdentities struct {
	*instrumentedAuthority
	id authority.Identities
}

func (ii *instrumentedIdentities) CreateEnrollmentToken(ctx context.Context, t authority.EnrollmentToken) error {
	return observeErr(ii.instrumentedAuthority, "create_enrollment_token", func() error { return ii.id.CreateEnrollmentToken(ctx, t) })
}

func (ii *instrumentedIdentities) ConsumeEnrollmentToken(ctx context.Context, hash [32]byte, runner wire.RunnerId, now time.Time) (authority.EnrollmentToken, error) {
	return observe(ii.instrumentedAuthority, "consume_enrollment_token", func() (authority.EnrollmentToken, error) {
		return ii.id.ConsumeEnrollmentToken(ctx, hash, runner, now)
	})
}

func (ii *instrumentedIdentities) RevokeEnrollmentToken(ctx context.Context, id string, now time.Time) error {
	return observeErr(ii.instrumentedAuthority, "revoke_enrollment_token", func() error { return ii.id.RevokeEnrollmentToken(ctx, id, now) })
}

func (ii *instrumentedIdentities) EnrollmentTokens(ctx context.Context, limit int) ([]authority.EnrollmentToken, error) {
	return observe(ii.instrumentedAuthority, "enrollment_tokens", func() ([]authority.EnrollmentToken, error) { return ii.id.EnrollmentTokens(ctx, limit) })
}

func (ii *instrumentedIdentities) RecordCertificate(ctx context.Context, c authority.IssuedCertificate) error {
	return observeErr(ii.instrumentedAuthority, "record_certificate", func() error { return ii.id.RecordCertificate(ctx, c) })
}

func (ii *instrumentedIdentities) RevokeCertificate(ctx context.Context, serial, reason string, now time.Time) error {
	return observeErr(ii.instrumentedAuthority, "revoke_certificate", func() error { return ii.id.RevokeCertificate(ctx, serial, reason, now) })
}

func (ii *instrumentedIdentities) Certificates(ctx context.Context, runner wire.RunnerId) ([]authority.IssuedCertificate, error) {
	return observe(ii.instrumentedAuthority, "certificates", func() ([]authority.IssuedCertificate, error) { return ii.id.Certificates(ctx, runner) })
}

func (ii *instrumentedIdentities) CheckCredentials(ctx context.Context, creds []authority.Credential) ([]authority.Revocation, error) {
	return observe(ii.instrumentedAuthority, "check_credentials", func() ([]authority.Revocation, error) { return ii.id.CheckCredentials(ctx, creds) })
}

var (
	_ authority.Authority  = (*instrumentedAuthority)(nil)
	_ authority.Identities = (*instrumentedIdentities)(nil)
)
