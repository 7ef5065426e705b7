package cas_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/wire"
)

const testTimeout = 20 * time.Second

// object is test content with its reference.
type object struct {
	data []byte
	ref  wire.CasObjectRef
}

func newObject(size int, seed uint64) object {
	data := make([]byte, size)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= size; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			data[i+j] = byte(v >> (8 * j))
		}
	}
	for i := size &^ 7; i < size; i++ {
		data[i] = byte(r.Uint32())
	}
	return object{data: data, ref: refOf(data)}
}

func refOf(data []byte) wire.CasObjectRef {
	return wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(data), Size: uint64(len(data))}
}

func newStore(t testing.TB, maxSize uint64) *cas.FSStore {
	t.Helper()
	s, err := cas.NewFSStore(cas.FSStoreConfig{Dir: t.TempDir(), MaxObjectSize: maxSize})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// put stores o in s directly.
func put(t testing.TB, s cas.ContentStore, o object) {
	t.Helper()
	p, err := s.Create(o.ref)
	if err != nil {
		t.Fatal(err)
	}
	for off := 0; off < len(o.data); off += 1 << 20 {
		if err := p.Append(o.data[off:min(len(o.data), off+1<<20)]); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
}

// content reads a complete object from s (nil when absent).
func content(t testing.TB, s cas.ContentStore, ref wire.CasObjectRef) []byte {
	t.Helper()
	r, err := s.Open(ref, 0)
	if err != nil {
		return nil
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func wantContent(t testing.TB, s cas.ContentStore, o object) {
	t.Helper()
	got := content(t, s, o.ref)
	if got == nil || !bytes.Equal(got, o.data) {
		t.Fatalf("store content of %d-byte object: got %d bytes, equal=%v", len(o.data), len(got), bytes.Equal(got, o.data))
	}
}

// auth is a lease → object → access table.
type auth struct {
	mu   sync.Mutex
	m    map[wire.LeaseId]map[wire.CasObjectRef]cas.Access
	down int // the next down calls fail transiently
}

func newAuth() *auth { return &auth{m: map[wire.LeaseId]map[wire.CasObjectRef]cas.Access{}} }

func (a *auth) allow(lease wire.LeaseId, acc cas.Access, objs ...object) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.m[lease] == nil {
		a.m[lease] = map[wire.CasObjectRef]cas.Access{}
	}
	for _, o := range objs {
		a.m[lease][o.ref] |= acc
	}
}

func (a *auth) Authorize(_ context.Context, lease wire.LeaseId, ref wire.CasObjectRef, acc cas.Access) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down > 0 {
		a.down--
		return errAuthorityDown
	}
	if a.m[lease][ref]&acc == 0 {
		return cas.ErrForbidden
	}
	return nil
}

// errAuthorityDown is the transient error of an auth made unavailable by
// failNext.
var errAuthorityDown = errors.New("authority: context deadline exceeded")

// failNext makes the next n Authorize calls fail transiently.
func (a *auth) failNext(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.down = n
}

// link is one agent↔daemon connection with the daemon serving CAS streams
// through a Session, echoing heartbeat- and control-stream frames and
// discarding diagnostic streams.
type link struct {
	agent, daemon *semantics.Conn
	wg            sync.WaitGroup
	errs          chan error
	once          sync.Once
}

func newMemLink(t testing.TB, srv *cas.Server, opts memory.Options) *link {
	t.Helper()
	bc, bs := memory.Pipe(opts)
	return newLink(t, srv, bc, bs)
}

func newLink(t testing.TB, srv *cas.Server, bc, bs semantics.BackendConn) *link {
	t.Helper()
	a, err := semantics.NewConn(bc, semantics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	d, err := semantics.NewConn(bs, semantics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l := &link{agent: a, daemon: d, errs: make(chan error, 1024)}
	sess := srv.NewSession()
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for {
			st, err := d.AcceptStream(context.Background())
			if err != nil {
				return
			}
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				switch st.Kind() {
				case wire.StreamHeartbeat, wire.StreamControl:
					echo(st)
					return
				case wire.StreamDiagnostic: // raw throughput sink
					_, _ = io.Copy(io.Discard, &st.RecvStream)
					_ = st.SendStream.Close()
					return
				}
				if err := sess.Handle(d.Context(), st); err != nil {
					select {
					case l.errs <- err:
					default:
					}
				}
			}()
		}
	}()
	t.Cleanup(l.close)
	return l
}

// close closes both ends and waits for every daemon handler to return.
func (l *link) close() {
	l.once.Do(func() {
		_ = l.agent.CloseWithCode(wire.CloseNormal, "")
		_ = l.daemon.CloseWithCode(wire.CloseNormal, "")
		l.wg.Wait()
	})
}

func echo(st *semantics.Stream) {
	for {
		f, err := st.ReadFrame()
		if err != nil {
			st.CancelWrite(semantics.StreamCancelled)
			return
		}
		if st.WriteFrame(func(p []byte) []byte { return append(p, f...) }) != nil {
			st.CancelRead(semantics.StreamCancelled)
			return
		}
	}
}

func newServer(t testing.TB, store cas.ContentStore, a cas.Authorizer, mod func(*cas.ServerConfig)) *cas.Server {
	t.Helper()
	cfg := cas.ServerConfig{Store: store, Authorizer: a, HeaderTimeout: 5 * time.Second, IdleTimeout: 10 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	s, err := cas.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newUploader(t testing.TB, src cas.Source, mod func(*cas.UploaderConfig)) *cas.Uploader {
	t.Helper()
	cfg := cas.UploaderConfig{Source: src, AckTimeout: 10 * time.Second, IdleTimeout: 10 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	u, err := cas.NewUploader(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func newDownloader(t testing.TB, store cas.ContentStore) *cas.Downloader {
	t.Helper()
	d, err := cas.NewDownloader(cas.DownloaderConfig{Store: store, HeaderTimeout: 5 * time.Second, IdleTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}
