package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/doctor"
	"forgeyard.dev/transport/internal/setup/daemonsetup"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/internal/tools/netsim"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
)

func runAgentCmd(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var o, e bytes.Buffer
	code := run(context.Background(), args, &o, &e, nil)
	return code, o.String(), e.String()
}

// findings decodes a --json doctor report and indexes it by check
// (the first finding of each check).
func findings(t *testing.T, out string) (doctor.Report, map[string]doctor.Finding) {
	t.Helper()
	var r doctor.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("not a doctor report: %v\n%s", err, out)
	}
	m := map[string]doctor.Finding{}
	for _, f := range r.Findings {
		if _, ok := m[f.Check]; !ok {
			m[f.Check] = f
		}
	}
	return r, m
}

func doctorPKI(t *testing.T) (string, *trust.DevPKI) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	pki, err := trust.GenerateDevPKI(dir, trust.DevPKIOptions{Agents: []string{"doc"}})
	if err != nil {
		t.Fatal(err)
	}
	return dir, pki
}

// TestDoctorOK: against a live in-process daemon every check passes, in
// the table and in JSON, and the daemon saw no registration.
func TestDoctorOK(t *testing.T) {
	dir, pki := doctorPKI(t)
	registered := make(chan daemon.SessionInfo, 1)
	_, addr := testDaemon(t, "quic", dir, daemon.Hooks{OnRegistered: func(s daemon.SessionInfo) { registered <- s }}, io.Discard)
	a, _ := pki.Agent("doc")
	args := []string{"doctor", "--dev-pki", dir, "--dev-agent", "doc", "--endpoint", "quic://" + addr, "--server-name", "localhost"}

	code, out, errOut := runAgentCmd(t, args...)
	if code != cli.ExitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"RESULT  CHECK", "OK      certificate", "runner " + a.Runner.String(), "OK      udp          quic://" + addr,
		"OK      tls-trust", "OK      client-cert", "OK      protocol", "negotiated " + wire.Current.String(), "OK      clock", "OK      mtu", "not detectable",
		"OK: 9 checks, 0 failed, 0 warnings"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor output lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = runAgentCmd(t, append(args, "--json")...)
	r, m := findings(t, out)
	if code != cli.ExitOK || r.Result != doctor.OK {
		t.Fatalf("json: exit %d %+v", code, r)
	}
	for _, c := range []string{"config", "certificate", "dns", "udp", "tls-trust", "client-cert", "protocol", "clock", "mtu"} {
		if m[c].Result != doctor.OK {
			t.Errorf("%s = %+v", c, m[c])
		}
	}
	select {
	case s := <-registered:
		t.Errorf("doctor registered a session: %+v", s)
	default:
	}
}

