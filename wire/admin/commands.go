package admin

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/health"
	"forgeyard.dev/transport/wire/internal/check"
	"forgeyard.dev/transport/wire/postcard"
)

// DrainV1 tells an agent to accept no new leases and to let running attempts
// finish (§97). DeadlineMs is the time, in milliseconds from receipt, the
// agent is given before it cancels what still runs; 0 means no deadline.
// Reason is operator text shown by the agent; no secrets (§212).
//
//	struct DrainV1 { reason: String /* ≤ 256 */, deadline_ms: u64 }
type DrainV1 struct {
	Reason     string
	DeadlineMs uint64
}

// MessageType implements wire.Message.
func (*DrainV1) MessageType() wire.MessageTypeId { return MsgDrain }

// AppendPostcard implements wire.Message.
func (m *DrainV1) AppendPostcard(b []byte) []byte {
	b = postcard.AppendString(b, m.Reason)
	return postcard.AppendU64(b, m.DeadlineMs)
}

// DecodePostcard implements wire.Message.
func (m *DrainV1) DecodePostcard(d *postcard.Decoder) {
	m.Reason = d.String(MaxText)
	m.DeadlineMs = d.U64()
}

// Validate implements wire.Message: Reason is at most MaxText bytes of UTF-8.
func (m *DrainV1) Validate() error {
	if !check.Text(m.Reason, MaxText, false) {
		return errInvalid("drain: reason must be ≤ 256 bytes of UTF-8")
	}
	return nil
}

// ResumeV1 ends a drain: the agent accepts leases again (§97).
//
//	struct ResumeV1 {}
type ResumeV1 struct{}

// MessageType implements wire.Message.
func (*ResumeV1) MessageType() wire.MessageTypeId { return MsgResume }

// AppendPostcard implements wire.Message; the body is empty.
func (*ResumeV1) AppendPostcard(b []byte) []byte { return b }

// DecodePostcard implements wire.Message; the body is empty.
func (*ResumeV1) DecodePostcard(*postcard.Decoder) {}

// Validate implements wire.Message; an empty message is always valid.
func (*ResumeV1) Validate() error { return nil }

// RefreshCapabilitiesV1 asks the agent to rescan its capabilities and send a
// CapabilityUpdateV1 if they changed (§94, §97).
//
//	struct RefreshCapabilitiesV1 {}
type RefreshCapabilitiesV1 struct{}

// MessageType implements wire.Message.
func (*RefreshCapabilitiesV1) MessageType() wire.MessageTypeId { return MsgRefreshCapabilities }

// AppendPostcard implements wire.Message; the body is empty.
func (*RefreshCapabilitiesV1) AppendPostcard(b []byte) []byte { return b }

// DecodePostcard implements wire.Message; the body is empty.
func (*RefreshCapabilitiesV1) DecodePostcard(*postcard.Decoder) {}

// Validate implements wire.Message; an empty message is always valid.
func (*RefreshCapabilitiesV1) Validate() error { return nil }

// RunHealthProbeV1 asks the agent to run one of its built-in health probes
// (§96–97) and report the result as a health.ProbeResponseV1. The probe is a
// fixed kind, never a program to run.
//
//	struct RunHealthProbeV1 { probe: health::ProbeKind }  // Connectivity=0, Disk=1, Clock=2, Full=3
type RunHealthProbeV1 struct {
	Probe health.ProbeKind
}

// MessageType implements wire.Message.
func (*RunHealthProbeV1) MessageType() wire.MessageTypeId { return MsgRunHealthProbe }

// AppendPostcard implements wire.Message.
func (m *RunHealthProbeV1) AppendPostcard(b []byte) []byte { return m.Probe.AppendPostcard(b) }

// DecodePostcard implements wire.Message.
func (m *RunHealthProbeV1) DecodePostcard(d *postcard.Decoder) {
	m.Probe = health.DecodeProbeKind(d)
}

// Validate implements wire.Message: the probe kind must be known.
func (m *RunHealthProbeV1) Validate() error {
	if !m.Probe.Valid() {
		return errInvalid("run health probe: unknown probe kind")
	}
	return nil
}
