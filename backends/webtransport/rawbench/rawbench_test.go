package rawbench

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// TestHoldN: DialN returns once the server echoed every session's byte,
// and the sessions stay up; a client without a certificate is refused.
func TestHoldN(t *testing.T) {
	pki := trusttest.NewPKI(t)
	s, err := Listen("127.0.0.1:0", pki.ServerConfig(t, "localhost"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	c, err := DialN(ctx, s.Addr().String(), 8, 4, 2, func(int) *tls.Config { return pki.ClientConfig(t, wire.NewRunnerId(), "localhost") })
	if err != nil {
		t.Fatal(err)
	}
	if c.Len() != 8 || s.Held() > 8 {
		t.Errorf("client holds %d, server %d; want 8", c.Len(), s.Held())
	}
	c.Close()
	if _, err := DialN(ctx, s.Addr().String(), 1, 1, 1, func(int) *tls.Config { return pki.NoClientCertConfig(t, "localhost") }); err == nil {
		t.Error("a client without a certificate was held")
	}
	cancel()
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}
