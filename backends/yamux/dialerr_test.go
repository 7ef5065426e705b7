package yamux

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"

	"forgeyard.dev/transport/backends/yamux/proxy"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// TestDialErrorNamesTheFailedHop: a failed dial still matches ErrHandshake,
// but its message starts with what failed — the proxy, TCP, TLS — rather
// than "yamux: handshake failed" for a handshake that never started.
func TestDialErrorNamesTheFailedHop(t *testing.T) {
	pki := trusttest.NewPKI(t)
	ln, err := Listen("127.0.0.1:0", pki.ServerConfig(t, "localhost"), Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	good := pki.ClientConfig(t, wire.NewRunnerId(), "localhost")
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := free.Addr().String()
	free.Close()

	// A proxy that answers every CONNECT with a fixed status.
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pl.Close()
	go func() {
		for {
			c, err := pl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
					fmt.Fprint(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
				}
			}()
		}
	}()
	via503, _ := proxy.Fixed("http://"+pl.Addr().String(), "")
	viaDead, _ := proxy.Fixed("http://"+dead, "")

	for _, c := range []struct {
		name, addr, prefix string
		d                  Dialer
	}{
		{"tcp refused", dead, "tcp: dial tcp " + dead, Dialer{TLS: good}},
		{"proxy 503", ln.Addr().String(), "proxy " + pl.Addr().String() + " could not reach " + ln.Addr().String(), Dialer{TLS: good, DialContext: via503.DialContext}},
		{"proxy down", ln.Addr().String(), "proxy " + dead + ": ", Dialer{TLS: good, DialContext: viaDead.DialContext}},
		{"tls untrusted server", ln.Addr().String(), "tls: handshake: ", Dialer{TLS: trusttest.NewPKI(t).ClientConfig(t, wire.NewRunnerId(), "localhost")}},
		{"client certificate refused", ln.Addr().String(), "tls: server acceptance of the client certificate: ", Dialer{TLS: pki.ExpiredClientConfig(t, wire.NewRunnerId(), "localhost")}},
	} {
		_, err := c.d.Dial(ctxT(t), c.addr)
		if !errors.Is(err, ErrHandshake) {
			t.Fatalf("%s: %v does not match ErrHandshake", c.name, err)
		}
		if !strings.HasPrefix(err.Error(), c.prefix) || strings.Contains(err.Error(), "handshake failed") {
			t.Errorf("%s: message\n got %q\nwant prefix %q (and no \"handshake failed\")", c.name, err, c.prefix)
		}
		if c.d.DialContext != nil && !proxy.Failed(err) {
			t.Errorf("%s: proxy.Failed(%v) = false", c.name, err)
		}
		if errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}
