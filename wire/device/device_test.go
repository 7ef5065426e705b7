package device

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/sample"
	"forgeyard.dev/transport/wire/postcard"
)

const (
	testFamily = wire.FamilyDevice
	testPrefix = "device."
)

var (
	tLease  = wire.LeaseId{ULID: sample.ULID(1)}
	tDevice = DeviceId("usb:1-1:SERIAL")
	tRef    = sample.Ref(wire.DigestSHA256, 2, 10)
)

func maxID(i int) DeviceId {
	s := fmt.Sprintf("dev-%03d.", i)
	return DeviceId(s + strings.Repeat("x", MaxDeviceId-len(s)))
}

func badEncodings() []badEncoding {
	long := DeviceId(strings.Repeat("d", MaxDeviceId+1))
	many := make([]DeviceInfoV1, MaxDevices+1)
	for i := range many {
		many[i] = DeviceInfoV1{ID: maxID(i), Platform: "android"}
	}
	return []badEncoding{
		{"device id", &ResetV1{Device: long, Lease: tLease}, postcard.ErrLengthOverBound},
		{"platform filter", &DiscoverV1{HasPlatformFilter: true, PlatformFilter: strings.Repeat("p", MaxPlatform+1)}, postcard.ErrLengthOverBound},
		{"too many devices", &DiscoverResultV1{Devices: many}, postcard.ErrLengthOverBound},
		{"model", &DiscoverResultV1{Devices: []DeviceInfoV1{{ID: tDevice, Model: strings.Repeat("m", MaxModel+1), Platform: "ios"}}}, postcard.ErrLengthOverBound},
		{"state", &DiscoverResultV1{Devices: []DeviceInfoV1{{ID: tDevice, Platform: "ios", State: numDeviceStates}}}, postcard.ErrBadEnum},
		{"reserve outcome", &ReserveResultV1{Device: tDevice, Outcome: numDeviceOutcomes}, postcard.ErrBadEnum},
		{"install message", &InstallResultV1{Device: tDevice, Message: strings.Repeat("m", MaxMessage+1)}, postcard.ErrLengthOverBound},
		{"install artifact algorithm", &InstallV1{Device: tDevice, Lease: tLease, Artifact: wire.CasObjectRef{Algorithm: 2, Digest: tRef.Digest}}, postcard.ErrBadEnum},
		{"suite", &RunTestV1{Device: tDevice, Lease: tLease, Suite: strings.Repeat("s", MaxSuite+1), TimeoutMs: 1}, postcard.ErrLengthOverBound},
		{"filter", &RunTestV1{Device: tDevice, Lease: tLease, Suite: "s", Filter: strings.Repeat("f", MaxFilter+1), TimeoutMs: 1}, postcard.ErrLengthOverBound},
		{"run test outcome", &RunTestResultV1{Device: tDevice, Outcome: 5}, postcard.ErrBadEnum},
		{"reset outcome", &ResetResultV1{Device: tDevice, Outcome: 9}, postcard.ErrBadEnum},
	}
}

func invalidMessages() []invalidMessage {
	run := func(f func(m *RunTestV1)) *RunTestV1 {
		m := &RunTestV1{Device: tDevice, Lease: tLease, Suite: "UITests", TimeoutMs: 1}
		f(m)
		return m
	}
	return []invalidMessage{
		{"filter without tag", &DiscoverV1{PlatformFilter: "ios"}},
		{"empty filter", &DiscoverV1{HasPlatformFilter: true}},
		{"filter control char", &DiscoverV1{HasPlatformFilter: true, PlatformFilter: "ios\n"}},
		{"info bad id", &DiscoverResultV1{Devices: []DeviceInfoV1{{ID: "a b", Platform: "ios"}}}},
		{"info empty platform", &DiscoverResultV1{Devices: []DeviceInfoV1{{ID: tDevice}}}},
		{"info state", &DiscoverResultV1{Devices: []DeviceInfoV1{{ID: tDevice, Platform: "ios", State: 4}}}},
		{"info model UTF-8", &DiscoverResultV1{Devices: []DeviceInfoV1{{ID: tDevice, Platform: "ios", Model: "\xff"}}}},
		{"duplicate device", &DiscoverResultV1{Devices: []DeviceInfoV1{{ID: tDevice, Platform: "ios"}, {ID: tDevice, Platform: "android"}}}},
		{"reserve empty id", &ReserveV1{Lease: tLease, DurationMs: 1}},
		{"reserve id with slash", &ReserveV1{Device: "a/b", Lease: tLease, DurationMs: 1}},
		{"reserve zero lease", &ReserveV1{Device: tDevice, DurationMs: 1}},
		{"reserve zero duration", &ReserveV1{Device: tDevice, Lease: tLease}},
		{"reserve ok without expiry", &ReserveResultV1{Device: tDevice, Outcome: OutcomeOk}},
		{"reserve busy with expiry", &ReserveResultV1{Device: tDevice, Outcome: OutcomeBusy, ReservationExpiresMs: 1}},
		{"reserve outcome", &ReserveResultV1{Device: tDevice, Outcome: 5, ReservationExpiresMs: 1}},
		{"install zero lease", &InstallV1{Device: tDevice, Artifact: tRef}},
		{"install zero digest", &InstallV1{Device: tDevice, Lease: tLease, Artifact: wire.CasObjectRef{Size: 1}}},
		{"install bad id", &InstallV1{Device: "x;rm", Lease: tLease, Artifact: tRef}},
		{"install result outcome", &InstallResultV1{Device: tDevice, Outcome: 5}},
		{"install result message", &InstallResultV1{Device: tDevice, Message: "a\x00b"}},
		{"run zero lease", run(func(m *RunTestV1) { m.Lease = wire.LeaseId{} })},
		{"run empty suite", run(func(m *RunTestV1) { m.Suite = "" })},
		{"run suite command line", run(func(m *RunTestV1) { m.Suite = "sh -c 'reboot'" })},
		{"run suite with semicolon", run(func(m *RunTestV1) { m.Suite = "UITests;reboot" })},
		{"run filter newline", run(func(m *RunTestV1) { m.Filter = "a\nb" })},
		{"run zero timeout", run(func(m *RunTestV1) { m.TimeoutMs = 0 })},
		{"run bad device", run(func(m *RunTestV1) { m.Device = "" })},
		{"result outcome", &RunTestResultV1{Device: tDevice, Outcome: 5}},
		{"result report without tag", &RunTestResultV1{Device: tDevice, Report: tRef}},
		{"result zero report", &RunTestResultV1{Device: tDevice, HasReport: true}},
		{"reset zero lease", &ResetV1{Device: tDevice}},
		{"reset bad id", &ResetV1{Device: "é", Lease: tLease}},
		{"reset result outcome", &ResetResultV1{Device: tDevice, Outcome: 5}},
	}
}

