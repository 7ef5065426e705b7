package deviceagent

import (
	"context"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/device"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newTestAgent(t *testing.T) (*Agent, *SimDriver, *clock) {
	t.Helper()
	drv := NewSimDriver(Device{ID: "d1", Model: "m", Platform: "android", Online: true},
		Device{ID: "d2", Platform: "ios", Online: false})
	c := &clock{t: time.UnixMilli(1767225600000)}
	a, err := New(Config{Driver: drv, StoreDir: t.TempDir(), Now: c.now})
	if err != nil {
		t.Fatal(err)
	}
	return a, drv, c
}

func serve(a *Agent, m wire.Message) wire.Message {
	return a.Serve(context.Background(), agent.ServiceRequest{Msg: m})
}

// TestReservationFencing: one lease holds a device; others are Busy until
// it expires or is reset; reserving again under the holder renews.
func TestReservationFencing(t *testing.T) {
	a, _, c := newTestAgent(t)
	l1, l2 := wire.NewLeaseId(), wire.NewLeaseId()
	rs := func(l wire.LeaseId) *device.ReserveResultV1 {
		return serve(a, &device.ReserveV1{Device: "d1", Lease: l, DurationMs: 1000}).(*device.ReserveResultV1)
	}
	if r := rs(l1); r.Outcome != device.OutcomeOk || r.ReservationExpiresMs != uint64(c.t.UnixMilli())+1000 {
		t.Fatalf("reserve: %+v", r)
	}
	if r := rs(l2); r.Outcome != device.OutcomeBusy {
		t.Fatalf("second lease: %+v", r)
	}
	if r := serve(a, &device.ResetV1{Device: "d1", Lease: l2}).(*device.ResetResultV1); r.Outcome != device.OutcomeBusy {
		t.Fatalf("reset by the other lease: %+v", r)
	}
	c.t = c.t.Add(500 * time.Millisecond)
	if r := rs(l1); r.Outcome != device.OutcomeOk || r.ReservationExpiresMs != uint64(c.t.UnixMilli())+1000 {
		t.Fatalf("renew: %+v", r)
	}
	c.t = c.t.Add(1000 * time.Millisecond) // expired
	if r := serve(a, &device.ResetV1{Device: "d1", Lease: l1}).(*device.ResetResultV1); r.Outcome != device.OutcomeFailed {
		t.Fatalf("reset under an expired reservation: %+v", r)
	}
	if r := rs(l2); r.Outcome != device.OutcomeOk {
		t.Fatalf("reserve after expiry: %+v", r)
	}
	if r := serve(a, &device.ResetV1{Device: "d1", Lease: l2}).(*device.ResetResultV1); r.Outcome != device.OutcomeOk {
		t.Fatalf("reset: %+v", r)
	}
	if r := rs(l1); r.Outcome != device.OutcomeOk {
		t.Fatalf("reserve after reset: %+v", r)
	}
	if r := serve(a, &device.ReserveV1{Device: "nope", Lease: l1, DurationMs: 1}).(*device.ReserveResultV1); r.Outcome != device.OutcomeNotFound {
		t.Fatalf("unknown device: %+v", r)
	}
	if r := serve(a, &device.ReserveV1{Device: "d2", Lease: l1, DurationMs: 1}).(*device.ReserveResultV1); r.Outcome != device.OutcomeFailed {
		t.Fatalf("offline device: %+v", r)
	}
}

func TestDiscoverStates(t *testing.T) {
	a, _, _ := newTestAgent(t)
	serve(a, &device.ReserveV1{Device: "d1", Lease: wire.NewLeaseId(), DurationMs: 1000})
	r := serve(a, &device.DiscoverV1{}).(*device.DiscoverResultV1)
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(r.Devices) != 2 || r.Devices[0].State != device.StateReserved || r.Devices[1].State != device.StateOffline {
		t.Fatalf("%+v", r.Devices)
	}
	r = serve(a, &device.DiscoverV1{HasPlatformFilter: true, PlatformFilter: "ios"}).(*device.DiscoverResultV1)
	if len(r.Devices) != 1 || r.Devices[0].ID != "d2" {
		t.Fatalf("filtered %+v", r.Devices)
	}
}

func TestSimArtifact(t *testing.T) {
	drv := NewSimDriver(Device{ID: "d", Platform: "p", Online: true})
	for _, bad := range []string{"", "test x pass\n", "suite s\ntest x maybe\n", "rm -rf /\n"} {
		if _, err := drv.Install(context.Background(), "d", stringsReader(bad)); err != ErrBadArtifact {
			t.Errorf("%q: %v", bad, err)
		}
	}
	if _, err := drv.RunTest(context.Background(), "d", TestRun{Suite: "s", Log: discard{}}); err != ErrNotInstalled {
		t.Fatalf("run before install: %v", err)
	}
}
