package quic

import (
	"context"
	"errors"
	"io"
	"math"

	quicgo "github.com/quic-go/quic-go"

	"forgeyard.dev/transport/backends/internal/errpair"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// This file is the ONE place where quic-go errors become semantics errors
// (in the spirit of go-libp2p's parseStreamError). Everything in this
// package returns errors through TranslateError.

// TranslateError maps a quic-go error onto the semantics contract:
//
//   - *quicgo.StreamError → *semantics.StreamError{Code, Remote}; a code
//     above 2^32-1 (not one of ours) becomes StreamProtocolError.
//   - *quicgo.ApplicationError → *semantics.ConnError{Code, Reason, Remote};
//     a code above 2^32-1 becomes CloseProtocolError.
//   - *quicgo.IdleTimeoutError → semantics.IdleTimeoutError().
//   - *quicgo.HandshakeTimeoutError → ConnError{CloseIdleTimeout}.
//   - a TLS alert (crypto TransportError) → ConnError{CloseAuthenticationFailure},
//     except internal_error (the peer's own failure) → ConnError{CloseInternalError}.
//   - CONNECTION_REFUSED (the server's handshake admission, its accept
//     queue full) → ConnError{CloseOverloaded}.
//   - another *quicgo.TransportError → ConnError{CloseProtocolError}
//     (NO_ERROR → CloseNormal).
//   - *quicgo.StatelessResetError (the peer lost its state, e.g. restarted)
//     → ConnError{CloseShutdown, Remote: true}.
//   - quicgo.ErrTransportClosed / ErrServerClosed (our endpoint was shut
//     down) → ConnError{CloseShutdown}.
//
// The result wraps both the semantics error and the original, so errors.As
// finds either and errors.Is(err, net.ErrClosed) holds for connection
// errors. nil, io.EOF and deadline errors (which already unwrap to
// os.ErrDeadlineExceeded) and anything unknown are returned unchanged.
// TranslateError is exported for backends/webtransport, which layers its
// own session and stream errors on top.
func TranslateError(err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	if _, ok := errors.AsType[*translated](err); ok {
		return err
	}
	if se, ok := errors.AsType[*quicgo.StreamError](err); ok {
		return newTranslated(&semantics.StreamError{Code: streamCode(uint64(se.ErrorCode)), Remote: se.Remote}, err)
	}
	if ce := ConnErrorOf(err); ce != nil {
		return newTranslated(ce, err)
	}
	return err
}

// ConnErrorOf returns the *semantics.ConnError that err (a connection-level
// quic-go error) stands for, or nil when err is not one. The result is a
// fresh value (callers may keep it) without the original attached; use it
// as a context cause.
func ConnErrorOf(err error) *semantics.ConnError {
	if err == nil {
		return nil
	}
	if ce, ok := errors.AsType[*semantics.ConnError](err); ok {
		c := *ce
		return &c
	}
	if ae, ok := errors.AsType[*quicgo.ApplicationError](err); ok {
		code, reason := semantics.CloseCode(ae.ErrorCode), ae.ErrorMessage
		if uint64(ae.ErrorCode) > math.MaxUint32 {
			code, reason = wire.CloseProtocolError, "foreign application error code: "+ae.Error()
		}
		return &semantics.ConnError{Code: code, Reason: reason, Remote: ae.Remote}
	}
	if _, ok := errors.AsType[*quicgo.IdleTimeoutError](err); ok {
		return semantics.IdleTimeoutError()
	}
	if _, ok := errors.AsType[*quicgo.HandshakeTimeoutError](err); ok {
		return &semantics.ConnError{Code: wire.CloseIdleTimeout, Reason: "handshake timeout"}
	}
	if te, ok := errors.AsType[*quicgo.TransportError](err); ok {
		switch {
		case te.ErrorCode == tlsInternalError:
			// The peer's TLS failed on its own side, not on our
			// credentials: a daemon's handshake that found no worker in
			// time (Admission, errQueueWait) ends so. Retry with backoff.
			return &semantics.ConnError{Code: wire.CloseInternalError, Reason: te.Error(), Remote: te.Remote}
		case te.ErrorCode.IsCryptoError():
			return &semantics.ConnError{Code: wire.CloseAuthenticationFailure, Reason: te.Error(), Remote: te.Remote}
		case te.ErrorCode == quicgo.NoError:
			return &semantics.ConnError{Code: wire.CloseNormal, Reason: te.ErrorMessage, Remote: te.Remote}
		case te.ErrorCode == quicgo.ConnectionRefused:
			return &semantics.ConnError{Code: wire.CloseOverloaded, Reason: "connection refused (server at a limit; retry with backoff)", Remote: te.Remote}
		default:
			return &semantics.ConnError{Code: wire.CloseProtocolError, Reason: te.Error(), Remote: te.Remote}
		}
	}
	if _, ok := errors.AsType[*quicgo.StatelessResetError](err); ok {
		return &semantics.ConnError{Code: wire.CloseShutdown, Reason: "stateless reset (peer lost its state)", Remote: true}
	}
	if errors.Is(err, quicgo.ErrTransportClosed) || errors.Is(err, quicgo.ErrServerClosed) {
		return &semantics.ConnError{Code: wire.CloseShutdown, Reason: "endpoint closed"}
	}
	return nil
}

// streamCode maps a QUIC stream error code onto ours.
func streamCode(c uint64) semantics.StreamErrorCode {
	if c > math.MaxUint32 {
		return semantics.StreamProtocolError
	}
	return semantics.StreamErrorCode(c)
}

// translated carries a semantics error and the library error it came from
// (errpair.Pair: Error reads like the semantics error; Unwrap exposes
// both). It is this package's own type, so an error backends/webtransport
// translated is not taken for one translated here.
type translated struct{ errpair.Pair }

func newTranslated(sem, orig error) *translated {
	return &translated{errpair.Pair{Sem: sem, Orig: orig}}
}

// closeError corrects one quic-go quirk at the same place as the rest of the
// translation: Close on a stream whose send side the peer has stopped
// (STOP_SENDING) returns a plain "close called for canceled stream" error,
// while the stream's context carries the *quicgo.StreamError as its cause.
// Report that cause, so Close tells the caller what a Write would have: the
// peer's code, Remote=true.
func closeError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	var se *quicgo.StreamError
	if errors.As(context.Cause(ctx), &se) {
		return se
	}
	return err
}

// tlsInternalError is the QUIC CRYPTO_ERROR of the TLS alert
// internal_error (80), RFC 9001 §4.8.
const tlsInternalError = quicgo.TransportErrorCode(0x100 + 80)
