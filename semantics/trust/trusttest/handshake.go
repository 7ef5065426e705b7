package trusttest

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// HandshakeTimeout bounds every step of Handshake.
const HandshakeTimeout = 10 * time.Second

// HandshakeResult is the outcome of Handshake.
type HandshakeResult struct {
	// ServerErr is the server's handshake error, nil on success.
	ServerErr error
	// ClientErr is the client's handshake error or, if its handshake
	// succeeded, the error of reading the server's one-byte confirmation.
	// In TLS 1.3 a client learns that the server rejected its certificate
	// only after its own handshake returns, so the read is what surfaces it.
	ClientErr error
	// ServerState and ClientState are the connection states after the
	// handshake (meaningful only when the matching error is nil).
	ServerState tls.ConnectionState
	ClientState tls.ConnectionState
}

// OK reports whether both sides completed the handshake.
func (r HandshakeResult) OK() bool { return r.ServerErr == nil && r.ClientErr == nil }

// Handshake runs a real crypto/tls handshake between server and client over
// a loopback TCP connection (127.0.0.1) and returns both outcomes. After a
// successful server handshake the server writes one byte, which the client
// reads, so both sides see rejections that TLS 1.3 reports after the
// client's handshake has returned. Everything is closed before it returns;
// no goroutine outlives the call.
func Handshake(t testing.TB, server, client *tls.Config) HandshakeResult {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("trusttest: listen on loopback: %v", err)
	}
	defer ln.Close()

	type serverOut struct {
		err   error
		state tls.ConnectionState
	}
	done := make(chan serverOut, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- serverOut{err: err}
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(HandshakeTimeout))
		tc := tls.Server(c, server)
		if err := tc.Handshake(); err != nil {
			done <- serverOut{err: err}
			return
		}
		_, err = tc.Write([]byte{'k'})
		st := tc.ConnectionState()
		// Wait for the client to close so the byte is not lost to a reset.
		_, _ = io.Copy(io.Discard, tc)
		done <- serverOut{err: err, state: st}
	}()

	var res HandshakeResult
	c, err := net.DialTimeout("tcp", ln.Addr().String(), HandshakeTimeout)
	if err != nil {
		_ = ln.Close()
		<-done
		t.Fatalf("trusttest: dial loopback: %v", err)
	}
	_ = c.SetDeadline(time.Now().Add(HandshakeTimeout))
	tc := tls.Client(c, client)
	res.ClientErr = tc.Handshake()
	if res.ClientErr == nil {
		res.ClientState = tc.ConnectionState()
		var b [1]byte
		_, err := io.ReadFull(tc, b[:])
		if err == nil && b[0] != 'k' {
			err = errors.New("trusttest: unexpected confirmation byte")
		}
		res.ClientErr = err
	}
	_ = c.Close()
	out := <-done
	res.ServerErr, res.ServerState = out.err, out.state
	return res
}
