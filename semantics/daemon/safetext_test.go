package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// secretMarker is planted in every error the leaky authority returns.
const secretMarker = "SECRET-MARKER-7f3a"

// leakyAuthority is an authority whose calls fail, while failing is set,
// with an error text a database driver might produce — a host, a password
// and the marker — which must never reach a peer.
type leakyAuthority struct {
	authority.Authority
	failing atomic.Bool
}

func (a *leakyAuthority) err(op string) error {
	return fmt.Errorf("authority %s: pq: connection to 10.9.8.7:5432 failed: password=hunter2 %s", op, secretMarker)
}

func (a *leakyAuthority) RegisterSession(ctx context.Context, r authority.Registration) (authority.SessionGrant, error) {
	if a.failing.Load() {
		return authority.SessionGrant{}, a.err("register")
	}
	return a.Authority.RegisterSession(ctx, r)
}

func (a *leakyAuthority) RunnerStatus(ctx context.Context, r wire.RunnerId) (authority.RunnerStatus, error) {
	if a.failing.Load() {
		return authority.RunnerStatus{}, a.err("status")
	}
	return a.Authority.RunnerStatus(ctx, r)
}

func (a *leakyAuthority) CheckEpoch(ctx context.Context, s wire.AgentSessionId, e uint64) (authority.SessionHolder, error) {
	if a.failing.Load() {
		return authority.SessionHolder{}, a.err("epoch")
	}
	return a.Authority.CheckEpoch(ctx, s, e)
}

func (a *leakyAuthority) AcceptLease(ctx context.Context, id wire.LeaseId, at wire.JobAttemptId, s authority.SessionRef, now time.Time) (authority.Lease, error) {
	if a.failing.Load() {
		return authority.Lease{}, a.err("accept")
	}
	return a.Authority.AcceptLease(ctx, id, at, s, now)
}

func (a *leakyAuthority) Lease(ctx context.Context, id wire.LeaseId) (authority.Lease, error) {
	if a.failing.Load() {
		return authority.Lease{}, a.err("lease")
	}
	return a.Authority.Lease(ctx, id)
}

func (a *leakyAuthority) RenewLease(ctx context.Context, msg wire.MessageId, id wire.LeaseId, at wire.JobAttemptId, s authority.SessionRef, now time.Time) (authority.RenewResult, error) {
	if a.failing.Load() {
		return authority.RenewResult{}, a.err("renew")
	}
	return a.Authority.RenewLease(ctx, msg, id, at, s, now)
}

func (a *leakyAuthority) CompleteAttempt(ctx context.Context, c authority.Completion) (authority.AckKind, error) {
	if a.failing.Load() {
		return 0, a.err("complete")
	}
	return a.Authority.CompleteAttempt(ctx, c)
}

func (a *leakyAuthority) Resync(ctx context.Context, s authority.SessionRef, cl []authority.AttemptClaim, now time.Time) ([]authority.Decision, error) {
	if a.failing.Load() {
		return nil, a.err("resync")
	}
	return a.Authority.Resync(ctx, s, cl, now)
}

func (a *leakyAuthority) SessionLeases(ctx context.Context, s wire.AgentSessionId, st ...authority.LeaseState) ([]authority.Lease, error) {
	if a.failing.Load() {
		return nil, a.err("session leases")
	}
	return a.Authority.SessionLeases(ctx, s, st...)
}

// noMarker fails if text carries the planted secret or the driver's text.
func noMarker(t *testing.T, where, text string) {
	t.Helper()
	for _, bad := range []string{secretMarker, "hunter2", "10.9.8.7", "pq:"} {
		if strings.Contains(text, bad) {
			t.Errorf("%s carries internal error text %q: %q", where, bad, text)
		}
	}
}

