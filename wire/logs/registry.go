package logs

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
)

// MaxLogFrameSize bounds the encoded body of a LogFrameV1.
const MaxLogFrameSize = maxsize.U64 + maxsize.Enum + maxsize.U64 + 3 /* u32 ≤ 65536 */ + 3 /* len ≤ 65536 */ + MaxLogChunk

// Messages registers the logs family.
var Messages = []wire.MessageInfo{
	{Type: MsgLogStreamHeader, Name: "logs.LogStreamHeaderV1", Since: wire.V(1, 0),
		MaxSize: 2*maxsize.ID + maxsize.U64 + maxsize.Enum + maxsize.U64,
		New:     func() wire.Message { return new(LogStreamHeaderV1) }},
	{Type: MsgLogFrame, Name: "logs.LogFrameV1", Since: wire.V(1, 0),
		MaxSize: MaxLogFrameSize,
		New:     func() wire.Message { return new(LogFrameV1) }},
	{Type: MsgLogResumeRequest, Name: "logs.LogResumeRequestV1", Since: wire.V(1, 0),
		MaxSize: maxsize.ID + maxsize.U64,
		New:     func() wire.Message { return new(LogResumeRequestV1) }},
	{Type: MsgLogAck, Name: "logs.LogAckV1", Since: wire.V(1, 0),
		MaxSize: maxsize.ID + maxsize.U64,
		New:     func() wire.Message { return new(LogAckV1) }},
	{Type: MsgLogsFinalized, Name: "logs.LogsFinalizedV1", Since: wire.V(1, 0),
		MaxSize: 2*maxsize.ID + 4*maxsize.U64,
		New:     func() wire.Message { return new(LogsFinalizedV1) }},
	{Type: MsgLogsFinalizedAck, Name: "logs.LogsFinalizedAckV1", Since: wire.V(1, 0),
		MaxSize: maxsize.ID + maxsize.U64,
		New:     func() wire.Message { return new(LogsFinalizedAckV1) }},
}
