package daemon_test

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/deviceagent"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/device"
	"forgeyard.dev/transport/wire/registry"
	"forgeyard.dev/transport/wire/signing"
)

const testArtifact = `suite smoke
test boot pass
test login pass
test upload pass
suite flaky
test boot pass
test network fail
`

// lockedBuffer is a bytes.Buffer safe for the daemon's log writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type deviceWorld struct {
	w        *enginetest.World
	id       enginetest.Identity
	drv      *deviceagent.SimDriver
	artifact wire.CasObjectRef
}

func newDeviceWorld(t *testing.T, b enginetest.Backend) *deviceWorld {
	t.Helper()
	w, _, store := enginetest.DataWorld(t, b)
	dw := &deviceWorld{w: w, id: w.NewIdentity(),
		drv: deviceagent.NewSimDriver(
			deviceagent.Device{ID: "emulator-5554", Model: "Pixel 8 (sim)", Platform: "android", Online: true},
			deviceagent.Device{ID: "sim-iphone-15", Model: "iPhone 15 (sim)", Platform: "ios", Online: true}),
		artifact: enginetest.PutObject(t, store, []byte(testArtifact))}
	da, err := deviceagent.New(deviceagent.Config{Driver: dw.drv, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	a, _, _ := w.StartAgent(dw.id, nil, tolerantPeer, func(c *agent.Config) { *c = da.AgentConfig(*c) })
	enginetest.AwaitConnected(t, a)
	return dw
}

func wantDeviceErr(t *testing.T, what string, err error, want device.DeviceOutcome) {
	t.Helper()
	var de *daemon.DeviceError
	if !errors.As(err, &de) || de.Outcome != want {
		t.Fatalf("%s: %v, want outcome %s", what, err, want)
	}
}

// TestDeviceEndToEnd (§100): the host discovers the device agent's
// devices, reserves one, installs an artifact from the daemon's CAS,
// runs two suites (the test log streamed back while it runs) and resets.
func TestDeviceEndToEnd(t *testing.T) {
	enginetest.DataBackends(t, func(t *testing.T, b enginetest.Backend) {
		dw := newDeviceWorld(t, b)
		d := dw.w.D
		devs, err := d.DiscoverDevices(ctxT(t, 10*time.Second), dw.id.Runner, "android")
		if err != nil {
			t.Fatal(err)
		}
		if len(devs) != 1 || devs[0].ID != "emulator-5554" || devs[0].State != device.StateAvailable {
			t.Fatalf("discovered %+v", devs)
		}
		res, err := d.ReserveDevice(ctxT(t, 10*time.Second), daemon.DeviceReserve{Runner: dw.id.Runner, Device: "emulator-5554", Duration: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if res.Epoch != 1 || res.Lease.IsZero() || !res.ExpiresAt.After(time.Now()) {
			t.Fatalf("reservation %+v", res)
		}
		devs, _ = d.DiscoverDevices(ctxT(t, 10*time.Second), dw.id.Runner, "")
		if len(devs) != 2 || devs[0].State != device.StateReserved || devs[1].State != device.StateAvailable {
			t.Fatalf("after reserve: %+v", devs)
		}
		msg, err := d.InstallOnDevice(ctxT(t, 10*time.Second), res, dw.artifact)
		if err != nil {
			t.Fatal(err)
		}
		if msg != "installed 2 suites, 5 tests" {
			t.Fatalf("install message %q", msg)
		}
		if got := dw.drv.Installed("emulator-5554"); len(got) != 2 {
			t.Fatalf("installed %v", got)
		}
		var log lockedBuffer
		r, err := d.RunDeviceTest(ctxT(t, 10*time.Second), res, daemon.DeviceTest{Suite: "smoke", Timeout: 5 * time.Second, Log: &log})
		if err != nil {
			t.Fatal(err)
		}
		want := "running suite smoke on emulator-5554\nPASS boot\nPASS login\nPASS upload\n3 passed, 0 failed\n"
		if r.Passed != 3 || r.Failed != 0 || log.String() != want || r.LogBytes != int64(len(want)) {
			t.Fatalf("run %+v, log %q", r, log.String())
		}
		var log2 lockedBuffer
		r, err = d.RunDeviceTest(ctxT(t, 10*time.Second), res, daemon.DeviceTest{Suite: "flaky", Timeout: 5 * time.Second, Log: &log2})
		wantDeviceErr(t, "failing suite", err, device.OutcomeFailed)
		if r.Passed != 1 || r.Failed != 1 || !strings.Contains(log2.String(), "FAIL network\n") {
			t.Fatalf("failing run %+v, log %q", r, log2.String())
		}
		if err := d.ResetDevice(ctxT(t, 10*time.Second), res); err != nil {
			t.Fatal(err)
		}
		if got := dw.drv.Installed("emulator-5554"); len(got) != 0 {
			t.Fatalf("installed after reset: %v", got)
		}
		if _, err := d.RunDeviceTest(ctxT(t, 10*time.Second), res, daemon.DeviceTest{Suite: "smoke", Timeout: time.Second}); !errors.Is(err, daemon.ErrStaleReservation) {
			t.Fatalf("run after reset: %v", err)
		}
		if _, err := d.ReserveDevice(ctxT(t, 10*time.Second), daemon.DeviceReserve{Runner: dw.id.Runner, Device: "no-such-device", Duration: time.Minute}); err == nil {
			t.Fatal("reserved a device that does not exist")
		} else {
			wantDeviceErr(t, "unknown device", err, device.OutcomeNotFound)
		}
	})
}

// TestDeviceReservationFenced: a device is held by one lease; a newer
// reservation makes the older one's commands stale at the daemon (nothing
// sent), and the device agent itself refuses commands under a lease that
// does not hold the device, as a second daemon's stale handle would send.
func TestDeviceReservationFenced(t *testing.T) {
	enginetest.DataBackends(t, func(t *testing.T, b enginetest.Backend) {
		dw := newDeviceWorld(t, b)
		d := dw.w.D
		reserve := func(lease wire.LeaseId) (daemon.DeviceReservation, error) {
			return d.ReserveDevice(ctxT(t, 10*time.Second), daemon.DeviceReserve{Runner: dw.id.Runner, Device: "emulator-5554", Lease: lease, Duration: time.Minute})
		}
		a, err := reserve(wire.LeaseId{})
		if err != nil {
			t.Fatal(err)
		}
		// Another lease cannot take the device while a holds it.
		_, err = reserve(wire.NewLeaseId())
		wantDeviceErr(t, "second lease", err, device.OutcomeBusy)
		// Reserving under the holding lease renews: epoch 2, a is stale.
		a2, err := reserve(a.Lease)
		if err != nil {
			t.Fatal(err)
		}
		if a2.Epoch != a.Epoch+1 || a2.Lease != a.Lease {
			t.Fatalf("renewal %+v after %+v", a2, a)
		}
		if _, err := d.InstallOnDevice(ctxT(t, 10*time.Second), a, dw.artifact); !errors.Is(err, daemon.ErrStaleReservation) {
			t.Fatalf("install under the superseded handle: %v", err)
		}
		if err := d.ResetDevice(ctxT(t, 10*time.Second), a2); err != nil {
			t.Fatal(err)
		}
		bres, err := reserve(wire.NewLeaseId())
		if err != nil {
			t.Fatal(err)
		}
		// The old lease's commands reach the agent (as from a daemon
		// that still has the old handle) and are refused there.
		for _, m := range []wire.Message{
			&device.InstallV1{Device: "emulator-5554", Lease: a.Lease, Artifact: dw.artifact},
			&device.RunTestV1{Device: "emulator-5554", Lease: a.Lease, Suite: "smoke", TimeoutMs: 1000},
			&device.ResetV1{Device: "emulator-5554", Lease: a.Lease},
			&device.ReserveV1{Device: "emulator-5554", Lease: a.Lease, DurationMs: 1000},
		} {
			env, err := daemon.CallRunner(ctxT(t, 5*time.Second), d, dw.id.Runner, m)
			if err != nil {
				t.Fatal(err)
			}
			var got device.DeviceOutcome
			switch r := env.Payload.(type) {
			case *device.InstallResultV1:
				got = r.Outcome
			case *device.RunTestResultV1:
				got = r.Outcome
			case *device.ResetResultV1:
				got = r.Outcome
			case *device.ReserveResultV1:
				got = r.Outcome
			}
			if got != device.OutcomeBusy {
				t.Fatalf("%s under the stale lease answered %+v", m.MessageType(), env.Payload)
			}
		}
		if got := dw.drv.Installed("emulator-5554"); len(got) != 0 {
			t.Fatalf("the stale lease installed %v", got)
		}
		// The holder still works.
		if _, err := d.InstallOnDevice(ctxT(t, 10*time.Second), bres, dw.artifact); err != nil {
			t.Fatal(err)
		}
	})
}

// TestDeviceAgentAcceptsOnlyDeviceFamily (§191, §300): a real device
// agent answers execution messages and the signing family with
// RoleForbidden; its CAS access is only the artifact of an install in
// flight.
func TestDeviceAgentAcceptsOnlyDeviceFamily(t *testing.T) {
	enginetest.DataBackends(t, func(t *testing.T, b enginetest.Backend) {
		dw := newDeviceWorld(t, b)
		samples := map[wire.MessageTypeId]wire.Message{}
		for _, m := range registry.Samples() {
			if _, seen := samples[m.MessageType()]; !seen {
				samples[m.MessageType()] = m
			}
		}
		for _, typ := range []wire.MessageTypeId{agentwire.MsgLeaseOffer, agentwire.MsgCancelAttempt, agentwire.MsgLeaseProbe,
			agentwire.MsgSecretMaterial, signing.MsgSignRequest, device.MsgDiscoverResult} {
			// The daemon's send check refuses it (§98) …
			if err := daemon.CheckRunnerSend(dw.w.D, dw.id.Runner, typ); err == nil {
				t.Errorf("the send check lets the daemon send %v to a device agent", typ)
			}
			// … and the device agent itself refuses it when it arrives.
			_, err := daemon.CallRunner(ctxT(t, 5*time.Second), dw.w.D, dw.id.Runner, samples[typ])
			wantWireErr(t, err, wire.ErrCodeRoleForbidden)
		}
		if _, err := dw.w.D.OfferLease(ctxT(t, 5*time.Second), dw.id.Runner, enginetest.Offer(1)); err != daemon.ErrRoleForbidden {
			t.Fatalf("OfferLease to a device agent: %v", err)
		}
		// A device-role transport with no install in flight may not read
		// the artifact, under any lease.
		rc := dw.w.DialRaw(dw.w.NewIdentity())
		rc.Hello(agentwire.RoleDeviceAgent)
		if m, ok := rc.Register(wire.NewAgentSessionId()).(*agentwire.RegistrationAcceptedV1); !ok {
			t.Fatalf("device agent registration: %#v", m)
		}
		st, err := cas.NewFSStore(cas.FSStoreConfig{Dir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		down, err := cas.NewDownloader(cas.DownloaderConfig{Store: st})
		if err != nil {
			t.Fatal(err)
		}
		err = down.Fetch(ctxT(t, 5*time.Second), rc.Sc, wire.NewLeaseId(), dw.artifact)
		if o, ok := cas.Outcome(err); !ok || o.String() != "Forbidden" {
			t.Fatalf("device download without an install: %v", err)
		}
		if s, _ := st.Stat(dw.artifact); s.Complete {
			t.Fatal("the artifact was downloaded")
		}
	})
}
