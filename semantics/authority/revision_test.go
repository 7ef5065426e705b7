package authority_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/wire"
)

// TestRevocationRevision: on SQLite the revocation revision stays put
// through writes that revoke nothing (a session registered, a lease
// created), moves after this handle disables a runner or revokes a
// certificate, and moves after another connection to the same file (the
// offline CLI) commits anything; PostgreSQL answers ok false.
func TestRevocationRevision(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "authority.db")
	a, err := authority.OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	rr := authority.RevocationRevisionsOf(a)
	if rr == nil {
		t.Fatal("the SQLite store has no revocation revision")
	}
	rev := func() authority.Revision {
		t.Helper()
		r, ok, err := rr.RevocationRevision(ctx)
		if err != nil || !ok {
			t.Fatalf("RevocationRevision: %v, ok %v", err, ok)
		}
		return r
	}
	r0 := rev()
	runner, sess := wire.NewRunnerId(), wire.NewAgentSessionId()
	if _, err := a.RegisterSession(ctx, authority.Registration{Runner: runner, Session: sess, Transport: wire.NewTransportSessionId(), Now: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := a.CreateLease(ctx, authority.Lease{ID: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId(), Runner: runner, Session: sess,
		TTL: time.Minute, ExpiresAt: time.Now().Add(time.Minute), State: authority.LeaseOffered, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if r := rev(); r != r0 {
		t.Fatalf("revision moved %v → %v with nothing revoked", r0, r)
	}
	if err := a.SetRunnerEnabled(ctx, runner, false, "test", time.Now()); err != nil {
		t.Fatal(err)
	}
	r1 := rev()
	if r1 == r0 {
		t.Fatal("revision unchanged after SetRunnerEnabled(false)")
	}
	ids := authority.IdentitiesOf(a)
	if err := ids.RecordCertificate(ctx, authority.IssuedCertificate{Serial: "0abc", Runner: runner, NotAfter: time.Now().Add(time.Hour), IssuedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := ids.RevokeCertificate(ctx, "0abc", "leaked", time.Now()); err != nil {
		t.Fatal(err)
	}
	r2 := rev()
	if r2 == r1 {
		t.Fatal("revision unchanged after RevokeCertificate")
	}
	cli, err := authority.OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if err := cli.SetRunnerEnabled(ctx, wire.NewRunnerId(), false, "offline", time.Now()); err != nil {
		t.Fatal(err)
	}
	if r := rev(); r == r2 {
		t.Fatal("revision unchanged after another connection's commit")
	}

	pg, err := authority.OpenPostgres(ctx, pgtest.Shared(t).NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	if prr := authority.RevocationRevisionsOf(pg); prr != nil {
		if _, ok, err := prr.RevocationRevision(ctx); ok || err != nil {
			t.Fatalf("PostgreSQL RevocationRevision ok %v err %v, want ok false (events instead)", ok, err)
		}
	}
}
