package backendtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

func runRaw(t *testing.T, f Factory) {
	t.Run("BidiBothWays", func(t *testing.T) {
		e := newEnv(t, f)
		c, s := e.pair(t)
		rawBidiRoundTrip(t, c, s, "client→server")
		rawBidiRoundTrip(t, s, c, "server→client")
	})
	t.Run("UniBothWays", func(t *testing.T) {
		e := newEnv(t, f)
		c, s := e.pair(t)
		rawUni(t, c, s, []byte("log line from client"))
		rawUni(t, s, c, []byte("object from server"))
	})
	t.Run("ConcurrentStreams", func(t *testing.T) {
		e := newEnv(t, f)
		c, s := e.pair(t)
		n := 200
		if testing.Short() {
			n = 50
		}
		rawConcurrentEcho(t, c, s, n)
	})
	t.Run("LargeTransfer", func(t *testing.T) {
		e := newEnv(t, f)
		c, s := e.pair(t)
		rawLarge(t, c, s, largeSize(f))
	})
	t.Run("HalfClose", func(t *testing.T) {
		e := newEnv(t, f)
		c, s := e.pair(t)
		rawHalfClose(t, c, s)
	})
	t.Run("ResetCodes", func(t *testing.T) {
		e := newEnv(t, f)
		c, s := e.pair(t)
		rawResets(t, c, s, 42, 43)
		rawResets(t, s, c, semantics.StreamForbidden, 0x3fff_ffff)
	})
	t.Run("CloseCodes", func(t *testing.T) {
		e := newEnv(t, f)
		for _, code := range []semantics.CloseCode{wire.CloseNormal, wire.CloseSessionFenced, wire.CloseRunnerDisabled, 4000} {
			c, s := e.pair(t)
			rawCloseCode(t, c, s, code, fmt.Sprintf("client closes with %s", code))
			c, s = e.pair(t)
			rawCloseCode(t, s, c, code, fmt.Sprintf("server closes with %s", code))
		}
	})
	t.Run("Deadlines", func(t *testing.T) {
		e := newEnv(t, f)
		c, s := e.pair(t)
		rawDeadlines(t, c, s)
	})
	t.Run("CloseUnblocks", func(t *testing.T) {
		opts := []goleak.Option{goleak.IgnoreCurrent()}
		t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
		e := newEnv(t, f)
		c, s := e.pair(t)
		rawCloseUnblocks(t, c, s)
	})
	t.Run("PeerCertificates", func(t *testing.T) {
		e := newEnv(t, f)
		runner := wire.NewRunnerId()
		c, s := e.pairWith(t, e.clientTLS(t, runner))
		checkPeerCerts(t, c.ConnectionState(), s.ConnectionState(), runner)
		if c.Backend() == "" || c.Backend() != s.Backend() {
			t.Fatalf("Backend() = %q / %q, want the same non-empty name", c.Backend(), s.Backend())
		}
		if c.LocalAddr() == nil || c.RemoteAddr() == nil || s.LocalAddr() == nil || s.RemoteAddr() == nil {
			t.Fatal("LocalAddr/RemoteAddr must not be nil")
		}
	})
}

// rawBidiRoundTrip opens a bidi stream on a, sends a request, and checks the
// response that b sends back after reading the request to EOF.
func rawBidiRoundTrip(t *testing.T, a, b semantics.BackendConn, what string) {
	t.Helper()
	ctx := testCtx(t)
	st, err := a.OpenStream(ctx)
	if err != nil {
		t.Fatalf("%s: OpenStream: %v", what, err)
	}
	req := []byte("request " + what)
	if _, err := st.Write(req); err != nil {
		t.Fatalf("%s: Write: %v", what, err)
	}
	if err := st.Close(); err != nil {
		t.Fatalf("%s: Close: %v", what, err)
	}
	peer, err := b.AcceptStream(ctx)
	if err != nil {
		t.Fatalf("%s: AcceptStream: %v", what, err)
	}
	got, err := io.ReadAll(peer)
	if err != nil || !bytes.Equal(got, req) {
		t.Fatalf("%s: peer read %q, %v; want %q", what, got, err, req)
	}
	resp := []byte("response " + what)
	if _, err := peer.Write(resp); err != nil {
		t.Fatalf("%s: peer Write: %v", what, err)
	}
	if err := peer.Close(); err != nil {
		t.Fatalf("%s: peer Close: %v", what, err)
	}
	got, err = io.ReadAll(st)
	if err != nil || !bytes.Equal(got, resp) {
		t.Fatalf("%s: read %q, %v; want %q", what, got, err, resp)
	}
}

