package daemon_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
)

// lateListener hands out one connection late: its first Accept returns
// only after Serve's context has ended (Shutdown cancels it) and a little
// more time, like a real listener whose handshake completes just as the
// daemon shuts down (Shutdown closes its listeners only at its end, and an
// Accept with a connection ready may return it although ctx is done).
// Later Accepts wait for ctx or Close.
type lateListener struct {
	waiting   chan struct{} // closed when the first Accept has started
	server    *memory.Conn  // nil once handed out
	mu        sync.Mutex
	closed    chan struct{}
	closeOnce sync.Once
}

func (l *lateListener) Accept(ctx context.Context) (semantics.BackendConn, error) {
	l.mu.Lock()
	c := l.server
	l.server = nil
	l.mu.Unlock()
	if c == nil {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-l.closed:
			return nil, errors.New("listener closed")
		}
	}
	close(l.waiting)
	<-ctx.Done()
	// No synchronisation with Shutdown here, only time: Shutdown is by
	// then waiting for (or done waiting for) the daemon's goroutines.
	time.Sleep(20 * time.Millisecond)
	return c, nil
}

func (l *lateListener) Addr() net.Addr { return memory.Addr{Name: "late"} }

func (l *lateListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	return nil
}

// TestServeShutdownLateAccept: a connection accepted while Shutdown is under
// way is not started on the daemon's wait group after Shutdown's Wait (a
// WaitGroup Add from zero concurrent with Wait: -race reports it, and
// without -race it can panic with "WaitGroup is reused before previous Wait
// has returned" or leave a connection goroutine running after Shutdown
// returned); Serve closes it with CloseShutdown before it returns nil.
func TestServeShutdownLateAccept(t *testing.T) {
	auth, err := authority.OpenSQLite(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer auth.Close()
	// A few rounds: the race needs Shutdown's Wait to find a background
	// goroutine still running, which is nearly always but not always so.
	for range 5 {
		d, err := daemon.New(daemon.Config{Authority: auth})
		if err != nil {
			t.Fatal(err)
		}
		client, server := memory.Pipe(memory.Options{})
		l := &lateListener{waiting: make(chan struct{}), server: server, closed: make(chan struct{})}
		served := make(chan error, 1)
		go func() { served <- d.Serve(context.Background(), l) }()
		<-l.waiting
		if err := d.Shutdown(context.Background()); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if err := <-served; err != nil {
			t.Fatalf("Serve after Shutdown: %v, want nil", err)
		}
		select {
		case <-client.Context().Done():
		default:
			t.Fatal("Serve returned with the connection it accepted during Shutdown still open")
		}
		var ce *semantics.ConnError
		if cause := context.Cause(client.Context()); !errors.As(cause, &ce) || ce.Code != wire.CloseShutdown {
			t.Fatalf("late connection closed with %v, want CloseShutdown", cause)
		}
		_ = client.CloseWithCode(0, "")
	}
}
