package proxy

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testProxy is a tiny CONNECT proxy on loopback. Targets named in names are
// resolved through it (so tests can use non-loopback names that are not
// exempt from the proxy).
type testProxy struct {
	ln       net.Listener
	user     string // "user:pass" required when set
	names    map[string]string
	extra    string   // written right after the 200
	status   string   // answer instead of 200 when set
	offer    []string // Proxy-Authenticate headers of the 407 (default: Basic realm="test")
	hang     bool     // never answer
	big      bool     // answer with an oversized header
	connects atomic.Int64
	lastReq  atomic.Value // *http.Request
	wg       sync.WaitGroup
}

func startProxy(t *testing.T, p *testProxy) *testProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.ln = ln
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

func (p *testProxy) addr() string { return p.ln.Addr().String() }

func (p *testProxy) serve(c net.Conn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil || req.Method != http.MethodConnect {
		return
	}
	p.connects.Add(1)
	p.lastReq.Store(req)
	if p.hang {
		_, _ = io.Copy(io.Discard, br)
		return
	}
	if p.big {
		fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nX-Big: %s\r\n\r\n", strings.Repeat("a", 2*MaxResponseHeader))
		return
	}
	if p.user != "" {
		want := "Basic " + base64.StdEncoding.EncodeToString([]byte(p.user))
		if req.Header.Get("Proxy-Authorization") != want {
			offer := p.offer
			if offer == nil {
				offer = []string{`Basic realm="test"`}
			}
			var h strings.Builder
			for _, o := range offer {
				fmt.Fprintf(&h, "Proxy-Authenticate: %s\r\n", o)
			}
			fmt.Fprintf(c, "HTTP/1.1 407 Proxy Authentication Required\r\n%sContent-Length: 0\r\n\r\n", h.String())
			return
		}
	}
	if p.status != "" {
		fmt.Fprintf(c, "HTTP/1.1 %s\r\nContent-Length: 0\r\n\r\n", p.status)
		return
	}
	target := req.Host
	if n, ok := p.names[target]; ok {
		target = n
	}
	up, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		fmt.Fprint(c, "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
		return
	}
	defer up.Close()
	_ = c.SetDeadline(time.Time{})
	// The 200 and the extra bytes in one write: the client's reader gets
	// them together and must keep the extra for the tunnel.
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"+p.extra); err != nil {
		return
	}
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, br); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	<-done
}

// echoServer echoes lines on loopback.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, msg string) string {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	return string(buf)
}

func TestConnectTunnelAndEarlyBytes(t *testing.T) {
	echo := echoServer(t)
	p := startProxy(t, &testProxy{extra: "early!"})
	d, err := Fixed("http://"+p.addr(), "")
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.DialContext(context.Background(), "tcp", echo)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// The bytes the proxy sent with its 200 come first.
	buf := make([]byte, len("early!"))
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "early!" {
		t.Fatalf("early bytes = %q, %v", buf, err)
	}
	if got := roundTrip(t, c, "hello through the proxy"); got != "hello through the proxy" {
		t.Fatalf("echo = %q", got)
	}
	req := p.lastReq.Load().(*http.Request)
	if req.Host != echo || req.Header.Get("Proxy-Authorization") != "" {
		t.Fatalf("CONNECT host %q auth %q", req.Host, req.Header.Get("Proxy-Authorization"))
	}
}

func TestAuth(t *testing.T) {
	echo := echoServer(t)
	p := startProxy(t, &testProxy{user: "agent:s3cret"})

	d, _ := Fixed("http://"+p.addr(), "")
	_, err := d.DialContext(context.Background(), "tcp", echo)
	var ae *AuthRequiredError
	if !errors.As(err, &ae) || ae.HadCredentials || ae.Proxy != p.addr() || !IsProxyError(err) {
		t.Fatalf("no credentials: err = %v", err)
	}
	want := "proxy authentication required by " + p.addr() + ": set credentials in the proxy URL (http://user:pass@host:port)"
	if err.Error() != want {
		t.Fatalf("message\n got %q\nwant %q", err, want)
	}
	if ae.Challenge != `Basic realm="test"` {
		t.Fatalf("challenge %q", ae.Challenge)
	}

	d, _ = Fixed("http://agent:wrong@"+p.addr(), "")
	_, err = d.DialContext(context.Background(), "tcp", echo)
	if !errors.As(err, &ae) || !ae.HadCredentials || !strings.Contains(err.Error(), "were refused") {
		t.Fatalf("wrong password: err = %v", err)
	}
	if strings.Contains(err.Error(), "wrong") {
		t.Fatalf("error leaks the password: %v", err)
	}

	d, _ = Fixed("http://agent:s3cret@"+p.addr(), "")
	c, err := d.DialContext(context.Background(), "tcp", echo)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := roundTrip(t, c, "authed"); got != "authed" {
		t.Fatalf("echo = %q", got)
	}
}

