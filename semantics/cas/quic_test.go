package cas_test

import (
	"testing"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/internal/testkit/testbackends"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/wire"
)

// newQUICLink dials a QUIC loopback connection and serves CAS on it.
func newQUICLink(t testing.TB, srv *cas.Server) *link {
	t.Helper()
	bc, bs := testbackends.Pair(t, "quic", memory.Options{})
	return newLink(t, srv, bc, bs)
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
