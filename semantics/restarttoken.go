package semantics

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"

	"forgeyard.dev/transport/wire"
)

// RestartToken authenticates a restart hint for one transport
// (docs/protocols/internal/restart-hint.md): the daemon derives it from a
// key that survives its restarts (the QUIC stateless reset key) and the
// session and transport ids, gives it to the agent over the encrypted
// control channel (agentwire.RestartTokenV1, feature RestartTokenV1), and
// a restarted daemon, which keeps no tokens, derives it again for every
// session the authority says its previous process held. KeyID names the
// key, so that an agent can tell a hint under another key (the daemon's
// key changed) from a hint meant for another session behind the same
// address. The zero value is no token.
type RestartToken struct {
	KeyID [4]byte
	Token [16]byte
}

// IsZero reports whether t is no token.
func (t RestartToken) IsZero() bool { return t == RestartToken{} }

// Equal reports whether t and o are the same token, in constant time.
func (t RestartToken) Equal(o RestartToken) bool {
	return subtle.ConstantTimeCompare(t.KeyID[:], o.KeyID[:])&subtle.ConstantTimeCompare(t.Token[:], o.Token[:]) == 1
}

// Labels of the restart token's derivations (HMAC-SHA256 under the key).
const (
	restartKeyIDLabel = "forgeyard restart token key id v1"
	restartTokenLabel = "forgeyard restart token v1\x00"
)

// DeriveRestartToken returns the restart token of transport in session
// under key (at least 32 secret bytes; nil or shorter: the zero token, no
// token): KeyID is HMAC-SHA256(key, "forgeyard restart token key id v1")
// and Token HMAC-SHA256(key, "forgeyard restart token v1" ‖ 0x00 ‖
// session ‖ transport), both truncated. A token names one transport, so a
// hint recorded on the network and replayed later can only match a
// transport that is already gone: the agent's next registration gets a
// new transport id and so a new token.
func DeriveRestartToken(key []byte, session wire.AgentSessionId, transport wire.TransportSessionId) RestartToken {
	if len(key) < 32 {
		return RestartToken{}
	}
	var t RestartToken
	m := hmac.New(sha256.New, key)
	m.Write([]byte(restartKeyIDLabel))
	copy(t.KeyID[:], m.Sum(nil))
	m.Reset()
	m.Write([]byte(restartTokenLabel))
	m.Write(session.ULID[:])
	m.Write(transport.ULID[:])
	copy(t.Token[:], m.Sum(nil))
	return t
}

// RestartTokenHinter is implemented by backend connections whose restart
// hints (PeerHinter) can carry a RestartToken. Once the engine armed the
// connection with its token, a hint from the peer's address carrying that
// token is delivered on PeerRestarted — authenticated: the engine ends the
// link at once — and a hint carrying another token under the same key
// (another session behind the same address) is dropped; a hint without a
// token, or under another key, is delivered on PeerHints as before.
type RestartTokenHinter interface {
	PeerHinter
	// ArmRestartToken sets the connection's token (the last call wins).
	ArmRestartToken(t RestartToken)
	// PeerRestarted returns a channel that receives a value (coalesced)
	// when a hint carrying the armed token arrives. It is never closed.
	PeerRestarted() <-chan struct{}
}

// HintVerdict is what a connection armed with a restart token (or not)
// does with a restart hint (ClassifyRestartHint).
type HintVerdict uint8

const (
	// HintProbe: unauthenticated; answer with a heartbeat probe (PeerHints).
	HintProbe HintVerdict = iota
	// HintRestarted: the hint carries the armed token; the peer restarted
	// (PeerRestarted).
	HintRestarted
	// HintIgnore: another session's token under the same key; not for
	// this connection.
	HintIgnore
)

// ClassifyRestartHint is the backends' rule for a hint carrying hint (zero:
// a tokenless hint) reaching a connection armed with armed (zero: none).
func ClassifyRestartHint(armed, hint RestartToken) HintVerdict {
	switch {
	case armed.IsZero() || hint.IsZero():
		return HintProbe
	case armed.Equal(hint):
		return HintRestarted
	case subtle.ConstantTimeCompare(armed.KeyID[:], hint.KeyID[:]) == 1:
		return HintIgnore
	}
	return HintProbe // another key: the daemon's key changed since it armed this one
}
