package cas_test

import (
	"context"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

const serverName = "daemon.forgeyard.test"

// newQUICLink dials a QUIC loopback connection and serves CAS on it.
func newQUICLink(t testing.TB, srv *cas.Server) *link {
	t.Helper()
	pki := trusttest.NewPKI(t)
	cfg := quic.Config{HandshakeTimeout: 5 * time.Second}
	ln, err := quic.Listen("127.0.0.1:0", pki.ServerConfig(t, serverName), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
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
	bc, err := quic.Dialer{TLS: pki.ClientConfig(t, wire.NewRunnerId(), serverName), Config: cfg}.Dial(ctx, ln.Addr().String())
	if err != nil {
		cancel()
		<-acc
		t.Fatal(err)
	}
	r := <-acc
	if r.err != nil {
		_ = bc.CloseWithCode(wire.CloseNormal, "")
		t.Fatal(r.err)
	}
	return newLink(t, srv, bc, r.c)
}

func TestQUICLoopback(t *testing.T) {
	ctx := ctxT(t)
	lease := wire.NewLeaseId()
	local, remote, back := newStore(t, 0), newStore(t, 0), newStore(t, 0)
	a := newAuth()
	var refs []wire.CasObjectRef
	var objs []object
	for i, n := range []int{0, 70 << 10, 3 << 20} {
		o := newObject(n, uint64(500+i))
		put(t, local, o)
		a.allow(lease, cas.AccessRead|cas.AccessWrite, o)
		objs = append(objs, o)
		refs = append(refs, o.ref)
	}
	forbidden := newObject(1000, 600)
	put(t, local, forbidden)
	srv := newServer(t, remote, a, nil)
	l := newQUICLink(t, srv)
	up := newUploader(t, local, nil)
	if err := up.UploadAll(ctx, l.agent, srv, lease, refs); err != nil {
		t.Fatal(err)
	}
	dl := newDownloader(t, back)
	if err := dl.FetchAll(ctx, l.agent, lease, refs); err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		wantContent(t, remote, o)
		wantContent(t, back, o)
	}
	wantOutcome(t, up.Upload(ctx, l.agent, lease, forbidden.ref), 2 /* Forbidden */)
}
