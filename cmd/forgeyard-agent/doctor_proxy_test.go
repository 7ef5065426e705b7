package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"syscall"
	"testing"

	"forgeyard.dev/transport/backends/yamux/proxy"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/doctor"
	"forgeyard.dev/transport/internal/tools/netsim"
	"forgeyard.dev/transport/semantics/daemon"
)

// blackholedQUIC returns a quic:// address that silently drops every
// datagram, in front of a live daemon.
func blackholedQUIC(t *testing.T, dir string) (addr, port string) {
	t.Helper()
	_, qaddr := testDaemon(t, "quic", dir, daemon.Hooks{}, io.Discard)
	p, err := netsim.NewUDPProxy(qaddr, netsim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	p.Blackhole(true)
	_, port, _ = strings.Cut(p.Addr(), ":")
	return p.Addr(), port
}

// TestDoctorQUICUnavailableHealthyOverRelay (issue 18): on a network
// without UDP, an agent that is healthy over its relay gets WARN for its
// QUIC endpoint, saying both, and exit 0; every other check passes.
func TestDoctorQUICUnavailableHealthyOverRelay(t *testing.T) {
	dir, _ := doctorPKI(t)
	qaddr, qport := blackholedQUIC(t, dir)
	_, yaddr := testDaemon(t, "yamux", dir, daemon.Hooks{}, io.Discard) // stands in for the relay
	relay := "relay+yamux://" + yaddr
	code, out, _ := runAgentCmd(t, "doctor", "--dev-pki", dir, "--dev-agent", "doc", "--endpoint", "quic://"+qaddr,
		"--endpoint", relay, "--server-name", "localhost", "--timeout", "500ms", "--json")
	r, m := findings(t, out)
	if code != cli.ExitOK || r.Result != doctor.Warn {
		t.Fatalf("exit %d, result %s; want 0 and WARN:\n%s", code, r.Result, out)
	}
	u := m["udp"]
	if want := "QUIC unavailable here, and the agent is healthy over " + relay + ": UDP to 127.0.0.1:" + qport + " is blocked or dropped (no answer within 500ms)"; u.Result != doctor.Warn || u.Detail != want {
		t.Fatalf("udp %+v\nwant WARN %q", u, want)
	}
	if !strings.Contains(u.Fix, "allow UDP "+qport) || !strings.Contains(u.Fix, "meanwhile the agent uses "+relay) || strings.Contains(u.Fix, "daemon runs") {
		t.Fatalf("udp fix %q", u.Fix)
	}
	for _, f := range r.Findings {
		if f.Result == doctor.Fail {
			t.Errorf("FAIL %+v", f)
		}
	}
	if m["protocol"].Target != relay || m["protocol"].Result != doctor.OK {
		t.Errorf("protocol over the relay: %+v", m["protocol"])
	}
}

// TestDoctorQUICUnavailableRelayDown: the same network with the relay
// down is a real failure: both stay FAIL (exit 1), the relay's line names
// forgeyard-relay, its listen key and port, the QUIC line the relay the
// agent would fall back to.
func TestDoctorQUICUnavailableRelayDown(t *testing.T) {
	dir, _ := doctorPKI(t)
	qaddr, qport := blackholedQUIC(t, dir)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	_, dport, _ := net.SplitHostPort(dead)
	relay := "relay+yamux://" + dead
	code, out, _ := runAgentCmd(t, "doctor", "--dev-pki", dir, "--dev-agent", "doc", "--endpoint", "quic://"+qaddr,
		"--endpoint", relay, "--server-name", "localhost", "--timeout", "500ms", "--json")
	_, m := findings(t, out)
	if code != cli.ExitFail || m["udp"].Result != doctor.Fail || m["tcp"].Result != doctor.Fail {
		t.Fatalf("exit %d\n%s", code, out)
	}
	if want := "check that forgeyard-relay runs on 127.0.0.1 and serves listen.yamux on port " + dport; m["tcp"].Fix != want {
		t.Errorf("tcp fix %q, want %q", m["tcp"].Fix, want)
	}
	if want := "allow UDP " + qport + " from this machine to 127.0.0.1; meanwhile the agent uses " + relay; m["udp"].Fix != want {
		t.Errorf("udp fix %q, want %q", m["udp"].Fix, want)
	}
}

// TestDoctorFixLines: each failure class gets its own fix line, naming
// the right scheme, port, key and action (the classification without a
// network; the tests above and TestDoctorThroughProxy cover it live).
func TestDoctorFixLines(t *testing.T) {
	cfg := func(eps ...string) *config.Agent {
		return &config.Agent{ControlPlane: config.ControlPlane{Endpoints: eps}}
	}
	one := func(d *agentDoctor) doctor.Finding {
		t.Helper()
		if len(d.r.Findings) == 0 {
			t.Fatal("no finding")
		}
		return d.r.Findings[len(d.r.Findings)-1]
	}
	quicEP, _ := config.ParseEndpoint("quic://d.example:7443")
	relayEP, _ := config.ParseEndpoint("relay+yamux://r.example:443")
	relay7444, _ := config.ParseEndpoint("relay+yamux://r.example:7444")
	daemonYamux, _ := config.ParseEndpoint("yamux://d.example:7444")

	// UDP: network unreachable is a routing problem on this machine, never
	// "check that the daemon runs".
	d := &agentDoctor{cfg: cfg("quic://d.example:7443", "relay+yamux://r.example:443"), r: &doctor.Report{}}
	d.dialFailed(quicEP, "d.example", true, fmt.Errorf("quic: dial: %w", &net.OpError{Op: "write", Net: "udp", Err: syscall.ENETUNREACH}))
	f := one(d)
	if f.Result != doctor.Fail || !strings.Contains(f.Detail, "network is unreachable: this machine has no UDP path there") ||
		!strings.Contains(f.Fix, "ip route get d.example") || !strings.Contains(f.Fix, "meanwhile the agent uses relay+yamux://r.example:443") || strings.Contains(f.Fix, "daemon runs") {
		t.Errorf("unreachable: %+v", f)
	}
	// The same failure with the relay healthy: WARN.
	d.healthy = "relay+yamux://r.example:443"
	d.judgeUDP()
	if f := one(d); f.Result != doctor.Warn || d.r.Result != doctor.Warn || !strings.HasPrefix(f.Detail, "QUIC unavailable here") {
		t.Errorf("unreachable, relay healthy: %+v (report %s)", f, d.r.Result)
	}
	// Port unreachable: something is there, nothing serves QUIC.
	d = &agentDoctor{cfg: cfg("quic://d.example:7443"), r: &doctor.Report{}}
	d.dialFailed(quicEP, "d.example", true, &net.OpError{Op: "read", Net: "udp", Err: syscall.ECONNREFUSED})
	if f := one(d); f.Fix != "check that the daemon runs on d.example and serves listen.quic on UDP port 7443" {
		t.Errorf("refused: %+v", f)
	}
	// No fallback configured: the fix proposes the relay on 443.
	d = &agentDoctor{cfg: cfg("quic://d.example:7443"), r: &doctor.Report{}, timeout: DefaultDoctorTimeout}
	d.dialFailed(quicEP, "d.example", true, &net.OpError{Op: "dial", Err: errTimeout{}})
	if f := one(d); !strings.Contains(f.Fix, `"relay+yamux://<relay>:443"`) || strings.Contains(f.Fix, "yamux://relay:7444") {
		t.Errorf("timeout, no fallback: %+v", f)
	}
	// A TLS+yamux failure after TCP: the server kind, key and port.
	d = &agentDoctor{cfg: cfg("relay+yamux://r.example:443"), r: &doctor.Report{}}
	d.dialFailed(relayEP, "r.example", false, errors.New("yamux: control stream: EOF"))
	if f := one(d); f.Fix != "check that forgeyard-relay runs on r.example and serves listen.yamux on port 443" {
		t.Errorf("relay yamux: %+v", f)
	}
	d.dialFailed(daemonYamux, "d.example", false, errors.New("yamux: alpn: server negotiated \"h2\""))
	if f := one(d); !strings.Contains(f.Fix, "did not negotiate ALPN forgeyard/1") || !strings.Contains(f.Fix, "try yamux+upgrade://d.example:7444") {
		t.Errorf("alpn: %+v", f)
	}

	// Proxy failures.
	px, _ := url.Parse("http://proxy.corp:3128")
	for _, c := range []struct {
		ep   config.Endpoint
		err  error
		want string
	}{
		{relayEP, &proxy.AuthRequiredError{Proxy: "proxy.corp:3128", Schemes: []string{"NTLM", "Negotiate"}},
			"proxy proxy.corp:3128 offers only NTLM/Negotiate: have it accept Basic for this agent, or exempt r.example from the proxy (control_plane.no_proxy or NO_PROXY) if it is reachable directly"},
		{relayEP, &proxy.AuthRequiredError{Proxy: "proxy.corp:3128", HadCredentials: true, Schemes: []string{"Basic"}},
			"correct the user and password in control_plane.proxy (or HTTPS_PROXY): http://user:pass@proxy.corp:3128; the agent retries a refused login only slowly (backoff.auth_after, backoff.auth_max) so the account is not locked"},
		{relayEP, &proxy.AuthRequiredError{Proxy: "proxy.corp:3128", Schemes: []string{"Basic"}},
			`set the proxy credentials: control_plane.proxy = "http://user:pass@proxy.corp:3128" (or HTTPS_PROXY)`},
		{relayEP, &proxy.StatusError{Proxy: "proxy.corp:3128", Target: "r.example:443", Code: 503, Status: "503 Service Unavailable"},
			"the proxy reached nothing at r.example:443: check that forgeyard-relay runs there and serves listen.yamux on port 443"},
		{relay7444, &proxy.StatusError{Proxy: "proxy.corp:3128", Target: "r.example:7444", Code: 403, Status: "403 Forbidden"},
			"proxy proxy.corp:3128 refuses CONNECT to port 7444 (stock proxies allow 443 only, squid SSL_ports): run the relay on 443 (its default listen.yamux) and use relay+yamux://r.example:443, or have port 7444 allowed"},
		{relayEP, &proxy.StatusError{Proxy: "proxy.corp:3128", Target: "r.example:443", Code: 403, Status: "403 Forbidden"},
			"proxy proxy.corp:3128 refuses CONNECT to r.example:443: have it allowed, or exempt it (control_plane.no_proxy or NO_PROXY)"},
		{relayEP, &proxy.ConnectError{Proxy: "proxy.corp:3128", Err: syscall.ECONNREFUSED},
			"the proxy proxy.corp:3128 itself is not reachable: check control_plane.proxy (or HTTPS_PROXY) and that the proxy runs"},
	} {
		d := &agentDoctor{cfg: cfg(c.ep.String()), r: &doctor.Report{}}
		if got := d.proxyFix(c.ep, px, fmt.Errorf("wrapped: %w", c.err)); got != c.want {
			t.Errorf("%v:\n got %q\nwant %q", c.err, got, c.want)
		}
	}
}

type errTimeout struct{}

func (errTimeout) Error() string   { return "i/o timeout" }
func (errTimeout) Timeout() bool   { return true }
func (errTimeout) Temporary() bool { return true }