// TestDoctorUDPBlocked: a QUIC endpoint behind a UDP proxy that drops
// everything gets the exact FAIL text and exit 1.
func TestDoctorUDPBlocked(t *testing.T) {
	dir, _ := doctorPKI(t)
	_, addr := testDaemon(t, "quic", dir, daemon.Hooks{}, io.Discard)
	p, err := netsim.NewUDPProxy(addr, netsim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	p.Blackhole(true)
	_, port, _ := strings.Cut(p.Addr(), ":")
	code, out, _ := runAgentCmd(t, "doctor", "--dev-pki", dir, "--dev-agent", "doc", "--endpoint", "quic://"+p.Addr(), "--server-name", "localhost",
		"--timeout", "500ms", "--json")
	_, m := findings(t, out)
	// Issue 18: the detail says what was seen; the fix names the relay
	// scheme and port that pass a stock proxy, not "yamux://relay:7444".
	want := "UDP to 127.0.0.1:" + port + " is blocked or dropped (no answer within 500ms)"
	if code != cli.ExitFail || m["udp"].Result != doctor.Fail || m["udp"].Detail != want {
		t.Fatalf("exit %d, udp %+v; want FAIL %q", code, m["udp"], want)
	}
	if !strings.Contains(m["udp"].Fix, "allow UDP "+port) || !strings.Contains(m["udp"].Fix, `"relay+yamux://<relay>:443"`) || strings.Contains(m["udp"].Fix, "yamux://relay:7444") {
		t.Errorf("fix %q", m["udp"].Fix)
	}
	if _, ok := m["protocol"]; ok {
		t.Errorf("protocol checked over a blocked path: %+v", m["protocol"])
	}
}

// TestDoctorWrongCA: a CA that did not sign the daemon certificate is a
// tls-trust FAIL with the x509 reason.
func TestDoctorWrongCA(t *testing.T) {
	dir, pki := doctorPKI(t)
	_, other := doctorPKI(t)
	_, addr := testDaemon(t, "quic", dir, daemon.Hooks{}, io.Discard)
	a, _ := pki.Agent("doc")
	code, out, _ := runAgentCmd(t, "doctor", "--endpoint", "quic://"+addr, "--server-name", "localhost",
		"--cert", a.CertFile, "--key", a.KeyFile, "--ca", other.CA.CertFile, "--json")
	_, m := findings(t, out)
	f := m["tls-trust"]
	if code != cli.ExitFail || f.Result != doctor.Fail || !strings.Contains(f.Detail, "x509: certificate signed by unknown authority") ||
		!strings.Contains(f.Fix, other.CA.CertFile) {
		t.Fatalf("exit %d, tls-trust %+v", code, f)
	}
	if m["udp"].Result != doctor.OK {
		t.Errorf("udp %+v: the daemon did answer", m["udp"])
	}

	// A server name the certificate does not hold: the hostname reason.
	code, out, _ = runAgentCmd(t, "doctor", "--dev-pki", dir, "--dev-agent", "doc", "--endpoint", "quic://"+addr, "--server-name", "daemon.wrong.example", "--json")
	_, m = findings(t, out)
	if f := m["tls-trust"]; code != cli.ExitFail || f.Result != doctor.Fail || !strings.Contains(f.Detail, "x509: certificate is valid for") ||
		!strings.Contains(f.Fix, "control_plane.server_name") {
		t.Fatalf("wrong name: exit %d, tls-trust %+v", code, f)
	}
}

// expiredAgentCert writes a certificate for a fresh RunnerId, signed by
// the dev CA, that expired an hour ago.
func expiredAgentCert(t *testing.T, pki *trust.DevPKI) (certFile, keyFile string, notAfter time.Time) {
	t.Helper()
	notAfter = time.Now().Add(-time.Hour).Truncate(time.Second)
	certFile, keyFile, _ = agentCert(t, pki, notAfter)
	return certFile, keyFile, notAfter
}

// agentCert writes a client certificate for a fresh RunnerId, signed by
// the dev CA, valid until notAfter (from at least an hour ago).
func agentCert(t *testing.T, pki *trust.DevPKI, notAfter time.Time) (certFile, keyFile string, runner wire.RunnerId) {
	t.Helper()
	runner = wire.NewRunnerId()
	caCert := readCert(t, pki.CA.CertFile)
	caKey := readKey(t, pki.CA.KeyFile)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	notBefore := notAfter.Add(-48 * time.Hour)
	if now := time.Now().Add(-time.Hour); now.Before(notBefore) {
		notBefore = now
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: "test-agent"},
		NotBefore: notBefore, NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, URIs: []*url.URL{trust.RunnerURI(runner)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "agent.pem"), filepath.Join(dir, "agent-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile, runner
}

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func readKey(t *testing.T, path string) crypto.Signer {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if k, err := x509.ParsePKCS8PrivateKey(blk.Bytes); err == nil {
		return k.(crypto.Signer)
	}
	k, err := x509.ParseECPrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestDoctorExpiredCert: an expired agent certificate is a certificate
// FAIL, and the daemon refuses it at the TLS handshake (§22): client-cert
// FAIL saying when it expired and to renew it.
func TestDoctorExpiredCert(t *testing.T) {
	dir, pki := doctorPKI(t)
	registered := make(chan daemon.SessionInfo, 1)
	_, addr := testDaemon(t, "quic", dir, daemon.Hooks{OnRegistered: func(s daemon.SessionInfo) { registered <- s }}, io.Discard)
	cert, key, notAfter := expiredAgentCert(t, pki)
	at := notAfter.UTC().Format(time.RFC3339)
	code, out, _ := runAgentCmd(t, "doctor", "--endpoint", "quic://"+addr, "--server-name", "localhost",
		"--cert", cert, "--key", key, "--ca", pki.CA.CertFile, "--json")
	_, m := findings(t, out)
	if f := m["certificate"]; code != cli.ExitFail || f.Result != doctor.Fail || !strings.Contains(f.Detail, "certificate expired at "+at) || !strings.Contains(f.Fix, "renew") {
		t.Fatalf("exit %d, certificate %+v", code, f)
	}
	f := m["client-cert"]
	if f.Result != doctor.Fail || f.Detail != "the daemon refused this agent's certificate: certificate expired at "+at+"; renew it" {
		t.Fatalf("client-cert %+v\n%s", f, out)
	}
	if m["tls-trust"].Result != doctor.OK {
		t.Errorf("tls-trust %+v", m["tls-trust"])
	}
	select {
	case s := <-registered:
		t.Errorf("expired certificate registered: %+v", s)
	default:
	}
}

// TestAgentExpiredCertRefused: the agent refuses to start with an expired
// certificate and says when it expired and to renew it.
func TestAgentExpiredCertRefused(t *testing.T) {
	_, pki := doctorPKI(t)
	cert, key, notAfter := expiredAgentCert(t, pki)
	code, _, errOut := runAgentCmd(t, "--endpoint", "quic://127.0.0.1:1", "--cert", cert, "--key", key, "--ca", pki.CA.CertFile)
	at := notAfter.UTC().Format(time.RFC3339)
	if code != cli.ExitUsage || !strings.Contains(errOut, "expired at "+at) || !strings.Contains(errOut, "renew it") {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
}

// TestAgentWarnsBeforeExpiry: an agent whose certificate expires within
// the warning window logs trust.ExpiryWarning at start (§22) and still
// connects; a certificate far from expiry logs nothing.
func TestAgentWarnsBeforeExpiry(t *testing.T) {
	dir, pki := doctorPKI(t)
	registered := make(chan daemon.SessionInfo, 1)
	_, addr := testDaemon(t, "quic", dir, daemon.Hooks{OnRegistered: func(s daemon.SessionInfo) { registered <- s }}, io.Discard)
	notAfter := time.Now().Add(3 * 24 * time.Hour).Truncate(time.Second)
	cert, key, runner := agentCert(t, pki, notAfter)
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--endpoint", "quic://" + addr, "--server-name", "localhost", "--cert", cert, "--key", key,
			"--ca", pki.CA.CertFile, "--log-format", "json"}, io.Discard, &logs, nil)
	}()
	select {
	case s := <-registered:
		if s.Runner != runner {
			t.Errorf("registered %v, want %v", s.Runner, runner)
		}
	case code := <-done:
		t.Fatalf("agent exited %d: %s", code, logs.String())
	case <-time.After(10 * time.Second):
		t.Fatalf("no registration: %s", logs.String())
	}
	cancel()
	if code := <-done; code != cli.ExitOK {
		t.Errorf("exit %d", code)
	}
	var warned bool
	for _, line := range strings.Split(logs.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["event"] != "certificate.expiry" {
			continue
		}
		warned = true
		msg, _ := rec["msg"].(string)
		if rec["level"] != "WARN" || !strings.Contains(msg, "runner "+runner.String()) || !strings.Contains(msg, "expires at "+notAfter.UTC().Format(time.RFC3339)) ||
			!strings.Contains(msg, "rotate it") || rec["not_after"] != notAfter.UTC().Format(time.RFC3339) {
			t.Errorf("expiry record %v", rec)
		}
	}
	if !warned {
		t.Errorf("no certificate.expiry warning:\n%s", logs.String())
	}

	// Far from expiry: nothing.
	a, _ := pki.Agent("doc")
	var quiet bytes.Buffer
	if checkCertExpiry(slog.New(slog.NewTextHandler(&quiet, nil)), a.CertFile, time.Now()) || quiet.Len() != 0 {
		t.Errorf("90-day certificate warned: %s", quiet.String())
	}
	// Expired: an error record.
	var loud bytes.Buffer
	if !checkCertExpiry(slog.New(slog.NewTextHandler(&loud, nil)), a.CertFile, a.NotAfter.Add(time.Minute)) ||
		!strings.Contains(loud.String(), "level=ERROR") || !strings.Contains(loud.String(), "EXPIRED") {
		t.Errorf("expired certificate: %s", loud.String())
	}
}

// connectProxy is a minimal HTTP CONNECT proxy on loopback that sends
// every tunnel to target (so test endpoints can use names that do not
// resolve here) and records the requested authorities. With deny it
// answers 407.
type connectProxy struct {
	ln     net.Listener
	asked  chan string
	target string
	deny   bool
}

func newConnectProxy(t *testing.T, target string, deny bool) *connectProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &connectProxy{ln: ln, asked: make(chan string, 16), target: target, deny: deny}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); p.serve(c) }()
		}
	}()
	return p
}

