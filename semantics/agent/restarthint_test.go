package agent_test

import (
	"context"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/enginetest"
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
