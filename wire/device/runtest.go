package device

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/check"
	"forgeyard.dev/transport/wire/postcard"
)

// ValidSuite reports whether s is a test-suite name: 1..=MaxSuite bytes of
// [A-Za-z0-9._:/@+#-] — a name, with no space or quote that could turn it
// into a command line.
func ValidSuite(s string) bool {
	if len(s) == 0 || len(s) > MaxSuite {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '.', c == '_', c == ':', c == '/', c == '@', c == '+', c == '#', c == '-':
		default:
			return false
		}
	}
	return true
}

// RunTestV1 runs a named test suite of the leased, installed artifact on a
// reserved device (§100): Suite names a suite inside the artifact and Filter
// narrows the tests run (its syntax is the suite runner's, e.g.
// "com.example.LoginTest#*"; empty runs all). Neither is ever a command
// line. TimeoutMs bounds the run, in milliseconds.
//
//	struct RunTestV1 {
//	    device: DeviceId, lease: [u8;16],
//	    suite: String,       // 1..=128 bytes of [A-Za-z0-9._:/@+#-]
//	    filter: String,      // ≤ 256 bytes of printable UTF-8
//	    timeout_ms: u32,     // > 0
//	}
type RunTestV1 struct {
	Device    DeviceId
	Lease     wire.LeaseId
	Suite     string
	Filter    string
	TimeoutMs uint32
}

// MessageType implements wire.Message.
func (*RunTestV1) MessageType() wire.MessageTypeId { return MsgRunTest }

// AppendPostcard implements wire.Message.
func (m *RunTestV1) AppendPostcard(b []byte) []byte {
	b = appendOperation(b, m.Device, &m.Lease)
	b = postcard.AppendString(b, m.Suite)
	b = postcard.AppendString(b, m.Filter)
	return postcard.AppendU32(b, m.TimeoutMs)
}

// DecodePostcard implements wire.Message.
func (m *RunTestV1) DecodePostcard(d *postcard.Decoder) {
	m.Device = readOperation(d, &m.Lease)
	m.Suite = d.String(MaxSuite)
	m.Filter = d.String(MaxFilter)
	m.TimeoutMs = d.U32()
}

// Validate implements wire.Message: a valid device id, a lease, a suite name
// (ValidSuite), a filter of printable UTF-8 within MaxFilter and a non-zero
// timeout are required.
func (m *RunTestV1) Validate() error {
	if err := checkOperation("run test", m.Device, m.Lease); err != nil {
		return err
	}
	if !ValidSuite(m.Suite) {
		return errInvalid("run test: suite must be a name of 1..=128 bytes of [A-Za-z0-9._:/@+#-]")
	}
	if !validText(m.Filter, MaxFilter, false) {
		return errInvalid("run test: filter must be ≤ 256 bytes of printable UTF-8")
	}
	if m.TimeoutMs == 0 {
		return errInvalid("run test: zero timeout")
	}
	return nil
}

// RunTestResultV1 answers RunTestV1 with the test counts and, optionally, the
// CAS reference of the uploaded report (JUnit XML or similar).
//
//	struct RunTestResultV1 {
//	    device: DeviceId, outcome: DeviceOutcome,
//	    passed: u32, failed: u32,
//	    report: Option<CasObjectRef>,
//	}
//
// HasReport is the Option tag; without it Report must be zero.
type RunTestResultV1 struct {
	Device    DeviceId
	Outcome   DeviceOutcome
	Passed    uint32
	Failed    uint32
	HasReport bool
	Report    wire.CasObjectRef
}

// MessageType implements wire.Message.
func (*RunTestResultV1) MessageType() wire.MessageTypeId { return MsgRunTestResult }

// AppendPostcard implements wire.Message.
func (m *RunTestResultV1) AppendPostcard(b []byte) []byte {
	b = appendResult(b, m.Device, m.Outcome)
	b = postcard.AppendU32(b, m.Passed)
	b = postcard.AppendU32(b, m.Failed)
	b = postcard.AppendOption(b, m.HasReport)
	if m.HasReport {
		b = m.Report.AppendPostcard(b)
	}
	return b
}

// DecodePostcard implements wire.Message.
func (m *RunTestResultV1) DecodePostcard(d *postcard.Decoder) {
	m.Device, m.Outcome = readResult(d)
	m.Passed = d.U32()
	m.Failed = d.U32()
	m.HasReport = d.Option()
	m.Report = wire.CasObjectRef{}
	if m.HasReport {
		m.Report.DecodePostcard(d)
	}
}

// Validate implements wire.Message: a valid device id, a known outcome, and a
// valid report reference exactly when HasReport.
func (m *RunTestResultV1) Validate() error {
	if err := checkResult("run test result", m.Device, m.Outcome); err != nil {
		return err
	}
	if m.HasReport && !check.ValidRef(&m.Report) {
		return errInvalid("run test result: report with unknown algorithm or zero digest")
	}
	if !m.HasReport && m.Report != (wire.CasObjectRef{}) {
		return errInvalid("run test result: report set without its option tag")
	}
	return nil
}
