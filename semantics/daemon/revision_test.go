package daemon_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// TestRevocationPollSkipsUnchanged: on SQLite the periodic revocation
// check skips the full pass while the authority's revocation revision is
// unchanged (heartbeats and registrations do not move it), and a runner
// disabled by another process on the same database file (the offline
// CLI) still closes its live transport within the poll bound.
func TestRevocationPollSkipsUnchanged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "authority.db")
	auth, err := authority.OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = auth.Close() })
	const poll = 50 * time.Millisecond
	w := enginetest.NewIDWorld(t, enginetest.MemoryBackend(), trusttest.NewPKI(t), auth, func(c *daemon.Config) { c.Identity.RevocationPoll = poll })
	id := w.NewIdentity()
	rc := w.DialRaw(id)
	rc.Join(wire.NewAgentSessionId())
	other := w.NewIdentity()
	rc2 := w.DialRaw(other)
	rc2.Join(wire.NewAgentSessionId())

	deadline := time.Now().Add(20 * time.Second)
	for w.D.IdentityStats().RevocationSkipped < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("after 20 s of 50 ms polls, %d skipped: the unchanged revision did not spare the full check", w.D.IdentityStats().RevocationSkipped)
		}
		time.Sleep(poll) // polling a counter the loop bumps; no event marks a skipped check
	}

	cli, err := authority.OpenSQLite(context.Background(), path) // another connection, as the CLI's
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	start := time.Now()
	if err := cli.SetRunnerEnabled(context.Background(), id.Runner, false, "decommissioned offline", time.Now()); err != nil {
		t.Fatal(err)
	}
	if code := rc.CloseCode(); code != wire.CloseRunnerDisabled {
		t.Fatalf("close code %v, want RunnerDisabled", code)
	}
	t.Logf("a disable by another process reached the daemon in %v (poll %v)", time.Since(start), poll)
	if took := time.Since(start); took > poll+2*time.Second {
		t.Fatalf("revocation took %v", took)
	}
	if st := w.D.IdentityStats(); st.RevokedClosed != 1 {
		t.Fatalf("RevokedClosed %d, want 1 (the other runner stays)", st.RevokedClosed)
	}
}
