package agent_test

import (
	"errors"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/internal/tools/netsim"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
)

// darkable is a path between the agent and the daemon that can silently
// drop everything: a netsim proxy, or a darkDialer on memory.
type darkable interface {
	Addr() string
	Blackhole(on bool)
}

// path is a netsim proxy between the agent and the daemon.
type path interface {
	darkable
	SetDown(netsim.Impairment)
}

// pathBackends are the backends a netsim proxy can sit under: UDP for QUIC
// and WebTransport, TCP for TLS+yamux.
func pathBackends() []enginetest.Backend {
	return []enginetest.Backend{enginetest.QuicBackend(), enginetest.WebtransportBackend(), enginetest.YamuxBackend()}
}

func newPath(t *testing.T, b enginetest.Backend, target string) path {
	t.Helper()
	if b.Name == "yamux" {
		p, err := netsim.NewTCPProxy(target, netsim.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		return p
	}
	p, err := netsim.NewUDPProxy(target, netsim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// awaitAcks waits (polling Stats: no event marks an ack) until the agent
// has n heartbeats acknowledged.
func awaitAcks(t *testing.T, a *agent.Agent, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for a.Stats().HeartbeatsAcked < n {
		if time.Now().After(deadline) {
			t.Fatalf("only %d heartbeats acked, want %d", a.Stats().HeartbeatsAcked, n)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not synchronisation
	}
}

// TestDeadPathDetectedWithinMisses: the path between a registered agent and
// its daemon silently drops everything (netsim blackhole; no close, no
// reset; on memory a darkDialer that also hides the daemon's close). The
// agent ends the link with ErrHeartbeatTimeout within 3
// heartbeat intervals (the default HeartbeatMisses) of the last ack — far
// below the transport's idle timeout — plus one interval of tolerance for
// a loaded machine, counts it, and when the path comes back reconnects
// under the same agent session.
func TestDeadPathDetectedWithinMisses(t *testing.T) {
	const every = 200 * time.Millisecond
	const limit = agent.DefaultHeartbeatMisses*every + every // tolerance: one interval
	for _, b := range append([]enginetest.Backend{enginetest.MemoryBackend()}, pathBackends()...) {
		t.Run(b.Name, func(t *testing.T) {
			w := enginetest.NewWorld(t, b, func(c *daemon.Config) { c.Timing.HeartbeatInterval = every })
			var p darkable
			if b.Name != "memory" {
				p = newPath(t, b, w.Addr)
			}
			id := w.NewIdentity()
			disc := make(chan error, 16)
			a, _, _ := w.StartAgent(id, enginetest.NewCountingExec(false), func(c *agent.Config) {
				if p == nil {
					dd := &darkDialer{inner: c.Endpoints[0].Dialer, addr: w.Addr}
					c.Endpoints[0].Dialer, p = dd, dd
				}
				c.Endpoints[0].Address = p.Addr()
				c.Hooks.OnDisconnected = func(err error) { disc <- err }
				c.HeartbeatMisses = 0 // the default window is the subject (enginetest widens it)
			})
			first := w.AwaitRegistered(id.Runner)
			enginetest.AwaitConnected(t, a)
			awaitAcks(t, a, 2)

			sentBefore := a.Stats().HeartbeatsSent
			p.Blackhole(true)
			dark := time.Now()
			var err error
			select {
			case err = <-disc:
			case <-time.After(10 * time.Second):
				t.Fatalf("no disconnect 10 s after the path went dark (stats %+v)", a.Stats())
			}
			el := time.Since(dark)
			t.Logf("%s: dead path detected after %v (interval %v, limit %v)", b.Name, el.Round(time.Millisecond), every, limit)
			if !errors.Is(err, agent.ErrHeartbeatTimeout) {
				t.Fatalf("link ended with %v, want ErrHeartbeatTimeout", err)
			}
			if el > limit {
				t.Fatalf("dead path detected after %v, want ≤ %v (3 intervals + 1)", el, limit)
			}
			if n := a.Stats().HeartbeatTimeouts; n != 1 {
				t.Fatalf("HeartbeatTimeouts = %d, want 1", n)
			}
			// Unacked for more than an interval and a quarter (the second
			// tick after the last ack; the link dies at the third), the
			// agent quickened its heartbeats (every quarter interval, here
			// the 100 ms floor).
			st := a.Stats()
			t.Logf("%s: %d heartbeats sent while dark", b.Name, st.HeartbeatsSent-sentBefore)
			if st.HeartbeatsQuickened < 1 {
				t.Fatalf("dark for %v: heartbeats never quickened (%d sent)", el, st.HeartbeatsSent-sentBefore)
			}

			p.Blackhole(false)
			again := w.AwaitRegistered(id.Runner)
			if again.Session != first.Session || again.Session != a.Session() {
				t.Fatalf("re-registered as session %s, want the same session %s", again.Session, first.Session)
			}
			if again.Transport == first.Transport {
				t.Fatal("re-registered on the same transport")
			}
			s := enginetest.AwaitConnected(t, a)
			if s.Transport != again.Transport {
				t.Fatalf("agent on transport %s, daemon registered %s", s.Transport, again.Transport)
			}
		})
	}
}

// TestSlowDaemonDoesNotFlap: once registered, every ack arrives 1.5
// heartbeat intervals late (netsim latency on the daemon → agent
// direction), later than the
// next heartbeat is sent but inside the liveness window. Over 10 intervals
// the agent keeps its link: no heartbeat timeout, no reconnect, and acks
// keep arriving.
func TestSlowDaemonDoesNotFlap(t *testing.T) {
	const every = 300 * time.Millisecond
	for _, b := range pathBackends() {
		t.Run(b.Name, func(t *testing.T) {
			w := enginetest.NewWorld(t, b, func(c *daemon.Config) {
				c.Timing.HeartbeatInterval = every
				c.Timing.RegistrationTimeout = 10 * time.Second
			})
			p := newPath(t, b, w.Addr)
			id := w.NewIdentity()
			disc := make(chan error, 16)
			a, _, _ := w.StartAgent(id, enginetest.NewCountingExec(false), func(c *agent.Config) {
				c.Endpoints[0].Address = p.Addr()
				c.RequestTimeout = 5 * time.Second
				c.Hooks.OnDisconnected = func(err error) { disc <- err }
			})
			s := enginetest.AwaitConnected(t, a)
			// The daemon turns slow once the agent is registered (a slow
			// registration would trip the daemon's own liveness rule first).
			p.SetDown(netsim.Impairment{Latency: every * 3 / 2})
			before := a.Stats()
			select {
			case err := <-disc:
				t.Fatalf("link ended with %v while the daemon was slow but live (stats %+v)", err, a.Stats())
			case <-time.After(10 * every): // the observation window
			}
			after := a.Stats()
			if after.HeartbeatTimeouts != 0 || after.Reconnects != 0 || a.Status().Transport != s.Transport {
				t.Fatalf("flapped: %d heartbeat timeouts, %d reconnects", after.HeartbeatTimeouts, after.Reconnects)
			}
			if acked := after.HeartbeatsAcked - before.HeartbeatsAcked; acked < 5 {
				t.Fatalf("only %d late acks in 10 intervals", acked)
			}
			t.Logf("%s: %d heartbeats acked 1.5 intervals late over 10 intervals, no reconnect", b.Name, after.HeartbeatsAcked-before.HeartbeatsAcked)
		})
	}
}
