package logs

import "forgeyard.dev/transport/wire"

// Encoded-size maxima of the Postcard building blocks, used to derive each
// message's MaxSize from its field bounds.
const (
	sizeU32  = 5  // u32 varint
	sizeU64  = 10 // u64 varint
	sizeID   = 16 // ULID, [u8;16]
	sizeEnum = 1  // enum discriminant below 128
)

// MaxLogFrameSize bounds the encoded body of a LogFrameV1.
const MaxLogFrameSize = sizeU64 + sizeEnum + sizeU64 + 3 /* u32 ≤ 65536 */ + 3 /* len ≤ 65536 */ + MaxLogChunk

// Messages registers the logs family.
var Messages = []wire.MessageInfo{
	{Type: MsgLogStreamHeader, Name: "logs.LogStreamHeaderV1", Since: wire.V(1, 0),
		MaxSize: 2*sizeID + sizeU64 + sizeEnum + sizeU64,
		New:     func() wire.Message { return new(LogStreamHeaderV1) }},
	{Type: MsgLogFrame, Name: "logs.LogFrameV1", Since: wire.V(1, 0),
		MaxSize: MaxLogFrameSize,
		New:     func() wire.Message { return new(LogFrameV1) }},
	{Type: MsgLogResumeRequest, Name: "logs.LogResumeRequestV1", Since: wire.V(1, 0),
		MaxSize: sizeID + sizeU64,
		New:     func() wire.Message { return new(LogResumeRequestV1) }},
	{Type: MsgLogAck, Name: "logs.LogAckV1", Since: wire.V(1, 0),
		MaxSize: sizeID + sizeU64,
		New:     func() wire.Message { return new(LogAckV1) }},
	{Type: MsgLogsFinalized, Name: "logs.LogsFinalizedV1", Since: wire.V(1, 0),
		MaxSize: 2*sizeID + 4*sizeU64,
		New:     func() wire.Message { return new(LogsFinalizedV1) }},
	{Type: MsgLogsFinalizedAck, Name: "logs.LogsFinalizedAckV1", Since: wire.V(1, 0),
		MaxSize: sizeID + sizeU64,
		New:     func() wire.Message { return new(LogsFinalizedAckV1) }},
}
