package authority_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/wire"
)

// TestWatchCrossDaemon: a cancel and a revocation committed through one
// handle (daemon A) reach a watcher on another handle of the same
// PostgreSQL database (daemon B) within a second, and not A's own watcher.
func TestWatchCrossDaemon(t *testing.T) {
	dsn := pgtest.Shared(t).NewDatabase(t)
	open := func() authority.Authority {
		a, err := authority.OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	a, b := open(), open()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evB, err := b.(authority.Watcher).Watch(ctx)
	if err != nil || evB == nil {
		t.Fatalf("Watch on b: %v, %v", evB, err)
	}
	evA, err := a.(authority.Watcher).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	runner, session := wire.NewRunnerId(), wire.NewAgentSessionId()
	if _, err := b.RegisterSession(ctx, authority.Registration{Runner: runner, Session: session, Transport: wire.NewTransportSessionId(), Now: now}); err != nil {
		t.Fatal(err)
	}
	mk := func() authority.Lease {
		l := authority.Lease{ID: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId(), Job: wire.NewJobId(), Runner: runner, Session: session,
			TTL: time.Minute, ExpiresAt: now.Add(time.Minute), CreatedAt: now}
		if err := b.CreateLease(ctx, l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	l1, l2 := mk(), mk()
	await := func(start time.Time, want authority.Event) {
		t.Helper()
		select {
		case got := <-evB:
			if got != want {
				t.Fatalf("event %+v, want %+v", got, want)
			}
			t.Logf("kind %d: %v from the call on a to the event on b", got.Kind, time.Since(start))
		case <-time.After(time.Second):
			t.Fatalf("no event within 1 s (want %+v)", want)
		}
	}
	start := time.Now()
	if _, err := a.CancelAttempt(ctx, l1.Attempt, 3, now); err != nil {
		t.Fatal(err)
	}
	await(start, authority.Event{Kind: authority.EventCancel, Lease: l1.ID, Attempt: l1.Attempt, Session: session, Reason: 3})
	start = time.Now()
	if err := a.RevokeLease(ctx, l2.ID, "operator", now); err != nil {
		t.Fatal(err)
	}
	await(start, authority.Event{Kind: authority.EventRevoke, Lease: l2.ID, Attempt: l2.Attempt, Session: session})
	// a's own changes are not reported to a: b's next change is the first
	// thing a sees.
	l3 := mk()
	if _, err := b.CancelAttempt(ctx, l3.Attempt, 1, now); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-evA:
		if got.Lease != l3.ID {
			t.Fatalf("a saw %+v, want only b's cancel of %s", got, l3.ID)
		}
	case <-time.After(time.Second):
		t.Fatal("a saw no event from b within 1 s")
	}
	// Disabling a runner is an EventRunner for every handle, the one that
	// made the change included (its daemon re-checks that runner only).
	start = time.Now()
	if err := a.SetRunnerEnabled(ctx, runner, false, "test", now); err != nil {
		t.Fatal(err)
	}
	await(start, authority.Event{Kind: authority.EventRunner, Runner: runner, Reason: authority.RunnerEventDisabled})
	select {
	case got := <-evA:
		if got.Kind != authority.EventRunner || got.Runner != runner {
			t.Fatalf("a saw %+v, want its own EventRunner for %s", got, runner)
		}
	case <-time.After(time.Second):
		t.Fatal("a saw no EventRunner for its own disable within 1 s")
	}
	// Revoking a certificate names its runner.
	other := wire.NewRunnerId()
	ids := a.(authority.Identities)
	if err := ids.RecordCertificate(ctx, authority.IssuedCertificate{Serial: "0abc", Runner: other, NotAfter: now.Add(time.Hour), IssuedAt: now}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	if err := ids.RevokeCertificate(ctx, "0abc", "compromised", now); err != nil {
		t.Fatal(err)
	}
	await(start, authority.Event{Kind: authority.EventRunner, Runner: other})
	cancel()
	for range evB { // closes when ctx ends
	}
}

func TestWatchSQLiteNil(t *testing.T) {
	a := openSQLite(t, filepath.Join(t.TempDir(), "authority.db"))
	ch, err := a.(authority.Watcher).Watch(context.Background())
	if ch != nil || err != nil {
		t.Fatalf("SQLite Watch = %v, %v; want nil, nil", ch, err)
	}
}

// TestWatchRetriedFromStart (issue 27 item 4): Watch called while
// PostgreSQL is down returns a channel at once (no error) and keeps
// retrying with backoff; Ping fails meanwhile. Once the server is back the
// watch connects by itself and delivers another handle's events.
func TestWatchRetriedFromStart(t *testing.T) {
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	if err := srv.StopServer("fast"); err != nil {
		if strings.Contains(err.Error(), "external") {
			t.Skip("FORGEYARD_PG_DSN: an external server cannot be stopped")
		}
		t.Fatal(err)
	}
	if err := srv.StartServer(); err != nil {
		t.Fatal(err)
	}
	dsn := srv.NewDatabase(t)
	open := func() authority.Authority {
		a, err := authority.OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	a, b := open(), open()
	if err := authority.PingerOf(b).Ping(context.Background()); err != nil {
		t.Fatalf("Ping with the server up: %v", err)
	}
	if err := srv.StopServer("fast"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	evB, err := b.(authority.Watcher).Watch(ctx)
	if err != nil || evB == nil {
		t.Fatalf("Watch with the server down: %v, %v; want a channel that connects later", evB, err)
	}
	pctx, pcancel := context.WithTimeout(ctx, time.Second)
	if err := authority.PingerOf(b).Ping(pctx); err == nil {
		t.Fatal("Ping succeeded with the server down")
	}
	pcancel()
	time.Sleep(300 * time.Millisecond) // a few failed attempts
	if err := srv.StartServer(); err != nil {
		t.Fatal(err)
	}
	// Events committed before the watch reconnects are lost (best effort):
	// cancel one attempt after another until one is delivered.
	now := time.Now()
	runner, session := wire.NewRunnerId(), wire.NewAgentSessionId()
	if _, err := a.RegisterSession(ctx, authority.Registration{Runner: runner, Session: session, Transport: wire.NewTransportSessionId(), Now: now}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		l := authority.Lease{ID: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId(), Job: wire.NewJobId(), Runner: runner, Session: session,
			TTL: time.Minute, ExpiresAt: now.Add(time.Minute), CreatedAt: now}
		if err := a.CreateLease(ctx, l); err != nil {
			t.Fatal(err)
		}
		if _, err := a.CancelAttempt(ctx, l.Attempt, 3, now); err != nil {
			t.Fatal(err)
		}
		select {
		case ev, ok := <-evB:
			if !ok {
				t.Fatal("the watch channel closed")
			}
			if ev.Kind != authority.EventCancel || ev.Attempt != l.Attempt {
				t.Fatalf("event %+v, want the cancel of %v", ev, l.Attempt)
			}
			return
		case <-time.After(250 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no event within 30 s of the server's restart")
		}
	}
}
