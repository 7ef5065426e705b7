package deviceagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/device"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// Config configures an Agent. New copies it.
type Config struct {
	// Driver manages the devices; required.
	Driver DeviceDriver
	// StoreDir holds the downloaded artifacts; empty → a new directory
	// under os.TempDir(), removed by Close.
	StoreDir string
	// MaxReservation bounds a reservation's duration; 0 → 1 h.
	MaxReservation time.Duration
	// OpTimeout bounds reserve, install and reset; 0 → 5 min.
	OpTimeout time.Duration
	// Now is the clock reservations expire by; nil → time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Agent serves the device family on a DeviceDriver's devices; it is the
// agent.Service of a device agent. Methods are safe for concurrent use.
type Agent struct {
	cfg   Config
	log   *slog.Logger
	store *cas.FSStore
	down  *cas.Downloader
	own   string // StoreDir to remove at Close

	mu   sync.Mutex
	held map[device.DeviceId]*hold
}

// hold is a device's reservation.
type hold struct {
	lease   wire.LeaseId
	expires time.Time
	busy    bool // an operation is running
}

var _ agent.Service = (*Agent)(nil)

// New checks cfg and returns an Agent.
func New(cfg Config) (*Agent, error) {
	if cfg.Driver == nil {
		return nil, errors.New("deviceagent: Config.Driver is required")
	}
	if cfg.MaxReservation <= 0 {
		cfg.MaxReservation = time.Hour
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 5 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, held: map[device.DeviceId]*hold{}}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	dir := cfg.StoreDir
	if dir == "" {
		d, err := os.MkdirTemp("", "forgeyard-device-")
		if err != nil {
			return nil, err
		}
		dir, a.own = d, d
	}
	st, err := cas.NewFSStore(cas.FSStoreConfig{Dir: filepath.Join(dir, "cas")})
	if err != nil {
		return nil, fmt.Errorf("deviceagent: artifact store: %w", err)
	}
	down, err := cas.NewDownloader(cas.DownloaderConfig{Store: st})
	if err != nil {
		return nil, err
	}
	a.store, a.down = st, down
	return a, nil
}

// Close removes the artifact store when New created it.
func (a *Agent) Close() error {
	if a.own != "" {
		return os.RemoveAll(a.own)
	}
	return nil
}

// AgentConfig returns base set up as this device agent's endpoint: the
// device role, the Agent as its Service and FeatureDeviceControlV1
// offered.
func (a *Agent) AgentConfig(base agent.Config) agent.Config {
	base.Role = agentwire.RoleDeviceAgent
	base.Service = a
	base.Executor = nil
	base.Features = base.Features.With(wire.FeatureDeviceControlV1)
	return base
}

// Serve implements agent.Service.
func (a *Agent) Serve(ctx context.Context, req agent.ServiceRequest) wire.Message {
	switch m := req.Msg.(type) {
	case *device.DiscoverV1:
		return a.discover(ctx, m)
	case *device.ReserveV1:
		return a.reserve(ctx, m)
	case *device.InstallV1:
		return a.install(ctx, req.Conn, m)
	case *device.RunTestV1:
		return a.runTest(ctx, req.Conn, req.Protocol, m)
	case *device.ResetV1:
		return a.reset(ctx, m)
	}
	return &wire.WireErrorV1{Code: wire.ErrCodeInvalidState, Retry: wire.RetryNever, Message: "a device agent answers device requests only"}
}

func (a *Agent) discover(ctx context.Context, m *device.DiscoverV1) wire.Message {
	devs, err := a.cfg.Driver.Discover(ctx)
	if err != nil {
		a.log.Warn("discover failed", "err", err)
		return &wire.WireErrorV1{Code: wire.ErrCodeInternal, Retry: wire.RetryBackoff, Message: "device discovery failed"}
	}
	now := a.cfg.Now()
	out := &device.DiscoverResultV1{}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, d := range devs {
		if m.HasPlatformFilter && d.Platform != m.PlatformFilter {
			continue
		}
		if len(out.Devices) == device.MaxDevices {
			break
		}
		info := device.DeviceInfoV1{ID: d.ID, Model: wire.TruncateUTF8(sanitize(d.Model), device.MaxModel), Platform: d.Platform, State: device.StateAvailable}
		h := a.held[d.ID]
		switch {
		case !d.Online:
			info.State = device.StateOffline
		case h != nil && h.busy:
			info.State = device.StateBusy
		case h != nil && now.Before(h.expires):
			info.State = device.StateReserved
		}
		if one := (device.DiscoverResultV1{Devices: []device.DeviceInfoV1{info}}); one.Validate() == nil {
			out.Devices = append(out.Devices, info)
		}
	}
	return out
}

// lookup returns whether the driver has the device and whether it is
// online.
func (a *Agent) lookup(ctx context.Context, id device.DeviceId) (found, online bool) {
	devs, err := a.cfg.Driver.Discover(ctx)
	if err != nil {
		return false, false
	}
	for _, d := range devs {
		if d.ID == id {
			return true, d.Online
		}
	}
	return false, false
}

func (a *Agent) reserve(ctx context.Context, m *device.ReserveV1) wire.Message {
	res := &device.ReserveResultV1{Device: m.Device}
	found, online := a.lookup(ctx, m.Device)
	if !found {
		res.Outcome = device.OutcomeNotFound
		return res
	}
	if !online {
		res.Outcome = device.OutcomeFailed
		return res
	}
	now := a.cfg.Now()
	d := min(time.Duration(m.DurationMs)*time.Millisecond, a.cfg.MaxReservation)
	a.mu.Lock()
	h := a.held[m.Device]
	if h != nil && (h.busy || (h.lease != m.Lease && now.Before(h.expires))) {
		a.mu.Unlock()
		res.Outcome = device.OutcomeBusy
		return res
	}
	renew := h != nil && h.lease == m.Lease && now.Before(h.expires)
	nh := &hold{lease: m.Lease, expires: now.Add(d), busy: !renew}
	a.held[m.Device] = nh
	a.mu.Unlock()
	if !renew {
		octx, cancel := context.WithTimeout(ctx, a.cfg.OpTimeout)
		err := a.cfg.Driver.Reserve(octx, m.Device)
		cancel()
		a.mu.Lock()
		if err != nil {
			delete(a.held, m.Device)
		} else {
			nh.busy = false
		}
		a.mu.Unlock()
		if err != nil {
			a.log.Warn("reserve failed", "device", string(m.Device), "err", err)
			res.Outcome = device.OutcomeFailed
			return res
		}
	}
	res.Outcome, res.ReservationExpiresMs = device.OutcomeOk, uint64(nh.expires.UnixMilli())
	a.log.Info("device reserved", "device", string(m.Device), "lease", m.Lease.String(), "renew", renew)
	return res
}

// begin fences an operation under lease on id: it returns OutcomeOk and
// marks the device busy when lease holds its unexpired reservation; end
// must follow.
func (a *Agent) begin(id device.DeviceId, lease wire.LeaseId) device.DeviceOutcome {
	a.mu.Lock()
	defer a.mu.Unlock()
	h := a.held[id]
	live := h != nil && a.cfg.Now().Before(h.expires)
	switch {
	case live && h.lease != lease:
		return device.OutcomeBusy // held by another lease
	case !live:
		return device.OutcomeFailed // not reserved (any more) by this lease
	case h.busy:
		return device.OutcomeBusy // another operation runs
	}
	h.busy = true
	return device.OutcomeOk
}

func (a *Agent) end(id device.DeviceId, lease wire.LeaseId) {
	a.mu.Lock()
	if h := a.held[id]; h != nil && h.lease == lease {
		h.busy = false
	}
	a.mu.Unlock()
}

func (a *Agent) install(ctx context.Context, conn *semantics.Conn, m *device.InstallV1) wire.Message {
	res := &device.InstallResultV1{Device: m.Device}
	if res.Outcome = a.begin(m.Device, m.Lease); res.Outcome != device.OutcomeOk {
		res.Message = "the device is not reserved by this lease"
		if res.Outcome == device.OutcomeBusy {
			res.Message = "the device is held by another lease or busy"
		}
		return res
	}
	defer a.end(m.Device, m.Lease)
	octx, cancel := context.WithTimeout(ctx, a.cfg.OpTimeout)
	defer cancel()
	// The downloader verifies the digest before committing the object.
	if err := a.down.Fetch(octx, conn, m.Lease, m.Artifact); err != nil {
		a.log.Warn("artifact download failed", "device", string(m.Device), "err", err)
		res.Outcome, res.Message = device.OutcomeFailed, "the artifact could not be fetched from the daemon"
		if octx.Err() != nil {
			res.Outcome = device.OutcomeTimeout
		}
		return res
	}
	r, err := a.store.Open(m.Artifact, 0)
	if err != nil {
		res.Outcome, res.Message = device.OutcomeFailed, "the artifact could not be read"
		return res
	}
	defer r.Close()
	msg, err := a.cfg.Driver.Install(octx, m.Device, r)
	if err != nil {
		a.log.Warn("install failed", "device", string(m.Device), "err", err)
		res.Outcome, res.Message = device.OutcomeFailed, "the installer failed"
		if octx.Err() != nil {
			res.Outcome = device.OutcomeTimeout
		}
		return res
	}
	res.Outcome, res.Message = device.OutcomeOk, wire.TruncateUTF8(sanitize(msg), device.MaxMessage)
	return res
}

func (a *Agent) runTest(ctx context.Context, conn *semantics.Conn, proto wire.ProtocolVersion, m *device.RunTestV1) wire.Message {
	res := &device.RunTestResultV1{Device: m.Device}
	if res.Outcome = a.begin(m.Device, m.Lease); res.Outcome != device.OutcomeOk {
		return res
	}
	defer a.end(m.Device, m.Lease)
	lw, err := openLog(ctx, conn, proto, m.Lease, a.cfg.Now)
	if err != nil {
		// No log stream, so no run: the daemon waits for a log only
		// with a run's outcome.
		a.log.Warn("test log stream refused", "device", string(m.Device), "err", err)
		res.Outcome = device.OutcomeNotFound
		return res
	}
	rctx, cancel := context.WithTimeout(ctx, time.Duration(m.TimeoutMs)*time.Millisecond)
	defer cancel()
	r, err := a.cfg.Driver.RunTest(rctx, m.Device, TestRun{Suite: m.Suite, Filter: m.Filter, Log: lw})
	res.Passed, res.Failed = r.Passed, r.Failed
	switch {
	case rctx.Err() != nil:
		res.Outcome = device.OutcomeTimeout
		fmt.Fprintf(lw, "test run timed out after %d ms\n", m.TimeoutMs)
	case err != nil:
		res.Outcome = device.OutcomeFailed
		fmt.Fprintf(lw, "test run failed: %s\n", sanitize(err.Error()))
	case r.Failed > 0:
		res.Outcome = device.OutcomeFailed
	default:
		res.Outcome = device.OutcomeOk
	}
	if err := lw.Close(); err != nil {
		a.log.Warn("test log stream failed", "device", string(m.Device), "err", err)
	}
	return res
}

func (a *Agent) reset(ctx context.Context, m *device.ResetV1) wire.Message {
	res := &device.ResetResultV1{Device: m.Device}
	if res.Outcome = a.begin(m.Device, m.Lease); res.Outcome != device.OutcomeOk {
		return res
	}
	octx, cancel := context.WithTimeout(ctx, a.cfg.OpTimeout)
	defer cancel()
	err := a.cfg.Driver.Reset(octx, m.Device)
	a.mu.Lock()
	if h := a.held[m.Device]; h != nil && h.lease == m.Lease {
		delete(a.held, m.Device) // the reservation ends with the reset
	}
	a.mu.Unlock()
	if err != nil {
		a.log.Warn("reset failed", "device", string(m.Device), "err", err)
		res.Outcome = device.OutcomeFailed
		if octx.Err() != nil {
			res.Outcome = device.OutcomeTimeout
		}
		return res
	}
	res.Outcome = device.OutcomeOk
	return res
}

// sanitize replaces control characters (the wire's text fields refuse
// them).
func sanitize(s string) string {
	b := []rune(s)
	for i, r := range b {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			b[i] = ' '
		}
	}
	return string(b)
}

