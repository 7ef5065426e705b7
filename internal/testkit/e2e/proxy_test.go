//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/netns"
)

// Issue 18: an agent behind a stock corporate proxy. The agent's only way
// out is the proxy in its own namespace (no route to the hub, no UDP); the
// relay listens on TCP 443 in the hub, as it does by default.

const (
	portRelay443 = 443
	squidPort    = 3128
	squidUser    = "agent"
	squidPass    = "s3cret-Pa55"
)

// behindProxy builds agent ⟷ proxy ⟷ hub with the daemon in the hub and
// returns the namespaces and addresses (the proxy is started by the test).
func behindProxy(t *testing.T) (w *world, agentNS, proxyNS *netns.NS, proxyIP, hubIP netip.Addr) {
	return behindProxyWithin(t, scenarioTimeout)
}

// behindProxyWithin is behindProxy for a scenario that observes for longer.
func behindProxyWithin(t *testing.T, timeout time.Duration) (w *world, agentNS, proxyNS *netns.NS, proxyIP, hubIP netip.Addr) {
	w = newWorldWithin(t, timeout)
	agentNS, proxyNS = netns.New(t, "agent"), netns.New(t, "proxy")
	_, proxyIP = netns.Link(t, agentNS, proxyNS, agentProxyNet)
	_, hubIP = netns.Link(t, proxyNS, w.hub, proxyHubNet)
	proxyNS.MustRun("sysctl", "-qw", "net.ipv4.ip_forward=0") // a proxy, not a router
	if out, err := agentNS.Run(w.ctx, "ip", "route", "get", hubIP.String()); err == nil {
		t.Fatalf("the agent has a route to the hub: %s", out)
	}
	w.startDaemon()
	return w, agentNS, proxyNS, proxyIP, hubIP
}

// startSquid runs squid in the proxy namespace like a stock enterprise
// proxy: Basic auth required, CONNECT to 443 only.
func startSquid(t *testing.T, proxyNS *netns.NS, proxyIP netip.Addr) *netns.Squid {
	netns.Require(t, "squid", "openssl")
	return proxyNS.StartSquid(netip.AddrPortFrom(proxyIP, squidPort), netns.SquidOptions{
		Users: map[string]string{squidUser: squidPass}, Allow: agentProxyNet})
}

// agentLine waits for the agent's first log line that satisfies match.
func (ar *agentRun) agentLine(what string, match func(logLine) bool) logLine {
	ar.w.t.Helper()
	l, err := ar.WaitLine(ar.w.ctx, func(l string) bool { return match(logLine(l)) })
	if err != nil {
		ar.w.t.Fatalf("agent never logged %s: %v", what, err)
	}
	return logLine(l)
}

// statusField reads one key of the agent's --status-file.
func (ar *agentRun) statusField(key string) any {
	b, err := os.ReadFile(ar.status)
	if err != nil {
		return nil
	}
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return m[key]
}

// waitStatusField polls the status file until key satisfies ok.
func (ar *agentRun) waitStatusField(key string, ok func(any) bool) any {
	ar.w.t.Helper()
	for {
		v := ar.statusField(key)
		if ok(v) {
			return v
		}
		select {
		case <-ar.w.ctx.Done():
			ar.w.t.Fatalf("status file %s never satisfied the test: last %v", key, v)
		case <-time.After(50 * time.Millisecond): // no event when the file is rewritten
		}
	}
}

func relay443(hub netip.Addr) string { return relayURI(hub, portRelay443) }

