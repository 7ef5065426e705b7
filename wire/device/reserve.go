package device

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

// ReserveV1 reserves a device for a lease for DurationMs milliseconds
// (§100); install, test and reset then require the same lease.
//
//	struct ReserveV1 { device: DeviceId, lease: [u8;16], duration_ms: u32 /* > 0 */ }
type ReserveV1 struct {
	Device     DeviceId
	Lease      wire.LeaseId
	DurationMs uint32
}

// MessageType implements wire.Message.
func (*ReserveV1) MessageType() wire.MessageTypeId { return MsgReserve }

// AppendPostcard implements wire.Message.
func (m *ReserveV1) AppendPostcard(b []byte) []byte {
	b = appendOperation(b, m.Device, &m.Lease)
	return postcard.AppendU32(b, m.DurationMs)
}

// DecodePostcard implements wire.Message.
func (m *ReserveV1) DecodePostcard(d *postcard.Decoder) {
	m.Device = readOperation(d, &m.Lease)
	m.DurationMs = d.U32()
}

// Validate implements wire.Message: a valid device id, a lease and a non-zero
// duration are required.
func (m *ReserveV1) Validate() error {
	if err := checkOperation("reserve", m.Device, m.Lease); err != nil {
		return err
	}
	if m.DurationMs == 0 {
		return errInvalid("reserve: zero duration")
	}
	return nil
}

// ReserveResultV1 answers ReserveV1. When Outcome is OutcomeOk,
// ReservationExpiresMs is the reservation's expiry in unix milliseconds
// (non-zero); otherwise it is 0.
//
//	struct ReserveResultV1 { device: DeviceId, outcome: DeviceOutcome, reservation_expires_ms: u64 }
type ReserveResultV1 struct {
	Device               DeviceId
	Outcome              DeviceOutcome
	ReservationExpiresMs uint64
}

// Alike in shape to the other results (InstallResultV1, ResetResultV1), but
// each answers its own operation: one head (appendResult), separate
// messages of the API.

// MessageType implements wire.Message.
func (*ReserveResultV1) MessageType() wire.MessageTypeId { return MsgReserveResult }

// AppendPostcard implements wire.Message.
func (m *ReserveResultV1) AppendPostcard(b []byte) []byte {
	b = appendResult(b, m.Device, m.Outcome)
	return postcard.AppendU64(b, m.ReservationExpiresMs)
}

// DecodePostcard implements wire.Message.
func (m *ReserveResultV1) DecodePostcard(d *postcard.Decoder) {
	m.Device, m.Outcome = readResult(d)
	m.ReservationExpiresMs = d.U64()
}

// Validate implements wire.Message: a valid device id and a known outcome;
// an expiry exactly when the reservation succeeded.
func (m *ReserveResultV1) Validate() error {
	if err := checkResult("reserve result", m.Device, m.Outcome); err != nil {
		return err
	}
	if (m.Outcome == OutcomeOk) != (m.ReservationExpiresMs != 0) {
		return errInvalid("reserve result: expiry must be set exactly when the outcome is Ok")
	}
	return nil
}

// ResetV1 returns a reserved device to a clean state and ends the lease's
// reservation (§100).
//
//	struct ResetV1 { device: DeviceId, lease: [u8;16] }
type ResetV1 struct {
	Device DeviceId
	Lease  wire.LeaseId
}

// MessageType implements wire.Message.
func (*ResetV1) MessageType() wire.MessageTypeId { return MsgReset }

// AppendPostcard implements wire.Message.
func (m *ResetV1) AppendPostcard(b []byte) []byte {
	return appendOperation(b, m.Device, &m.Lease)
}

// DecodePostcard implements wire.Message.
func (m *ResetV1) DecodePostcard(d *postcard.Decoder) {
	m.Device = readOperation(d, &m.Lease)
}

// Validate implements wire.Message: a valid device id and a lease are
// required.
func (m *ResetV1) Validate() error {
	if err := checkOperation("reset", m.Device, m.Lease); err != nil {
		return err
	}
	return nil
}

// ResetResultV1 answers ResetV1.
//
//	struct ResetResultV1 { device: DeviceId, outcome: DeviceOutcome }
type ResetResultV1 struct {
	Device  DeviceId
	Outcome DeviceOutcome
}

// MessageType implements wire.Message.
func (*ResetResultV1) MessageType() wire.MessageTypeId { return MsgResetResult }

// AppendPostcard implements wire.Message.
func (m *ResetResultV1) AppendPostcard(b []byte) []byte {
	return appendResult(b, m.Device, m.Outcome)
}

// DecodePostcard implements wire.Message.
func (m *ResetResultV1) DecodePostcard(d *postcard.Decoder) {
	m.Device, m.Outcome = readResult(d)
}

// Validate implements wire.Message: a valid device id and a known outcome.
func (m *ResetResultV1) Validate() error {
	if err := checkResult("reset result", m.Device, m.Outcome); err != nil {
		return err
	}
	return nil
}
