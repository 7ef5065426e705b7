// Package acceptq is the part of a listener's Close that the backends with
// an accept queue share (backends/memory, backends/webtransport,
// backends/yamux): the connections established but not yet returned by
// Accept are closed with CloseShutdown.
package acceptq

import (
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// Reason is the close reason of a connection its listener's Close ended.
const Reason = "listener closed"

// Closer is a queued connection.
type Closer interface {
	CloseWithCode(semantics.CloseCode, string) error
}

// CloseQueued closes every connection waiting in q with CloseShutdown and
// Reason, and returns once q is empty (it does not wait for more).
func CloseQueued[C Closer](q <-chan C) {
	for {
		select {
		case c := <-q:
			_ = c.CloseWithCode(wire.CloseShutdown, Reason)
		default:
			return
		}
	}
}
