package health

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

// Encoded-size maxima of the Postcard building blocks, used to derive each
// message's MaxSize from its field bounds.
const (
	sizeU32  = 5  // u32 varint
	sizeU64  = 10 // u64 varint
	sizeEnum = 1  // enum discriminant below 128
)

func sizeString(max int) int { return postcard.UvarintLen(uint64(max)) + max }

var (
	sizeCheck   = sizeString(MaxCheckName) + sizeEnum + sizeString(MaxCheckMessage)
	sizeSummary = sizeEnum + postcard.UvarintLen(MaxChecks) + MaxChecks*sizeCheck + sizeU64
)

// Messages registers the health family.
var Messages = []wire.MessageInfo{
	{Type: MsgHealthSummary, Name: "health.HealthSummaryV1", Since: wire.V(1, 0),
		MaxSize: sizeSummary,
		New:     func() wire.Message { return new(HealthSummaryV1) }},
	{Type: MsgProbeRequest, Name: "health.ProbeRequestV1", Since: wire.V(1, 0),
		MaxSize: sizeEnum,
		New:     func() wire.Message { return new(ProbeRequestV1) }},
	{Type: MsgProbeResponse, Name: "health.ProbeResponseV1", Since: wire.V(1, 0),
		MaxSize: sizeEnum + sizeSummary + sizeU32,
		New:     func() wire.Message { return new(ProbeResponseV1) }},
}
