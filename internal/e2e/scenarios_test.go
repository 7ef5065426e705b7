//go:build linux

package e2e

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/netns"
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

// checkFallbackTime asserts the fallback target on an agent that races
// its backends (happy eyeballs); a sequential agent waits out each UDP
// handshake timeout, so there the time is only logged.
func checkFallbackTime(t *testing.T, took time.Duration) {
	t.Helper()
	if !agentRaces(t) {
		t.Logf("NOT ASSERTED: this forgeyard-agent dials its endpoints one after the other; target %v needs the staggered fallback", fallbackTarget)
		return
	}
	if took > fallbackTarget {
		t.Fatalf("agent start → registered took %v, target %v", took, fallbackTarget)
	}
}

// TestUDPBlockedRegistersOverYamux is scenario (a): every UDP datagram of
// the agent is silently dropped; it registers over TLS+yamux.
func TestUDPBlockedRegistersOverYamux(t *testing.T) {
	w, agentNS, agentIP, hubIP := agentBesideHub(t)
	w.hub.Nft(rulesDropUDP)
	ar := w.startAgent(agentNS, allEndpoints(hubIP), nil)
	_, took := registered(t, w, ar, 1, "yamux", agentIP)
	t.Logf("(a) UDP silently dropped: agent start → registered over yamux in %v", took.Round(time.Millisecond))
	checkFallbackTime(t, took)
}

// TestOnlyUDP443RegistersOverWebTransport is scenario (b): only UDP to
// port 443 leaves the agent's namespace; it registers over WebTransport.
func TestOnlyUDP443RegistersOverWebTransport(t *testing.T) {
	w, agentNS, agentIP, hubIP := agentBesideHub(t)
	w.hub.Nft(rulesOnlyUDP443)
	ar := w.startAgent(agentNS, allEndpoints(hubIP), nil)
	_, took := registered(t, w, ar, 1, "webtransport", agentIP)
	t.Logf("(b) only UDP 443 allowed: agent start → registered over webtransport in %v", took.Round(time.Millisecond))
	checkFallbackTime(t, took)
}

// TestProxyOnlyRegistersOverYamux is scenario (c): the agent's only way
// out is tinyproxy in its own namespace (the agent has no route to the
// hub); HTTPS_PROXY leads the TLS+yamux dial through HTTP CONNECT.
func TestProxyOnlyRegistersOverYamux(t *testing.T) {
	w := newWorld(t)
	if !strings.Contains(agentHelp(t), "proxy") {
		t.Skip("NOT RUN: this forgeyard-agent has no HTTP CONNECT proxy support (HTTPS_PROXY, relay/proxy) yet")
	}
	agentNS, proxyNS := netns.New(t, "agent"), netns.New(t, "proxy")
	agentIP, proxyIP := netns.Link(t, agentNS, proxyNS, agentProxyNet)
	proxyOut, hubIP := netns.Link(t, proxyNS, w.hub, proxyHubNet)
	proxyNS.MustRun("sysctl", "-qw", "net.ipv4.ip_forward=0") // a proxy, not a router
	if out, err := agentNS.Run(w.ctx, "ip", "route", "get", hubIP.String()); err == nil {
		t.Fatalf("the agent has a route to the hub: %s", out)
	}
	w.startDaemon()
	tp := proxyNS.StartTinyproxy(netip.AddrPortFrom(proxyIP, 8888), agentProxyNet, portYamux)
	ar := w.startAgent(agentNS, allEndpoints(hubIP), []string{"HTTPS_PROXY=" + tp.URL(), "NO_PROXY="})
	_ = agentIP
	_, took := registered(t, w, ar, 1, "yamux", proxyOut)
	if _, err := tp.WaitLine(w.ctx, func(l string) bool {
		return strings.Contains(l, fmt.Sprintf("CONNECT %s:%d", hubIP, portYamux))
	}); err != nil {
		t.Fatalf("tinyproxy logged no CONNECT to the daemon: %v", err)
	}
	t.Logf("(c) HTTP CONNECT proxy only: agent start → registered over yamux in %v", took.Round(time.Millisecond))
}

// TestRelayKilledMidAttemptResumes is scenario (d): the path the agent
// uses dies mid-attempt; the agent reconnects over another path, resyncs,
// and the daemon ends with every log line once and one completion.
func TestRelayKilledMidAttemptResumes(t *testing.T) {
	const lines = 150
	w := newWorld(t)
	agentNS := netns.New(t, "agent")
	agentIP, hubIP := netns.Link(t, agentNS, w.hub, agentHubNet)
	w.startDaemon("--demo-leases", "1")
	ar := w.startAgent(agentNS, []string{yamuxURI(hubIP), wtURI(hubIP)}, nil,
		"--synthetic-duration", "600ms", "--synthetic-log-lines", strconv.Itoa(lines), "--synthetic-log-interval", "10ms")
	registered(t, w, ar, 1, "yamux", agentIP)

	// Mid-attempt: once part of the log is durable at the daemon.
	attempt := w.waitAttemptLog(20)
	before := lineCount(w.durableLog(attempt))
	if before >= lines {
		t.Fatalf("the whole log (%d lines) was durable before the cut: nothing to resume", before)
	}
	cutAt := time.Now()
	w.hub.Nft(rulesResetYamux)
	c2, _ := registered(t, w, ar, 2, "webtransport", agentIP)
	t.Logf("(d) path cut with %d/%d log lines durable: reconnected over webtransport in %v", before, lines, c2.At.Sub(cutAt).Round(time.Millisecond))

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

// The daemon logs a completion's answer as its number.
var (
	ackAccepted  = strconv.Itoa(int(agentwire.AckAccepted))
	ackDuplicate = strconv.Itoa(int(agentwire.AckDuplicateAccepted))
)

// TestUDPRestoredMovesBackToQUIC is scenario (e): UDP is blocked, the
// agent registers over TLS+yamux; the block is lifted and it ends up over
// QUIC again.
func TestUDPRestoredMovesBackToQUIC(t *testing.T) {
	w, agentNS, agentIP, hubIP := agentBesideHub(t)
	w.hub.Nft(rulesDropUDP)
	ar := w.startAgent(agentNS, []string{quicURI(hubIP), yamuxURI(hubIP)}, nil)
	registered(t, w, ar, 1, "yamux", agentIP)
	w.unblock()
	liftedAt := time.Now()
	// Until the agent re-probes QUIC by itself, end the yamux connection
	// so that it dials again in preference order.
	w.hub.Nft(rulesResetYamux)
	c2, _ := registered(t, w, ar, 2, "quic", agentIP)
	t.Logf("(e) UDP restored: back on QUIC %v later", c2.At.Sub(liftedAt).Round(time.Millisecond))
}