func (p *connectProxy) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil || req.Method != http.MethodConnect {
		return
	}
	p.asked <- req.Host
	if p.deny {
		io.WriteString(c, "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\nContent-Length: 0\r\n\r\n")
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		io.WriteString(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
		return
	}
	defer up.Close()
	io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, br); up.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { io.Copy(c, up); done <- struct{}{} }()
	<-done
}

// TestDoctorThroughProxy: a yamux endpoint whose name only the proxy can
// resolve is checked through the agent's --proxy (HTTP CONNECT): tcp, TLS
// trust, client certificate and the Hello round trip; a proxy that wants
// credentials is a tcp FAIL saying so.
func TestDoctorThroughProxy(t *testing.T) {
	dir, _ := doctorPKI(t)
	_, addr := testDaemon(t, "yamux", dir, daemon.Hooks{}, io.Discard)
	for _, deny := range []bool{false, true} {
		p := newConnectProxy(t, addr, deny)
		code, out, _ := runAgentCmd(t, "doctor", "--dev-pki", dir, "--dev-agent", "doc", "--endpoint", "yamux://daemon.invalid:7444",
			"--server-name", "localhost", "--proxy", "http://"+p.ln.Addr().String(), "--json")
		_, m := findings(t, out)
		select {
		case got := <-p.asked:
			if got != "daemon.invalid:7444" {
				t.Errorf("proxy asked for %q", got)
			}
		default:
			t.Errorf("the proxy saw no CONNECT:\n%s", out)
		}
		if m["dns"].Result != doctor.OK || !strings.Contains(m["dns"].Detail, "the proxy resolves it") {
			t.Errorf("dns %+v", m["dns"])
		}
		if deny {
			if code != cli.ExitFail || m["tcp"].Result != doctor.Fail || !strings.Contains(m["tcp"].Detail, "proxy authentication required by "+p.ln.Addr().String()+": set credentials in the proxy URL") {
				t.Errorf("407: exit %d tcp %+v", code, m["tcp"])
			}
			continue
		}
		if code != cli.ExitOK || m["tcp"].Result != doctor.OK || !strings.Contains(m["tcp"].Detail, "through proxy "+p.ln.Addr().String()) ||
			m["tls-trust"].Result != doctor.OK || m["client-cert"].Result != doctor.OK || m["protocol"].Result != doctor.OK || m["clock"].Result != doctor.OK {
			t.Errorf("through proxy: exit %d\n%s", code, out)
		}
	}
}

