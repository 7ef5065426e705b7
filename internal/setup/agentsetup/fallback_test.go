package agentsetup

import (
	"bufio"
	"context"
	"crypto"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/webtransport"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/backends/yamux/proxy"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func parse(t testing.TB, uris ...string) []config.Endpoint {
	t.Helper()
	var out []config.Endpoint
	for _, u := range uris {
		e, err := config.ParseEndpoint(u)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, e)
	}
	return out
}

func TestEndpointsFromURIs(t *testing.T) {
	px, err := proxy.Fixed("http://proxy.example:3128", "")
	if err != nil {
		t.Fatal(err)
	}
	eps, err := Endpoints(parse(t, "quic://d.example", "webtransport://d.example", "yamux://d.example",
		"yamux+upgrade://d.example", "relay://r.example", "relay+webtransport://r.example:8443"),
		EndpointOptions{TLS: &tls.Config{}, Proxy: px})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		addr, backend string
		class         agent.Class
		proxied       bool
		upgrade       bool
	}{
		{"d.example:7443", "quic", agent.ClassQUIC, false, false},
		{webtransport.URL("d.example:443"), "webtransport", agent.ClassWebTransport, false, false},
		{"d.example:7444", "yamux", agent.ClassTCP, true, false},
		{"d.example:443", "yamux+upgrade", agent.ClassTCP, true, true},
		{"r.example:443", "relay+yamux", agent.ClassRelay, true, false},
		{webtransport.URL("r.example:8443"), "relay+webtransport", agent.ClassRelay, false, false},
	}
	for i, w := range want {
		e := eps[i]
		if e.Address != w.addr || e.Backend != w.backend || e.Class != w.class {
			t.Errorf("%d: %+v, want %+v", i, e, w)
		}
		switch d := e.Dialer.(type) {
		case yamux.Dialer:
			if (d.DialContext != nil) != w.proxied || d.Upgrade != w.upgrade || d.TLS.ServerName == "" {
				t.Errorf("%d: yamux dialer proxied=%v upgrade=%v", i, d.DialContext != nil, d.Upgrade)
			}
		case quic.Dialer, webtransport.Dialer:
			if w.proxied {
				t.Errorf("%d: UDP dialer for a TCP endpoint", i)
			}
		default:
			t.Errorf("%d: dialer %T", i, d)
		}
	}
	// Without a proxy nothing is proxied.
	eps, _ = Endpoints(parse(t, "yamux://d.example"), EndpointOptions{TLS: &tls.Config{}})
	if eps[0].Dialer.(yamux.Dialer).DialContext != nil {
		t.Fatal("direct endpoint has a DialContext")
	}
	if _, err := Endpoints(parse(t, "yamux://d.example"), EndpointOptions{}); err == nil {
		t.Fatal("no TLS accepted")
	}
}

func TestProxyFor(t *testing.T) {
	t.Setenv("HTTPS_PROXY", "")
	t.Setenv("https_proxy", "")
	if d, err := ProxyFor(config.ProxyFromEnvironment, ""); d != nil || err != nil {
		t.Fatalf("no environment: %v %v", d, err)
	}
	t.Setenv("HTTPS_PROXY", "http://proxy.example:3128")
	if d, err := ProxyFor(config.ProxyFromEnvironment, ""); d == nil || err != nil {
		t.Fatalf("environment: %v %v", d, err)
	}
	if d, err := ProxyFor(config.ProxyNone, ""); d != nil || err != nil {
		t.Fatalf("none: %v %v", d, err)
	}
	if d, err := ProxyFor("http://u:p@proxy.example:3128", "localhost"); d == nil || err != nil {
		t.Fatalf("explicit: %v %v", d, err)
	}
	if _, err := ProxyFor("socks5://proxy.example:1080", ""); err == nil {
		t.Fatal("socks accepted")
	}
}

func TestPolicy(t *testing.T) {
	p := Policy(config.Fallback{ClassStagger: []config.Duration{{Duration: time.Second}}, ProbeSuccesses: 5, DisableProbe: true})
	if len(p.ClassStagger) != 1 || p.ClassStagger[0] != time.Second || p.ProbeSuccesses != 5 || p.ProbeInterval >= 0 || p.MemoryTTL != 0 {
		t.Fatalf("%+v", p)
	}
}

// ---- end to end: an in-process daemon, a CONNECT proxy, a UDP black hole ----

// connectProxy is a minimal CONNECT proxy on loopback.
type connectProxy struct {
	ln       net.Listener
	connects atomic.Int64
	wg       sync.WaitGroup
}

func newConnectProxy(t testing.TB) *connectProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &connectProxy{ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.wg.Add(1)
			go func() { defer p.wg.Done(); p.serve(c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); p.wg.Wait() })
	return p
}

func (p *connectProxy) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil || req.Method != http.MethodConnect {
		return
	}
	up, err := net.Dial("tcp", req.Host)
	if err != nil {
		_, _ = io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\n\r\n")
		return
	}
	defer up.Close()
	p.connects.Add(1)
	_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\n")
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, br); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}

