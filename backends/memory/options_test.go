package memory_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// streamConn adapts a bidi stream to net.Conn for nettest.TestConn. Close
// ends both directions locally, as closing a socket does.
type streamConn struct {
	semantics.RawStream
	c *memory.Conn
}

func (s streamConn) Close() error {
	s.RawStream.CancelRead(semantics.StreamCancelled)
	return s.RawStream.Close()
}
func (s streamConn) LocalAddr() net.Addr  { return s.c.LocalAddr() }
func (s streamConn) RemoteAddr() net.Addr { return s.c.RemoteAddr() }

// TestNettestConn holds the memory streams to x/net/nettest's net.Conn bar
// (as Tailscale's memnet is).
func TestNettestConn(t *testing.T) {
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		a, b := memory.Pipe(memory.Options{})
		ctx := context.Background()
		s1, err := a.OpenStream(ctx)
		if err != nil {
			return nil, nil, nil, err
		}
		s2, err := b.AcceptStream(ctx)
		if err != nil {
			return nil, nil, nil, err
		}
		stop = func() {
			_ = a.CloseWithCode(wire.CloseNormal, "")
			_ = b.CloseWithCode(wire.CloseNormal, "")
		}
		return streamConn{s1, a}, streamConn{s2, b}, stop, nil
	})
}

func pipeStream(t *testing.T, opts memory.Options) (a, b *memory.Conn, sa, sb semantics.RawStream) {
	t.Helper()
	a, b = memory.Pipe(opts)
	t.Cleanup(func() {
		_ = a.CloseWithCode(wire.CloseNormal, "")
		_ = b.CloseWithCode(wire.CloseNormal, "")
	})
	ctx := context.Background()
	sa, err := a.OpenStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sb, err = b.AcceptStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return a, b, sa, sb
}

func TestLatency(t *testing.T) {
	_, _, sa, sb := pipeStream(t, memory.Options{Latency: 30 * time.Millisecond})
	start := time.Now()
	if _, err := sa.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 20*time.Millisecond {
		t.Fatal("Write waited for the latency")
	}
	buf := make([]byte, 1)
	if _, err := io.ReadFull(sb, buf); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 30*time.Millisecond {
		t.Fatalf("delivered after %v, before the 30ms latency", el)
	}
}

func TestBandwidth(t *testing.T) {
	_, _, sa, sb := pipeStream(t, memory.Options{Bandwidth: 10e6})
	go func() { _, _ = sa.Write(make([]byte, 1e6)); _ = sa.Close() }()
	start := time.Now()
	n, err := io.Copy(io.Discard, sb)
	if err != nil || n != 1e6 {
		t.Fatalf("copied %d, %v", n, err)
	}
	if el := time.Since(start); el < 90*time.Millisecond {
		t.Fatalf("1 MB at 10 MB/s took %v, want ≥ ~100ms", el)
	}
}

func wantCut(t *testing.T, what string, err error) {
	t.Helper()
	var ce *semantics.ConnError
	if !errors.As(err, &ce) || ce.Code != wire.CloseIdleTimeout || ce.Reason != memory.CutReason || ce.Remote {
		t.Fatalf("%s: %v, want the cut ConnError", what, err)
	}
}

func TestCutAfterBytes(t *testing.T) {
	a, b, sa, sb := pipeStream(t, memory.Options{CutAfterBytes: 1000})
	readErr := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, sb); readErr <- err }()
	n, err := sa.Write(make([]byte, 2000))
	if n != 1000 {
		t.Fatalf("wrote %d bytes before the cut, want 1000", n)
	}
	wantCut(t, "writer", err)
	wantCut(t, "peer read", <-readErr)
	wantCut(t, "peer context", context.Cause(b.Context()))
	wantCut(t, "own context", context.Cause(a.Context()))
}

func TestCutAfterWrites(t *testing.T) {
	_, _, sa, _ := pipeStream(t, memory.Options{CutAfterWrites: 3})
	for i := 0; i < 3; i++ {
		if _, err := sa.Write([]byte("ok")); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	_, err := sa.Write([]byte("cut"))
	wantCut(t, "fourth write", err)
}

func TestDisconnect(t *testing.T) {
	a, _, _, sb := pipeStream(t, memory.Options{})
	readErr := make(chan error, 1)
	go func() { _, err := sb.Read(make([]byte, 1)); readErr <- err }()
	a.Disconnect()
	wantCut(t, "blocked peer read", <-readErr)
}

func TestFlowControl(t *testing.T) {
	_, _, sa, sb := pipeStream(t, memory.Options{StreamWindow: 1024})
	_ = sa.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	n, err := sa.Write(make([]byte, 2048))
	if n != 1024 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write beyond the window: %d, %v; want 1024 and a deadline error", n, err)
	}
	if _, err := io.ReadFull(sb, make([]byte, 1024)); err != nil {
		t.Fatal(err)
	}
	_ = sa.SetWriteDeadline(time.Time{})
	if _, err := sa.Write(make([]byte, 1024)); err != nil {
		t.Fatalf("Write after the peer read: %v", err)
	}
}

func TestIncomingStreamLimit(t *testing.T) {
	a, b := memory.Pipe(memory.Options{MaxIncomingStreams: 1})
	defer a.CloseWithCode(0, "")
	defer b.CloseWithCode(0, "")
	ctx := context.Background()
	s1, err := a.OpenUniStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := a.OpenUniStream(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second stream over MaxIncomingStreams: %v", err)
	}
	_ = s1.Close()
	r1, err := b.AcceptUniStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(r1); err != nil {
		t.Fatal(err)
	}
	if _, err := a.OpenUniStream(ctx); err != nil {
		t.Fatalf("stream after the first finished: %v", err)
	}
}

func TestNetworkErrors(t *testing.T) {
	n := memory.NewNetwork()
	l, err := n.Listen("daemon", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Listen("daemon", nil); !errors.Is(err, memory.ErrAddrInUse) {
		t.Fatalf("second Listen: %v", err)
	}
	d := &memory.Dialer{Network: n}
	if _, err := d.Dial(context.Background(), "nobody"); !errors.Is(err, memory.ErrConnRefused) {
		t.Fatalf("Dial without a listener: %v", err)
	}
	c, err := d.Dial(context.Background(), "daemon")
	if err != nil {
		t.Fatal(err)
	}
	s, err := l.Accept(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s.RemoteAddr().String() != c.LocalAddr().String() || c.Backend() != "memory" {
		t.Fatalf("addresses %v / %v", s.RemoteAddr(), c.LocalAddr())
	}
	_ = l.Close()
	if _, err := l.Accept(context.Background()); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
	if _, err := d.Dial(context.Background(), "daemon"); !errors.Is(err, memory.ErrConnRefused) {
		t.Fatalf("Dial after listener Close: %v", err)
	}
	// The established connection is unaffected.
	if _, err := c.OpenStream(context.Background()); err != nil {
		t.Fatal(err)
	}
	_ = c.CloseWithCode(0, "")
	_ = s.CloseWithCode(0, "")
}
