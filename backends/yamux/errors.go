package yamux

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	hyamux "github.com/hashicorp/yamux"

	"forgeyard.dev/transport/backends/yamux/proxy"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// This file is the one place where yamux and socket errors become
// semantics errors (STYLE.md rule 6). Nothing else compares yamux errors.

// ErrWriteAfterClose is returned by Write after the stream's send side was
// closed gracefully with Close.
var ErrWriteAfterClose = errors.New("yamux: write on closed stream")

// ErrHandshake wraps every failure to establish a connection (proxy, TCP,
// TLS, ALPN, HTTP Upgrade, control-stream setup); errors.Is(err,
// ErrHandshake) reports it. The error's message does not repeat it: it
// starts with what actually failed, "proxy host:port: …" (the HTTP CONNECT
// proxy, backends/yamux/proxy), "tcp: …", "tls: …" or "yamux: …", so an
// operator reads at once which hop to look at.
var ErrHandshake = errors.New("yamux: handshake failed")

// Connection-failure classifications (documented in doc.go).
var (
	errConnLost     = &semantics.ConnError{Code: wire.CloseInternalError, Reason: "connection lost", Remote: true}
	errIdle         = &semantics.ConnError{Code: wire.CloseIdleTimeout, Reason: "idle timeout"}
	errWriteStalled = &semantics.ConnError{Code: wire.CloseIdleTimeout, Reason: "write stalled"}
)

// deadlineError reports a passed read or write deadline. It matches
// os.ErrDeadlineExceeded with errors.Is, is a net.Error with Timeout() true,
// and keeps yamux's original error wrapped.
type deadlineError struct{ orig error }

func (e *deadlineError) Error() string   { return "yamux: i/o deadline exceeded" }
func (e *deadlineError) Timeout() bool   { return true }
func (e *deadlineError) Temporary() bool { return true }
func (e *deadlineError) Unwrap() []error { return []error{os.ErrDeadlineExceeded, e.orig} }

// handshakeErr is a failed handshake step; it matches ErrHandshake and
// unwraps to the step's error.
type handshakeErr struct {
	step string // "tcp", "tls", "alpn", "http upgrade", "server acceptance", "ready", "yamux", "control stream"
	err  error
}

func (e *handshakeErr) Error() string {
	switch e.step {
	case "tcp":
		if proxy.Failed(e.err) {
			return e.err.Error() // "proxy host:port: …", "proxy host:port refused CONNECT …"
		}
		return "tcp: " + e.err.Error()
	case "tls":
		return "tls: handshake: " + e.err.Error()
	case "server acceptance":
		// The server verifies the client certificate after the client's
		// side of the TLS 1.3 handshake completed: a rejection arrives
		// here as the server's alert.
		return "tls: server acceptance of the client certificate: " + e.err.Error()
	}
	return "yamux: " + e.step + ": " + e.err.Error()
}

func (e *handshakeErr) Unwrap() error { return e.err }

func (e *handshakeErr) Is(target error) bool { return target == ErrHandshake }

func handshakeError(step string, err error) error {
	return &handshakeErr{step: step, err: err}
}

// streamError translates an error returned by yamux Stream.Read (read=true)
// or Stream.Write for stream s. A sticky stream error recorded by a reset,
// a StopSending or a local cancel always wins: the deadline tricks used to
// wake blocked calls must never leak out as timeouts.
func (c *Conn) streamError(s *stream, err error, read bool) error {
	if sticky := s.stickyErr(read); sticky != nil {
		return sticky
	}
	switch {
	case errors.Is(err, hyamux.ErrTimeout):
		return &deadlineError{orig: err}
	case err == io.EOF && read:
		// After a session shutdown yamux reports io.EOF on every stream:
		// that is a connection error, not the peer's FIN.
		if c.sess.IsClosed() {
			return c.connError()
		}
		s.sawEOF()
		return io.EOF
	case errors.Is(err, hyamux.ErrConnectionReset):
		// A yamux RST without our ResetStream record: the peer's yamux
		// refused the stream (accept backlog) or timed out its close.
		return s.remoteRST()
	case errors.Is(err, hyamux.ErrConnectionWriteTimeout):
		// hashicorp/yamux#142: the frame may or may not have been sent, so
		// the stream's state is unknown; the only safe answer is to end
		// the connection.
		c.fail(errWriteStalled)
		return c.connError()
	case errors.Is(err, hyamux.ErrStreamClosed), errors.Is(err, hyamux.ErrSessionShutdown),
		errors.Is(err, hyamux.ErrRemoteGoAway):
		return c.connError()
	}
	if c.sess.IsClosed() {
		return c.connError()
	}
	return fmt.Errorf("yamux: stream %d: %w", s.id, err)
}

// sessionError translates an error from Session.OpenStream.
func (c *Conn) sessionError(err error) error {
	switch {
	case errors.Is(err, hyamux.ErrConnectionWriteTimeout):
		c.fail(errWriteStalled)
		return c.connError()
	case errors.Is(err, hyamux.ErrSessionShutdown), errors.Is(err, hyamux.ErrRemoteGoAway):
		return c.connError()
	case errors.Is(err, hyamux.ErrTimeout):
		return &deadlineError{orig: err}
	}
	if c.sess.IsClosed() {
		return c.connError()
	}
	return fmt.Errorf("yamux: open stream: %w", err)
}

// classify names a session that died without a close record, from what the
// socket wrapper observed.
func (sc *sockConn) classify() *semantics.ConnError {
	switch {
	case sc.idleFired.Load():
		return errIdle
	case sc.writeStalled.Load():
		return errWriteStalled
	}
	return errConnLost
}

// noteReadErr and noteWriteErr record why the socket failed.
func (sc *sockConn) noteReadErr(err error) {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		sc.idleFired.Store(true)
		return
	}
	idle := max(time.Now().UnixNano()-sc.lastActive.Load(), 1)
	sc.lostIdle.CompareAndSwap(0, idle)
}

func (sc *sockConn) noteWriteErr(err error) {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		sc.writeStalled.Store(true)
	}
}
