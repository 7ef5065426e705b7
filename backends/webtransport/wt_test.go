package webtransport

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	quicgo "github.com/quic-go/quic-go"
	wt "github.com/quic-go/webtransport-go"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

const serverName = "daemon.forgeyard.test"

func listen(t *testing.T, cfg Config) (*trusttest.PKI, *Listener) {
	t.Helper()
	pki := trusttest.NewPKI(t)
	ln, err := Listen("127.0.0.1:0", pki.ServerConfig(t, serverName), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return pki, ln
}

func TestParseURL(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:4433":                    "https://127.0.0.1:4433" + Path,
		"https://relay.example" + Path:      "https://relay.example:443" + Path,
		"https://relay.example:8443/custom": "https://relay.example:8443/custom",
		"[::1]:443":                         "https://[::1]:443" + Path,
	} {
		u, err := parseURL(in)
		if err != nil || u.String() != want {
			t.Errorf("parseURL(%q) = %v, %v; want %s", in, u, err, want)
		}
	}
	for _, bad := range []string{"http://x:1/", "quic://x:1", "https:///nohost", "%zz"} {
		if _, err := parseURL(bad); err == nil {
			t.Errorf("parseURL(%q) accepted", bad)
		}
	}
}

// Only the well-known path serves sessions; nothing reaches Accept.
func TestWrongPathRejected(t *testing.T) {
	pki, ln := listen(t, testConfig)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := Dialer{TLS: pki.ClientConfig(t, wire.NewRunnerId(), serverName), Config: testConfig}
	if c, err := d.Dial(ctx, "https://"+ln.Addr().String()+"/other"); err == nil {
		_ = c.CloseWithCode(0, "")
		t.Fatal("dial to another path succeeded")
	} else if !strings.Contains(err.Error(), "404") {
		t.Fatalf("wrong path: %v, want HTTP 404", err)
	}
	actx, acancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer acancel()
	if c, err := ln.Accept(actx); err == nil {
		t.Fatalf("Accept returned a session for the wrong path: %v", c.RemoteAddr())
	}
}

// A WebTransport client that does not offer forgeyard/1 gets its session
// closed with CloseProtocolError, and it is never Accepted.
func TestApplicationProtocolRequired(t *testing.T) {
	pki, ln := listen(t, testConfig)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tc := pki.ClientConfig(t, wire.NewRunnerId(), serverName)
	tr := &wt.Transport{TLSClientConfig: tc, QUICConfig: &quicgo.Config{EnableDatagrams: true, EnableStreamResetPartialDelivery: true}}
	defer tr.Close()
	rsp, sess, err := tr.Dial(ctx, URL(ln.Addr().String()), nil)
	if err == nil {
		// The session was established; the server closes it at once.
		if rsp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", rsp.StatusCode)
		}
		_, err = sess.AcceptStream(ctx)
		var se *wt.SessionError
		if errors.As(err, &se) && se.ErrorCode != wt.SessionErrorCode(wire.CloseProtocolError) {
			t.Fatalf("session without forgeyard/1: %v, want SessionError ProtocolError", err)
		}
	}
	// The WT_CLOSE_SESSION capsule or the QUIC close that follows it
	// (same code, same reason) may arrive first, during or after the dial.
	if !strings.Contains(err.Error(), ApplicationProtocol+" required") {
		t.Fatalf("session without forgeyard/1: %v, want the server's reason", err)
	}
	actx, acancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer acancel()
	if _, err := ln.Accept(actx); err == nil {
		t.Fatal("a session without forgeyard/1 was Accepted")
	}
}

func TestIdleTimeout(t *testing.T) {
	cfg := Config{KeepAlivePeriod: -1, MaxIdleTimeout: 300 * time.Millisecond, HandshakeTimeout: 5 * time.Second}
	pki, ln := listen(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acc := make(chan semantics.BackendConn, 1)
	go func() {
		s, err := ln.Accept(ctx)
		if err == nil {
			acc <- s
		}
		close(acc)
	}()
	c, err := Dialer{TLS: pki.ClientConfig(t, wire.NewRunnerId(), serverName), Config: cfg}.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s, ok := <-acc
	if !ok {
		t.Fatal("no session accepted")
	}
	_, err = c.AcceptStream(ctx)
	var ce *semantics.ConnError
	if !errors.As(err, &ce) || ce.Code != wire.CloseIdleTimeout {
		t.Fatalf("AcceptStream on an idle session: %v, want ConnError IdleTimeout", err)
	}
	for _, cc := range []semantics.BackendConn{c, s} {
		<-cc.Context().Done()
		if cause := context.Cause(cc.Context()); !errors.As(cause, &ce) || ce.Code != wire.CloseIdleTimeout {
			t.Fatalf("context cause %v, want IdleTimeout", cause)
		}
	}
}

// The server sees the agent's certificate through the session, and the
// TLS ALPN is h3 while the session protocol is forgeyard/1.
func TestSessionState(t *testing.T) {
	pki, ln := listen(t, testConfig)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	acc := make(chan semantics.BackendConn, 1)
	go func() {
		s, _ := ln.Accept(ctx)
		acc <- s
	}()
	c, err := Dialer{TLS: pki.ClientConfig(t, wire.NewRunnerId(), serverName), Config: testConfig}.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseWithCode(wire.CloseNormal, "")
	s := <-acc
	if s == nil {
		t.Fatal("no session")
	}
	defer s.CloseWithCode(wire.CloseNormal, "")
	if st := s.ConnectionState(); st.NegotiatedProtocol != "h3" || len(st.VerifiedChains) == 0 {
		t.Fatalf("server state: ALPN %q, %d verified chains", st.NegotiatedProtocol, len(st.VerifiedChains))
	}
	if s.Backend() != "webtransport" {
		t.Fatalf("Backend() = %q", s.Backend())
	}
}
