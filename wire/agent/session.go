package agent

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
	"forgeyard.dev/transport/wire/postcard"
)

// HeartbeatAckV1 acknowledges HeartbeatV1 number Seq and carries the
// daemon's clock (§80–82, §147). Heartbeats and their acks may be lost;
// liveness uses timeouts, not delivery.
//
//	struct HeartbeatAckV1 { seq: u64, server_time_ms: u64 /* Unix ms */ }
//
// Validate: non-zero server_time_ms.
type HeartbeatAckV1 struct {
	Seq          uint64
	ServerTimeMs uint64
}

const nameHeartbeatAck = "agent.HeartbeatAckV1"

var maxHeartbeatAckSize = 2 * maxsize.U64

// MessageType implements wire.Message.
func (*HeartbeatAckV1) MessageType() wire.MessageTypeId { return MsgHeartbeatAck }

// AppendPostcard implements wire.Message.
func (m *HeartbeatAckV1) AppendPostcard(b []byte) []byte {
	b = postcard.AppendU64(b, m.Seq)
	return postcard.AppendU64(b, m.ServerTimeMs)
}

// DecodePostcard implements wire.Message.
func (m *HeartbeatAckV1) DecodePostcard(d *postcard.Decoder) {
	m.Seq = d.U64()
	m.ServerTimeMs = d.U64()
}

// Validate implements wire.Message.
func (m *HeartbeatAckV1) Validate() error {
	if m.ServerTimeMs == 0 {
		return invalid(nameHeartbeatAck, "server_time_ms", "zero")
	}
	return nil
}

// ServerTimeV1 carries the daemon's clock for diagnostics and deadline
// conversion (§147).
//
//	struct ServerTimeV1 { server_time_ms: u64 /* Unix ms */ }
//
// Validate: non-zero server_time_ms.
type ServerTimeV1 struct {
	ServerTimeMs uint64
}

const nameServerTime = "agent.ServerTimeV1"

var maxServerTimeSize = maxsize.U64

// MessageType implements wire.Message.
func (*ServerTimeV1) MessageType() wire.MessageTypeId { return MsgServerTime }

// AppendPostcard implements wire.Message.
func (m *ServerTimeV1) AppendPostcard(b []byte) []byte {
	return postcard.AppendU64(b, m.ServerTimeMs)
}

// DecodePostcard implements wire.Message.
func (m *ServerTimeV1) DecodePostcard(d *postcard.Decoder) { m.ServerTimeMs = d.U64() }

// Validate implements wire.Message.
func (m *ServerTimeV1) Validate() error {
	if m.ServerTimeMs == 0 {
		return invalid(nameServerTime, "server_time_ms", "zero")
	}
	return nil
}

// GoAwayV1 announces that the daemon will close this connection with Code
// and tells the agent how to reconnect: wait ReconnectInMs (the daemon
// spreads this value across agents to avoid a thundering herd), keep trying
// for TryForMs, and prefer AlternateEndpoints in order.
//
//	struct GoAwayV1 {
//	    code: u32,                          // wire.CloseCode
//	    reconnect_in_ms: u32,
//	    try_for_ms: u32,
//	    alternate_endpoints: Vec<String>,   // ≤ 16 × ≤ MaxEndpoint (256) bytes
//	    message: String,                    // ≤ MaxMessage (256) bytes, truncated on encode
//	}
//
// Validate: non-empty distinct endpoints within bounds, UTF-8 message.
// Unknown close codes from a newer peer are accepted.
type GoAwayV1 struct {
	Code               wire.CloseCode
	ReconnectInMs      uint32
	TryForMs           uint32
	AlternateEndpoints []string
	Message            string
}

const nameGoAway = "agent.GoAwayV1"

var maxGoAwaySize = 3*maxsize.U32 + maxsize.Seq(MaxAlternateEndpoints, maxsize.Bytes(MaxEndpoint)) +
	maxsize.Bytes(MaxMessage)

// MessageType implements wire.Message.
func (*GoAwayV1) MessageType() wire.MessageTypeId { return MsgGoAway }