// TestAuthSchemes: a proxy that offers only schemes this package does not
// speak gets a message saying so (not "credentials were refused"), with or
// without credentials; one that offers Basic among others is a plain
// credentials problem, and the refusal names what the proxy asked for.
func TestAuthSchemes(t *testing.T) {
	echo := echoServer(t)
	for _, c := range []struct {
		offer   []string
		creds   string
		schemes []string
		want    string
	}{
		{[]string{"NTLM", "Negotiate"}, "", []string{"NTLM", "Negotiate"},
			"requires NTLM/Negotiate authentication, which is not supported; use Basic or a proxy exception (no_proxy / NO_PROXY)"},
		{[]string{`Digest realm="corp", nonce="abc", qop="auth"`}, "agent:s3cret@", []string{"Digest"},
			"requires Digest authentication, which is not supported; use Basic or a proxy exception"},
		{[]string{"Negotiate", `Basic realm="corp proxy"`}, "agent:wrong@", []string{"Negotiate", "Basic"},
			`the credentials in the proxy URL were refused (check user and password in http://user:pass@host:port; it asks for Negotiate)`},
		{[]string{`Basic realm="corp proxy"`}, "agent:wrong@", []string{"Basic"},
			`were refused (check user and password in http://user:pass@host:port; it asks for Basic realm="corp proxy")`},
	} {
		p := startProxy(t, &testProxy{user: "agent:right", offer: c.offer})
		d, _ := Fixed("http://"+c.creds+p.addr(), "")
		_, err := d.DialContext(context.Background(), "tcp", echo)
		var ae *AuthRequiredError
		if !errors.As(err, &ae) || !Failed(err) || !ae.AuthFailure() {
			t.Fatalf("%v: err = %v", c.offer, err)
		}
		if fmt.Sprint(ae.Schemes) != fmt.Sprint(c.schemes) {
			t.Errorf("%v: schemes %q, want %q", c.offer, ae.Schemes, c.schemes)
		}
		if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), p.addr()) {
			t.Errorf("%v: message\n got %q\nwant it to name the proxy and contain %q", c.offer, err, c.want)
		}
		if strings.Contains(err.Error(), "wrong") {
			t.Errorf("error leaks the password: %v", err)
		}
	}
}

// TestUnreachableAndConnectError: 502/503/504 mean the proxy could not
// reach the target (not a refusal); a proxy that cannot be reached is a
// *ConnectError naming it; both are proxy failures (Failed).
func TestUnreachableAndConnectError(t *testing.T) {
	for _, st := range []string{"502 Bad Gateway", "503 Service Unavailable", "504 Gateway Timeout"} {
		p := startProxy(t, &testProxy{status: st})
		d, _ := Fixed(p.addr(), "")
		_, err := d.DialContext(context.Background(), "tcp", "relay.example:443")
		var se *StatusError
		if !errors.As(err, &se) || !se.Unreachable() || !Failed(err) {
			t.Fatalf("%s: err = %v", st, err)
		}
		if want := "proxy " + p.addr() + " could not reach relay.example:443: " + st; !strings.HasPrefix(err.Error(), want) {
			t.Fatalf("%s: message %q, want prefix %q", st, err, want)
		}
	}
	// A real 502 from the test proxy: nothing listens at the target.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	p := startProxy(t, &testProxy{})
	d, _ := Fixed(p.addr(), "")
	if _, err := d.DialContext(context.Background(), "tcp", dead); err == nil || !strings.Contains(err.Error(), "could not reach "+dead) {
		t.Fatalf("dead target: err = %v", err)
	}
	// The proxy itself is down.
	d, _ = Fixed(dead, "")
	_, err = d.DialContext(context.Background(), "tcp", "relay.example:443")
	var ce *ConnectError
	if !errors.As(err, &ce) || ce.Proxy != dead || !Failed(err) || IsProxyError(err) || !strings.HasPrefix(err.Error(), "proxy "+dead+": ") {
		t.Fatalf("proxy down: err = %v", err)
	}
	if Failed(errors.New("tls: bad certificate")) {
		t.Fatal("a non-proxy error counts as a proxy failure")
	}
}

func TestRefusedAndOversizedAndHang(t *testing.T) {
	p := startProxy(t, &testProxy{status: "403 Forbidden"})
	d, _ := Fixed(p.addr(), "") // scheme-less form means http://
	_, err := d.DialContext(context.Background(), "tcp", "daemon.example:7444")
	var se *StatusError
	if !errors.As(err, &se) || se.Code != 403 || se.Target != "daemon.example:7444" {
		t.Fatalf("err = %v", err)
	}
	if want := "proxy " + p.addr() + " refused CONNECT to daemon.example:7444: 403 Forbidden"; err.Error() != want {
		t.Fatalf("message %q, want %q", err, want)
	}

	big := startProxy(t, &testProxy{big: true})
	d, _ = Fixed(big.addr(), "")
	_, err = d.DialContext(context.Background(), "tcp", "daemon.example:7444")
	if err == nil || !strings.Contains(err.Error(), "exceeds") {
		t.Fatalf("oversized header: err = %v", err)
	}

	hang := startProxy(t, &testProxy{hang: true})
	d, _ = Fixed(hang.addr(), "")
	d.Timeout = 200 * time.Millisecond
	start := time.Now()
	_, err = d.DialContext(context.Background(), "tcp", "daemon.example:7444")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hung proxy: err = %v", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("hung proxy took %v (timeout 200ms)", el)
	}
	// Cancellation ends the exchange too.
	d.Timeout = time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = d.DialContext(ctx, "tcp", "daemon.example:7444")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: err = %v", err)
	}

	if _, err := d.DialContext(context.Background(), "udp", "x:1"); err == nil {
		t.Fatal("udp through CONNECT accepted")
	}
}

