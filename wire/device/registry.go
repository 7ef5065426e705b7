package device

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
)

var (
	sizeDevice = maxsize.Bytes(MaxDeviceId)
	sizeInfo   = sizeDevice + maxsize.Bytes(MaxModel) + maxsize.Bytes(MaxPlatform) + maxsize.Enum
)

// Messages registers the device family.
var Messages = []wire.MessageInfo{
	{Type: MsgDiscover, Name: "device.DiscoverV1", Since: wire.V(1, 0),
		MaxSize: maxsize.Option + maxsize.Bytes(MaxPlatform),
		New:     func() wire.Message { return new(DiscoverV1) }},
	{Type: MsgDiscoverResult, Name: "device.DiscoverResultV1", Since: wire.V(1, 0),
		MaxSize: maxsize.Seq(MaxDevices, sizeInfo),
		New:     func() wire.Message { return new(DiscoverResultV1) }},
	{Type: MsgReserve, Name: "device.ReserveV1", Since: wire.V(1, 0),
		MaxSize: sizeDevice + maxsize.ID + maxsize.U32,
		New:     func() wire.Message { return new(ReserveV1) }},
	{Type: MsgReserveResult, Name: "device.ReserveResultV1", Since: wire.V(1, 0),
		MaxSize: sizeDevice + maxsize.Enum + maxsize.U64,
		New:     func() wire.Message { return new(ReserveResultV1) }},
	{Type: MsgInstall, Name: "device.InstallV1", Since: wire.V(1, 0),
		MaxSize: sizeDevice + maxsize.ID + maxsize.Ref,
		New:     func() wire.Message { return new(InstallV1) }},
	{Type: MsgInstallResult, Name: "device.InstallResultV1", Since: wire.V(1, 0),
		MaxSize: sizeDevice + maxsize.Enum + maxsize.Bytes(MaxMessage),
		New:     func() wire.Message { return new(InstallResultV1) }},
	{Type: MsgRunTest, Name: "device.RunTestV1", Since: wire.V(1, 0),
		MaxSize: sizeDevice + maxsize.ID + maxsize.Bytes(MaxSuite) + maxsize.Bytes(MaxFilter) + maxsize.U32,
		New:     func() wire.Message { return new(RunTestV1) }},
	{Type: MsgRunTestResult, Name: "device.RunTestResultV1", Since: wire.V(1, 0),
		MaxSize: sizeDevice + maxsize.Enum + 2*maxsize.U32 + maxsize.Option + maxsize.Ref,
		New:     func() wire.Message { return new(RunTestResultV1) }},
	{Type: MsgReset, Name: "device.ResetV1", Since: wire.V(1, 0),
		MaxSize: sizeDevice + maxsize.ID,
		New:     func() wire.Message { return new(ResetV1) }},
	{Type: MsgResetResult, Name: "device.ResetResultV1", Since: wire.V(1, 0),
		MaxSize: sizeDevice + maxsize.Enum,
		New:     func() wire.Message { return new(ResetResultV1) }},
}
