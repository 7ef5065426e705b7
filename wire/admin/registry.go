package admin

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

// Encoded-size maxima of the Postcard building blocks, used to derive each
// message's MaxSize from its field bounds.
const (
	sizeU16  = 3  // u16 varint
	sizeU64  = 10 // u64 varint
	sizeBool = 1
	sizeEnum = 1 // enum discriminant below 128
)

var sizeText = postcard.UvarintLen(MaxText) + MaxText

// Messages registers the admin family.
var Messages = []wire.MessageInfo{
	{Type: MsgDrain, Name: "admin.DrainV1", Since: wire.V(1, 0),
		MaxSize: sizeText + sizeU64,
		New:     func() wire.Message { return new(DrainV1) }},
	{Type: MsgResume, Name: "admin.ResumeV1", Since: wire.V(1, 0),
		MaxSize: 0,
		New:     func() wire.Message { return new(ResumeV1) }},
	{Type: MsgRefreshCapabilities, Name: "admin.RefreshCapabilitiesV1", Since: wire.V(1, 0),
		MaxSize: 0,
		New:     func() wire.Message { return new(RefreshCapabilitiesV1) }},
	{Type: MsgRunHealthProbe, Name: "admin.RunHealthProbeV1", Since: wire.V(1, 0),
		MaxSize: sizeEnum,
		New:     func() wire.Message { return new(RunHealthProbeV1) }},
	{Type: MsgAdminAck, Name: "admin.AdminAckV1", Since: wire.V(1, 0),
		MaxSize: sizeU16 + sizeBool + sizeText,
		New:     func() wire.Message { return new(AdminAckV1) }},
}
