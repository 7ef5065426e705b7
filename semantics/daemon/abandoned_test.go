package daemon_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/trust/trusttest"
)

// gatedAuthority holds the first RegisterSession until release is closed.
type gatedAuthority struct {
	authority.Authority
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (a *gatedAuthority) RegisterSession(ctx context.Context, r authority.Registration) (authority.SessionGrant, error) {
	first := false
	a.once.Do(func() { first = true })
	if first {
		close(a.entered)
		<-a.release
	}
	return a.Authority.RegisterSession(ctx, r)
}

// TestRegistrationAbandonedNotCompletedTwice (issue 25 item 2): an agent
// whose connection ends while the authority is still recording its
// registration registers again on its next connection; the daemon counts,
// announces and serves one registration, not two, and the abandoned one
// is counted as such.
func TestRegistrationAbandonedNotCompletedTwice(t *testing.T) {
	inner, err := authority.OpenSQLite(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = inner.Close() })
	gate := &gatedAuthority{Authority: inner, entered: make(chan struct{}), release: make(chan struct{})}
	w := enginetest.NewWorldWith(t, enginetest.MemoryBackend(), trusttest.NewPKI(t), gate)
	id := w.NewIdentity()
	a, rd, _ := w.StartAgent(id, agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}))
	select {
	case <-gate.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no registration reached the authority")
	}
	if !rd.Cut() { // the agent's first connection ends mid-registration
		t.Fatal("no connection to cut")
	}
	close(gate.release)
	enginetest.AwaitConnected(t, a)
	w.AwaitRegistered(id.Runner)
	st := w.D.Stats()
	if st.Registrations != 1 || st.RegistrationsAbandoned != 1 {
		t.Fatalf("registrations %d, abandoned %d; want 1 and 1", st.Registrations, st.RegistrationsAbandoned)
	}
	if sessions := w.D.Sessions(); len(sessions) != 1 {
		t.Fatalf("daemon serves %d sessions, want 1: %+v", len(sessions), sessions)
	}
	if as := a.Stats(); as.Registrations != 1 {
		t.Fatalf("agent saw %d registrations, want 1", as.Registrations)
	}
}
