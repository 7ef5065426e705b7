//go:build linux

package e2e

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/netns"
	agentwire "forgeyard.dev/transport/wire/agent"
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
	return []string{quicURI(hub), wtURI(hub), yamuxURI(hub, portYamux)}
}

// registered checks that the agent, its status file and the daemon agree
// that the agent's n-th connection is up: the agent over agentBackend, the
// daemon holding one live session of the runner over daemonBackend from
// remote (a relay dials the daemon over QUIC itself). It returns the
// connection, the agent's time from its "agent starting" line to
// registered, and the daemon's session.
func registered(t *testing.T, w *world, ar *agentRun, n int, agentBackend, daemonBackend string, remote netip.Addr) (connection, time.Duration, session) {
	t.Helper()
	c := ar.waitConnected(n)
	if c.Backend != agentBackend {
		t.Fatalf("agent connection %d over %q (%s), want %s", n, c.Backend, c.Endpoint, agentBackend)
	}
	ar.waitStatus(agentBackend)
	s := w.liveSession(daemonBackend, remote)
	return c, c.At.Sub(ar.startedAt()), s
}

// sameSession asserts that a reconnect kept the agent session under a
// newer epoch (a resync, not a new registration).
func sameSession(t *testing.T, before, after session) {
	t.Helper()
	if after.Session != before.Session || after.Epoch <= before.Epoch {
		t.Fatalf("after the reconnect: session %s epoch %d, before: %s epoch %d; want the same session, a newer epoch",
			after.Session, after.Epoch, before.Session, before.Epoch)
	}
}

// checkFallbackTime asserts the design's bound on start → registered.
func checkFallbackTime(t *testing.T, took time.Duration) {
	t.Helper()
	if took > fallbackTarget {
		t.Fatalf("agent start → registered took %v, target %v", took, fallbackTarget)
	}
}

// TestUDPBlockedRegistersOverYamux is scenario (a): every UDP datagram of
// the agent is silently dropped; it registers through forgeyard-relay over
// TLS+yamux (the relay class starts 1 s after QUIC), within the target.
func TestUDPBlockedRegistersOverYamux(t *testing.T) {
	w, agentNS, _, hubIP := agentBesideHub(t)
	w.hub.Nft(rulesDropUDP)
	w.startRelay("relay", portRelay1)
	ar := w.startAgent(agentNS, []string{quicURI(hubIP), wtURI(hubIP), relayURI(hubIP, portRelay1)}, nil)
	c, took, _ := registered(t, w, ar, 1, "yamux", "quic", relayedVia)
	t.Logf("(a) UDP silently dropped: agent start → registered over yamux (%s) in %v", c.Endpoint, took.Round(time.Millisecond))
	if !strings.HasSuffix(c.Endpoint, fmt.Sprintf(":%d", portRelay1)) {
		t.Fatalf("registered through %s, not the relay", c.Endpoint)
	}
	checkFallbackTime(t, took)
}

// TestOnlyUDP443RegistersOverWebTransport is scenario (b): only UDP to
// port 443 leaves the agent's namespace; it registers over WebTransport.
func TestOnlyUDP443RegistersOverWebTransport(t *testing.T) {
	w, agentNS, agentIP, hubIP := agentBesideHub(t)
	w.hub.Nft(rulesOnlyUDP443)
	ar := w.startAgent(agentNS, allEndpoints(hubIP), nil)
	_, took, _ := registered(t, w, ar, 1, "webtransport", "webtransport", agentIP)
	t.Logf("(b) only UDP 443 allowed: agent start → registered over webtransport in %v", took.Round(time.Millisecond))
	checkFallbackTime(t, took)
}

// TestProxyOnlyRegistersOverYamux is scenario (c): the agent's only way
// out is tinyproxy in its own namespace (the agent has no route to the
// hub); HTTPS_PROXY leads the TLS+yamux dial to the relay through HTTP
// CONNECT.
func TestProxyOnlyRegistersOverYamux(t *testing.T) {
	w := newWorld(t)
	agentNS, proxyNS := netns.New(t, "agent"), netns.New(t, "proxy")
	_, proxyIP := netns.Link(t, agentNS, proxyNS, agentProxyNet)
	_, hubIP := netns.Link(t, proxyNS, w.hub, proxyHubNet)
	proxyNS.MustRun("sysctl", "-qw", "net.ipv4.ip_forward=0") // a proxy, not a router
	if out, err := agentNS.Run(w.ctx, "ip", "route", "get", hubIP.String()); err == nil {
		t.Fatalf("the agent has a route to the hub: %s", out)
	}
	w.startDaemon()
	w.startRelay("relay", portRelay1)
	tp := proxyNS.StartTinyproxy(netip.AddrPortFrom(proxyIP, 8888), agentProxyNet, portRelay1)
	ar := w.startAgent(agentNS, []string{quicURI(hubIP), wtURI(hubIP), relayURI(hubIP, portRelay1)},
		[]string{"HTTPS_PROXY=" + tp.URL(), "NO_PROXY="})
	c, took, _ := registered(t, w, ar, 1, "yamux", "quic", relayedVia)
	if _, err := tp.WaitLine(w.ctx, func(l string) bool {
		return strings.Contains(l, fmt.Sprintf("CONNECT %s:%d", hubIP, portRelay1))
	}); err != nil {
		t.Fatalf("tinyproxy logged no CONNECT to %s:%d: %v", hubIP, portRelay1, err)
	}
	t.Logf("(c) HTTP CONNECT proxy only: agent start → registered over yamux (%s) in %v", c.Endpoint, took.Round(time.Millisecond))
	checkFallbackTime(t, took)
}