// TestSquidBasicAuthRegistersThroughRelay443: through squid with the right
// password the agent registers over TLS+yamux to the relay on 443; squid
// logged the authenticated tunnel.
func TestSquidBasicAuthRegistersThroughRelay443(t *testing.T) {
	w, agentNS, proxyNS, proxyIP, hubIP := behindProxy(t)
	sq := startSquid(t, proxyNS, proxyIP)
	w.startRelay("relay", portRelay443)
	ar := w.startAgent(agentNS, []string{quicURI(hubIP), relay443(hubIP)}, nil, "--proxy", sq.URL(squidUser, squidPass))
	c, took, _ := registered(t, w, ar, 1, "yamux", "quic", relayedVia)
	if c.Endpoint != fmt.Sprintf("%s:%d", hubIP, portRelay443) {
		t.Fatalf("registered through %s, not the relay on 443", c.Endpoint)
	}
	// squid logs a tunnel when it ends.
	if err := ar.Stop(10 * time.Second); err != nil {
		t.Fatalf("agent exit: %v", err)
	}
	line, err := sq.WaitAccess(w.ctx, func(l string) bool {
		return strings.Contains(l, "TCP_TUNNEL/200") && strings.Contains(l, fmt.Sprintf("CONNECT %s:443 %s ", hubIP, squidUser))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("squid (basic auth, CONNECT to 443 only): registered through relay+yamux://%s:443 in %v; squid: %s", hubIP, took.Round(time.Millisecond), line)
}

// TestSquidWrongPasswordBacksOff: a wrong password is refused (407) and
// reported at WARN naming the proxy and what it asks for; after three
// refused rounds the agent logs an ERROR and waits 30–60 s instead of the
// ordinary ≤ 60 s full-jitter backoff, and its status file says when it
// retries and why it failed.
func TestSquidWrongPasswordBacksOff(t *testing.T) {
	w, agentNS, proxyNS, proxyIP, hubIP := behindProxy(t)
	sq := startSquid(t, proxyNS, proxyIP)
	w.startRelay("relay", portRelay443)
	ar := w.startAgent(agentNS, []string{quicURI(hubIP), relay443(hubIP)}, nil, "--proxy", sq.URL(squidUser, "wrong-password"))
	failed := ar.agentLine("the 407", func(l logLine) bool {
		return l.msg() == "endpoint failed" && strings.Contains(l.str("err"), "proxy authentication")
	})
	want := fmt.Sprintf("proxy authentication required by %s: the credentials in the proxy URL were refused (check user and password in http://user:pass@host:port; it asks for Basic realm=\"forgeyard-test\")", sq.Addr)
	if failed.str("level") != "WARN" || failed.str("err") != want {
		t.Fatalf("first failure at %s: %q\nwant WARN %q", failed.str("level"), failed.str("err"), want)
	}
	if strings.Contains(string(failed), "wrong-password") {
		t.Fatalf("the log leaks the password: %s", failed)
	}
	slow := ar.agentLine("the authentication backoff", func(l logLine) bool {
		return strings.HasPrefix(l.msg(), "authentication on the path keeps failing")
	})
	retry, _ := slow.fields()["retry_in"].(float64)
	if slow.str("level") != "ERROR" || time.Duration(retry) < 30*time.Second || time.Duration(retry) > time.Minute {
		t.Fatalf("backoff line %s: level %s, retry_in %v; want ERROR and 30s–60s", slow, slow.str("level"), time.Duration(retry))
	}
	// squid logs a transaction after answering it: wait for the 4th 407
	// to reach the log (the next login is at least 30 s away).
	count407 := func() int {
		n := 0
		for _, l := range sq.AccessLog() {
			if strings.Contains(l, "TCP_DENIED/407") {
				n++
			}
		}
		return n
	}
	if _, err := sq.WaitAccess(w.ctx, func(string) bool { return count407() >= 4 }); err != nil {
		t.Fatal(err)
	}
	if denied := count407(); denied != 4 {
		t.Fatalf("squid refused %d logins before the long backoff, want 4 (3 rounds on the ordinary schedule, then the first long wait):\n%s", denied, strings.Join(sq.AccessLog(), "\n"))
	}
	next := ar.waitStatusField("next_retry", func(v any) bool {
		s, _ := v.(string)
		at, err := time.Parse(time.RFC3339Nano, s)
		return err == nil && time.Until(at) > 20*time.Second
	})
	last, _ := ar.statusField("last_dial_error").(string)
	if !strings.Contains(last, "the credentials in the proxy URL were refused") {
		t.Fatalf("status last_dial_error %q", last)
	}
	t.Logf("wrong password: %d refused logins, then retry in %v (status next_retry %v)", count407(), time.Duration(retry).Round(time.Second), next)
}

// TestSquidRefusesConnectToNon443: a relay on another port is refused by
// the proxy's policy (403), and the agent says so.
func TestSquidRefusesConnectToNon443(t *testing.T) {
	w, agentNS, proxyNS, proxyIP, hubIP := behindProxy(t)
	sq := startSquid(t, proxyNS, proxyIP)
	w.startRelay("relay", portRelay1)
	ar := w.startAgent(agentNS, []string{relayURI(hubIP, portRelay1)}, nil, "--proxy", sq.URL(squidUser, squidPass))
	want := fmt.Sprintf("proxy %s refused CONNECT to %s:%d: 403 Forbidden", sq.Addr, hubIP, portRelay1)
	l := ar.agentLine("the 403", func(l logLine) bool { return l.msg() == "endpoint failed" })
	if l.str("level") != "WARN" || l.str("err") != want {
		t.Fatalf("failure %s %q, want WARN %q", l.str("level"), l.str("err"), want)
	}
	if _, err := sq.WaitAccess(w.ctx, func(l string) bool {
		return strings.Contains(l, "TCP_DENIED/403") && strings.Contains(l, fmt.Sprintf("CONNECT %s:%d", hubIP, portRelay1))
	}); err != nil {
		t.Fatal(err)
	}
	ar.waitStatusField("last_dial_error", func(v any) bool { s, _ := v.(string); return strings.Contains(s, want) })
}

// TestSquidRelayDown: nothing listens on the relay's port; squid answers
// 503 and the agent reports that the proxy could not reach the relay (not
// a refusal).
func TestSquidRelayDown(t *testing.T) {
	w, agentNS, proxyNS, proxyIP, hubIP := behindProxy(t)
	sq := startSquid(t, proxyNS, proxyIP)
	ar := w.startAgent(agentNS, []string{relay443(hubIP)}, nil, "--proxy", sq.URL(squidUser, squidPass))
	l := ar.agentLine("the 503", func(l logLine) bool { return l.msg() == "endpoint failed" })
	wantPrefix := fmt.Sprintf("proxy %s could not reach %s:443: 503 Service Unavailable", sq.Addr, hubIP)
	if l.str("level") != "WARN" || !strings.HasPrefix(l.str("err"), wantPrefix) {
		t.Fatalf("failure %s %q, want WARN starting %q", l.str("level"), l.str("err"), wantPrefix)
	}
}

// TestIdleCuttingProxyAdaptsKeepalive: tinyproxy closes tunnels idle for
// 5 s; the agent's link is quiet ~10 s between heartbeats and pings, so it
// is cut after ~5 s. After that one cut the agent shortens its keepalive
// below 5 s (logged once) and then stays connected.
func TestIdleCuttingProxyAdaptsKeepalive(t *testing.T) {
	const idle = 5 * time.Second
	w, agentNS, proxyNS, proxyIP, hubIP := behindProxy(t)
	tp := proxyNS.StartTinyproxyTimeout(netip.AddrPortFrom(proxyIP, 8888), agentProxyNet, idle, portRelay443)
	w.startRelay("relay", portRelay443)
	ar := w.startAgent(agentNS, []string{relay443(hubIP)}, nil, "--proxy", tp.URL())
	adapted := ar.agentLine("the keepalive adaptation", func(l logLine) bool {
		return strings.HasPrefix(l.msg(), "the network cuts idle TCP connections")
	})
	to, _ := adapted.fields()["to"].(float64)
	cut, _ := adapted.fields()["idle_cut"].(float64)
	if adapted.str("level") != "WARN" || time.Duration(to) >= idle || time.Duration(cut) < idle-time.Second || time.Duration(cut) > idle+time.Second {
		t.Fatalf("adaptation line %s: want WARN, idle_cut about %v, to below it", adapted, idle)
	}
	// The connection after the adaptation (the 2nd) survives more than two
	// of the proxy's idle periods.
	c := ar.waitConnected(2)
	window, cancel := context.WithTimeout(w.ctx, 2*idle+2*time.Second)
	defer cancel()
	cuts := 0
	if l, err := ar.WaitLine(window, func(l string) bool {
		if logLine(l).msg() == "disconnected" {
			cuts++
		}
		return cuts > 1
	}); err == nil {
		t.Fatalf("connection %s over %s cut again after adapting to %v: %s", c.Endpoint, c.Backend, time.Duration(to), l)
	}
	n := 0
	for _, l := range ar.Lines() {
		if strings.HasPrefix(logLine(l).msg(), "the network cuts idle TCP connections") {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d adaptation lines, want 1", n)
	}
	t.Logf("proxy idle cut %v: the agent measured %v, keepalive 10s → %v, then stayed connected %v", idle,
		time.Duration(cut).Round(100*time.Millisecond), time.Duration(to), 2*idle+2*time.Second)
}

// TestSquidIdleCutOnce (issue 27): squid cuts tunnels idle for 5 s
// (read_timeout); the agent's link is quiet ~10 s between heartbeats and
// pings. Over relay+yamux on 443 and over direct TLS+yamux, both through
// squid with Basic auth, an idle agent is cut once, shortens its keepalive
// below the cut at once (one WARN) and is not cut again for the rest of a
// 60 s window.
func TestSquidIdleCutOnce(t *testing.T) {
	const idle, window = 5 * time.Second, 60 * time.Second
	for _, tc := range []struct {
		name  string
		relay bool
	}{{"relay+yamux", true}, {"tls+yamux", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			netns.Require(t, "squid", "openssl")
			w, agentNS, proxyNS, proxyIP, hubIP := behindProxyWithin(t, window+45*time.Second)
			sq := proxyNS.StartSquid(netip.AddrPortFrom(proxyIP, squidPort), netns.SquidOptions{
				Users: map[string]string{squidUser: squidPass}, Allow: agentProxyNet,
				ReadTimeout: idle, ConnectPorts: []uint16{portRelay443, portYamux}})
			ep, want := yamuxURI(hubIP, portYamux), fmt.Sprintf("%s:%d", hubIP, portYamux)
			if tc.relay {
				w.startRelay("relay", portRelay443)
				ep, want = relay443(hubIP), fmt.Sprintf("%s:%d", hubIP, portRelay443)
			}
			ar := w.startAgent(agentNS, []string{ep}, nil, "--proxy", sq.URL(squidUser, squidPass))
			c := ar.waitConnected(1)
			if c.Endpoint != want {
				t.Fatalf("connected to %s, want %s", c.Endpoint, want)
			}
			obs, cancel := context.WithTimeout(w.ctx, window)
			defer cancel()
			cuts, connects := 0, 0 // WaitLine reads the agent's log from its start
			_, _ = ar.WaitLine(obs, func(l string) bool {
				switch logLine(l).msg() {
				case "disconnected":
					cuts++
				case "connected":
					connects++
				}
				return false // observe the whole window
			})
			if w.ctx.Err() != nil {
				t.Fatalf("the scenario ran out of time before the %v window ended", window)
			}
			var adapted []logLine
			for _, l := range ar.Lines() {
				if strings.HasPrefix(logLine(l).msg(), "the network cuts idle TCP connections") {
					adapted = append(adapted, logLine(l))
				}
			}
			if cuts == 0 {
				t.Fatalf("squid never cut the idle tunnel in %v: the scenario does not exercise read_timeout", window)
			}
			if cuts > 1 || connects != cuts+1 {
				t.Fatalf("cut %d times (%d connections) in %v behind a %v idle cut, want once and connected again", cuts, connects, window, idle)
			}
			if len(adapted) != 1 || adapted[0].str("level") != "WARN" {
				t.Fatalf("%d keepalive adaptation lines, want one WARN: %v", len(adapted), adapted)
			}
			to, _ := adapted[0].fields()["to"].(float64)
			if time.Duration(to) >= idle {
				t.Fatalf("keepalive adapted to %v, not below the %v cut", time.Duration(to), idle)
			}
			cut, _ := adapted[0].fields()["idle_cut"].(float64)
			t.Logf("squid read_timeout %v over %s: cut %d time in %v (measured idle cut %v), keepalive 10s → %v", idle, tc.name, cuts, window,
				time.Duration(cut).Round(100*time.Millisecond), time.Duration(to))
		})
	}
}
