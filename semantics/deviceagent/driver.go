package deviceagent

import (
	"context"
	"io"

	"forgeyard.dev/transport/wire/device"
)

// Device is one device a driver manages.
type Device struct {
	ID       device.DeviceId
	Model    string // ≤ device.MaxModel bytes
	Platform string // 1..=device.MaxPlatform bytes, e.g. "android"
	Online   bool   // reachable; an offline device is listed but not reserved
}

// TestRun is one suite to run on a device.
type TestRun struct {
	Suite  string // a suite name inside the installed artifact (device.ValidSuite)
	Filter string // the suite runner's filter; empty runs every test
	// Log receives the run's output as it is produced; writes never block
	// for long (they are streamed to the daemon).
	Log io.Writer
}

// TestResult counts a finished run's tests.
type TestResult struct {
	Passed, Failed uint32
}

// DeviceDriver manages the devices attached to a device agent. The Agent
// calls it only for devices it reported, one operation per device at a
// time, and only under the device's current reservation; ctx ends with the
// operation's deadline or the transport.
type DeviceDriver interface {
	// Discover lists the attached devices.
	Discover(ctx context.Context) ([]Device, error)
	// Reserve prepares a device for exclusive use (claims it from other
	// tools); the Agent has already checked no other lease holds it.
	Reserve(ctx context.Context, id device.DeviceId) error
	// Install installs an artifact (verified against its digest) read from
	// r, and returns the installer's summary.
	Install(ctx context.Context, id device.DeviceId, r io.Reader) (string, error)
	// RunTest runs a suite of the installed artifact.
	RunTest(ctx context.Context, id device.DeviceId, run TestRun) (TestResult, error)
	// Reset returns the device to a clean state (uninstalls, wipes).
	Reset(ctx context.Context, id device.DeviceId) error
}
