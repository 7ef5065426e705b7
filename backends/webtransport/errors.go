package webtransport

import (
	"context"
	"errors"
	"io"
	"os"
	"time"

	wt "github.com/quic-go/webtransport-go"

	"forgeyard.dev/transport/backends/internal/errpair"
	fyquic "forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// This file is the ONE place where webtransport-go errors become semantics
// errors; QUIC-level errors go through backends/quic.TranslateError.

// sessionConnError maps a session's close error (what webtransport-go
// returns once a session is gone) to a *semantics.ConnError, or nil when it
// is not a WebTransport session error.
func sessionConnError(err error) *semantics.ConnError {
	if se, ok := errors.AsType[*wt.SessionError](err); ok {
		return &semantics.ConnError{Code: semantics.CloseCode(se.ErrorCode), Reason: se.Message, Remote: se.Remote}
	}
	return nil
}

// translate maps a stream or session operation's error:
//
//   - *wt.StreamError → *semantics.StreamError{Code, Remote};
//   - *wt.SessionError → *semantics.ConnError{Code, Reason, Remote};
//   - deadlines and the caller's context errors → unchanged;
//   - anything else (HTTP/3 or QUIC errors: the session is going away and
//     webtransport-go may have lost the code) → the connection's *ConnError
//     (its Context cause, waited for up to causeWait), else
//     backends/quic.TranslateError.
//
// The original error stays in the chain.
func (c *conn) translate(err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	if _, ok := errors.AsType[*translated](err); ok {
		return err
	}
	if se, ok := errors.AsType[*wt.StreamError](err); ok {
		return newTranslated(&semantics.StreamError{Code: semantics.StreamErrorCode(se.ErrorCode), Remote: se.Remote}, err)
	}
	if ce := sessionConnError(err); ce != nil {
		c.settle(ce)
		return newTranslated(ce, err)
	}
	if isDeadline(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err // the caller's deadline or context, not the connection's
	}
	// Anything else (HTTP/3 or QUIC errors) means the session is going
	// away; webtransport-go may have lost the code on the way, so report
	// the connection's cause, which closeCause works out (bounded by
	// causeWait).
	t := time.NewTimer(causeWait + 100*time.Millisecond)
	defer t.Stop()
	select {
	case <-c.ctx.Done():
		if ce, ok := context.Cause(c.ctx).(*semantics.ConnError); ok {
			return newTranslated(ce, err)
		}
	case <-t.C:
	}
	return fyquic.TranslateError(err)
}

// settle records ce as the connection's cause if none is recorded yet, so
// Context is done before a caller sees a connection error.
func (c *conn) settle(ce *semantics.ConnError) {
	if c.ctx.Err() == nil {
		c.cancel(ce)
	}
}

// translated carries a semantics error and the library error it came from
// (errpair.Pair: Error reads like the semantics error; Unwrap exposes
// both). It is this package's own type, so an error backends/quic
// translated is not taken for one translated here.
type translated struct{ errpair.Pair }

func newTranslated(sem, orig error) *translated {
	return &translated{errpair.Pair{Sem: sem, Orig: orig}}
}

// fallbackConnError is the cause when a session ended without a
// WebTransport close and without the QUIC connection closing.
func fallbackConnError(sessErr error) *semantics.ConnError {
	msg := "webtransport session ended"
	if sessErr != nil {
		msg += ": " + sessErr.Error()
	}
	return &semantics.ConnError{Code: wire.CloseProtocolError, Reason: wire.TruncateUTF8(msg, wire.MaxCloseReason), Remote: true}
}

func isDeadline(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }
