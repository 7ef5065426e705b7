package health

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
)

var (
	sizeCheck   = maxsize.Bytes(MaxCheckName) + maxsize.Enum + maxsize.Bytes(MaxCheckMessage)
	sizeSummary = maxsize.Enum + maxsize.Seq(MaxChecks, sizeCheck) + maxsize.U64
)

// Messages registers the health family.
var Messages = []wire.MessageInfo{
	{Type: MsgHealthSummary, Name: "health.HealthSummaryV1", Since: wire.V(1, 0),
		MaxSize: sizeSummary,
		New:     func() wire.Message { return new(HealthSummaryV1) }},
	{Type: MsgProbeRequest, Name: "health.ProbeRequestV1", Since: wire.V(1, 0),
		MaxSize: maxsize.Enum,
		New:     func() wire.Message { return new(ProbeRequestV1) }},
	{Type: MsgProbeResponse, Name: "health.ProbeResponseV1", Since: wire.V(1, 0),
		MaxSize: maxsize.Enum + sizeSummary + maxsize.U32,
		New:     func() wire.Message { return new(ProbeResponseV1) }},
}
