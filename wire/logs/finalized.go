package logs

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

// LogsFinalizedV1 is the agent's log finalization barrier (§243): no frame
// after LastSeq will be sent for the attempt. Frames the agent's bounded spool
// had to drop are counted here, so a loss is always reported, never silent.
//
//	struct LogsFinalizedV1 {
//	    attempt: [u8;16], lease: [u8;16],
//	    last_seq: u64,        // sequence of the last frame sent
//	    total_bytes: u64,     // uncompressed log bytes produced by the attempt
//	    dropped_frames: u64,  // frames dropped by the spool
//	    dropped_bytes: u64,   // uncompressed bytes in those frames
//	}
type LogsFinalizedV1 struct {
	Attempt       wire.JobAttemptId
	Lease         wire.LeaseId
	LastSeq       uint64
	TotalBytes    uint64
	DroppedFrames uint64
	DroppedBytes  uint64
}

// MessageType implements wire.Message.
func (*LogsFinalizedV1) MessageType() wire.MessageTypeId { return MsgLogsFinalized }

// AppendPostcard implements wire.Message.
func (m *LogsFinalizedV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Attempt.ULID[:]...)
	b = append(b, m.Lease.ULID[:]...)
	b = postcard.AppendU64(b, m.LastSeq)
	b = postcard.AppendU64(b, m.TotalBytes)
	b = postcard.AppendU64(b, m.DroppedFrames)
	return postcard.AppendU64(b, m.DroppedBytes)
}

// DecodePostcard implements wire.Message.
func (m *LogsFinalizedV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Attempt.ULID)
	wire.ReadULID(d, &m.Lease.ULID)
	m.LastSeq = d.U64()
	m.TotalBytes = d.U64()
	m.DroppedFrames = d.U64()
	m.DroppedBytes = d.U64()
}

// Validate implements wire.Message: attempt and lease are required, dropped
// bytes imply dropped frames, and the dropped bytes are part of the total.
func (m *LogsFinalizedV1) Validate() error {
	if m.Attempt.IsZero() || m.Lease.IsZero() {
		return errInvalid("logs finalized: attempt and lease are required")
	}
	if m.DroppedBytes > 0 && m.DroppedFrames == 0 {
		return errInvalid("logs finalized: dropped bytes without dropped frames")
	}
	if m.DroppedBytes > m.TotalBytes {
		return errInvalid("logs finalized: dropped bytes exceed total bytes")
	}
	return nil
}

// LogsFinalizedAckV1 is the daemon's acknowledgement of LogsFinalizedV1: the
// log of the attempt is durable up to LastSeq.
//
//	struct LogsFinalizedAckV1 { attempt: [u8;16], last_seq: u64 }
type LogsFinalizedAckV1 struct {
	Attempt wire.JobAttemptId
	LastSeq uint64
}

// MessageType implements wire.Message.
func (*LogsFinalizedAckV1) MessageType() wire.MessageTypeId { return MsgLogsFinalizedAck }

// AppendPostcard implements wire.Message (the layout of LogAckV1, resume.go).
func (m *LogsFinalizedAckV1) AppendPostcard(b []byte) []byte {
	return appendAttemptSeq(b, &m.Attempt, m.LastSeq)
}

// DecodePostcard implements wire.Message.
func (m *LogsFinalizedAckV1) DecodePostcard(d *postcard.Decoder) {
	m.LastSeq = decodeAttemptSeq(d, &m.Attempt)
}

// Validate implements wire.Message: the attempt is required.
func (m *LogsFinalizedAckV1) Validate() error {
	return checkAttempt("logs finalized ack", m.Attempt)
}