func TestEnvironment(t *testing.T) {
	echo := echoServer(t)
	p := startProxy(t, &testProxy{names: map[string]string{}})
	_, port, _ := net.SplitHostPort(echo)
	target := "daemon.internal.test:" + port
	p.names[target] = echo

	t.Setenv("HTTPS_PROXY", "http://"+p.addr())
	t.Setenv("https_proxy", "")
	t.Setenv("NO_PROXY", "")
	t.Setenv("no_proxy", "")
	t.Setenv("REQUEST_METHOD", "")
	d := FromEnvironment()
	c, err := d.DialContext(context.Background(), "tcp", target)
	if err != nil {
		t.Fatal(err)
	}
	if got := roundTrip(t, c, "env"); got != "env" {
		t.Fatalf("echo %q", got)
	}
	c.Close()
	if p.connects.Load() != 1 {
		t.Fatalf("connects = %d", p.connects.Load())
	}

	// Loopback targets never use the environment's proxy.
	c, err = d.DialContext(context.Background(), "tcp", echo)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	// NO_PROXY: the domain is reached directly (through Forward).
	t.Setenv("NO_PROXY", ".internal.test")
	d = FromEnvironment()
	var direct atomic.Int64
	d.Forward = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == target {
			direct.Add(1)
			addr = echo
		}
		var nd net.Dialer
		return nd.DialContext(ctx, network, addr)
	}
	c, err = d.DialContext(context.Background(), "tcp", target)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if direct.Load() != 1 || p.connects.Load() != 1 {
		t.Fatalf("NO_PROXY: direct %d, proxied %d", direct.Load(), p.connects.Load())
	}

	// Unset: direct.
	t.Setenv("HTTPS_PROXY", "")
	if d := FromEnvironment(); d.Proxy != nil {
		t.Fatal("no proxy configured but Proxy set")
	}
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"http://proxy.example:3128", "http://proxy.example:3128", ""},
		{"proxy.example", "http://proxy.example:80", ""},
		{"http://u:p@proxy.example:3128/", "http://u:p@proxy.example:3128", ""},
		{"https://proxy.example:443", "", "not supported"},
		{"socks5://proxy.example:1080", "", "not supported"},
		{"http://proxy.example:3128/path", "", "only http://"},
		{"http://:3128", "", "missing host"},
	} {
		u, err := ParseURL(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: err %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || u.String() != tc.want {
			t.Errorf("%q: %v %v, want %s", tc.in, u, err, tc.want)
		}
	}
	if _, err := ParseURL("http://u:hunter2@proxy.example:3128/x"); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("password in error: %v", err)
	}
}

// TestTinyproxy runs Debian's tinyproxy on loopback (when installed) with
// basic auth and tunnels through it.
func TestTinyproxy(t *testing.T) {
	bin, err := exec.LookPath("tinyproxy")
	if err != nil {
		t.Skip("tinyproxy not installed (apt-get install -y tinyproxy); `make test` installs it")
	}
	echo := echoServer(t)
	_, echoPort, _ := net.SplitHostPort(echo)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir := t.TempDir()
	conf := fmt.Sprintf(`Port %d
Listen 127.0.0.1
Timeout 30
MaxClients 20
LogLevel Info
LogFile "%s"
PidFile "%s"
Allow 127.0.0.1
BasicAuth agent s3cret
ConnectPort %s
`, port, filepath.Join(dir, "tinyproxy.log"), filepath.Join(dir, "tinyproxy.pid"), echoPort)
	if err := os.WriteFile(filepath.Join(dir, "tinyproxy.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-d", "-c", filepath.Join(dir, "tinyproxy.conf"))
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if os.Geteuid() == 0 {
		// tinyproxy drops to nobody when root; the temp dir must be readable.
		_ = os.Chmod(dir, 0o777)
		_ = os.Chmod(filepath.Join(dir, "tinyproxy.conf"), 0o644)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	// No readiness event: poll the port with a deadline.
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "tinyproxy.log"))
			t.Fatalf("tinyproxy did not listen on %s: %v\n%s", addr, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}

	d, _ := Fixed("http://"+addr, "")
	_, err = d.DialContext(context.Background(), "tcp", echo)
	var ae *AuthRequiredError
	if !errors.As(err, &ae) {
		t.Fatalf("tinyproxy without credentials: err = %v", err)
	}
	d, _ = Fixed("http://agent:s3cret@"+addr, "")
	c, err := d.DialContext(context.Background(), "tcp", echo)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := roundTrip(t, c, "via tinyproxy"); got != "via tinyproxy" {
		t.Fatalf("echo %q", got)
	}
}
