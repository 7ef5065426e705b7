package agent_test

import (
	"context"
	"sync"
	"sync/atomic"

	"forgeyard.dev/transport/semantics"
)

// darkDialer is a path for a backend without a network to black-hole (the
// memory backend): after Blackhole(true) every connection it dialed goes
// silent — writes are swallowed, arriving data is dropped, and even the
// daemon's close is not seen (its Context stays live) until the agent
// closes the connection itself; new dials hang until their context ends.
// Blackhole(false) lets new dials through again.
type darkDialer struct {
	inner semantics.BackendDialer
	addr  string
	dark  atomic.Bool
}

func (d *darkDialer) Addr() string { return d.addr }

func (d *darkDialer) Blackhole(on bool) { d.dark.Store(on) }

func (d *darkDialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	if d.dark.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	c, err := d.inner.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	dc := &darkConn{BackendConn: c, d: d, closed: make(chan struct{})}
	dc.ctx, dc.cancel = context.WithCancelCause(context.Background())
	go func() {
		<-c.Context().Done()
		if d.dark.Load() {
			<-dc.closed // the peer's close is not seen on a dark path
		}
		dc.cancel(context.Cause(c.Context()))
	}()
	return dc, nil
}

type darkConn struct {
	semantics.BackendConn
	d      *darkDialer
	ctx    context.Context
	cancel context.CancelCauseFunc
	closed chan struct{} // closed by the local CloseWithCode
	once   sync.Once
}

func (c *darkConn) Context() context.Context { return c.ctx }

func (c *darkConn) CloseWithCode(code semantics.CloseCode, reason string) error {
	c.once.Do(func() { close(c.closed) })
	return c.BackendConn.CloseWithCode(code, reason)
}

// hold returns err at once on a live path; on a dark one only after the
// local close.
func (c *darkConn) hold(err error) error {
	if c.d.dark.Load() {
		<-c.closed
	}
	return err
}

func (c *darkConn) OpenStream(ctx context.Context) (semantics.RawStream, error) {
	s, err := c.BackendConn.OpenStream(ctx)
	if err != nil {
		return nil, err
	}
	return &darkStream{RawStream: s, c: c}, nil
}

func (c *darkConn) AcceptStream(ctx context.Context) (semantics.RawStream, error) {
	s, err := c.BackendConn.AcceptStream(ctx)
	if err != nil {
		return nil, c.hold(err)
	}
	return &darkStream{RawStream: s, c: c}, nil
}

func (c *darkConn) OpenUniStream(ctx context.Context) (semantics.RawSendStream, error) {
	s, err := c.BackendConn.OpenUniStream(ctx)
	if err != nil {
		return nil, err
	}
	return &darkSend{RawSendStream: s, c: c}, nil
}

func (c *darkConn) AcceptUniStream(ctx context.Context) (semantics.RawRecvStream, error) {
	s, err := c.BackendConn.AcceptUniStream(ctx)
	if err != nil {
		return nil, c.hold(err)
	}
	return &darkRecv{RawRecvStream: s, c: c}, nil
}

func darkRead(c *darkConn, r func() (int, error)) (int, error) {
	for {
		n, err := r()
		if !c.d.dark.Load() {
			return n, err
		}
		if err != nil {
			return 0, c.hold(err)
		}
		// Data arriving on a dark path is dropped.
	}
}

type darkStream struct {
	semantics.RawStream
	c *darkConn
}

func (s *darkStream) Write(p []byte) (int, error) {
	if s.c.d.dark.Load() {
		return len(p), nil
	}
	return s.RawStream.Write(p)
}

func (s *darkStream) Read(p []byte) (int, error) {
	return darkRead(s.c, func() (int, error) { return s.RawStream.Read(p) })
}

type darkSend struct {
	semantics.RawSendStream
	c *darkConn
}

func (s *darkSend) Write(p []byte) (int, error) {
	if s.c.d.dark.Load() {
		return len(p), nil
	}
	return s.RawSendStream.Write(p)
}

type darkRecv struct {
	semantics.RawRecvStream
	c *darkConn
}

func (s *darkRecv) Read(p []byte) (int, error) {
	return darkRead(s.c, func() (int, error) { return s.RawRecvStream.Read(p) })
}
