package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/device"
	wlogs "forgeyard.dev/transport/wire/logs"
	"forgeyard.dev/transport/wire/registry"
)

// Errors of the device API (§100).
var (
	// ErrNoDeviceAgent: the runner is not connected to this daemon as a
	// device agent.
	ErrNoDeviceAgent = errors.New("daemon: runner is not connected as a device agent")
	// ErrStaleReservation: the reservation is not the device's current one
	// on this daemon (a newer reservation replaced it, it was reset, it
	// expired, or its device agent reconnected); nothing was sent.
	ErrStaleReservation = errors.New("daemon: device reservation is stale")
)

// DeviceError is a device operation the device agent answered with an
// outcome other than Ok.
type DeviceError struct {
	Op      string // "reserve", "install", "run test", "reset"
	Device  device.DeviceId
	Outcome device.DeviceOutcome
	Message string // the agent's text (install only)
}

// Error names the operation, the device and the outcome.
func (e *DeviceError) Error() string {
	s := fmt.Sprintf("daemon: device %s: %s: %s", e.Device, e.Op, e.Outcome)
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// DeviceReserve asks a device agent to reserve one of its devices.
type DeviceReserve struct {
	Runner wire.RunnerId // the device agent
	Device device.DeviceId
	// Lease is the fencing token the reservation is held under; zero
	// mints a new one. Renewing a reservation is reserving again under
	// the same lease.
	Lease    wire.LeaseId
	Duration time.Duration // > 0, at most 2³²−1 ms
}

// DeviceReservation is a granted reservation: the handle every later
// device operation takes. It is fenced like a lease: Epoch counts the
// reservations of the device on this daemon, and only the current one's
// commands are sent (ErrStaleReservation otherwise); the device agent
// itself refuses commands under any lease but the one holding the device
// (OutcomeBusy), which also fences reservations made through another
// daemon.
type DeviceReservation struct {
	Runner    wire.RunnerId
	Device    device.DeviceId
	Lease     wire.LeaseId
	Epoch     uint64
	ExpiresAt time.Time
}

// DeviceTest is one test run.
type DeviceTest struct {
	Suite   string        // a suite name inside the installed artifact (device.ValidSuite)
	Filter  string        // optional, the suite runner's syntax
	Timeout time.Duration // > 0
	// Log, when set, receives the run's log as the device agent streams
	// it (a log stream under the reservation's lease, §43).
	Log io.Writer
}

// DeviceTestResult is a finished test run.
type DeviceTestResult struct {
	Passed, Failed uint32
	HasReport      bool
	Report         wire.CasObjectRef
	LogBytes       int64 // bytes of log received
}

type devKey struct {
	runner wire.RunnerId
	device device.DeviceId
}

// reservations is the daemon's view of the device reservations it made,
// and the data-plane grants of the operations in flight (an install's
// artifact download, a test run's log stream).
type reservations struct {
	mu     sync.Mutex
	cur    map[devKey]DeviceReservation
	epochs map[devKey]uint64
	grants map[grantKey]bool     // install: (transport, lease, artifact) may be read
	runs   map[runKey]*deviceRun // run test: (transport, lease) may stream a log
}

type grantKey struct {
	transport wire.TransportSessionId
	lease     wire.LeaseId
	obj       wire.CasObjectRef
}

type runKey struct {
	transport wire.TransportSessionId
	lease     wire.LeaseId
}

type deviceRun struct {
	attached bool          // under reservations.mu
	bytes    int64         // under reservations.mu
	done     chan struct{} // closed when the log stream ended
	logMu    sync.Mutex
	log      io.Writer // nil once RunDeviceTest returned: late frames are dropped
}

// write passes p to the run's Log while RunDeviceTest waits for it.
func (r *deviceRun) write(p []byte) {
	r.logMu.Lock()
	defer r.logMu.Unlock()
	if r.log != nil {
		_, _ = r.log.Write(p)
	}
}

func (r *reservations) init() {
	if r.cur == nil {
		r.cur, r.epochs = map[devKey]DeviceReservation{}, map[devKey]uint64{}
		r.grants, r.runs = map[grantKey]bool{}, map[runKey]*deviceRun{}
	}
}

// deviceConn returns runner's active device-agent transport.
func (d *Daemon) deviceConn(runner wire.RunnerId) (*conn, error) {
	cs := d.peerConns(agentwire.RoleDeviceAgent, runner)
	if len(cs) == 0 {
		return nil, ErrNoDeviceAgent
	}
	return cs[0], nil
}

// DiscoverDevices asks runner's device agent for its devices; platform,
// when not empty, keeps only that platform's.
func (d *Daemon) DiscoverDevices(ctx context.Context, runner wire.RunnerId, platform string) ([]device.DeviceInfoV1, error) {
	c, err := d.deviceConn(runner)
	if err != nil {
		return nil, err
	}
	m := &device.DiscoverV1{HasPlatformFilter: platform != "", PlatformFilter: platform}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("daemon: invalid discover: %w", err)
	}
	r, err := askDevice[*device.DiscoverResultV1](ctx, c, m, nil)
	if err != nil {
		return nil, err
	}
	return r.Devices, nil
}

