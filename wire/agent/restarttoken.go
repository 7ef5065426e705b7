package agent

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
	"forgeyard.dev/transport/wire/postcard"
)

// MsgRestartToken is the MessageTypeId of RestartTokenV1.
var MsgRestartToken = id(0x1d)

// RestartTokenV1 gives the agent the restart token of this transport
// (docs/protocols/internal/restart-hint.md): a daemon that restarts after
// a crash sends every session its previous process held a restart hint
// datagram carrying the session's token, and an agent whose connection
// holds that token ends the link at once, without a heartbeat probe. The
// daemon sends it once, when the session becomes active, on QUIC and
// WebTransport connections (a TCP agent learns of a crash from its
// kernel). TransportSession names the transport the token is for (the
// token is derived from the session and transport ids, so a replayed hint
// can match only a transport that is gone); KeyID names the daemon's
// token key, so an agent can tell a hint under another key (the key
// rotated with the daemon's TLS key) from another session's hint.
//
//	struct RestartTokenV1 {
//	    transport_session: [u8;16],
//	    key_id: [u8;4],
//	    token: [u8;16],
//	}
//
// Compatibility (docs/protocols/internal/compatibility.md): a new message
// (variant 0x1d, since 1.3) gated by the feature RestartTokenV1. A daemon
// sends it only to an agent that negotiated the feature; other agents
// answer restart hints with a heartbeat probe as before.
//
// Validate: non-zero transport_session and token.
type RestartTokenV1 struct {
	TransportSession wire.TransportSessionId
	KeyID            [4]byte
	Token            [16]byte
}

const nameRestartToken = "agent.RestartTokenV1"

var maxRestartTokenSize = maxsize.ID + 4 + 16

// MessageType implements wire.Message.
func (*RestartTokenV1) MessageType() wire.MessageTypeId { return MsgRestartToken }

// AppendPostcard implements wire.Message.
func (m *RestartTokenV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.TransportSession.ULID[:]...)
	b = append(b, m.KeyID[:]...)
	return append(b, m.Token[:]...)
}

// DecodePostcard implements wire.Message.
func (m *RestartTokenV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.TransportSession.ULID)
	d.Fixed(m.KeyID[:])
	d.Array16(&m.Token)
}

// Validate implements wire.Message.
func (m *RestartTokenV1) Validate() error {
	const n = nameRestartToken
	if err := checkIDs(n, idField{"transport_session", m.TransportSession.ULID}); err != nil {
		return err
	}
	if m.Token == ([16]byte{}) {
		return invalid(n, "token", "zero")
	}
	return nil
}
