package quic

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"

	quicgo "github.com/quic-go/quic-go"

	"forgeyard.dev/transport/semantics"
)

// A failed QUIC handshake never reaches Listener.Accept: quic-go drops the
// connection inside the Transport. To see it, the Transport's ConnContext
// (called for every incoming connection attempt that passed address
// validation, with the remote address) attaches a handshakeWatch to the
// connection's context and registers a context.AfterFunc on it: quic-go
// cancels that context with the connection's close error when the
// connection ends, so the AfterFunc sees every connection's end on its own
// goroutine, off the handshake path. A connection handed to Accept is
// marked first and not reported; one that ended with a TLS alert (a crypto
// TransportError, sent or received) or the handshake timeout is.

// WatchHandshakes makes tr report every incoming connection whose handshake
// failed to hook as backend (nothing when hook is nil). It sets
// tr.ConnContext and must be called before tr.Listen. Connections returned
// by the listener must be passed to HandshakeAccepted. It is
// PrepareServerTransport with a Config of hook only (the default
// handshake cap included).
func WatchHandshakes(tr *quicgo.Transport, backend string, hook func(semantics.HandshakeFailure)) {
	PrepareServerTransport(tr, backend, Config{OnHandshakeFailure: hook})
}

// HandshakeAccepted marks qc as established: its end is not a handshake
// failure. A no-op for a connection of a Transport without WatchHandshakes.
func HandshakeAccepted(qc *quicgo.Conn) {
	if w, ok := qc.Context().Value(handshakeWatchKey{}).(*handshakeWatch); ok {
		if w.state.CompareAndSwap(attemptPending, attemptAccepted) {
			w.admission.completed.Add(1)
			if stop := w.unwatch; stop != nil {
				w.unwatch = nil // the func holds the AfterFunc's context
				stop()          // its end is no handshake's: nothing left to watch
			}
		}
		w.done()
	}
}

// RejectedAfterHandshake reports to hook (when not nil) a connection whose
// handshake completed but that the listener refused (e.g. wrong ALPN),
// with reason protocol. Exported for backends/webtransport.
func RejectedAfterHandshake(hook func(semantics.HandshakeFailure), backend string, remote net.Addr, err error) {
	if hook == nil {
		return
	}
	f := semantics.NewHandshakeFailure(backend, remote, err, false)
	f.Reason = semantics.HandshakeProtocol
	hook(f)
}

// handshakeFailure tells whether cause, a connection's close error, ends a
// failed handshake (nil error: it does not), and returns the error to
// classify and whether the peer aborted: a local TLS alert
// unwraps to crypto/tls's error (which carries the tls.AlertError and any
// *tls.CertificateVerificationError); a peer's alert gets its
// tls.AlertError attached here.
func handshakeFailure(cause error) (byPeer bool, err error) {
	if _, ok := errors.AsType[*quicgo.HandshakeTimeoutError](cause); ok {
		return false, cause
	}
	te, ok := errors.AsType[*quicgo.TransportError](cause)
	if !ok || !te.ErrorCode.IsCryptoError() {
		return false, nil
	}
	if te.Remote {
		return true, fmt.Errorf("%w%.0w", cause, tls.AlertError(uint8(te.ErrorCode-0x100)))
	}
	if _, ok := errors.AsType[tls.AlertError](cause); !ok {
		cause = fmt.Errorf("%w%.0w", cause, tls.AlertError(uint8(te.ErrorCode-0x100)))
	}
	return false, cause
}
