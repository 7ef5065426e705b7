package admin

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
)

var sizeText = maxsize.Bytes(MaxText)

// Messages registers the admin family.
var Messages = []wire.MessageInfo{
	{Type: MsgDrain, Name: "admin.DrainV1", Since: wire.V(1, 0),
		MaxSize: sizeText + maxsize.U64,
		New:     func() wire.Message { return new(DrainV1) }},
	{Type: MsgResume, Name: "admin.ResumeV1", Since: wire.V(1, 0),
		MaxSize: 0,
		New:     func() wire.Message { return new(ResumeV1) }},
	{Type: MsgRefreshCapabilities, Name: "admin.RefreshCapabilitiesV1", Since: wire.V(1, 0),
		MaxSize: 0,
		New:     func() wire.Message { return new(RefreshCapabilitiesV1) }},
	{Type: MsgRunHealthProbe, Name: "admin.RunHealthProbeV1", Since: wire.V(1, 0),
		MaxSize: maxsize.Enum,
		New:     func() wire.Message { return new(RunHealthProbeV1) }},
	{Type: MsgAdminAck, Name: "admin.AdminAckV1", Since: wire.V(1, 0),
		MaxSize: maxsize.U16 + maxsize.Bool + sizeText,
		New:     func() wire.Message { return new(AdminAckV1) }},
}