// ReserveDevice reserves a device for req.Duration. The returned
// reservation supersedes any earlier one of the device on this daemon.
func (d *Daemon) ReserveDevice(ctx context.Context, req DeviceReserve) (DeviceReservation, error) {
	c, err := d.deviceConn(req.Runner)
	if err != nil {
		return DeviceReservation{}, err
	}
	if req.Lease.IsZero() {
		req.Lease = wire.NewLeaseId()
	}
	ms := req.Duration.Milliseconds()
	if ms <= 0 || ms > 1<<32-1 {
		return DeviceReservation{}, fmt.Errorf("daemon: reservation duration %v out of range", req.Duration)
	}
	m := &device.ReserveV1{Device: req.Device, Lease: req.Lease, DurationMs: uint32(ms)}
	if err := m.Validate(); err != nil {
		return DeviceReservation{}, fmt.Errorf("daemon: invalid reserve: %w", err)
	}
	r, err := askDevice(ctx, c, m, func(r *device.ReserveResultV1) bool { return r.Device == req.Device })
	if err != nil {
		return DeviceReservation{}, err
	}
	if r.Outcome != device.OutcomeOk {
		return DeviceReservation{}, &DeviceError{Op: "reserve", Device: req.Device, Outcome: r.Outcome}
	}
	k := devKey{req.Runner, req.Device}
	p := &d.peers.res
	p.mu.Lock()
	defer p.mu.Unlock()
	p.init()
	p.epochs[k]++
	res := DeviceReservation{Runner: req.Runner, Device: req.Device, Lease: req.Lease, Epoch: p.epochs[k],
		ExpiresAt: time.UnixMilli(int64(r.ReservationExpiresMs))}
	p.cur[k] = res
	return res, nil
}

// current returns the transport to use for res, or ErrStaleReservation.
func (d *Daemon) current(res DeviceReservation) (*conn, error) {
	k := devKey{res.Runner, res.Device}
	p := &d.peers.res
	p.mu.Lock()
	cur, ok := p.cur[k]
	p.mu.Unlock()
	if !ok || cur != res || !d.now().Before(res.ExpiresAt) {
		return nil, ErrStaleReservation
	}
	// The device agent's session keeps its reservations across
	// reconnects: its current transport serves them.
	return d.deviceConn(res.Runner)
}

