package rawbench

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// TestHoldN: DialN returns once the server echoed every connection's byte,
// and the connections stay up; a client without a certificate is refused.
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

// TestStreamPair: bytes written on the client stream arrive in order on the
// server stream, and back.
func TestStreamPair(t *testing.T) {
	pki := trusttest.NewPKI(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := StreamPair(ctx, pki.ServerConfig(t, "localhost"), pki.ClientConfig(t, wire.NewRunnerId(), "localhost"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	want := make([]byte, 1<<20)
	for i := range want {
		want[i] = byte(i * 7)
	}
	go func() { _, _ = p.Client.Write(want) }()
	got := make([]byte, len(want))
	if _, err := io.ReadFull(p.Server, got); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("server read %v, equal=%v", err, bytes.Equal(got, want))
	}
	if _, err := p.Server.Write([]byte("ok")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(p.Client, got[:2]); err != nil || string(got[:2]) != "ok" {
		t.Fatalf("client read %q, %v", got[:2], err)
	}
}
