package agent

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
	"forgeyard.dev/transport/wire/internal/seq"
	"forgeyard.dev/transport/wire/postcard"
)

// RegisterAgentV1 registers an agent session on the connection after
// HelloAckV1 (§57). KeyProof is the runner key's signature over
// HelloAckV1.challenge ‖ HelloAckV1.transport_session; the daemon verifies it
// against the key bound to Runner, so a relay in the path cannot register on
// the agent's behalf. ResumeEpoch, when present, is the epoch of the
// registration the agent resumes (§227–230).
//
//	struct RegisterAgentV1 {
//	    runner: [u8;16],
//	    session: [u8;16],
//	    agent_version: String,              // ≤ MaxAgentVersion (64) bytes
//	    capabilities: RunnerCapabilitiesV1,
//	    capability_digest: [u8;32],
//	    key_proof: Bytes,                   // ≤ MaxKeyProof (512) bytes
//	    resume_epoch: Option<u64>,
//	    cert_chain: Vec<Bytes>,             // ≤ MaxCertChain (4) × ≤ MaxCertDER (8192) bytes, DER, leaf first
//	}
//
// CertChain carries the agent's certificate chain when TLS terminates at a
// relay (ARCHITECTURE.md decision 10): the daemon verifies it against the
// runner CA and KeyProof against its leaf key. On a direct connection it may
// be empty (the TLS peer certificate is used) or must equal the TLS chain.
//
// Validate: non-zero runner and session, non-empty agent_version, valid
// capabilities, non-zero capability_digest, non-empty key_proof, and a
// resume_epoch > 0 when present.
type RegisterAgentV1 struct {
	Runner           wire.RunnerId
	Session          wire.AgentSessionId
	AgentVersion     string
	Capabilities     RunnerCapabilitiesV1
	CapabilityDigest wire.CapabilityDigest
	KeyProof         []byte
	HasResumeEpoch   bool
	ResumeEpoch      uint64
	CertChain        [][]byte
}

const nameRegisterAgent = "agent.RegisterAgentV1"

var maxRegisterAgentSize = 2*maxsize.ID + maxsize.Bytes(MaxAgentVersion) + maxCapabilitiesSize + maxsize.Digest +
	maxsize.Bytes(MaxKeyProof) + 1 + maxsize.U64 + maxsize.Seq(MaxCertChain, maxsize.Bytes(MaxCertDER))

// MessageType implements wire.Message.
func (*RegisterAgentV1) MessageType() wire.MessageTypeId { return MsgRegisterAgent }

// AppendPostcard implements wire.Message.
func (m *RegisterAgentV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Runner.ULID[:]...)
	b = append(b, m.Session.ULID[:]...)
	b = postcard.AppendString(b, m.AgentVersion)
	b = m.Capabilities.AppendPostcard(b)
	b = append(b, m.CapabilityDigest.Digest[:]...)
	b = postcard.AppendBytes(b, m.KeyProof)
	b = postcard.AppendOption(b, m.HasResumeEpoch)
	if m.HasResumeEpoch {
		b = postcard.AppendU64(b, m.ResumeEpoch)
	}
	return seq.AppendBytes(b, m.CertChain)
}

// DecodePostcard implements wire.Message. KeyProof is copied out of the input
// into the existing capacity of m.KeyProof.
func (m *RegisterAgentV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Runner.ULID)
	wire.ReadULID(d, &m.Session.ULID)
	m.AgentVersion = d.String(MaxAgentVersion)
	m.Capabilities.DecodePostcard(d)
	wire.ReadDigest(d, &m.CapabilityDigest.Digest)
	m.KeyProof = readBytesInto(d, m.KeyProof, MaxKeyProof)
	m.HasResumeEpoch = d.Option()
	m.ResumeEpoch = 0
	if m.HasResumeEpoch {
		m.ResumeEpoch = d.U64()
	}
	m.CertChain = seq.DecodeBytes(d, MaxCertChain, MaxCertDER)
}