// InstallOnDevice installs artifact, an object of the daemon's content
// store, on the reserved device: the device agent downloads it from this
// daemon's CAS (only this artifact, under this reservation, while the
// install runs, §93), verifies its digest and installs it. It returns the
// installer's message.
func (d *Daemon) InstallOnDevice(ctx context.Context, res DeviceReservation, artifact wire.CasObjectRef) (string, error) {
	c, err := d.current(res)
	if err != nil {
		return "", err
	}
	m := &device.InstallV1{Device: res.Device, Lease: res.Lease, Artifact: artifact}
	if err := m.Validate(); err != nil {
		return "", fmt.Errorf("daemon: invalid install: %w", err)
	}
	g := grantKey{c.transport, res.Lease, artifact}
	p := &d.peers.res
	p.mu.Lock()
	p.init()
	p.grants[g] = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.grants, g)
		p.mu.Unlock()
	}()
	r, err := askDevice(ctx, c, m, func(r *device.InstallResultV1) bool { return r.Device == res.Device })
	if err != nil {
		return "", err
	}
	if r.Outcome != device.OutcomeOk {
		return r.Message, &DeviceError{Op: "install", Device: res.Device, Outcome: r.Outcome, Message: r.Message}
	}
	return r.Message, nil
}

// RunDeviceTest runs a test suite of the installed artifact on the
// reserved device and returns its counts once the result and the whole
// log (to t.Log) arrived. A failed suite is a result with Failed > 0 and
// a *DeviceError with OutcomeFailed.
func (d *Daemon) RunDeviceTest(ctx context.Context, res DeviceReservation, t DeviceTest) (DeviceTestResult, error) {
	c, err := d.current(res)
	if err != nil {
		return DeviceTestResult{}, err
	}
	ms := t.Timeout.Milliseconds()
	if ms <= 0 || ms > 1<<32-1 {
		return DeviceTestResult{}, fmt.Errorf("daemon: test timeout %v out of range", t.Timeout)
	}
	m := &device.RunTestV1{Device: res.Device, Lease: res.Lease, Suite: t.Suite, Filter: t.Filter, TimeoutMs: uint32(ms)}
	if err := m.Validate(); err != nil {
		return DeviceTestResult{}, fmt.Errorf("daemon: invalid run test: %w", err)
	}
	rk := runKey{c.transport, res.Lease}
	run := &deviceRun{log: t.Log, done: make(chan struct{})}
	p := &d.peers.res
	p.mu.Lock()
	p.init()
	if p.runs[rk] != nil {
		p.mu.Unlock()
		return DeviceTestResult{}, &DeviceError{Op: "run test", Device: res.Device, Outcome: device.OutcomeBusy, Message: "a test is already running under this reservation"}
	}
	p.runs[rk] = run
	p.mu.Unlock()
	// Alike in shape to InstallDevice's grant guard, but a run also drops
	// the host's log writer when it ends.
	defer func() {
		p.mu.Lock()
		delete(p.runs, rk)
		p.mu.Unlock()
		run.logMu.Lock()
		run.log = nil // the host's writer is not written after we return
		run.logMu.Unlock()
	}()
	r, err := askDevice(ctx, c, m, func(r *device.RunTestResultV1) bool { return r.Device == res.Device })
	if err != nil {
		return DeviceTestResult{}, err
	}
	out := DeviceTestResult{Passed: r.Passed, Failed: r.Failed, HasReport: r.HasReport, Report: r.Report}
	switch r.Outcome {
	case device.OutcomeOk, device.OutcomeFailed, device.OutcomeTimeout:
		// The run streamed its log (closed before the result was sent;
		// the streams are independent, so it may still be arriving).
		select {
		case <-run.done:
		case <-ctx.Done():
			return out, ctx.Err()
		case <-c.sc.Done():
			return out, ErrNotConnected
		}
	}
	p.mu.Lock()
	out.LogBytes = run.bytes
	p.mu.Unlock()
	if r.Outcome != device.OutcomeOk {
		return out, &DeviceError{Op: "run test", Device: res.Device, Outcome: r.Outcome}
	}
	return out, nil
}

