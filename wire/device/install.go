package device

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/check"
	"forgeyard.dev/transport/wire/postcard"
)

// InstallV1 installs a CAS artifact of the lease (an app package, a firmware
// image) on a reserved device (§100). The device agent fetches the artifact
// through the cas family, verifying its digest, before installing it.
//
//	struct InstallV1 { device: DeviceId, lease: [u8;16], artifact: CasObjectRef }
type InstallV1 struct {
	Device   DeviceId
	Lease    wire.LeaseId
	Artifact wire.CasObjectRef
}

// MessageType implements wire.Message.
func (*InstallV1) MessageType() wire.MessageTypeId { return MsgInstall }

// AppendPostcard implements wire.Message.
func (m *InstallV1) AppendPostcard(b []byte) []byte {
	b = appendOperation(b, m.Device, &m.Lease)
	return m.Artifact.AppendPostcard(b)
}

// DecodePostcard implements wire.Message.
func (m *InstallV1) DecodePostcard(d *postcard.Decoder) {
	m.Device = readOperation(d, &m.Lease)
	m.Artifact.DecodePostcard(d)
}

// Validate implements wire.Message: a valid device id, a lease and a valid
// artifact reference are required.
func (m *InstallV1) Validate() error {
	if err := checkOperation("install", m.Device, m.Lease); err != nil {
		return err
	}
	if !check.ValidRef(&m.Artifact) {
		return errInvalid("install: artifact with unknown algorithm or zero digest")
	}
	return nil
}

// InstallResultV1 answers InstallV1; Message is operator text (the installer's
// summary or why it failed), no secrets (§212).
//
//	struct InstallResultV1 { device: DeviceId, outcome: DeviceOutcome, message: String /* ≤ 256 */ }
type InstallResultV1 struct {
	Device  DeviceId
	Outcome DeviceOutcome
	Message string
}

// MessageType implements wire.Message.
func (*InstallResultV1) MessageType() wire.MessageTypeId { return MsgInstallResult }

// AppendPostcard implements wire.Message.
func (m *InstallResultV1) AppendPostcard(b []byte) []byte {
	b = appendResult(b, m.Device, m.Outcome)
	return postcard.AppendString(b, m.Message)
}

// DecodePostcard implements wire.Message.
func (m *InstallResultV1) DecodePostcard(d *postcard.Decoder) {
	m.Device, m.Outcome = readResult(d)
	m.Message = d.String(MaxMessage)
}

// Validate implements wire.Message: a valid device id, a known outcome and a
// message of at most MaxMessage bytes of UTF-8.
func (m *InstallResultV1) Validate() error {
	if err := checkResult("install result", m.Device, m.Outcome); err != nil {
		return err
	}
	if !validText(m.Message, MaxMessage, false) {
		return errInvalid("install result: message must be ≤ 256 bytes of printable UTF-8")
	}
	return nil
}