func rawUni(t *testing.T, a, b semantics.BackendConn, payload []byte) {
	t.Helper()
	ctx := testCtx(t)
	st, err := a.OpenUniStream(ctx)
	if err != nil {
		t.Fatalf("OpenUniStream: %v", err)
	}
	if _, err := st.Write(payload); err != nil {
		t.Fatalf("Write: %v", err)
	}
	if err := st.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	rs, err := b.AcceptUniStream(ctx)
	if err != nil {
		t.Fatalf("AcceptUniStream: %v", err)
	}
	got, err := io.ReadAll(rs)
	if err != nil || !bytes.Equal(got, payload) {
		t.Fatalf("uni read %q, %v; want %q", got, err, payload)
	}
}

// payload returns n deterministic pseudo-random bytes for seed.
func payload(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := 0; j < 8; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// rawConcurrentEcho runs n bidi streams at once; b echoes each; a checks
// every byte.
func rawConcurrentEcho(t *testing.T, a, b semantics.BackendConn, n int) {
	t.Helper()
	ctx := testCtx(t)
	errs := make(chan error, 2*n+1)
	var wg sync.WaitGroup
	wg.Go(func() { // echo server
		var inner sync.WaitGroup
		defer inner.Wait()
		for i := 0; i < n; i++ {
			st, err := b.AcceptStream(ctx)
			if err != nil {
				errs <- fmt.Errorf("AcceptStream %d: %w", i, err)
				return
			}
			inner.Go(func() {
				data, err := io.ReadAll(st)
				if err != nil {
					errs <- fmt.Errorf("echo read: %w", err)
					st.CancelWrite(semantics.StreamInternalError)
					return
				}
				if _, err := st.Write(data); err != nil {
					errs <- fmt.Errorf("echo write: %w", err)
					return
				}
				if err := st.Close(); err != nil {
					errs <- fmt.Errorf("echo close: %w", err)
				}
			})
		}
	})
	for i := 0; i < n; i++ {
		wg.Go(func() {
			want := payload(uint64(i), 1024+(i*977)%(32<<10))
			st, err := a.OpenStream(ctx)
			if err != nil {
				errs <- fmt.Errorf("OpenStream %d: %w", i, err)
				return
			}
			done := make(chan []byte, 1)
			go func() { // read concurrently so large echoes cannot deadlock
				got, err := io.ReadAll(st)
				if err != nil {
					errs <- fmt.Errorf("stream %d read: %w", i, err)
				}
				done <- got
			}()
			if _, err := st.Write(want); err != nil {
				errs <- fmt.Errorf("stream %d write: %w", i, err)
			}
			if err := st.Close(); err != nil {
				errs <- fmt.Errorf("stream %d close: %w", i, err)
			}
			if got := <-done; !bytes.Equal(got, want) {
				errs <- fmt.Errorf("stream %d: echo of %d bytes differs (got %d bytes)", i, len(want), len(got))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// rawLarge sends size bytes on a uni stream from a to b and compares hashes.
func rawLarge(t *testing.T, a, b semantics.BackendConn, size int) {
	t.Helper()
	ctx := testCtx(t)
	got := receiveHashed(ctx, b.AcceptUniStream)
	st, err := a.OpenUniStream(ctx)
	if err != nil {
		t.Fatalf("OpenUniStream: %v", err)
	}
	start := time.Now()
	want := sendHashed(t, st, size, 7, 0)
	r := <-got
	if r.err != nil {
		t.Fatalf("receiver: %v", r.err)
	}
	if r.n != int64(size) || r.sum != want {
		t.Fatalf("received %d bytes (hash match %v), want %d", r.n, r.sum == want, size)
	}
	el := time.Since(start)
	t.Logf("%d MiB in %v (%.0f MB/s)", size>>20, el.Round(time.Millisecond), float64(size)/el.Seconds()/1e6)
}

// rawOpen opens a raw bidi stream on a, writes hello on it (which makes it
// visible to the peer) and accepts it on b, where hello is left to read;
// any failure fails t.
func rawOpen(t testing.TB, ctx context.Context, a, b semantics.BackendConn, hello []byte) (st, peer semantics.RawStream) {
	t.Helper()
	st = rawWrite(t, ctx, a.OpenStream, hello)
	peer, err := b.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st, peer
}

// rawOpenUni is rawOpen for a uni stream.
func rawOpenUni(t testing.TB, ctx context.Context, a, b semantics.BackendConn, hello []byte) (semantics.RawSendStream, semantics.RawRecvStream) {
	t.Helper()
	st := rawWrite(t, ctx, a.OpenUniStream, hello)
	rs, err := b.AcceptUniStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st, rs
}

// rawWrite opens a raw stream with open (a BackendConn's OpenStream or
// OpenUniStream) and writes p on it; any failure fails t.
func rawWrite[S io.Writer](t testing.TB, ctx context.Context, open func(context.Context) (S, error), p []byte) S {
	t.Helper()
	st, err := open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write(p); err != nil {
		t.Fatal(err)
	}
	return st
}

// writeUntilBlocked writes n chunks of size bytes to w, whose peer does not
// read, and returns the error that ended the writes (the test closes the
// connection under the blocked writer); writing them all is an error.
func writeUntilBlocked(w io.Writer, size, n int) error {
	chunk := make([]byte, size)
	for i := 0; i < n; i++ {
		if _, err := w.Write(chunk); err != nil {
			return err
		}
	}
	return errors.New("256 MiB written without flow control blocking")
}

// hashed is what the receiver of a large transfer got: the SHA-256 of the
// bytes, how many, and the error that ended the stream (nil at EOF).
type hashed struct {
	sum [32]byte
	n   int64
	err error
}

// receiveHashed accepts a stream with accept and hashes all it delivers,
// in a goroutine; the result arrives on the channel. rawLarge and
// connLarge share it (over a semantics.BackendConn and a semantics.Conn).
func receiveHashed[R io.Reader](ctx context.Context, accept func(context.Context) (R, error)) <-chan hashed {
	got := make(chan hashed, 1)
	go func() {
		rs, err := accept(ctx)
		if err != nil {
			got <- hashed{err: err}
			return
		}
		h := sha256.New()
		n, err := io.Copy(h, rs)
		r := hashed{n: n, err: err}
		copy(r.sum[:], h.Sum(nil))
		got <- r
	}()
	return got
}

// sendHashed writes size bytes to w in 64 KiB chunks of payload(seed),
// byte mark of each chunk varied so that the chunks differ, closes w and
// returns the SHA-256 of what it wrote.
func sendHashed(t *testing.T, w io.WriteCloser, size int, seed uint64, mark int) [32]byte {
	t.Helper()
	h := sha256.New()
	chunk := payload(seed, 64<<10)
	for sent := 0; sent < size; {
		n := min(len(chunk), size-sent)
		chunk[mark] = byte(sent >> 16)
		h.Write(chunk[:n])
		if _, err := w.Write(chunk[:n]); err != nil {
			t.Fatalf("Write at %d: %v", sent, err)
		}
		sent += n
	}
	if err := w.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// rawHalfClose: a sends FIN after its request; b keeps sending afterwards
// and a still receives everything.
func rawHalfClose(t *testing.T, a, b semantics.BackendConn) {
	t.Helper()
	ctx := testCtx(t)
	st, err := a.OpenStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte("req")); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	peer, err := b.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(peer); err != nil || string(got) != "req" {
		t.Fatalf("peer read %q, %v", got, err)
	}
	// The peer's read side is finished; its write side still flows, in
	// several writes after the FIN arrived.
	want := payload(11, 256<<10)
	go func() {
		for off := 0; off < len(want); off += 8 << 10 {
			if _, err := peer.Write(want[off : off+8<<10]); err != nil {
				return
			}
		}
		_ = peer.Close()
	}()
	got, err := io.ReadAll(st)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after half-close read %d bytes, %v; want %d bytes", len(got), err, len(want))
	}
}

// rawResets checks CancelWrite and CancelRead codes as seen by the peer and
// locally.
func rawResets(t *testing.T, a, b semantics.BackendConn, wcode, rcode semantics.StreamErrorCode) {
	t.Helper()
	ctx := testCtx(t)

	// CancelWrite → peer Read gets *StreamError{wcode, Remote: true}.
	st, peer := rawOpen(t, ctx, a, b, []byte("x"))
	st.CancelWrite(wcode)
	_, err := st.Write([]byte("y"))
	wantStreamError(t, "Write after own CancelWrite", err, wcode, false)
	_ = peer.SetReadDeadline(time.Now().Add(opTimeout))
	buf := make([]byte, 16)
	for i := 0; ; i++ {
		if _, err = peer.Read(buf); err != nil || i > 16 {
			break
		}
	}
	wantStreamError(t, "peer Read after CancelWrite", err, wcode, true)

	// CancelRead → peer Write gets *StreamError{rcode, Remote: true}.
	st2, peer2 := rawOpen(t, ctx, a, b, []byte("x"))
	peer2.CancelRead(rcode)
	_, err = peer2.Read(buf)
	wantStreamError(t, "Read after own CancelRead", err, rcode, false)
	_ = st2.SetWriteDeadline(time.Now().Add(opTimeout))
	chunk := make([]byte, 4096)
	for i := 0; i < 1<<16; i++ { // bounded: at most 256 MiB
		if _, err = st2.Write(chunk); err != nil {
			break
		}
	}
	wantStreamError(t, "Write after peer CancelRead", err, rcode, true)

	// Uni stream reset.
	us, rs := rawOpenUni(t, ctx, a, b, []byte("x"))
	us.CancelWrite(wcode)
	_ = rs.SetReadDeadline(time.Now().Add(opTimeout))
	for i := 0; ; i++ {
		if _, err = rs.Read(buf); err != nil || i > 16 {
			break
		}
	}
	wantStreamError(t, "uni peer Read after CancelWrite", err, wcode, true)
}

// rawCloseCode closes `closer` with code and checks both sides' errors.
func rawCloseCode(t *testing.T, closer, peer semantics.BackendConn, code semantics.CloseCode, reason string) {
	t.Helper()
	ctx := testCtx(t)
	acceptErr := make(chan error, 1)
	go func() {
		_, err := peer.AcceptStream(ctx)
		acceptErr <- err
	}()
	if err := closer.CloseWithCode(code, reason); err != nil {
		t.Fatalf("CloseWithCode(%s): %v", code, err)
	}
	if err := closer.CloseWithCode(wire.CloseInternalError, "second close"); err != nil {
		t.Fatalf("second CloseWithCode must be a no-op, got %v", err)
	}
	waitDone(t, "peer Context after close", peer.Context().Done())
	cause := context.Cause(peer.Context())
	wantConnError(t, "peer context cause", cause, code, true)
	var ce *semantics.ConnError
	errors.As(cause, &ce)
	if ce.Reason != reason {
		t.Fatalf("peer saw reason %q, want %q", ce.Reason, reason)
	}
	if !errors.Is(cause, netErrClosed) {
		t.Fatalf("ConnError must unwrap to net.ErrClosed")
	}
	select {
	case err := <-acceptErr:
		wantConnError(t, "peer AcceptStream after close", err, code, true)
	case <-time.After(opTimeout):
		t.Fatal("peer AcceptStream still blocked after close")
	}
	waitDone(t, "closer Context", closer.Context().Done())
	wantConnError(t, "closer context cause", context.Cause(closer.Context()), code, false)
	_, err := closer.OpenStream(ctx)
	wantConnError(t, "closer OpenStream after close", err, code, false)
	_, err = peer.OpenUniStream(ctx)
	wantConnError(t, "peer OpenUniStream after close", err, code, true)
}

func rawDeadlines(t *testing.T, a, b semantics.BackendConn) {
	t.Helper()
	ctx := testCtx(t)
	st, peer := rawOpen(t, ctx, a, b, []byte("hello"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(peer, buf); err != nil {
		t.Fatal(err)
	}

	// Read deadline.
	_ = st.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	start := time.Now()
	_, err := st.Read(buf)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	if el := time.Since(start); el > opTimeout/2 {
		t.Fatalf("read deadline fired after %v", el)
	}
	// A deadline in the past fails at once.
	_ = st.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err = st.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read with past deadline: %v", err)
	}
	// Extending works and the stream is still usable.
	_ = st.SetReadDeadline(time.Now().Add(opTimeout))
	if _, err := peer.Write([]byte("world")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(st, buf); err != nil || string(buf) != "world" {
		t.Fatalf("Read after extending deadline: %q, %v", buf, err)
	}
	_ = st.SetReadDeadline(time.Time{})

	// Write deadline: peer does not read, so flow control blocks the writer.
	_ = st.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	chunk := make([]byte, 16<<10)
	written := 0
	for i := 0; i < 1<<14; i++ { // bounded: at most 256 MiB
		n, err2 := st.Write(chunk)
		written += n
		if err2 != nil {
			err = err2
			break
		}
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write past deadline after %d bytes: %v, want os.ErrDeadlineExceeded", written, err)
	}
	// Drain on the peer, extend, and write again.
	drained := make(chan int64, 1)
	go func() {
		n, _ := io.CopyN(io.Discard, peer, int64(written)+int64(len(chunk)))
		drained <- n
	}()
	_ = st.SetWriteDeadline(time.Now().Add(opTimeout))
	if _, err := st.Write(chunk); err != nil {
		t.Fatalf("Write after extending deadline: %v", err)
	}
	select {
	case n := <-drained:
		if n != int64(written+len(chunk)) {
			t.Fatalf("peer drained %d bytes, want %d", n, written+len(chunk))
		}
	case <-time.After(opTimeout):
		t.Fatal("peer did not receive the data written after the deadline was extended")
	}
}

// rawCloseUnblocks blocks calls in Read, Write and Accept on both sides and
// checks that closing releases them all with the close code.
func rawCloseUnblocks(t *testing.T, c, s semantics.BackendConn) {
	t.Helper()
	ctx := testCtx(t)
	calls := newBlockedCalls()
	// Accepts on both sides.
	calls.closer(func() error { _, err := c.AcceptStream(ctx); return err })
	calls.closer(func() error { _, err := c.AcceptUniStream(ctx); return err })
	calls.peer(func() error { _, err := s.AcceptUniStream(ctx); return err })
	// A stream blocked in Read (client side) and in Read on the server side.
	st, peer := rawOpen(t, ctx, c, s, []byte("x"))
	calls.closer(func() error { _, err := io.ReadAll(st); return err })
	calls.peer(func() error {
		b := make([]byte, 1)
		if _, err := io.ReadFull(peer, b); err != nil {
			return fmt.Errorf("unexpected: %w", err)
		}
		_, err := io.ReadAll(peer)
		return err
	})
	// A stream blocked in Write: the server accepts it but never reads.
	ws, _ := rawOpen(t, ctx, c, s, []byte("w"))
	calls.closer(func() error { return writeUntilBlocked(ws, 16<<10, 1<<14) })
	// Wait until the writer is stuck: nothing else needs to be ready, since
	// every blocked call must end whatever state it is in.
	calls.closeUnblocksAll(t, c.CloseWithCode)
	_ = s.CloseWithCode(wire.CloseNormal, "")
	_ = context.Cause(ctx)
}
