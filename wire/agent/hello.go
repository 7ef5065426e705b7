package agent

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
	"forgeyard.dev/transport/wire/postcard"
)

// TransportHelloV1 is the first message on a new connection's control stream
// (§57–59): the peer's role, the protocol versions and features it speaks,
// and, when it resumes, the agent session it held before.
//
//	struct TransportHelloV1 {
//	    role: PeerRole,
//	    versions: ProtocolRange,            // {min: {u16,u16}, max: {u16,u16}}
//	    features: FeatureSet,               // Vec<u16>, ≤ 64 entries
//	    agent_session: Option<[u8;16]>,
//	    agent_version: String,              // ≤ MaxAgentVersion (64) bytes
//	}
//
// Validate: known role, a non-empty versions range, a non-zero agent_session
// when present, a non-empty agent_version.
type TransportHelloV1 struct {
	Role            PeerRole
	Versions        wire.ProtocolRange
	Features        wire.FeatureSet
	HasAgentSession bool
	AgentSession    wire.AgentSessionId
	AgentVersion    string
}

const nameTransportHello = "agent.TransportHelloV1"

var maxTransportHelloSize = maxsize.Enum + rangeMax + featuresMax + 1 + maxsize.ID + maxsize.Bytes(MaxAgentVersion)

// MessageType implements wire.Message.
func (*TransportHelloV1) MessageType() wire.MessageTypeId { return MsgTransportHello }

// AppendPostcard implements wire.Message.
func (m *TransportHelloV1) AppendPostcard(b []byte) []byte {
	b = postcard.AppendVariant(b, uint32(m.Role))
	b = m.Versions.AppendPostcard(b)
	b = m.Features.AppendPostcard(b)
	b = postcard.AppendOption(b, m.HasAgentSession)
	if m.HasAgentSession {
		b = append(b, m.AgentSession.ULID[:]...)
	}
	return postcard.AppendString(b, m.AgentVersion)
}

// DecodePostcard implements wire.Message.
func (m *TransportHelloV1) DecodePostcard(d *postcard.Decoder) {
	m.Role = PeerRole(d.Variant(numPeerRoles))
	m.Versions.DecodePostcard(d)
	m.Features.DecodePostcard(d)
	m.HasAgentSession = d.Option()
	m.AgentSession = wire.AgentSessionId{}
	if m.HasAgentSession {
		wire.ReadULID(d, &m.AgentSession.ULID)
	}
	m.AgentVersion = d.String(MaxAgentVersion)
}

// Validate implements wire.Message.
func (m *TransportHelloV1) Validate() error {
	const n = nameTransportHello
	if !m.Role.Valid() {
		return invalid(n, "role", "unknown peer role")
	}
	if err := checkRange(n, "versions", m.Versions); err != nil {
		return err
	}
	if err := checkOptionID(n, "agent_session", m.HasAgentSession, m.AgentSession.ULID); err != nil {
		return err
	}
	return checkString(n, "agent_version", m.AgentVersion, MaxAgentVersion, true)
}

// ChallengeSize is the size of HelloAckV1.Challenge.
const ChallengeSize = 32

// HelloAckV1 is the daemon's answer to TransportHelloV1: the negotiated
// version (§25), its own range and the intersected features (§247), the id
// it gave this connection, its clock, and a fresh challenge. The agent signs
// challenge‖transport_session with its runner key in RegisterAgentV1, which
// proves key possession end to end even through a relay that terminates TLS.
//
//	struct HelloAckV1 {
//	    negotiated: ProtocolVersion,        // {u16, u16}
//	    server_range: ProtocolRange,
//	    features: FeatureSet,               // Vec<u16>, ≤ 64 entries
//	    transport_session: [u8;16],
//	    server_time_ms: u64,                // Unix ms
//	    challenge: [u8;32],
//	}
//
// Validate: negotiated lies in server_range, non-zero transport_session,
// server_time_ms and challenge.
type HelloAckV1 struct {
	Negotiated       wire.ProtocolVersion
	ServerRange      wire.ProtocolRange
	Features         wire.FeatureSet
	TransportSession wire.TransportSessionId
	ServerTimeMs     uint64
	Challenge        [ChallengeSize]byte
}

const nameHelloAck = "agent.HelloAckV1"

var maxHelloAckSize = verMax + rangeMax + featuresMax + maxsize.ID + maxsize.U64 + ChallengeSize

// MessageType implements wire.Message.
func (*HelloAckV1) MessageType() wire.MessageTypeId { return MsgHelloAck }

// AppendPostcard implements wire.Message.
func (m *HelloAckV1) AppendPostcard(b []byte) []byte {
	b = m.Negotiated.AppendPostcard(b)
	b = m.ServerRange.AppendPostcard(b)
	b = m.Features.AppendPostcard(b)
	b = append(b, m.TransportSession.ULID[:]...)
	b = postcard.AppendU64(b, m.ServerTimeMs)
	return append(b, m.Challenge[:]...)
}

// DecodePostcard implements wire.Message.
func (m *HelloAckV1) DecodePostcard(d *postcard.Decoder) {
	m.Negotiated.DecodePostcard(d)
	m.ServerRange.DecodePostcard(d)
	m.Features.DecodePostcard(d)
	wire.ReadULID(d, &m.TransportSession.ULID)
	m.ServerTimeMs = d.U64()
	d.Array32(&m.Challenge)
}

// Validate implements wire.Message.
func (m *HelloAckV1) Validate() error {
	const n = nameHelloAck
	if err := checkRange(n, "server_range", m.ServerRange); err != nil {
		return err
	}
	if !m.ServerRange.Contains(m.Negotiated) {
		return invalid(n, "negotiated", "outside server_range")
	}
	if err := checkID(n, "transport_session", m.TransportSession.ULID); err != nil {
		return err
	}
	if m.ServerTimeMs == 0 {
		return invalid(n, "server_time_ms", "zero")
	}
	if m.Challenge == [ChallengeSize]byte{} {
		return invalid(n, "challenge", "all zero")
	}
	return nil
}
