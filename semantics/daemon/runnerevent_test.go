package daemon_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// TestRunnerEventsAcrossDaemons (issue 15): a drain, a resume and a
// disable recorded through daemon A reach the agent connected to daemon B
// at once, over the authority's LISTEN/NOTIFY events (EventRunner) — B's
// revocation poll is off, and nothing else tells a connected agent of a
// drain set elsewhere until it reconnects.
func TestRunnerEventsAcrossDaemons(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.Shared(t).NewDatabase(t)
	open := func() authority.Authority {
		a, err := authority.OpenPostgres(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		return a
	}
	noPoll := func(c *daemon.Config) { c.Identity.RevocationPoll = -1 }
	b := enginetest.QuicBackend()
	pki := trusttest.NewPKI(t)
	wa := enginetest.NewWorldWith(t, b, pki, open(), sharedDB, noPoll, func(c *daemon.Config) { c.ID = "daemon-a" })
	wb := enginetest.NewWorldWith(t, b, pki, open(), sharedDB, noPoll, func(c *daemon.Config) { c.ID = "daemon-b" })
	id := wb.NewIdentity()
	a, _, _ := wb.StartAgent(id, enginetest.NewCountingExec(false))
	wb.AwaitActive(id.Runner)
	await := func(what string, ok func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		for !ok() {
			if time.Since(start) > 10*time.Second {
				t.Fatalf("%s: not within 10 s", what)
			}
			time.Sleep(5 * time.Millisecond) // agent status: no event to await
		}
		return time.Since(start)
	}
	reconnects := a.Stats().Reconnects
	if err := wa.D.DrainRunner(ctx, id.Runner, "rack move"); !errors.Is(err, daemon.ErrNotConnected) {
		t.Fatalf("drain through A: %v, want ErrNotConnected (recorded anyway)", err)
	}
	t.Logf("drain through A reached the agent on B in %v", await("drain", func() bool { return a.Status().Draining }))
	if err := wa.D.ResumeRunner(ctx, id.Runner); !errors.Is(err, daemon.ErrNotConnected) {
		t.Fatalf("resume through A: %v", err)
	}
	t.Logf("resume through A reached the agent on B in %v", await("resume", func() bool { return !a.Status().Draining }))
	if n := a.Stats().Reconnects; n != reconnects {
		t.Fatalf("the agent reconnected (%d → %d): the drain must reach it on its transport", reconnects, n)
	}

	// Disable: B closes the runner's transport with RunnerDisabled.
	id2 := wb.NewIdentity()
	rc := wb.DialRaw(id2)
	rc.Join(wire.NewAgentSessionId())
	start := time.Now()
	if err := wa.D.DisableRunner(ctx, id2.Runner, "decommissioned"); err != nil {
		t.Fatal(err)
	}
	if code := rc.CloseCode(); code != wire.CloseRunnerDisabled {
		t.Fatalf("close code %v, want RunnerDisabled", code)
	}
	t.Logf("disable through A closed the transport on B in %v (revocation poll off)", time.Since(start))
}
