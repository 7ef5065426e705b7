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
	return appendAttemptSeq(b, &m.Attempt, m.FromSeq)
}

// DecodePostcard implements wire.Message.
func (m *LogResumeRequestV1) DecodePostcard(d *postcard.Decoder) {
	m.FromSeq = decodeAttemptSeq(d, &m.Attempt)
}

// Validate implements wire.Message: the attempt is required.
func (m *LogResumeRequestV1) Validate() error {
	return checkAttempt("log resume request", m.Attempt)
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

// Alike in shape to LogResumeRequestV1 and LogsFinalizedAckV1, but the
// sequence number means another thing in each: one layout
// (appendAttemptSeq), three messages of the API.

// MessageType implements wire.Message.
func (*LogAckV1) MessageType() wire.MessageTypeId { return MsgLogAck }

// AppendPostcard implements wire.Message.
func (m *LogAckV1) AppendPostcard(b []byte) []byte {
	return appendAttemptSeq(b, &m.Attempt, m.DurableSeq)
}

// DecodePostcard implements wire.Message.
func (m *LogAckV1) DecodePostcard(d *postcard.Decoder) {
	m.DurableSeq = decodeAttemptSeq(d, &m.Attempt)
}

// Validate implements wire.Message: the attempt is required.
func (m *LogAckV1) Validate() error {
	return checkAttempt("log ack", m.Attempt)
}

// LogResumeRequestV1, LogAckV1 and LogsFinalizedAckV1 share one layout,
// {attempt: [u8;16], u64}, and one rule, the attempt is required: the
// functions below encode, decode and check them once. They stay three
// types: the u64 is where to resend from, what is durably stored, and the
// last frame of a finalized log.
func appendAttemptSeq(b []byte, attempt *wire.JobAttemptId, seq uint64) []byte {
	b = append(b, attempt.ULID[:]...)
	return postcard.AppendU64(b, seq)
}

// decodeAttemptSeq reads the layout into attempt and returns the u64.
func decodeAttemptSeq(d *postcard.Decoder, attempt *wire.JobAttemptId) uint64 {
	wire.ReadULID(d, &attempt.ULID)
	return d.U64()
}

// checkAttempt reports "<what>: attempt is required" for a zero attempt.
func checkAttempt(what string, attempt wire.JobAttemptId) error {
	if attempt.IsZero() {
		return errInvalid(what + ": attempt is required")
	}
	return nil
}