// AppendPostcard implements wire.Message.
func (m *GoAwayV1) AppendPostcard(b []byte) []byte {
	b = postcard.AppendU32(b, uint32(m.Code))
	b = postcard.AppendU32(b, m.ReconnectInMs)
	b = postcard.AppendU32(b, m.TryForMs)
	b = appendStrings(b, m.AlternateEndpoints)
	return postcard.AppendString(b, truncateText(m.Message, MaxMessage))
}

// DecodePostcard implements wire.Message.
func (m *GoAwayV1) DecodePostcard(d *postcard.Decoder) {
	m.Code = wire.CloseCode(d.U32())
	m.ReconnectInMs = d.U32()
	m.TryForMs = d.U32()
	m.AlternateEndpoints = readStrings(d, m.AlternateEndpoints, MaxAlternateEndpoints, MaxEndpoint)
	m.Message = d.String(MaxMessage)
}

// Validate implements wire.Message.
func (m *GoAwayV1) Validate() error {
	if err := checkStrings(nameGoAway, "alternate_endpoints", m.AlternateEndpoints,
		MaxAlternateEndpoints, MaxEndpoint); err != nil {
		return err
	}
	return checkText(nameGoAway, "message", m.Message)
}

// SessionFencedV1 tells a transport that it lost control authority for the
// agent session to a newer one (§61–63): FencedTransport is the receiver's
// transport, HolderTransport the one that now holds the session at
// HolderEpoch, connected from HolderRemote. If the agent did not open the
// holder itself (a duplicate agent process, a stale relay path), the daemon
// expects the situation to resolve within ResolvesWithinMs; otherwise the
// receiver should stop.
//
//	struct SessionFencedV1 {
//	    session: [u8;16],
//	    fenced_transport: [u8;16],
//	    holder_transport: [u8;16],
//	    holder_epoch: u64,
//	    holder_remote: String,              // ≤ MaxRemoteAddr (128) bytes, may be empty
//	    resolves_within_ms: u32,
//	}
//
// Validate: non-zero ids and holder_epoch, fenced_transport !=
// holder_transport, holder_remote within its bound.
type SessionFencedV1 struct {
	Session          wire.AgentSessionId
	FencedTransport  wire.TransportSessionId
	HolderTransport  wire.TransportSessionId
	HolderEpoch      uint64
	HolderRemote     string
	ResolvesWithinMs uint32
}

const nameSessionFenced = "agent.SessionFencedV1"

var maxSessionFencedSize = 3*maxsize.ID + maxsize.U64 + maxsize.Bytes(MaxRemoteAddr) + maxsize.U32

// MessageType implements wire.Message.
func (*SessionFencedV1) MessageType() wire.MessageTypeId { return MsgSessionFenced }

// AppendPostcard implements wire.Message.
func (m *SessionFencedV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Session.ULID[:]...)
	b = append(b, m.FencedTransport.ULID[:]...)
	b = append(b, m.HolderTransport.ULID[:]...)
	b = postcard.AppendU64(b, m.HolderEpoch)
	b = postcard.AppendString(b, m.HolderRemote)
	return postcard.AppendU32(b, m.ResolvesWithinMs)
}

// DecodePostcard implements wire.Message.
func (m *SessionFencedV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Session.ULID)
	wire.ReadULID(d, &m.FencedTransport.ULID)
	wire.ReadULID(d, &m.HolderTransport.ULID)
	m.HolderEpoch = d.U64()
	m.HolderRemote = d.String(MaxRemoteAddr)
	m.ResolvesWithinMs = d.U32()
}

// Validate implements wire.Message.
func (m *SessionFencedV1) Validate() error {
	const n = nameSessionFenced
	if err := checkIDs(n, idField{"session", m.Session.ULID},
		idField{"fenced_transport", m.FencedTransport.ULID},
		idField{"holder_transport", m.HolderTransport.ULID}); err != nil {
		return err
	}
	if m.FencedTransport == m.HolderTransport {
		return invalid(n, "holder_transport", "equals fenced_transport")
	}
	if m.HolderEpoch == 0 {
		return invalid(n, "holder_epoch", "zero")
	}
	return checkString(n, "holder_remote", m.HolderRemote, MaxRemoteAddr, false)
}