// logWriter streams a run's log as raw LogFrameV1 frames.
type logWriter struct {
	mu    sync.Mutex
	s     *semantics.SendStream
	seq   uint64
	now   func() time.Time
	proto wire.ProtocolVersion
	err   error
}

func openLog(ctx context.Context, conn *semantics.Conn, proto wire.ProtocolVersion, lease wire.LeaseId, now func() time.Time) (*logWriter, error) {
	s, err := conn.OpenUniStream(ctx, wire.StreamLog)
	if err != nil {
		return nil, err
	}
	w := &logWriter{s: s, now: now, proto: proto}
	hdr := &wlogs.LogStreamHeaderV1{Attempt: wire.JobAttemptId(lease), Lease: lease, FirstSeq: 1, Encoding: wlogs.LogEncodingRaw}
	if err := s.WriteEnvelope(&wire.Envelope{Protocol: proto, MessageID: wire.NewMessageId(), SentAtMs: uint64(now().UnixMilli()), Payload: hdr}); err != nil {
		s.CancelWrite(semantics.StreamCancelled)
		return nil, err
	}
	return w, nil
}

// Write sends p as frames of at most wlogs.MaxLogChunk bytes. After a
// stream error it drops the data (the run goes on; its result still
// reaches the daemon).
func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(p)
	for len(p) > 0 && w.err == nil {
		c := p[:min(len(p), wlogs.MaxLogChunk)]
		p = p[len(c):]
		w.seq++
		f := &wlogs.LogFrameV1{Seq: w.seq, Stream: wlogs.LogStdout, TimestampMs: uint64(w.now().UnixMilli()),
			UncompressedLen: uint32(len(c)), Bytes: c}
		w.err = w.s.WriteEnvelope(&wire.Envelope{Protocol: w.proto, MessageID: wire.NewMessageId(), Payload: f})
	}
	return n, nil
}

// Close ends the log stream (FIN).
func (w *logWriter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		w.s.CancelWrite(semantics.StreamCancelled)
		return w.err
	}
	return w.s.Close()
}
