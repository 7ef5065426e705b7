package cas

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
)

var sizeBatch = maxsize.Seq(MaxBatch, maxsize.Ref)

// Messages registers the cas family.
var Messages = []wire.MessageInfo{
	{Type: MsgNeedObjects, Name: "cas.NeedObjectsV1", Since: wire.V(1, 0),
		MaxSize: maxsize.ID + sizeBatch,
		New:     func() wire.Message { return new(NeedObjectsV1) }},
	{Type: MsgMissingObjects, Name: "cas.MissingObjectsV1", Since: wire.V(1, 0),
		MaxSize: maxsize.ID + sizeBatch,
		New:     func() wire.Message { return new(MissingObjectsV1) }},
	{Type: MsgCasObjectStreamHeader, Name: "cas.CasObjectStreamHeaderV1", Since: wire.V(1, 0),
		MaxSize: maxsize.ID + maxsize.Ref + 2*maxsize.U64 + maxsize.Enum,
		New:     func() wire.Message { return new(CasObjectStreamHeaderV1) }},
	{Type: MsgCasRangeResumeRequest, Name: "cas.CasRangeResumeRequestV1", Since: wire.V(1, 0),
		MaxSize: maxsize.ID + maxsize.Ref + maxsize.U64,
		New:     func() wire.Message { return new(CasRangeResumeRequestV1) }},
	{Type: MsgCasFetchRequest, Name: "cas.CasFetchRequestV1", Since: wire.V(1, 0),
		MaxSize: maxsize.ID + maxsize.Ref + maxsize.U64,
		New:     func() wire.Message { return new(CasFetchRequestV1) }},
	{Type: MsgCasObjectAck, Name: "cas.CasObjectAckV1", Since: wire.V(1, 0),
		MaxSize: maxsize.ID + maxsize.Ref + maxsize.Enum + maxsize.U64,
		New:     func() wire.Message { return new(CasObjectAckV1) }},
	{Type: MsgOutputsFinalized, Name: "cas.OutputsFinalizedV1", Since: wire.V(1, 0),
		MaxSize: 2*maxsize.ID + sizeBatch,
		New:     func() wire.Message { return new(OutputsFinalizedV1) }},
}
