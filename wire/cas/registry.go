package cas

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

// Encoded-size maxima of the Postcard building blocks, used to derive each
// message's MaxSize from its field bounds.
const (
	sizeU64  = 10                      // u64 varint
	sizeID   = 16                      // ULID, [u8;16]
	sizeEnum = 1                       // enum discriminant below 128
	sizeRef  = sizeEnum + 32 + sizeU64 // CasObjectRef
)

var sizeBatch = postcard.UvarintLen(MaxBatch) + MaxBatch*sizeRef

// Messages registers the cas family.
var Messages = []wire.MessageInfo{
	{Type: MsgNeedObjects, Name: "cas.NeedObjectsV1", Since: wire.V(1, 0),
		MaxSize: sizeID + sizeBatch,
		New:     func() wire.Message { return new(NeedObjectsV1) }},
	{Type: MsgMissingObjects, Name: "cas.MissingObjectsV1", Since: wire.V(1, 0),
		MaxSize: sizeID + sizeBatch,
		New:     func() wire.Message { return new(MissingObjectsV1) }},
	{Type: MsgCasObjectStreamHeader, Name: "cas.CasObjectStreamHeaderV1", Since: wire.V(1, 0),
		MaxSize: sizeID + sizeRef + 2*sizeU64 + sizeEnum,
		New:     func() wire.Message { return new(CasObjectStreamHeaderV1) }},
	{Type: MsgCasRangeResumeRequest, Name: "cas.CasRangeResumeRequestV1", Since: wire.V(1, 0),
		MaxSize: sizeID + sizeRef + sizeU64,
		New:     func() wire.Message { return new(CasRangeResumeRequestV1) }},
	{Type: MsgCasFetchRequest, Name: "cas.CasFetchRequestV1", Since: wire.V(1, 0),
		MaxSize: sizeID + sizeRef + sizeU64,
		New:     func() wire.Message { return new(CasFetchRequestV1) }},
	{Type: MsgCasObjectAck, Name: "cas.CasObjectAckV1", Since: wire.V(1, 0),
		MaxSize: sizeID + sizeRef + sizeEnum + sizeU64,
		New:     func() wire.Message { return new(CasObjectAckV1) }},
	{Type: MsgOutputsFinalized, Name: "cas.OutputsFinalizedV1", Since: wire.V(1, 0),
		MaxSize: 2*sizeID + sizeBatch,
		New:     func() wire.Message { return new(OutputsFinalizedV1) }},
}