// TestDoctorVersionMismatch: a daemon that speaks only 2.0 answers the
// hello with a rejection; doctor shows both ranges and the daemon's
// message.
func TestDoctorVersionMismatch(t *testing.T) {
	dir, _ := doctorPKI(t)
	v2 := wire.ProtocolRange{Min: wire.V(2, 0), Max: wire.V(2, 0)}
	addr := configuredDaemon(t, dir, daemon.Config{Protocol: v2})
	code, out, _ := runAgentCmd(t, "doctor", "--dev-pki", dir, "--dev-agent", "doc", "--endpoint", "quic://"+addr, "--server-name", "localhost", "--json")
	_, m := findings(t, out)
	f := m["protocol"]
	if code != cli.ExitFail || f.Result != doctor.Fail || !strings.Contains(f.Detail, "no common protocol version: daemon speaks "+v2.String()+", this agent "+wire.Supported.String()) ||
		!strings.Contains(f.Fix, "upgrade the agent or the daemon") {
		t.Fatalf("exit %d protocol %+v\n%s", code, f, out)
	}
}

// configuredDaemon serves a daemon built from cfg (Authority filled in) on
// QUIC loopback with the dev PKI's server certificate.
func configuredDaemon(t *testing.T, pkiDir string, cfg daemon.Config) string {
	t.Helper()
	var stls config.ServerTLS
	if _, err := daemonsetup.DevDaemon(pkiDir, &stls); err != nil {
		t.Fatal(err)
	}
	tc, err := serversetup.ServerTLS(stls)
	if err != nil {
		t.Fatal(err)
	}
	au, err := authority.OpenSQLite(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Authority = au
	d, err := daemon.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := quic.Listen("127.0.0.1:0", tc, quic.Config{})
	if err != nil {
		t.Fatal(err)
	}
	go d.Serve(context.Background(), ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Shutdown(ctx)
		ln.Close()
		au.Close()
	})
	return ln.Addr().String()
}