// ResetDevice returns the device to a clean state and ends the
// reservation (also when the device agent answers with an error: the
// reservation is not used again).
func (d *Daemon) ResetDevice(ctx context.Context, res DeviceReservation) error {
	c, err := d.current(res)
	if err != nil {
		return err
	}
	k := devKey{res.Runner, res.Device}
	p := &d.peers.res
	defer func() {
		p.mu.Lock()
		if p.cur[k] == res {
			delete(p.cur, k)
		}
		p.mu.Unlock()
	}()
	r, err := askDevice(ctx, c, &device.ResetV1{Device: res.Device, Lease: res.Lease},
		func(r *device.ResetResultV1) bool { return r.Device == res.Device })
	if err != nil {
		return err
	}
	if r.Outcome != device.OutcomeOk {
		return &DeviceError{Op: "reset", Device: res.Device, Outcome: r.Outcome}
	}
	return nil
}

// askDevice sends the request m to c's device agent and returns the answer:
// an R (about the request's device when same, given, says so) or else an
// error naming the message that came.
func askDevice[R wire.Message](ctx context.Context, c *conn, m wire.Message, same func(R) bool) (R, error) {
	var zero R
	env, err := c.call(ctx, m)
	if err != nil {
		return zero, err
	}
	r, ok := env.Payload.(R)
	if !ok || same != nil && !same(r) {
		return zero, fmt.Errorf("daemon: device agent answered %s", nameOf(env.Payload.MessageType()))
	}
	return r, nil
}

// deviceDataAllowed reports whether c is an active device-agent transport
// (it may open CAS downloads and log streams, each checked against the
// operation in flight).
func (c *conn) deviceDataAllowed() bool {
	_, _, _, role := c.ident()
	st := c.getState()
	return role == agentwire.RoleDeviceAgent && !c.isFenced() && st >= stateActive && st <= stateDraining
}

// authorizeDeviceCAS lets a device agent read exactly the artifact of an
// install in flight on its transport under that reservation's lease.
func (d *Daemon) authorizeDeviceCAS(c *conn, lease wire.LeaseId, obj wire.CasObjectRef, access cas.Access) error {
	p := &d.peers.res
	p.mu.Lock()
	ok := p.grants[grantKey{c.transport, lease, obj}]
	p.mu.Unlock()
	if ok && access == cas.AccessRead {
		return nil
	}
	return cas.ErrForbidden
}

// serveDeviceLog receives a test run's log stream from a device agent: a
// LogStreamHeaderV1 naming the reservation's lease of a run in flight on
// this transport, then raw LogFrameV1 frames, written to the run's Log.
// Anything else is refused (StreamForbidden, StreamProtocolError).
func (c *conn) serveDeviceLog(rs *semantics.RecvStream) {
	body, err := rs.ReadFrame()
	if err != nil {
		rs.CancelRead(semantics.StreamProtocolError)
		return
	}
	var env wire.Envelope
	hdr, ok := decodeAs[*wlogs.LogStreamHeaderV1](&env, body)
	if !ok || hdr.Encoding != wlogs.LogEncodingRaw {
		rs.CancelRead(semantics.StreamProtocolError)
		return
	}
	p := &c.d.peers.res
	p.mu.Lock()
	run := p.runs[runKey{c.transport, hdr.Lease}]
	if run != nil && run.attached {
		run = nil
	}
	if run != nil {
		run.attached = true
	}
	p.mu.Unlock()
	if run == nil {
		rs.CancelRead(semantics.StreamForbidden)
		return
	}
	defer close(run.done)
	for {
		body, err := rs.ReadFrame()
		if err != nil {
			return // EOF: the run's log is complete; else the run's result says what happened
		}
		f, ok := decodeAs[*wlogs.LogFrameV1](&env, body)
		if !ok {
			rs.CancelRead(semantics.StreamProtocolError)
			return
		}
		run.write(f.Bytes)
		p.mu.Lock()
		run.bytes += int64(len(f.Bytes))
		p.mu.Unlock()
	}
}

// decodeAs decodes an envelope frame body whose validated payload must be
// a T.
func decodeAs[T wire.Message](env *wire.Envelope, body []byte) (T, bool) {
	var zero T
	if err := env.Decode(body, registry.Default); err != nil || env.Payload.Validate() != nil {
		return zero, false
	}
	m, ok := env.Payload.(T)
	return m, ok
}
