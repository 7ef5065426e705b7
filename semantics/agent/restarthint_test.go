package agent_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
)

// hintConn is a backend connection that hears restart hints from hints.
type hintConn struct {
	semantics.BackendConn
	hints chan struct{}
}

func (c hintConn) PeerHints() <-chan struct{} { return c.hints }

type hintDialer struct {
	inner semantics.BackendDialer
	conns chan hintConn
}

func (d hintDialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	c, err := d.inner.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	hc := hintConn{BackendConn: c, hints: make(chan struct{}, 1)}
	d.conns <- hc
	return hc, nil
}

// TestRestartHintAnsweredWithHeartbeat: a restart hint makes an idle agent
// (its next heartbeat a minute away) send a heartbeat at once; a live
// daemon acks it and the link stays (a hint never ends a connection by
// itself).
func TestRestartHintAnsweredWithHeartbeat(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.MemoryBackend(), func(c *daemon.Config) {
		c.Timing.HeartbeatInterval = time.Minute
	})
	id := w.NewIdentity()
	conns := make(chan hintConn, 4)
	a, _, _ := w.StartAgent(id, agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}), func(c *agent.Config) {
		c.Endpoints[0].Dialer = hintDialer{inner: c.Endpoints[0].Dialer, conns: conns}
	})
	enginetest.AwaitConnected(t, a)
	hc := <-conns
	before := a.Stats()
	hc.hints <- struct{}{}
	for deadline := time.Now().Add(10 * time.Second); a.Stats().HeartbeatsAcked <= before.HeartbeatsAcked; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no heartbeat acked after a restart hint: %+v", a.Stats())
		}
	}
	st := a.Stats()
	if st.RestartHints != 1 || st.Reconnects != 0 || st.HeartbeatsSent <= before.HeartbeatsSent {
		t.Fatalf("after a hint: %d hints answered, %d reconnects, heartbeats %d → %d; want 1, 0 and more",
			st.RestartHints, st.Reconnects, before.HeartbeatsSent, st.HeartbeatsSent)
	}
}

// TestRestartHintUnackedEndsLink: after a restart hint, a daemon that acks
// no heartbeat (the restarted process whose stateless reset was lost; here
// a path gone dark) ends the link within the hint window (1 s) with
// ErrRestartHinted — not at the dead-link rule's 3 intervals (3 minutes
// here) — and the agent reconnects when the path is back.
func TestRestartHintUnackedEndsLink(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.MemoryBackend(), func(c *daemon.Config) {
		c.Timing.HeartbeatInterval = time.Minute
	})
	id := w.NewIdentity()
	conns := make(chan hintConn, 4)
	disc := make(chan error, 4)
	var dd *darkDialer
	a, _, _ := w.StartAgent(id, agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}), func(c *agent.Config) {
		dd = &darkDialer{inner: c.Endpoints[0].Dialer, addr: w.Addr}
		c.Endpoints[0].Dialer = hintDialer{inner: dd, conns: conns}
		c.Endpoints[0].Address = dd.Addr()
		c.Hooks.OnDisconnected = func(err error) { disc <- err }
	})
	first := w.AwaitRegistered(id.Runner)
	enginetest.AwaitConnected(t, a)
	hc := <-conns
	dd.Blackhole(true)
	hinted := time.Now()
	hc.hints <- struct{}{}
	var err error
	select {
	case err = <-disc:
	case <-time.After(10 * time.Second):
		t.Fatalf("link not ended 10 s after an unacked restart hint: %+v", a.Stats())
	}
	el := time.Since(hinted)
	if !errors.Is(err, agent.ErrRestartHinted) || el > 2*time.Second {
		t.Fatalf("link ended after %v with %v, want ErrRestartHinted within 1 s (+1 s tolerance)", el, err)
	}
	if st := a.Stats(); st.RestartHintTimeouts != 1 || st.HeartbeatTimeouts != 0 {
		t.Fatalf("hint timeouts %d, heartbeat timeouts %d; want 1 and 0", st.RestartHintTimeouts, st.HeartbeatTimeouts)
	}
	dd.Blackhole(false)
	again := w.AwaitRegistered(id.Runner)
	if again.Session != first.Session || again.Transport == first.Transport {
		t.Fatalf("re-registered as %+v after %+v, want the same session on a new transport", again, first)
	}
}