// Validate implements wire.Message.
func (m *RegisterAgentV1) Validate() error {
	const n = nameRegisterAgent
	if err := checkIDs(n, idField{"runner", m.Runner.ULID}, idField{"session", m.Session.ULID}); err != nil {
		return err
	}
	if err := checkString(n, "agent_version", m.AgentVersion, MaxAgentVersion, true); err != nil {
		return err
	}
	if err := m.Capabilities.validate(n); err != nil {
		return err
	}
	if m.CapabilityDigest.IsZero() {
		return invalid(n, "capability_digest", "zero digest")
	}
	if err := checkBytes(n, "key_proof", m.KeyProof, MaxKeyProof); err != nil {
		return err
	}
	if m.HasResumeEpoch && m.ResumeEpoch == 0 {
		return invalid(n, "resume_epoch", "zero")
	}
	if !m.HasResumeEpoch && m.ResumeEpoch != 0 {
		return invalid(n, "resume_epoch", "value set but Has flag false")
	}
	if len(m.CertChain) > MaxCertChain {
		return invalid(n, "cert_chain", "more certificates than its bound")
	}
	return checkCerts(n, m.CertChain)
}

// RegistrationAcceptedV1 activates the control session (§57). Epoch is the
// monotonic registration epoch of the agent session (a newer epoch fences
// older transports). The interval fields are the daemon's timing policy for
// this agent; AlternateEndpoints and FallbackStaggerMs drive reconnect and
// happy-eyeballs fallback (the i-th stagger delays the i-th fallback).
//
//	struct RegistrationAcceptedV1 {
//	    session: [u8;16],
//	    epoch: u64,
//	    transport_session: [u8;16],
//	    heartbeat_interval_ms: u32,
//	    lease_renew_interval_ms: u32,
//	    max_backoff_ms: u32,
//	    alternate_endpoints: Vec<String>,   // ≤ 16 × ≤ MaxEndpoint (256) bytes
//	    fallback_stagger_ms: Vec<u32>,      // ≤ MaxFallbackStagger (8)
//	    server_time_ms: u64,                // Unix ms
//	}
//
// Validate: non-zero ids, epoch, intervals, max_backoff_ms and
// server_time_ms; non-empty distinct endpoints within bounds.
type RegistrationAcceptedV1 struct {
	Session              wire.AgentSessionId
	Epoch                uint64
	TransportSession     wire.TransportSessionId
	HeartbeatIntervalMs  uint32
	LeaseRenewIntervalMs uint32
	MaxBackoffMs         uint32
	AlternateEndpoints   []string
	FallbackStaggerMs    []uint32
	ServerTimeMs         uint64
}

const nameRegistrationAccepted = "agent.RegistrationAcceptedV1"

var maxRegistrationAcceptedSize = maxsize.ID + maxsize.U64 + maxsize.ID + 3*maxsize.U32 +
	maxsize.Seq(MaxAlternateEndpoints, maxsize.Bytes(MaxEndpoint)) + maxsize.Seq(MaxFallbackStagger, maxsize.U32) +
	maxsize.U64

// MessageType implements wire.Message.
func (*RegistrationAcceptedV1) MessageType() wire.MessageTypeId { return MsgRegistrationAccepted }

// AppendPostcard implements wire.Message.
func (m *RegistrationAcceptedV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Session.ULID[:]...)
	b = postcard.AppendU64(b, m.Epoch)
	b = append(b, m.TransportSession.ULID[:]...)
	b = postcard.AppendU32(b, m.HeartbeatIntervalMs)
	b = postcard.AppendU32(b, m.LeaseRenewIntervalMs)
	b = postcard.AppendU32(b, m.MaxBackoffMs)
	b = appendStrings(b, m.AlternateEndpoints)
	b = seq.Append(b, m.FallbackStaggerMs, func(v *uint32, b []byte) []byte { return postcard.AppendU32(b, *v) })
	return postcard.AppendU64(b, m.ServerTimeMs)
}

// DecodePostcard implements wire.Message.
func (m *RegistrationAcceptedV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Session.ULID)
	m.Epoch = d.U64()
	wire.ReadULID(d, &m.TransportSession.ULID)
	m.HeartbeatIntervalMs = d.U32()
	m.LeaseRenewIntervalMs = d.U32()
	m.MaxBackoffMs = d.U32()
	m.AlternateEndpoints = readStrings(d, m.AlternateEndpoints, MaxAlternateEndpoints, MaxEndpoint)
	for v := range seq.Decode(d, &m.FallbackStaggerMs, MaxFallbackStagger, 1) {
		*v = d.U32()
	}
	m.ServerTimeMs = d.U64()
}

