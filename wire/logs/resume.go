package logs

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

// LogResumeRequestV1 asks the agent to resend an attempt's log from a
// sequence number after a reconnect (§86, §233). The agent replays from its
// spool starting at FromSeq; frames it no longer holds are reported as
// dropped in LogsFinalizedV1, never silently skipped.
//
//	struct LogResumeRequestV1 { attempt: [u8;16], from_seq: u64 }
type LogResumeRequestV1 struct {
	Attempt wire.JobAttemptId
	FromSeq uint64
}

// MessageType implements wire.Message.
func (*LogResumeRequestV1) MessageType() wire.MessageTypeId { return MsgLogResumeRequest }

// AppendPostcard implements wire.Message.
func (m *LogResumeRequestV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Attempt.ULID[:]...)
	return postcard.AppendU64(b, m.FromSeq)
}

// DecodePostcard implements wire.Message.
func (m *LogResumeRequestV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Attempt.ULID)
	m.FromSeq = d.U64()
}

// Validate implements wire.Message: the attempt is required.
func (m *LogResumeRequestV1) Validate() error {
	if m.Attempt.IsZero() {
		return errInvalid("log resume request: attempt is required")
	}
	return nil
}

// LogAckV1 is sent by the daemon to the agent: every frame of the attempt up
// to and including DurableSeq is durably stored, so the agent may release it
// from its spool.
//
//	struct LogAckV1 { attempt: [u8;16], durable_seq: u64 }
type LogAckV1 struct {
	Attempt    wire.JobAttemptId
	DurableSeq uint64
}

// MessageType implements wire.Message.
func (*LogAckV1) MessageType() wire.MessageTypeId { return MsgLogAck }

// AppendPostcard implements wire.Message. (LogResumeRequestV1 has the same
// layout, but its u64 is where to resend from, not what is stored: not one type.)
func (m *LogAckV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Attempt.ULID[:]...)
	return postcard.AppendU64(b, m.DurableSeq)
}

// DecodePostcard implements wire.Message.
func (m *LogAckV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Attempt.ULID)
	m.DurableSeq = d.U64()
}

// Validate implements wire.Message: the attempt is required.
func (m *LogAckV1) Validate() error {
	if m.Attempt.IsZero() {
		return errInvalid("log ack: attempt is required")
	}
	return nil
}
