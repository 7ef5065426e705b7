package authority_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/authority/authoritytest"
	"forgeyard.dev/transport/wire"
)

func TestMain(m *testing.M) {
	if os.Getenv(crashEnv) != "" {
		crashChild() // a crash-durability child process (crash_test.go); it is killed
		os.Exit(3)
	}
	code := m.Run()
	pgtest.StopShared()
	authority.StopBenchServers()
	os.Exit(code)
}

func openSQLite(t *testing.T, path string) authority.Authority {
	t.Helper()
	a, err := authority.OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func TestSQLite(t *testing.T) {
	authoritytest.Run(t, authoritytest.Opener{
		Open: func(t *testing.T) authority.Authority {
			return openSQLite(t, filepath.Join(t.TempDir(), "authority.db"))
		},
	})
}

func TestPostgres(t *testing.T) {
	srv := pgtest.Shared(t)
	var dsn string
	authoritytest.Run(t, authoritytest.Opener{
		Open: func(t *testing.T) authority.Authority {
			dsn = srv.NewDatabase(t)
			a, err := authority.OpenPostgres(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { a.Close() })
			return a
		},
		Shared: func(t *testing.T) authority.Authority {
			a, err := authority.OpenPostgres(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { a.Close() })
			return a
		},
	})
}

// TestSQLiteSurvivesRestart: the embedded store keeps sessions, leases and
// completions across a daemon restart (reopening the file).
func TestSQLiteSurvivesRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "authority.db")
	ctx := context.Background()
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	a, err := authority.OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	runner, session := wire.NewRunnerId(), wire.NewAgentSessionId()
	g, err := a.RegisterSession(ctx, authority.Registration{Runner: runner, Session: session, Transport: wire.NewTransportSessionId(), Now: now})
	if err != nil {
		t.Fatal(err)
	}
	l := authority.Lease{ID: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId(), Job: wire.NewJobId(), Runner: runner, Session: session,
		TTL: time.Minute, ExpiresAt: now.Add(time.Minute), CreatedAt: now}
	if err := a.CreateLease(ctx, l); err != nil {
		t.Fatal(err)
	}
	msg := wire.NewMessageId()
	ref := authority.SessionRef{Session: session, Epoch: g.Epoch}
	if ack, err := a.CompleteAttempt(ctx, authority.Completion{MessageID: msg, Attempt: l.Attempt, Lease: l.ID, Session: ref, Now: now}); err != nil || ack != authority.AckAccepted {
		t.Fatalf("complete = %v, %v", ack, err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b := openSQLite(t, path)
	g2, err := b.RegisterSession(ctx, authority.Registration{Runner: runner, Session: session, Transport: wire.NewTransportSessionId(), Now: now})
	if err != nil || g2.Epoch != g.Epoch+1 {
		t.Fatalf("epoch after restart = %d, %v; want %d", g2.Epoch, err, g.Epoch+1)
	}
	ref.Epoch = g2.Epoch
	if ack, err := b.CompleteAttempt(ctx, authority.Completion{MessageID: msg, Attempt: l.Attempt, Lease: l.ID, Session: ref, Now: now}); err != nil || ack != authority.AckDuplicateAccepted {
		t.Fatalf("retry after restart = %v, %v; want DuplicateAccepted", ack, err)
	}
}