// Validate implements wire.Message.
func (m *RegistrationAcceptedV1) Validate() error {
	const n = nameRegistrationAccepted
	if err := checkIDs(n, idField{"session", m.Session.ULID},
		idField{"transport_session", m.TransportSession.ULID}); err != nil {
		return err
	}
	if err := checkNonZero(n, numField{"epoch", m.Epoch}, numField{"heartbeat_interval_ms", uint64(m.HeartbeatIntervalMs)},
		numField{"lease_renew_interval_ms", uint64(m.LeaseRenewIntervalMs)}, numField{"max_backoff_ms", uint64(m.MaxBackoffMs)}); err != nil {
		return err
	}
	if len(m.FallbackStaggerMs) > MaxFallbackStagger {
		return invalid(n, "fallback_stagger_ms", "more elements than its bound")
	}
	if m.ServerTimeMs == 0 {
		return invalid(n, "server_time_ms", "zero")
	}
	return checkStrings(n, "alternate_endpoints", m.AlternateEndpoints, MaxAlternateEndpoints, MaxEndpoint)
}

// RegistrationRejectedV1 refuses a registration (§57, §252–254). Retry tells
// the agent whether and how to try again; ServerRange, when present, is the
// daemon's supported range (sent with ErrCodeUnsupportedVersion so the
// operator sees both ranges).
//
//	struct RegistrationRejectedV1 {
//	    code: u16,                          // wire.ProtocolErrorCode
//	    retry: RetryClass,
//	    message: String,                    // ≤ MaxRejectMessage (512) bytes, truncated on encode
//	    server_range: Option<ProtocolRange>,
//	}
//
// Validate: non-zero code (unknown codes from a newer peer are accepted),
// known retry class, a valid server_range when present. The message is safe
// operator text, never a secret or stack trace (§264).
type RegistrationRejectedV1 struct {
	Code           wire.ProtocolErrorCode
	Retry          wire.RetryClass
	Message        string
	HasServerRange bool
	ServerRange    wire.ProtocolRange
}

const nameRegistrationRejected = "agent.RegistrationRejectedV1"

// numRetryClasses mirrors wire's count of RetryClass values (RetryUnsupported+1).
const numRetryClasses = uint32(wire.RetryUnsupported) + 1

var maxRegistrationRejectedSize = maxsize.U16 + maxsize.Enum + maxsize.Bytes(MaxRejectMessage) + 1 + rangeMax

// MessageType implements wire.Message.
func (*RegistrationRejectedV1) MessageType() wire.MessageTypeId { return MsgRegistrationRejected }

// AppendPostcard implements wire.Message.
func (m *RegistrationRejectedV1) AppendPostcard(b []byte) []byte {
	b = postcard.AppendU16(b, uint16(m.Code))
	b = postcard.AppendVariant(b, uint32(m.Retry))
	b = postcard.AppendString(b, truncateText(m.Message, MaxRejectMessage))
	b = postcard.AppendOption(b, m.HasServerRange)
	if m.HasServerRange {
		b = m.ServerRange.AppendPostcard(b)
	}
	return b
}

// DecodePostcard implements wire.Message.
func (m *RegistrationRejectedV1) DecodePostcard(d *postcard.Decoder) {
	m.Code = wire.ProtocolErrorCode(d.U16())
	m.Retry = wire.RetryClass(d.Variant(numRetryClasses))
	m.Message = d.String(MaxRejectMessage)
	m.HasServerRange = d.Option()
	m.ServerRange = wire.ProtocolRange{}
	if m.HasServerRange {
		m.ServerRange.DecodePostcard(d)
	}
}

// Validate implements wire.Message.
func (m *RegistrationRejectedV1) Validate() error {
	const n = nameRegistrationRejected
	if m.Code == 0 {
		return invalid(n, "code", "zero")
	}
	if uint32(m.Retry) >= numRetryClasses {
		return invalid(n, "retry", "unknown retry class")
	}
	if err := checkText(n, "message", m.Message); err != nil {
		return err
	}
	if m.HasServerRange {
		return checkRange(n, "server_range", m.ServerRange)
	}
	if m.ServerRange != (wire.ProtocolRange{}) {
		return invalid(n, "server_range", "value set but Has flag false")
	}
	return nil
}