func maximalMessages() []wire.Message {
	devices := make([]DeviceInfoV1, MaxDevices)
	for i := range devices {
		devices[i] = DeviceInfoV1{ID: maxID(i), Model: strings.Repeat("m", MaxModel),
			Platform: strings.Repeat("p", MaxPlatform), State: StateOffline}
	}
	big := sample.Ref(wire.DigestBLAKE3, 9, math.MaxUint64)
	id := maxID(0)
	return []wire.Message{
		&DiscoverV1{HasPlatformFilter: true, PlatformFilter: strings.Repeat("p", MaxPlatform)},
		&DiscoverResultV1{Devices: devices},
		&ReserveV1{Device: id, Lease: tLease, DurationMs: math.MaxUint32},
		&ReserveResultV1{Device: id, Outcome: OutcomeOk, ReservationExpiresMs: math.MaxUint64},
		&InstallV1{Device: id, Lease: tLease, Artifact: big},
		&InstallResultV1{Device: id, Outcome: OutcomeTimeout, Message: strings.Repeat("m", MaxMessage)},
		&RunTestV1{Device: id, Lease: tLease, Suite: strings.Repeat("s", MaxSuite), Filter: strings.Repeat("f", MaxFilter), TimeoutMs: math.MaxUint32},
		&RunTestResultV1{Device: id, Outcome: OutcomeTimeout, Passed: math.MaxUint32, Failed: math.MaxUint32, HasReport: true, Report: big},
		&ResetV1{Device: id, Lease: tLease},
		&ResetResultV1{Device: id, Outcome: OutcomeTimeout},
	}
}

func TestEnumStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{StateAvailable.String(), "Available"}, {StateReserved.String(), "Reserved"},
		{StateBusy.String(), "Busy"}, {StateOffline.String(), "Offline"}, {DeviceState(4).String(), "DeviceState(4)"},
		{OutcomeOk.String(), "Ok"}, {OutcomeNotFound.String(), "NotFound"}, {OutcomeBusy.String(), "Busy"},
		{OutcomeFailed.String(), "Failed"}, {OutcomeTimeout.String(), "Timeout"}, {DeviceOutcome(5).String(), "DeviceOutcome(5)"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

func TestDeviceIdValid(t *testing.T) {
	for _, tc := range []struct {
		id   DeviceId
		want bool
	}{
		{"R58M123ABC", true}, {"usb:1-4.2:R58M_1", true}, {maxID(1), true},
		{"", false}, {DeviceId(strings.Repeat("a", MaxDeviceId+1)), false},
		{"a b", false}, {"a/b", false}, {"a;b", false}, {"$(x)", false}, {"é", false}, {"a\x00", false},
	} {
		if got := tc.id.Valid(); got != tc.want {
			t.Errorf("DeviceId(%q).Valid() = %v", tc.id, got)
		}
	}
}

// Every sample's enum variants: each device state and outcome appears.
func TestSamplesCoverEnums(t *testing.T) {
	states, outcomes := map[DeviceState]bool{}, map[DeviceOutcome]bool{}
	for _, m := range Samples() {
		switch m := m.(type) {
		case *DiscoverResultV1:
			for _, d := range m.Devices {
				states[d.State] = true
			}
		case *ReserveResultV1:
			outcomes[m.Outcome] = true
		}
	}
	if len(states) != numDeviceStates || len(outcomes) != numDeviceOutcomes {
		t.Fatalf("samples cover states %v and outcomes %v", states, outcomes)
	}
}

// A bad Option tag is rejected.
func TestBadOptionTag(t *testing.T) {
	if _, err := decodeBody(t, MsgDiscover, []byte{2}); !errors.Is(err, postcard.ErrBadOption) {
		t.Fatalf("got %v, want ErrBadOption", err)
	}
}
