package quic

import (
	"context"
	"net"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// Connections dialled through one Transport share its socket: the server
// sees one source address; the socket outlives a closed connection and
// Close, and closes with the last connection; no dial after Close.
func TestSharedTransport(t *testing.T) {
	e := newTenv(t, testConfig)
	tr, err := NewTransport("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := Dialer{TLS: e.pki.ClientConfig(t, wire.NewRunnerId(), serverName), Config: testConfig, Transport: tr}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var remotes []string
	var conns, servers []semantics.BackendConn
	for range 2 {
		c, err := d.Dial(ctx, e.ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		s, err := e.ln.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		remotes = append(remotes, s.RemoteAddr().String())
		conns, servers = append(conns, c), append(servers, s)
		defer s.CloseWithCode(wire.CloseNormal, "")
	}
	if remotes[0] != remotes[1] || remotes[0] != tr.LocalAddr().String() {
		t.Fatalf("server saw %v, want both from %v", remotes, tr.LocalAddr())
	}
	_ = conns[0].CloseWithCode(wire.CloseNormal, "")
	_ = tr.Close()
	if _, err := d.Dial(ctx, e.ln.Addr().String()); err == nil {
		t.Fatal("dial through a closed Transport succeeded")
	}
	// The second connection still works over the shared socket.
	if isClosed(tr.ep) {
		t.Fatal("socket closed while a connection uses it")
	}
	st, err := conns[1].OpenStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	ss, err := servers[1].AcceptStream(ctx)
	if err != nil {
		t.Fatalf("stream over the shared socket after Close: %v", err)
	}
	if _, err := ss.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	_ = conns[1].CloseWithCode(wire.CloseNormal, "")
	for deadline := time.Now().Add(5 * time.Second); !isClosed(tr.ep); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("shared socket not closed after its last connection")
		}
	}
}

func isClosed(e *endpoint) bool { return e.users.Closed() }

// Dialer.LocalAddr binds the dial's own socket: the server sees it.
func TestDialerLocalAddr(t *testing.T) {
	e := newTenv(t, testConfig)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dialer{TLS: e.pki.ClientConfig(t, wire.NewRunnerId(), serverName), Config: testConfig, LocalAddr: "127.0.0.3:0"}.Dial(ctx, e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseWithCode(wire.CloseNormal, "")
	s, err := e.ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.CloseWithCode(wire.CloseNormal, "")
	if ip := s.RemoteAddr().(*net.UDPAddr).IP.String(); ip != "127.0.0.3" {
		t.Fatalf("server saw %v, want 127.0.0.3", s.RemoteAddr())
	}
}
