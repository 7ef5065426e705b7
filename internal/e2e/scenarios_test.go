//go:build linux

package e2e

import (
	"net/netip"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/netns"
)

// agentBesideHub builds agent ⟷ hub and starts the daemon in the hub.
func agentBesideHub(t *testing.T) (w *world, agentNS *netns.NS, agentIP, hubIP netip.Addr) {
	w = newWorld(t)
	agentNS = netns.New(t, "agent")
	agentIP, hubIP = netns.Link(t, agentNS, w.hub, agentHubNet)
	w.startDaemon()
	return w, agentNS, agentIP, hubIP
}

// allEndpoints is the agent's endpoint list in preference order.
func allEndpoints(hub netip.Addr) []string {
	return []string{quicURI(hub), wtURI(hub), yamuxURI(hub)}
}

// registered checks that the agent, the status file and the daemon agree
// that the agent is connected over backend, and returns the agent's
// time from start to registered.
func registered(t *testing.T, w *world, ar *agentRun, n int, backend string, agentIP netip.Addr) (connection, time.Duration) {
	t.Helper()
	c := ar.waitConnected(n)
	if c.Backend != backend {
		t.Fatalf("agent connected over %q (%s), want %s", c.Backend, c.Endpoint, backend)
	}
	ar.waitStatus(backend)
	w.liveSession(backend, agentIP)
	return c, c.At.Sub(ar.start)
}

// TestUDPBlockedRegistersOverYamux is scenario (a): every UDP datagram of
// the agent is silently dropped; it registers over TLS+yamux.
func TestUDPBlockedRegistersOverYamux(t *testing.T) {
	w, agentNS, agentIP, hubIP := agentBesideHub(t)
	w.hub.Nft(rulesDropUDP)
	ar := w.startAgent(agentNS, allEndpoints(hubIP), nil)
	_, took := registered(t, w, ar, 1, "yamux", agentIP)
	t.Logf("(a) UDP silently dropped: agent start → registered over yamux in %v", took.Round(time.Millisecond))
}

// TestOnlyUDP443RegistersOverWebTransport is scenario (b): only UDP to
// port 443 leaves the agent's namespace; it registers over WebTransport.
func TestOnlyUDP443RegistersOverWebTransport(t *testing.T) {
	w, agentNS, agentIP, hubIP := agentBesideHub(t)
	w.hub.Nft(rulesOnlyUDP443)
	ar := w.startAgent(agentNS, allEndpoints(hubIP), nil)
	_, took := registered(t, w, ar, 1, "webtransport", agentIP)
	t.Logf("(b) only UDP 443 allowed: agent start → registered over webtransport in %v", took.Round(time.Millisecond))
}
