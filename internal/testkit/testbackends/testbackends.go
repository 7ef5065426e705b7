// Package testbackends gives tests and benchmarks outside backends/ one way
// to get a connected pair of real backend connections on loopback (QUIC,
// TLS+yamux, WebTransport) or in memory, with a throwaway mTLS PKI, so a
// data-plane test can run the same body on every backend.
package testbackends

import (
	"context"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/webtransport"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// Network lists the real network backends, in the order tests run them.
var Network = []string{"quic", "yamux", "webtransport"}

// All is "memory" followed by Network.
var All = append([]string{"memory"}, Network...)

const serverName = "daemon.test"

// Pair returns a connected (client, server) pair of backend connections of
// the named backend ("memory", "quic", "yamux", "webtransport") over
// loopback with mTLS. Both are closed, and the listener too, when tb ends.
// opts applies to the memory backend only.
func Pair(tb testing.TB, name string, opts memory.Options) (client, server semantics.BackendConn) {
	tb.Helper()
	if name == "memory" {
		c, s := memory.Pipe(opts)
		tb.Cleanup(func() {
			_ = c.CloseWithCode(wire.CloseNormal, "")
			_ = s.CloseWithCode(wire.CloseNormal, "")
		})
		return c, s
	}
	pki := trusttest.NewPKI(tb)
	srvTLS := pki.ServerConfig(tb, serverName)
	cliTLS := pki.ClientConfig(tb, wire.NewRunnerId(), serverName)
	var (
		ln   semantics.BackendListener
		addr string
		d    semantics.BackendDialer
	)
	// opened takes a backend's listener (or its error) and dialer.
	opened := func(l semantics.BackendListener, err error, dialer semantics.BackendDialer) {
		if err != nil {
			tb.Fatal(err)
		}
		ln, addr, d = l, l.Addr().String(), dialer
	}
	switch name {
	case "quic":
		cfg := quic.Config{HandshakeTimeout: 5 * time.Second}
		l, err := quic.Listen("127.0.0.1:0", srvTLS, cfg)
		opened(l, err, quic.Dialer{TLS: cliTLS, Config: cfg})
	case "yamux":
		l, err := yamux.Listen("127.0.0.1:0", srvTLS, yamux.Config{})
		opened(l, err, yamux.Dialer{TLS: cliTLS})
	case "webtransport":
		cfg := webtransport.Config{HandshakeTimeout: 5 * time.Second}
		l, err := webtransport.Listen("127.0.0.1:0", srvTLS, cfg)
		opened(l, err, webtransport.Dialer{TLS: cliTLS, Config: cfg})
	default:
		tb.Fatalf("testbackends: unknown backend %q", name)
	}
	tb.Cleanup(func() { _ = ln.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type res struct {
		c   semantics.BackendConn
		err error
	}
	acc := make(chan res, 1)
	go func() {
		c, err := ln.Accept(ctx)
		acc <- res{c, err}
	}()
	c, err := d.Dial(ctx, addr)
	if err != nil {
		cancel()
		<-acc
		tb.Fatalf("%s dial: %v", name, err)
	}
	r := <-acc
	if r.err != nil {
		_ = c.CloseWithCode(wire.CloseNormal, "")
		tb.Fatalf("%s accept: %v", name, r.err)
	}
	tb.Cleanup(func() {
		_ = c.CloseWithCode(wire.CloseNormal, "")
		_ = r.c.CloseWithCode(wire.CloseNormal, "")
	})
	return c, r.c
}

// Conns is Pair wrapped in semantics.Conns with default configuration.
func Conns(tb testing.TB, name string, opts memory.Options) (client, server *semantics.Conn) {
	tb.Helper()
	bc, bs := Pair(tb, name, opts)
	var err error
	if client, err = semantics.NewConn(bc, semantics.Config{}); err != nil {
		tb.Fatal(err)
	}
	if server, err = semantics.NewConn(bs, semantics.Config{}); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = client.CloseWithCode(wire.CloseNormal, "")
		_ = server.CloseWithCode(wire.CloseNormal, "")
	})
	return client, server
}
