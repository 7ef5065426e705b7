// Package device holds the V1 device-agent family (family 7, §100): typed
// operations on attached test devices — discover, reserve, install an
// artifact, run a named test suite, reset — and their results.
//
// Like admin (§98), this family carries no command line: a test run names a
// suite inside the leased artifact and an optional filter, never a program
// or arguments. Every operation but discovery names the lease that
// authorizes it.
//
// Every message is a wire type, distinct from the domain types built from it
// after Validate (§34, §260). Type numbers are explicit and stable
// (§159–160): never renumber, never reuse. Every length is bounded by a named
// constant that both Validate and the decoder enforce. AppendPostcard encodes
// exactly what it is given and never allocates beyond growing its buffer;
// call Validate before encoding a value built locally. Validate errors match
// postcard.ErrInvalidValue under errors.Is.
package device

import (
	"log/slog"
	"unicode"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/check"
	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/postcard"
)

// Alike in shape to the other families' id, type-number list and errInvalid,
// but each is its own family's frozen numbering and error prefix (API).
func id(v uint8) wire.MessageTypeId { return wire.TypeID(wire.FamilyDevice, v) }

// Message type numbers of the device family (family 7). Frozen.
var (
	MsgDiscover       = id(0x01)
	MsgDiscoverResult = id(0x02)
	MsgReserve        = id(0x03)
	MsgReserveResult  = id(0x04)
	MsgInstall        = id(0x05)
	MsgInstallResult  = id(0x06)
	MsgRunTest        = id(0x07)
	MsgRunTestResult  = id(0x08)
	MsgReset          = id(0x09)
	MsgResetResult    = id(0x0a)
)

// Bounds of the device family, in bytes or elements.
const (
	MaxDeviceId = 64  // DeviceId, bytes
	MaxModel    = 64  // DeviceInfoV1.Model, bytes
	MaxPlatform = 32  // DeviceInfoV1.Platform and DiscoverV1.PlatformFilter, bytes
	MaxDevices  = 256 // DiscoverResultV1.Devices, elements
	MaxSuite    = 128 // RunTestV1.Suite, bytes
	MaxFilter   = 256 // RunTestV1.Filter, bytes
	MaxMessage  = 256 // InstallResultV1.Message, bytes
)

// DeviceId names a device attached to a device agent: 1..=64 bytes of
// [A-Za-z0-9._:-] (a serial number, a USB path, a simulator UDID). On the
// wire it is a String.
type DeviceId string

// Valid reports whether id is 1..=MaxDeviceId bytes of [A-Za-z0-9._:-].
func (id DeviceId) Valid() bool {
	if len(id) == 0 || len(id) > MaxDeviceId {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

func appendDeviceId(b []byte, id DeviceId) []byte { return postcard.AppendString(b, string(id)) }

func readDeviceId(d *postcard.Decoder) DeviceId { return DeviceId(d.String(MaxDeviceId)) }

// DeviceState is a device's availability. Postcard enum.
type DeviceState uint32

// Device states.
const (
	StateAvailable DeviceState = 0 // attached, idle, not reserved
	StateReserved  DeviceState = 1 // reserved by a lease
	StateBusy      DeviceState = 2 // installing, testing or resetting
	StateOffline   DeviceState = 3 // known but not reachable

	numDeviceStates = 4
)

// String returns the state's name (Available, Reserved, …).
func (s DeviceState) String() string { return enum.Name(deviceStateNames[:], s, "DeviceState") }

var deviceStateNames = [...]string{
	StateAvailable: "Available", StateReserved: "Reserved", StateBusy: "Busy",
	StateOffline: "Offline",
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (s DeviceState) LogValue() slog.Value { return slog.StringValue(s.String()) }

// DeviceOutcome is the result of one device operation. Postcard enum.
type DeviceOutcome uint32

// Device operation outcomes.
const (
	OutcomeOk       DeviceOutcome = 0 // the operation completed
	OutcomeNotFound DeviceOutcome = 1 // no such device
	OutcomeBusy     DeviceOutcome = 2 // reserved by another lease or in use
	OutcomeFailed   DeviceOutcome = 3 // the operation failed on the device
	OutcomeTimeout  DeviceOutcome = 4 // the operation did not finish in time

	numDeviceOutcomes = 5
)

// String returns the outcome's name (Ok, NotFound, …).
func (o DeviceOutcome) String() string { return enum.Name(deviceOutcomeNames[:], o, "DeviceOutcome") }

var deviceOutcomeNames = [...]string{
	OutcomeOk: "Ok", OutcomeNotFound: "NotFound", OutcomeBusy: "Busy", OutcomeFailed: "Failed",
	OutcomeTimeout: "Timeout",
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (o DeviceOutcome) LogValue() slog.Value { return slog.StringValue(o.String()) }

// errInvalid reports a Validate failure. It matches postcard.ErrInvalidValue
// under errors.Is.
func errInvalid(what string) error { return check.Invalid("device", what) }

// Every device operation (InstallV1, ReserveV1, RunTestV1, ResetV1) opens
// with {device: DeviceId, lease: [u8;16]} and every operation result with
// {device: DeviceId, outcome: DeviceOutcome}; appendOperation, readOperation
// and checkOperation, and appendResult, readResult and checkResult, encode,
// decode and validate those heads once.

func appendOperation(b []byte, device DeviceId, lease *wire.LeaseId) []byte {
	b = appendDeviceId(b, device)
	return append(b, lease.ULID[:]...)
}

// readOperation reads an operation's head into lease and returns the device.
func readOperation(d *postcard.Decoder, lease *wire.LeaseId) DeviceId {
	device := readDeviceId(d)
	wire.ReadULID(d, &lease.ULID)
	return device
}

func appendResult(b []byte, device DeviceId, outcome DeviceOutcome) []byte {
	b = appendDeviceId(b, device)
	return postcard.AppendVariant(b, uint32(outcome))
}

func readResult(d *postcard.Decoder) (DeviceId, DeviceOutcome) {
	device := readDeviceId(d)
	return device, DeviceOutcome(d.Variant(numDeviceOutcomes))
}

// checkOperation validates what every device operation names: a valid
// device id and the lease that authorizes the operation. op names the
// message in the error ("install", "run test").
func checkOperation(op string, device DeviceId, lease wire.LeaseId) error {
	if !device.Valid() {
		return errInvalid(op + ": invalid device id")
	}
	if lease.IsZero() {
		return errInvalid(op + ": lease is required")
	}
	return nil
}

// checkResult validates what every operation result names: a valid device
// id and a known outcome. op names the message in the error ("install
// result").
func checkResult(op string, device DeviceId, outcome DeviceOutcome) error {
	if !device.Valid() {
		return errInvalid(op + ": invalid device id")
	}
	if outcome >= numDeviceOutcomes {
		return errInvalid(op + ": unknown outcome")
	}
	return nil
}

// validText reports whether s is at most max bytes of UTF-8 without control
// characters (so that no newline or NUL reaches a device tool), and non-empty
// when required.
func validText(s string, max int, required bool) bool {
	if !check.Text(s, max, required) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}
