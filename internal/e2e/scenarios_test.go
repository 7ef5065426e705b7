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
// the agent is silently dropped; it registers through forgeyard-relay over
// TLS+yamux (without a relay in the module: the daemon's own TLS+yamux
// listener).
func TestUDPBlockedRegistersOverYamux(t *testing.T) {
	w, agentNS, agentIP, hubIP := agentBesideHub(t)
	w.hub.Nft(rulesDropUDP)
	eps := allEndpoints(hubIP)
	daemonBackend, remote := "yamux", agentIP
	if haveRelay() {
		w.startRelay("relay", portRelay1)
		eps = []string{quicURI(hubIP), wtURI(hubIP), relayURI(t, hubIP, portRelay1)}
		daemonBackend, remote = "quic", relayedVia
	} else {
		t.Log("NO RELAY: this module has no forgeyard-relay; the daemon's TLS+yamux listener stands in")
	}
	ar := w.startAgent(agentNS, eps, nil)
	c, took, _ := registered(t, w, ar, 1, "yamux", daemonBackend, remote)
	t.Logf("(a) UDP silently dropped: agent start → registered over yamux (%s) in %v", c.Endpoint, took.Round(time.Millisecond))
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
// hub); HTTPS_PROXY leads the TLS+yamux dial to the relay (or the
// daemon's TLS+yamux listener) through HTTP CONNECT.
func TestProxyOnlyRegistersOverYamux(t *testing.T) {
	w := newWorld(t)
	if !strings.Contains(agentHelp(t), "proxy") {
		t.Skip("NOT RUN: this forgeyard-agent has no HTTP CONNECT proxy support (HTTPS_PROXY, relay/proxy) yet")
	}
	agentNS, proxyNS := netns.New(t, "agent"), netns.New(t, "proxy")
	_, proxyIP := netns.Link(t, agentNS, proxyNS, agentProxyNet)
	proxyOut, hubIP := netns.Link(t, proxyNS, w.hub, proxyHubNet)
	proxyNS.MustRun("sysctl", "-qw", "net.ipv4.ip_forward=0") // a proxy, not a router
	if out, err := agentNS.Run(w.ctx, "ip", "route", "get", hubIP.String()); err == nil {
		t.Fatalf("the agent has a route to the hub: %s", out)
	}
	w.startDaemon()
	eps := allEndpoints(hubIP)
	target, daemonBackend, remote := portYamux, "yamux", proxyOut
	if haveRelay() {
		w.startRelay("relay", portRelay1)
		eps = []string{quicURI(hubIP), wtURI(hubIP), relayURI(t, hubIP, portRelay1)}
		target, daemonBackend, remote = portRelay1, "quic", relayedVia
	} else {
		t.Log("NO RELAY: this module has no forgeyard-relay; the daemon's TLS+yamux listener stands in")
	}
	tp := proxyNS.StartTinyproxy(netip.AddrPortFrom(proxyIP, 8888), agentProxyNet, uint16(target))
	ar := w.startAgent(agentNS, eps, []string{"HTTPS_PROXY=" + tp.URL(), "NO_PROXY="})
	c, took, _ := registered(t, w, ar, 1, "yamux", daemonBackend, remote)
	if _, err := tp.WaitLine(w.ctx, func(l string) bool {
		return strings.Contains(l, fmt.Sprintf("CONNECT %s:%d", hubIP, target))
	}); err != nil {
		t.Fatalf("tinyproxy logged no CONNECT to %s:%d: %v", hubIP, target, err)
	}
	t.Logf("(c) HTTP CONNECT proxy only: agent start → registered over yamux (%s) in %v", c.Endpoint, took.Round(time.Millisecond))
}

// TestRelayKilledMidAttemptResumes is scenario (d): the relay the agent
// uses is SIGKILLed mid-attempt; the agent reconnects through a second
// relay, resyncs, and the daemon ends with every log line once and one
// completion. Without a relay in the module, the agent's TLS+yamux path
// to the daemon is reset instead and it reconnects over WebTransport.
func TestRelayKilledMidAttemptResumes(t *testing.T) {
	const lines = 150
	w := newWorld(t)
	agentNS := netns.New(t, "agent")
	agentIP, hubIP := netns.Link(t, agentNS, w.hub, agentHubNet)
	w.startDaemon("--demo-leases", "1")
	synth := []string{"--synthetic-duration", "600ms", "--synthetic-log-lines", strconv.Itoa(lines), "--synthetic-log-interval", "10ms"}
	relays := map[string]*netns.Proc{}
	var ar *agentRun
	var s1 session
	var cut func(first connection) (backend, daemonBackend string, remote netip.Addr)
	if haveRelay() {
		relays[fmt.Sprint(portRelay1)] = w.startRelay("relay1", portRelay1)
		relays[fmt.Sprint(portRelay2)] = w.startRelay("relay2", portRelay2)
		ar = w.startAgent(agentNS, []string{relayURI(t, hubIP, portRelay1), relayURI(t, hubIP, portRelay2)}, nil, synth...)
		_, _, s1 = registered(t, w, ar, 1, "yamux", "quic", relayedVia)
		cut = func(first connection) (string, string, netip.Addr) {
			_, port, _ := strings.Cut(strings.TrimPrefix(first.Endpoint, hubIP.String()), ":")
			r := relays[port]
			if r == nil {
				t.Fatalf("agent connected through %q, not a relay", first.Endpoint)
			}
			r.Kill()
			t.Logf("SIGKILLed %s (the agent's relay)", r.Name)
			return "yamux", "quic", relayedVia
		}
	} else {
		t.Log("NO RELAY: this module has no forgeyard-relay; the agent's TLS+yamux path to the daemon is reset instead")
		w.hub.Nft(rulesDropUDP) // until the cut: only TLS+yamux works
		ar = w.startAgent(agentNS, []string{yamuxURI(hubIP, portYamux), wtURI(hubIP)}, nil, synth...)
		_, _, s1 = registered(t, w, ar, 1, "yamux", "yamux", agentIP)
		cut = func(connection) (string, string, netip.Addr) {
			w.unblock()
			w.hub.Nft(rulesResetYamux)
			return "webtransport", "webtransport", agentIP
		}
	}
	first := ar.waitConnected(1)

	// Mid-attempt: once part of the log is durable at the daemon.
	attempt := w.waitAttemptLog(20)
	before := lineCount(w.durableLog(attempt))
	if before >= lines {
		t.Fatalf("the whole log (%d lines) was durable before the cut: nothing to resume", before)
	}
	cutAt := time.Now()
	backend, daemonBackend, remote := cut(first)
	c2, _, s2 := registered(t, w, ar, 2, backend, daemonBackend, remote)
	sameSession(t, s1, s2)
	if c2.Endpoint == first.Endpoint {
		t.Fatalf("reconnected to the endpoint that died: %s", c2.Endpoint)
	}
	t.Logf("(d) path cut with %d/%d log lines durable: reconnected over %s (%s) in %v", before, lines, c2.Backend, c2.Endpoint, c2.At.Sub(cutAt).Round(time.Millisecond))

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
// agent registers over TLS+yamux; the block is lifted and the agent moves
// back to QUIC by itself (its background probe). An agent without the
// probe has its TLS+yamux connection reset instead, to make it dial again
// in preference order.
func TestUDPRestoredMovesBackToQUIC(t *testing.T) {
	w, agentNS, agentIP, hubIP := agentBesideHub(t)
	w.hub.Nft(rulesDropUDP)
	var extra []string
	probes := agentRaces(t)
	if probes {
		extra = []string{"--config", w.agentConfig()}
	}
	ar := w.startAgent(agentNS, []string{quicURI(hubIP), yamuxURI(hubIP, portYamux)}, nil, extra...)
	_, _, s1 := registered(t, w, ar, 1, "yamux", "yamux", agentIP)
	w.unblock()
	liftedAt := time.Now()
	if !probes {
		t.Log("NO PROBE: this forgeyard-agent does not move back by itself; its TLS+yamux connection is reset")
		w.hub.Nft(rulesResetYamux)
	}
	c2, _, s2 := registered(t, w, ar, 2, "quic", "quic", agentIP)
	sameSession(t, s1, s2)
	t.Logf("(e) UDP restored: back on QUIC %v later", c2.At.Sub(liftedAt).Round(time.Millisecond))
}
