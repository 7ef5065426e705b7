package device

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

// Encoded-size maxima of the Postcard building blocks, used to derive each
// message's MaxSize from its field bounds.
const (
	sizeU32    = 5  // u32 varint
	sizeU64    = 10 // u64 varint
	sizeID     = 16 // ULID, [u8;16]
	sizeEnum   = 1  // enum discriminant below 128
	sizeOption = 1
	sizeRef    = sizeEnum + 32 + sizeU64 // CasObjectRef
)

// sizeString is the largest encoding of a string of at most max bytes.
func sizeString(max int) int { return postcard.UvarintLen(uint64(max)) + max }

var (
	sizeDevice = sizeString(MaxDeviceId)
	sizeInfo   = sizeDevice + sizeString(MaxModel) + sizeString(MaxPlatform) + sizeEnum
)

// Messages registers the device family.
var Messages = []wire.MessageInfo{
	{Type: MsgDiscover, Name: "device.DiscoverV1", Since: wire.V(1, 0),
		MaxSize: sizeOption + sizeString(MaxPlatform),
		New:     func() wire.Message { return new(DiscoverV1) }},
	{Type: MsgDiscoverResult, Name: "device.DiscoverResultV1", Since: wire.V(1, 0),
		MaxSize: postcard.UvarintLen(MaxDevices) + MaxDevices*sizeInfo,
		New:     func() wire.Message { return new(DiscoverResultV1) }},
	{Type: MsgReserve, Name: "device.ReserveV1", Since: wire.V(1, 0),
		MaxSize: sizeDevice + sizeID + sizeU32,
		New:     func() wire.Message { return new(ReserveV1) }},
	{Type: MsgReserveResult, Name: "device.ReserveResultV1", Since: wire.V(1, 0),
		MaxSize: sizeDevice + sizeEnum + sizeU64,
		New:     func() wire.Message { return new(ReserveResultV1) }},
	{Type: MsgInstall, Name: "device.InstallV1", Since: wire.V(1, 0),
		MaxSize: sizeDevice + sizeID + sizeRef,
		New:     func() wire.Message { return new(InstallV1) }},
	{Type: MsgInstallResult, Name: "device.InstallResultV1", Since: wire.V(1, 0),
		MaxSize: sizeDevice + sizeEnum + sizeString(MaxMessage),
		New:     func() wire.Message { return new(InstallResultV1) }},
	{Type: MsgRunTest, Name: "device.RunTestV1", Since: wire.V(1, 0),
		MaxSize: sizeDevice + sizeID + sizeString(MaxSuite) + sizeString(MaxFilter) + sizeU32,
		New:     func() wire.Message { return new(RunTestV1) }},
	{Type: MsgRunTestResult, Name: "device.RunTestResultV1", Since: wire.V(1, 0),
		MaxSize: sizeDevice + sizeEnum + 2*sizeU32 + sizeOption + sizeRef,
		New:     func() wire.Message { return new(RunTestResultV1) }},
	{Type: MsgReset, Name: "device.ResetV1", Since: wire.V(1, 0),
		MaxSize: sizeDevice + sizeID,
		New:     func() wire.Message { return new(ResetV1) }},
	{Type: MsgResetResult, Name: "device.ResetResultV1", Since: wire.V(1, 0),
		MaxSize: sizeDevice + sizeEnum,
		New:     func() wire.Message { return new(ResetResultV1) }},
}
