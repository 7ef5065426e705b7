package device

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/seq"
	"forgeyard.dev/transport/wire/postcard"
)

// DeviceInfoV1 describes one attached device.
//
//	struct DeviceInfoV1 {
//	    id: DeviceId,          // String, 1..=64 bytes of [A-Za-z0-9._:-]
//	    model: String,         // ≤ 64 bytes
//	    platform: String,      // 1..=32 bytes, e.g. "android", "ios"
//	    state: DeviceState,    // Available=0, Reserved=1, Busy=2, Offline=3
//	}
type DeviceInfoV1 struct {
	ID       DeviceId
	Model    string
	Platform string
	State    DeviceState
}

const deviceInfoMinSize = 1 + 1 + 1 + 1

func (i *DeviceInfoV1) appendPostcard(b []byte) []byte {
	b = appendDeviceId(b, i.ID)
	b = postcard.AppendString(b, i.Model)
	b = postcard.AppendString(b, i.Platform)
	return postcard.AppendVariant(b, uint32(i.State))
}

func (i *DeviceInfoV1) decodePostcard(d *postcard.Decoder) {
	i.ID = readDeviceId(d)
	i.Model = d.String(MaxModel)
	i.Platform = d.String(MaxPlatform)
	i.State = DeviceState(d.Variant(numDeviceStates))
}

func (i *DeviceInfoV1) validate() error {
	if !i.ID.Valid() {
		return errInvalid("device info: invalid device id")
	}
	if !validText(i.Model, MaxModel, false) {
		return errInvalid("device info: model must be ≤ 64 bytes of printable UTF-8")
	}
	if !validText(i.Platform, MaxPlatform, true) {
		return errInvalid("device info: platform must be 1..=32 bytes of printable UTF-8")
	}
	if i.State >= numDeviceStates {
		return errInvalid("device info: unknown state")
	}
	return nil
}

// DiscoverV1 asks a device agent for its attached devices, optionally only
// those of one platform (§100).
//
//	struct DiscoverV1 { platform_filter: Option<String /* 1..=32 */> }
//
// HasPlatformFilter is the Option tag; without it PlatformFilter must be
// empty.
type DiscoverV1 struct {
	HasPlatformFilter bool
	PlatformFilter    string
}

// MessageType implements wire.Message.
func (*DiscoverV1) MessageType() wire.MessageTypeId { return MsgDiscover }

// AppendPostcard implements wire.Message.
func (m *DiscoverV1) AppendPostcard(b []byte) []byte {
	b = postcard.AppendOption(b, m.HasPlatformFilter)
	if m.HasPlatformFilter {
		b = postcard.AppendString(b, m.PlatformFilter)
	}
	return b
}

// DecodePostcard implements wire.Message.
func (m *DiscoverV1) DecodePostcard(d *postcard.Decoder) {
	m.HasPlatformFilter = d.Option()
	m.PlatformFilter = ""
	if m.HasPlatformFilter {
		m.PlatformFilter = d.String(MaxPlatform)
	}
}

// Validate implements wire.Message: a present filter is 1..=MaxPlatform bytes
// of printable UTF-8; an absent one is empty.
func (m *DiscoverV1) Validate() error {
	if !m.HasPlatformFilter {
		if m.PlatformFilter != "" {
			return errInvalid("discover: platform filter set without its option tag")
		}
		return nil
	}
	if !validText(m.PlatformFilter, MaxPlatform, true) {
		return errInvalid("discover: platform filter must be 1..=32 bytes of printable UTF-8")
	}
	return nil
}

// DiscoverResultV1 lists the devices a device agent has attached.
//
//	struct DiscoverResultV1 { devices: Vec<DeviceInfoV1> /* ≤ 256, unique ids */ }
type DiscoverResultV1 struct {
	Devices []DeviceInfoV1
}

// MessageType implements wire.Message.
func (*DiscoverResultV1) MessageType() wire.MessageTypeId { return MsgDiscoverResult }

// AppendPostcard implements wire.Message.
func (m *DiscoverResultV1) AppendPostcard(b []byte) []byte {
	return seq.Append(b, m.Devices, (*DeviceInfoV1).appendPostcard)
}

// DecodePostcard implements wire.Message. It reuses the capacity of
// m.Devices.
func (m *DiscoverResultV1) DecodePostcard(d *postcard.Decoder) {
	for i := range seq.Decode(d, &m.Devices, MaxDevices, deviceInfoMinSize) {
		i.decodePostcard(d)
	}
}

// Validate implements wire.Message: at most MaxDevices valid devices with
// unique ids.
func (m *DiscoverResultV1) Validate() error {
	if len(m.Devices) > MaxDevices {
		return errInvalid("discover result: more than 256 devices")
	}
	var seen map[DeviceId]bool
	for i := range m.Devices {
		if err := m.Devices[i].validate(); err != nil {
			return err
		}
		if seen == nil {
			seen = make(map[DeviceId]bool, len(m.Devices))
		}
		if seen[m.Devices[i].ID] {
			return errInvalid("discover result: duplicate device id")
		}
		seen[m.Devices[i].ID] = true
	}
	return nil
}
