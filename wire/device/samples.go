package device

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/sample"
)

// Samples returns one deterministic, fully populated, valid instance of every
// device message, plus extra instances so that every enum variant (every
// device state and outcome) appears. Ids and digests are fixed; nothing
// depends on the clock or randomness. Each call returns fresh values.
func Samples() []wire.Message {
	lease := wire.LeaseId{ULID: sample.ULID(0x71)}
	const pixel, iphone DeviceId = "usb:1-4.2:R58M123ABC", "sim:8A1F-42C9.iphone-15"
	const t0 = 1767225600000 // 2026-01-01T00:00:00Z in unix ms
	apk := sample.Ref(wire.DigestSHA256, 0x72, 48_213_504)
	report := sample.Ref(wire.DigestBLAKE3, 0x73, 18_432)
	m := []wire.Message{
		&DiscoverV1{HasPlatformFilter: true, PlatformFilter: "android"},
		&DiscoverV1{},
		&DiscoverResultV1{Devices: []DeviceInfoV1{
			{ID: pixel, Model: "Pixel 8", Platform: "android", State: StateAvailable},
			{ID: iphone, Model: "iPhone 15 (simulator)", Platform: "ios", State: StateReserved},
			{ID: "usb:1-4.3:R58M456DEF", Model: "Galaxy S24", Platform: "android", State: StateBusy},
			{ID: "tcp:10.0.0.7:5555", Model: "", Platform: "android", State: StateOffline},
		}},
		&ReserveV1{Device: pixel, Lease: lease, DurationMs: 1_800_000},
		&ReserveResultV1{Device: pixel, Outcome: OutcomeOk, ReservationExpiresMs: t0 + 1_800_000},
		&InstallV1{Device: pixel, Lease: lease, Artifact: apk},
		&InstallResultV1{Device: pixel, Outcome: OutcomeOk, Message: "installed com.example.app 4.2.0 (42000)"},
		&RunTestV1{Device: pixel, Lease: lease, Suite: "androidTest/com.example.LoginSuite",
			Filter: "com.example.LoginTest#testValid*", TimeoutMs: 600_000},
		&RunTestResultV1{Device: pixel, Outcome: OutcomeOk, Passed: 41, Failed: 1, HasReport: true, Report: report},
		&RunTestResultV1{Device: iphone, Outcome: OutcomeTimeout, Passed: 3, Failed: 0},
		&ResetV1{Device: pixel, Lease: lease},
		&ResetResultV1{Device: pixel, Outcome: OutcomeOk},
	}
	for _, o := range []DeviceOutcome{OutcomeNotFound, OutcomeBusy, OutcomeFailed, OutcomeTimeout} {
		m = append(m, &ReserveResultV1{Device: iphone, Outcome: o})
	}
	return append(m,
		&InstallResultV1{Device: iphone, Outcome: OutcomeFailed, Message: "INSTALL_FAILED_INSUFFICIENT_STORAGE"},
		&ResetResultV1{Device: iphone, Outcome: OutcomeBusy},
	)
}