// TestDoctorClockSkew: a daemon clock five minutes ahead is a clock WARN
// naming the difference; the report is WARN, exit 0. The same daemon
// offers two features; the negotiated one is shown.
func TestDoctorClockSkew(t *testing.T) {
	dir, _ := doctorPKI(t)
	addr := configuredDaemon(t, dir, daemon.Config{Now: func() time.Time { return time.Now().Add(5 * time.Minute) },
		Features: wire.Features(wire.FeatureTraceContextV1, wire.FeatureSigningV1)})
	code, out, _ := runAgentCmd(t, "doctor", "--dev-pki", dir, "--dev-agent", "doc", "--endpoint", "quic://"+addr, "--server-name", "localhost", "--json")
	r, m := findings(t, out)
	f := m["clock"]
	if code != cli.ExitOK || r.Result != doctor.Warn || f.Result != doctor.Warn || !strings.Contains(f.Detail, "the daemon's clock is 5m0s ahead") ||
		!strings.Contains(f.Detail, "ahead of this machine's") || !strings.Contains(f.Fix, "NTP") {
		t.Fatalf("exit %d clock %+v\n%s", code, f, out)
	}
	// The features shown are the ones the agent would get: the daemon's
	// offer intersected with the agent's (TraceContextV1, not SigningV1).
	if p := m["protocol"]; p.Result != doctor.OK || !strings.HasSuffix(p.Detail, "features {TraceContextV1}") {
		t.Errorf("protocol %+v", p)
	}
}

// TestDoctorWebTransport: a WebTransport endpoint is checked like QUIC
// (udp, TLS, hello) over its own backend.
func TestDoctorWebTransport(t *testing.T) {
	dir, _ := doctorPKI(t)
	var stls config.ServerTLS
	if _, err := daemonsetup.DevDaemon(dir, &stls); err != nil {
		t.Fatal(err)
	}
	tc, err := serversetup.ServerTLS(stls)
	if err != nil {
		t.Fatal(err)
	}
	au, err := authority.OpenSQLite(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(daemon.Config{Authority: au})
	if err != nil {
		t.Fatal(err)
	}
	ls, err := serversetup.Listen(config.Listen{WebTransport: "127.0.0.1:0"}, tc, quic.Config{}, yamux.Config{})
	if err != nil {
		t.Fatal(err)
	}
	go d.Serve(context.Background(), ls[0])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Shutdown(ctx)
		ls[0].Close()
		au.Close()
	})
	code, out, _ := runAgentCmd(t, "doctor", "--dev-pki", dir, "--dev-agent", "doc", "--endpoint", "webtransport://"+ls[0].Addr().String(),
		"--server-name", "localhost", "--json")
	r, m := findings(t, out)
	if code != cli.ExitOK || r.Result != doctor.OK {
		t.Fatalf("exit %d\n%s", code, out)
	}
	for _, c := range []string{"udp", "tls-trust", "client-cert", "protocol", "clock"} {
		if m[c].Result != doctor.OK || !strings.HasPrefix(m[c].Target, "webtransport://") {
			t.Errorf("%s = %+v", c, m[c])
		}
	}
}
