package cas_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/wire"
)

// gatedSource serves o, but the first reader stops after stopAt bytes:
// it closes reached and blocks until release is closed.
type gatedSource struct {
	o       object
	stopAt  int
	reached chan struct{}
	release chan struct{}
	once    sync.Once
}

func (s *gatedSource) Open(ref wire.CasObjectRef, off uint64) (io.ReadCloser, error) {
	r := bytes.NewReader(s.o.data[off:])
	first := false
	s.once.Do(func() { first = true })
	if !first {
		return io.NopCloser(r), nil
	}
	return io.NopCloser(&gatedReader{s: s, r: r}), nil
}

type gatedReader struct {
	s *gatedSource
	r *bytes.Reader
	n int
}

func (g *gatedReader) Read(p []byte) (int, error) {
	if g.n >= g.s.stopAt {
		close(g.s.reached)
		<-g.s.release
		return 0, errors.New("source closed")
	}
	p = p[:min(len(p), g.s.stopAt-g.n)]
	n, err := g.r.Read(p)
	g.n += n
	return n, err
}

// TestCancelKeepsPrefix: cancelling an upload mid-way returns the context
// error, the daemon keeps what it received, and the next Upload resumes.
func TestCancelKeepsPrefix(t *testing.T) {
	o := newObject(2<<20, 21)
	lease := wire.NewLeaseId()
	remote := newStore(t, 0)
	a := newAuth()
	a.allow(lease, cas.AccessWrite, o)
	srv := newServer(t, remote, a, nil)
	l := newMemLink(t, srv, memory.Options{})
	src := &gatedSource{o: o, stopAt: 768 << 10, reached: make(chan struct{}), release: make(chan struct{})}
	up := newUploader(t, src, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- up.Upload(ctx, l.agent, lease, o.ref) }()
	select {
	case <-src.reached:
	case err := <-done:
		t.Fatalf("upload ended before reaching the gate: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("upload never reached the gate")
	}
	cancel()
	close(src.release)
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("cancelled upload did not return")
	}
	if !errors.Is(err, context.Canceled) {
		var se *semantics.StreamError
		if !errors.As(err, &se) {
			t.Fatalf("cancelled upload: %v", err)
		}
	}
	// The daemon handler ends on the reset; wait for it via a fresh link
	// teardown of this one.
	l.close()
	st, _ := remote.Stat(o.ref)
	if st.Complete || st.Partial == 0 || st.Partial > uint64(src.stopAt) {
		t.Fatalf("after cancel: %+v (sent %d)", st, src.stopAt)
	}
	l2 := newMemLink(t, srv, memory.Options{})
	if err := up.Upload(ctxT(t), l2.agent, lease, o.ref); err != nil {
		t.Fatal(err)
	}
	wantContent(t, remote, o)
	if up.Stats().Probes != 1 || up.Stats().SkippedPrefix != int64(st.Partial) {
		t.Fatalf("uploader %+v, prefix %d", up.Stats(), st.Partial)
	}
}

func TestHeaderTimeoutAndWrongKind(t *testing.T) {
	srv := newServer(t, newStore(t, 0), newAuth(), func(c *cas.ServerConfig) { c.HeaderTimeout = 100 * time.Millisecond })
	l := newMemLink(t, srv, memory.Options{})
	st, err := l.agent.OpenStream(ctxT(t), wire.StreamCasUpload)
	if err != nil {
		t.Fatal(err)
	}
	_ = st.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = st.ReadFrame()
	var se *semantics.StreamError
	if !errors.As(err, &se) || !se.Remote {
		t.Fatalf("silent upload stream: %v, want a remote reset", err)
	}
	st.CancelWrite(semantics.StreamCancelled)
	l.close()
	if srv.Stats().Failed != 1 {
		t.Fatalf("stats %+v", srv.Stats())
	}

	// Session.Handle given a stream of another kind resets it.
	bc, bs := memory.Pipe(memory.Options{})
	ac, _ := semantics.NewConn(bc, semantics.Config{})
	dc, _ := semantics.NewConn(bs, semantics.Config{})
	defer ac.CloseWithCode(wire.CloseNormal, "")
	defer dc.CloseWithCode(wire.CloseNormal, "")
	as, err := ac.OpenStream(ctxT(t), wire.StreamSigning)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := dc.AcceptStream(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.NewSession().Handle(ctxT(t), ds); !errors.Is(err, cas.ErrProtocol) {
		t.Fatalf("Handle of a signing stream: %v", err)
	}
	_ = as.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := as.ReadFrame(); !errors.As(err, &se) || se.Code != semantics.StreamProtocolError {
		t.Fatalf("peer of a wrong-kind stream: %v", err)
	}
	as.CancelWrite(semantics.StreamCancelled)
}
