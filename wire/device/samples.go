package device

import (
	"github.com/oklog/ulid/v2"

	"forgeyard.dev/transport/wire"
)

// sampleULID returns a fixed ULID: the timestamp 2026-01-01T00:00:00Z and ten
// bytes derived from tag.
func sampleULID(tag byte) ulid.ULID {
	u := ulid.ULID{0x01, 0x9b, 0x77, 0x2a, 0x3c, 0x00}
	for i := 6; i < len(u); i++ {
		u[i] = tag ^ byte(i*0x11)
	}
	return u
}

// sampleRef returns a fixed object reference whose digest bytes derive from
// tag.
func sampleRef(alg wire.DigestAlgorithm, tag byte, size uint64) wire.CasObjectRef {
	r := wire.CasObjectRef{Algorithm: alg, Size: size}
	for i := range r.Digest {
		r.Digest[i] = tag + byte(i*7)
	}
	return r
}

// Samples returns one deterministic, fully populated, valid instance of every
// device message, plus extra instances so that every enum variant (every
// device state and outcome) appears. Ids and digests are fixed; nothing
// depends on the clock or randomness. Each call returns fresh values.
func Samples() []wire.Message {
	lease := wire.LeaseId{ULID: sampleULID(0x71)}
	const pixel, iphone DeviceId = "usb:1-4.2:R58M123ABC", "sim:8A1F-42C9.iphone-15"
	const t0 = 1767225600000 // 2026-01-01T00:00:00Z in unix ms
	apk := sampleRef(wire.DigestSHA256, 0x72, 48_213_504)
	report := sampleRef(wire.DigestBLAKE3, 0x73, 18_432)
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