// TestRelayKilledMidAttemptResumes is scenario (d): the relay the agent
// uses is SIGKILLed mid-attempt; the agent reconnects through a second
// relay under the same agent session, resyncs, and the daemon ends with
// every log line once and one completion.
func TestRelayKilledMidAttemptResumes(t *testing.T) {
	const lines = 150
	w := newWorld(t)
	agentNS := netns.New(t, "agent")
	_, hubIP := netns.Link(t, agentNS, w.hub, agentHubNet)
	w.startDaemon("--demo-leases", "1")
	relays := map[string]*netns.Proc{
		relayURI(hubIP, portRelay1): w.startRelay("relay1", portRelay1),
		relayURI(hubIP, portRelay2): w.startRelay("relay2", portRelay2),
	}
	ar := w.startAgent(agentNS, []string{relayURI(hubIP, portRelay1), relayURI(hubIP, portRelay2)}, nil,
		"--synthetic-duration", "600ms", "--synthetic-log-lines", strconv.Itoa(lines), "--synthetic-log-interval", "10ms")
	first, _, s1 := registered(t, w, ar, 1, "yamux", "quic", relayedVia)
	var used *netns.Proc
	for uri, p := range relays {
		if strings.HasSuffix(uri, "//"+first.Endpoint) {
			used = p
		}
	}
	if used == nil {
		t.Fatalf("agent connected through %q, not a relay", first.Endpoint)
	}

	// Mid-attempt: once part of the log is durable at the daemon.
	attempt := w.waitAttemptLog(20)
	before := lineCount(w.durableLog(attempt))
	if before >= lines {
		t.Fatalf("the whole log (%d lines) was durable before the cut: nothing to resume", before)
	}
	cutAt := time.Now()
	used.Kill()
	c2, _, s2 := registered(t, w, ar, 2, "yamux", "quic", relayedVia)
	sameSession(t, s1, s2)
	if c2.Endpoint == first.Endpoint {
		t.Fatalf("reconnected to the relay that was killed: %s", c2.Endpoint)
	}
	t.Logf("(d) %s SIGKILLed with %d/%d log lines durable: reconnected through %s in %v", used.Name, before, lines, c2.Endpoint, c2.At.Sub(cutAt).Round(time.Millisecond))

	done, err := w.daemon.WaitLine(w.ctx, func(l string) bool {
		ll := logLine(l)
		return ll.msg() == "attempt completed" && ll.str("attempt") == attempt.String()
	})
	if err != nil {
		t.Fatalf("no completion of %s: %v", attempt, err)
	}
	if ack := logLine(done).str("ack"); ack != ackAccepted {
		t.Fatalf("first completion answer %q, want %s (Accepted)", ack, ackAccepted)
	}
	// The log is durable before the completion is sent (§243).
	checkLog(t, w.durableLog(attempt), lines)
	w.stopDaemon()
	accepted := 0
	for _, l := range w.daemon.Lines() {
		ll := logLine(l)
		if ll.msg() == "attempt completed" && ll.str("attempt") == attempt.String() {
			switch ll.str("ack") {
			case ackAccepted:
				accepted++
			case ackDuplicate: // a retry after the cut, answered from the dedup record
			default:
				t.Fatalf("completion of %s answered %q", attempt, ll.str("ack"))
			}
		}
	}
	if accepted != 1 {
		t.Fatalf("%d first-time completions of %s in the daemon's log, want 1", accepted, attempt)
	}
	if n := w.completions(attempt); n != 1 {
		t.Fatalf("authority holds %d completions of %s, want 1", n, attempt)
	}
}

// The daemon logs a completion's answer by name (its LogValue).
var (
	ackAccepted  = agentwire.AckAccepted.String()
	ackDuplicate = agentwire.AckDuplicateAccepted.String()
)

// TestUDPRestoredMovesBackToQUIC is scenario (e): UDP is blocked, the
// agent registers over TLS+yamux; the block is lifted and the agent's
// background probe moves it back to QUIC by itself, under the same agent
// session.
func TestUDPRestoredMovesBackToQUIC(t *testing.T) {
	w, agentNS, agentIP, hubIP := agentBesideHub(t)
	w.hub.Nft(rulesDropUDP)
	ar := w.startAgent(agentNS, []string{quicURI(hubIP), yamuxURI(hubIP, portYamux)}, nil, "--config", w.agentConfig())
	_, _, s1 := registered(t, w, ar, 1, "yamux", "yamux", agentIP)
	w.unblock()
	liftedAt := time.Now()
	c2, _, s2 := registered(t, w, ar, 2, "quic", "quic", agentIP)
	sameSession(t, s1, s2)
	t.Logf("(e) UDP restored: back on QUIC %v later", c2.At.Sub(liftedAt).Round(time.Millisecond))
}