// e2e is one daemon on QUIC and TLS+yamux (both forms), a UDP black hole
// standing in for "QUIC silently dropped", and a CONNECT proxy.
type e2e struct {
	pki       *trusttest.PKI
	d         *daemon.Daemon
	quicAddr  string
	yamuxAddr string
	blackhole string
	proxy     *connectProxy
}

func newE2E(t testing.TB) *e2e {
	t.Helper()
	auth, err := authority.OpenSQLite(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	pki := trusttest.NewPKI(t)
	d, err := daemon.New(daemon.Config{Authority: auth, RunnerCAs: pki.CAPool()})
	if err != nil {
		t.Fatal(err)
	}
	ql, err := quic.Listen("127.0.0.1:0", pki.ServerConfig(t, "localhost"), quic.Config{})
	if err != nil {
		t.Fatal(err)
	}
	yl, err := yamux.Listen("127.0.0.1:0", pki.ServerConfig(t, "localhost"), yamux.Config{})
	if err != nil {
		t.Fatal(err)
	}
	hole, err := net.ListenPacket("udp", "127.0.0.1:0") // never read: every datagram is dropped
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = d.Serve(context.Background(), ql) }()
	go func() { defer wg.Done(); _ = d.Serve(context.Background(), yl) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = d.Shutdown(ctx)
		_ = ql.Close()
		_ = yl.Close()
		wg.Wait()
		_ = hole.Close()
		_ = auth.Close()
	})
	return &e2e{pki: pki, d: d, quicAddr: ql.Addr().String(), yamuxAddr: yl.Addr().String(),
		blackhole: hole.LocalAddr().String(), proxy: newConnectProxy(t)}
}

// runAgent starts an agent over uris and returns the time to registered
// and its status.
func (e *e2e) runAgent(t testing.TB, o EndpointOptions, uris ...string) (time.Duration, agent.Status) {
	t.Helper()
	runner := wire.NewRunnerId()
	cert := e.pki.IssueClient(t, runner, trusttest.LeafOptions{})
	o.TLS = e.pki.ClientConfigWith(t, cert, "localhost")
	eps, err := Endpoints(parse(t, uris...), o)
	if err != nil {
		t.Fatal(err)
	}
	connected := make(chan agent.Status, 1)
	a, err := agent.New(agent.Config{Runner: runner, Signer: cert.PrivateKey.(crypto.Signer), CertChain: cert.Certificate,
		Endpoints: eps, Executor: agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}), RequestTimeout: 5 * time.Second,
		Fallback: agent.Fallback{ProbeInterval: -1},
		Hooks: agent.Hooks{OnConnected: func(s agent.Status) {
			select {
			case connected <- s:
			default:
			}
		}}})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(context.Background()) }()
	defer func() { _ = a.Close(); <-done }()
	select {
	case s := <-connected:
		return time.Since(start), s
	case <-time.After(10 * time.Second):
		t.Fatalf("agent never registered: %+v", a.Status())
		return 0, agent.Status{}
	}
}

// TestUpgradeThroughProxyWhenUDPDropped: QUIC is a black hole, the only
// TCP path is yamux+upgrade through a CONNECT proxy: the agent registers
// over it within 1.5 s.
func TestUpgradeThroughProxyWhenUDPDropped(t *testing.T) {
	e := newE2E(t)
	px, err := proxy.Fixed("http://"+e.proxy.ln.Addr().String(), "")
	if err != nil {
		t.Fatal(err)
	}
	el, s := e.runAgent(t, EndpointOptions{Proxy: px}, "quic://"+e.blackhole, "yamux+upgrade://"+e.yamuxAddr)
	t.Logf("registered over %s (%s) after %v: %s", s.Backend, s.Endpoint, el, s.FallbackReason)
	if s.Backend != "yamux" || s.Endpoint != e.yamuxAddr || s.Class != "tcp" {
		t.Fatalf("status %+v", s)
	}
	if el > 1500*time.Millisecond {
		t.Fatalf("registered after %v, want ≤ 1.5 s", el)
	}
	if e.proxy.connects.Load() != 1 {
		t.Fatalf("proxy saw %d CONNECTs", e.proxy.connects.Load())
	}
	if !strings.Contains(s.FallbackReason, "yamux+upgrade") {
		t.Fatalf("reason %q", s.FallbackReason)
	}
}

// BenchmarkFallback measures agent start → registered: QUIC reachable
// (baseline) and QUIC silently dropped (TLS+yamux wins at its +500 ms
// offset).
func BenchmarkFallback(b *testing.B) {
	e := newE2E(b)
	for _, bc := range []struct {
		name string
		quic func() string
	}{
		{"udp-ok", func() string { return e.quicAddr }},
		{"udp-dropped", func() string { return e.blackhole }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var total time.Duration
			for b.Loop() {
				el, _ := e.runAgent(b, EndpointOptions{}, "quic://"+bc.quic(), "yamux://"+e.yamuxAddr)
				total += el
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms-to-registered")
		})
	}
}
