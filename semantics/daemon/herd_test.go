package daemon_test

import (
	"crypto/tls"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
)

// TestHerdOneRegistrationPerAgent (issue 25): 200 agents dial one QUIC
// daemon at once through an admission of one handshake worker and 32
// handshakes in progress, so those beyond are refused (CONNECTION_REFUSED
// before any cryptography) and come back after their refusal backoff.
// Every agent registers, and every registration the daemon completes is
// one its agent received (none completed for a connection the agent gave
// up: the daemon's count equals the agents').
func TestHerdOneRegistrationPerAgent(t *testing.T) {
	const agents = 200
	var ln *quic.Listener
	b := enginetest.Backend{Name: "quic",
		Listen: func(t *testing.T, conf *tls.Config) (semantics.BackendListener, string) {
			l, err := quic.Listen("127.0.0.1:0", conf, quic.Config{HandshakeWorkers: 1, MaxHandshakes: 32})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			ln = l
			return l, l.Addr().String()
		},
		Dialer: func(t *testing.T, conf *tls.Config) semantics.BackendDialer {
			return quic.Dialer{TLS: conf, Config: quic.Config{RefusalBackoff: quic.DefaultRefusalBackoff}}
		}}
	var mu sync.Mutex
	perRunner := map[wire.RunnerId]int{}
	all := make(chan struct{})
	w := enginetest.NewWorld(t, b, func(c *daemon.Config) {
		c.Timing.RegistrationTimeout = time.Minute
		c.Timing.HeartbeatInterval = 10 * time.Second // no dead-link reconnects of a loaded machine (a legitimate second registration)
		user := c.Hooks.OnRegistered
		c.Hooks.OnRegistered = func(s daemon.SessionInfo) {
			user(s)
			mu.Lock()
			perRunner[s.Runner]++
			if len(perRunner) == agents && perRunner[s.Runner] == 1 {
				close(all)
			}
			mu.Unlock()
		}
	})
	as := make([]*agent.Agent, 0, agents)
	for range agents {
		// Patient agents: the property is one registration each, not
		// how fast a loaded machine admits them (a request timeout would
		// make an agent give up on a registration the daemon completes).
		a, _, _ := w.StartAgent(w.NewIdentity(), agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}), func(c *agent.Config) {
			c.RequestTimeout = time.Minute
			c.Backoff = agent.Backoff{Base: 100 * time.Millisecond, Max: 2 * time.Second}
		})
		as = append(as, a)
	}
	select {
	case <-all:
	case <-time.After(3 * time.Minute):
		mu.Lock()
		t.Fatalf("%d of %d agents registered", len(perRunner), agents)
	}
	// Every registration the daemon completed reached its agent: the
	// daemon's count equals the agents' own (polled until registrations
	// in flight land). An agent may register more than once on a loaded
	// machine (a reconnect), and then both sides count it; a registration
	// the daemon completed for a connection its agent had given up would
	// be counted by the daemon alone.
	agentSide := func() (n int64) {
		for _, a := range as {
			n += a.Stats().Registrations
		}
		return n
	}
	var st daemon.Stats
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		st = w.D.Stats()
		if st.Registrations == agentSide() || time.Now().After(deadline) {
			break
		}
	}
	hs := ln.HandshakeStats()
	t.Logf("%d agents: registrations %d (agents saw %d), abandoned %d; handshakes %+v", agents, st.Registrations, agentSide(), st.RegistrationsAbandoned, hs)
	if got := agentSide(); st.Registrations != got {
		t.Fatalf("daemon counted %d registrations, its agents saw %d", st.Registrations, got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(perRunner) != agents {
		t.Fatalf("%d of %d runners registered", len(perRunner), agents)
	}
	if hs.Signed < agents {
		t.Fatalf("%d signed handshakes for %d registered agents", hs.Signed, agents)
	}
}