// TestErrorRepliesCarryNoInternalText (§262–265, §300 "protocol error
// response contains safe stable code"): with an authority whose every
// failure carries a planted secret, each request that reaches it —
// renewal, lease answer, completion, resync, logs-finalized barrier,
// registration — is answered with the stable code and a fixed text; the
// secret reaches neither a reply, a rejection nor the close reason.
func TestErrorRepliesCarryNoInternalText(t *testing.T) {
	enginetest.AllBackends(t, func(t *testing.T, b enginetest.Backend) {
		sq, err := authority.OpenSQLite(context.Background(), ":memory:")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sq.Close() })
		auth := &leakyAuthority{Authority: sq}
		w := enginetest.NewWorldWith(t, b, trusttest.NewPKI(t), auth)
		id := w.NewIdentity()
		rc := w.DialRaw(id)
		rc.Join(wire.NewAgentSessionId())
		w.AwaitActive(id.Runner)
		auth.failing.Store(true)

		lease, attempt := wire.NewLeaseId(), wire.NewJobAttemptId()
		reqs := []wire.Message{
			&agentwire.LeaseRenewV1{Lease: lease, Attempt: attempt, ObservedPhase: agentwire.PhaseRunning},
			&agentwire.LeaseAcceptedV1{Lease: lease, Attempt: attempt, Session: rc.Sess},
			&agentwire.AttemptCompletionV1{Job: wire.NewJobId(), Attempt: attempt, Lease: lease, Spec: enginetest.Spec(1),
				Result: agentwire.ExecutionResultV1{Kind: agentwire.ResultSucceeded}},
			&agentwire.AgentResyncV1{Session: rc.Sess, Epoch: rc.Epoch, CapabilityDigest: wire.CapabilityDigest{Digest: wire.Digest{9}}},
			&wlogs.LogsFinalizedV1{Attempt: attempt, Lease: lease, LastSeq: 1},
		}
		internal := 0
		for _, m := range reqs {
			env, err := rc.Call(m)
			var we *wire.WireErrorV1
			switch {
			case errors.As(err, &we):
				noMarker(t, fmt.Sprintf("error reply to %T", m), we.Message)
				if we.Code == wire.ErrCodeInternal {
					internal++
				}
			case err != nil:
				t.Fatalf("%T: %v", m, err)
			default:
				noMarker(t, fmt.Sprintf("answer to %T", m), fmt.Sprintf("%+v", env.Payload))
			}
		}
		if internal < 3 {
			t.Errorf("%d Internal answers, want the authority failure reported at least 3 times", internal)
		}

		// A registration while the authority fails: a rejection with a
		// fixed text, and a close reason without the secret.
		id2 := w.NewIdentity()
		rc2 := w.DialRaw(id2)
		rc2.Hello(agentwire.RoleAgent)
		rej, ok := rc2.Register(wire.NewAgentSessionId()).(*agentwire.RegistrationRejectedV1)
		if !ok {
			t.Fatal("registration was not rejected while the authority fails")
		}
		if rej.Code != wire.ErrCodeInternal {
			t.Errorf("rejection code %s, want Internal", rej.Code)
		}
		noMarker(t, "registration rejection", rej.Message)
		rc2.CloseCode()
		noMarker(t, "close reason", fmt.Sprint(context.Cause(rc2.Bc.Context())))
	})
}

// TestEnrollmentRefusalsCarryNoParserText: a malformed enrollment token or
// CSR is answered with the sentinel's fixed text, never the parser's.
func TestEnrollmentRefusalsCarryNoParserText(t *testing.T) {
	enginetest.AllBackends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewIDWorld(t, b, trusttest.NewPKI(t), enginetest.SqliteAuth(t))
		tok, err := trust.NewEnrollmentToken()
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			req  *agentwire.CertificateRequestV1
			want string
		}{
			{"csr", &agentwire.CertificateRequestV1{Token: tok, CSR: []byte{0x30, 0x03, 0x02, 0x01, 0x07}}, trust.ErrBadCSR.Error()},
			{"token", &agentwire.CertificateRequestV1{Token: "fyet_" + strings.Repeat("!", 52), CSR: []byte{0x30, 0}}, trust.ErrBadEnrollmentToken.Error()},
		} {
			rc := enginetest.RawOn(t, dialNoCert(t, w), enginetest.Identity{})
			rc.Hello(agentwire.RoleAgent)
			_, err := rc.Call(tc.req)
			var we *wire.WireErrorV1
			if !errors.As(err, &we) {
				t.Fatalf("%s: answer %v, want a WireErrorV1", tc.name, err)
			}
			if we.Message != tc.want {
				t.Errorf("%s: refusal text %q, want the fixed %q", tc.name, we.Message, tc.want)
			}
		}
	})
}
