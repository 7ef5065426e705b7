package daemon

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
	"unique"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/admin"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/health"
)

// The runner inventory (issue 16 items 3–5): what each runner reported
// (capabilities at registration and in CapabilityUpdateV1, health
// summaries and probe results), where it is connected, its last
// heartbeat and its drain state. With an authority that has an Inventory
// (authority.InventoryOf: both SQL stores) everything is stored there, so
// every daemon of an HA set answers for every runner and honours a drain
// set on any of them; without one the daemon knows only the runners
// connected to it and keeps drains in memory.

// Errors of the inventory and admin operations.
var (
	// ErrUnknownRunner: the inventory knows nothing of the runner.
	ErrUnknownRunner = errors.New("daemon: unknown runner")
	// ErrNotSupported: the agent refused the admin command as not
	// supported (an older agent).
	ErrNotSupported = errors.New("daemon: the agent does not support this command")
)

// presenceEvery bounds how often a connection's heartbeat time is written
// to the inventory (RunnerInfo.LastHeartbeat of a runner connected to this
// daemon is always the live value).
const presenceEvery = 30 * time.Second

// RunnerInfo is one runner of the inventory (Daemon.Runners, Daemon.Runner).
type RunnerInfo struct {
	Runner              wire.RunnerId
	Capabilities        authority.Capabilities
	CapabilitiesUpdated time.Time // zero: never reported
	// Connected: a registered transport of the runner is up — on this
	// daemon (Local), or on Daemon per the authority.
	Connected bool
	Local     bool
	Daemon    string // the daemon holding (or last holding) its session
	Session   wire.AgentSessionId
	Role      agentwire.PeerRole
	Backend   string
	Protocol  string
	// AgentVersion is the version string the agent sent in its hello.
	AgentVersion  string
	ConnectedAt   time.Time
	LastHeartbeat time.Time
	Health        authority.Health
	Drained       bool
	DrainReason   string
	DrainChanged  time.Time
}

// liveInv is what this daemon holds of one of its transports.
type liveInv struct {
	caps       authority.Capabilities
	capsAt     time.Time
	health     authority.Health
	hbSaved    time.Time // last heartbeat written to the inventory
	refreshing bool      // a digest-mismatch refresh is in flight (checkDigest)
	// toldDrained: this daemon's last drain message on the transport was
	// DrainV1 (markDrainSent); a resume set on another daemon is then sent
	// before the next offer (ensureResumed).
	toldDrained bool
}

// invState is the daemon's part of the inventory (under its own mutex).
type invState struct {
	mu   sync.Mutex
	live map[wire.TransportSessionId]*liveInv
}

func (s *invState) get(t wire.TransportSessionId) *liveInv {
	if s.live == nil {
		s.live = map[wire.TransportSessionId]*liveInv{}
	}
	l := s.live[t]
	if l == nil {
		l = &liveInv{}
		s.live[t] = l
	}
	return l
}

// capsOf converts validated wire capabilities.
func capsOf(c agentwire.RunnerCapabilitiesV1, digest wire.CapabilityDigest) authority.Capabilities {
	return authority.Capabilities{OS: intern(c.OS), Arch: intern(c.Arch), Labels: internAll(c.Labels), MaxParallel: c.MaxParallel,
		CPUMillis: c.CPUMillis, MemBytes: c.MemBytes, DiskBytes: c.DiskBytes, Tools: internAll(c.Tools), Digest: digest.Digest}
}

// intern returns the one copy of s the daemon keeps: the strings a
// connection holds for its life (capabilities, health, agent version) are
// mostly the same across a fleet, and each decoded copy would otherwise
// stay with its connection (issue 26 item 1).
func intern(s string) string { return unique.Make(s).Value() }

// internAll is a copy of ss with its strings interned (as slices.Clone:
// nil stays nil).
func internAll(ss []string) []string {
	if ss == nil {
		return nil
	}
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = intern(s)
	}
	return out
}

// healthOf converts a validated wire summary; probe is "" for a summary
// the agent sent on its own.
func healthOf(s *health.HealthSummaryV1, probe string, at time.Time) authority.Health {
	h := authority.Health{Status: s.Status.String(), UptimeMs: s.UptimeMs, Probe: intern(probe), ReportedAt: at}
	if len(s.Checks) > 0 {
		h.Checks = make([]authority.HealthCheck, len(s.Checks))
	}
	for i, c := range s.Checks {
		h.Checks[i] = authority.HealthCheck{Name: intern(c.Name), Status: c.Status.String(), Message: intern(c.Message)}
	}
	return h
}

// inventory returns the authority's inventory, nil without one.
func (d *Daemon) inventory() authority.Inventory { return authority.InventoryOf(d.auth) }

// noteRegistered records a registration's capabilities and presence.
// Read goroutine; the authority writes run on the work goroutine.
func (c *conn) noteRegistered(caps agentwire.RunnerCapabilitiesV1, digest wire.CapabilityDigest) {
	d := c.d
	now := d.now()
	ac := capsOf(caps, digest)
	d.inv.mu.Lock()
	l := d.inv.get(c.transport)
	l.caps, l.capsAt, l.hbSaved = ac, now, now
	d.inv.mu.Unlock()
	inv := d.inventory()
	if inv == nil {
		return
	}
	info := c.info()
	c.inventoryLater(func() {
		ctx, cancel := c.authCtx()
		defer cancel()
		if err := inv.PutCapabilities(ctx, info.Runner, ac, now); err != nil {
			d.authorityFailed("inventory_capabilities", err, "runner", info.Runner.String())
		}
		if err := inv.PutPresence(ctx, authority.Presence{Runner: info.Runner, Session: info.Session, Daemon: d.cfg.ID,
			Backend: info.Backend, Protocol: info.Protocol.String(), AgentVersion: info.AgentVersion, Role: uint32(info.Role),
			ConnectedAt: d.toAuth(info.ConnectedAt), LastHeartbeat: d.toAuth(now), Connected: true}); err != nil {
			d.authorityFailed("inventory_presence", err, "runner", info.Runner.String())
		}
	})
}

// noteHeartbeat writes the heartbeat time to the inventory at most every
// presenceEvery. Read goroutine.
func (c *conn) noteHeartbeat(at time.Time) {
	d := c.d
	inv := d.inventory()
	if inv == nil {
		return
	}
	d.inv.mu.Lock()
	l := d.inv.get(c.transport)
	due := at.Sub(l.hbSaved) >= presenceEvery
	if due {
		l.hbSaved = at
	}
	d.inv.mu.Unlock()
	if !due {
		return
	}
	runner, sess, _, _ := c.ident()
	c.inventoryLater(func() {
		ctx, cancel := c.authCtx()
		defer cancel()
		if err := inv.TouchHeartbeat(ctx, runner, sess, d.toAuth(at)); err != nil {
			d.authorityFailed("inventory_heartbeat", err, "runner", runner.String())
		}
	})
}

// checkDigest compares the capability digest a heartbeat carries with the
// snapshot this daemon holds (§236, capability recovery by digest
// comparison): on a mismatch — an update that never arrived — it asks the
// agent for its snapshot (RefreshCapabilitiesV1), one request at a time.
// Read goroutine; the request runs on its own goroutine.
func (c *conn) checkDigest(digest wire.CapabilityDigest) {
	d := c.d
	d.inv.mu.Lock()
	l := d.inv.live[c.transport]
	stale := l != nil && !digest.IsZero() && !l.capsAt.IsZero() && l.caps.Digest != digest.Digest && !l.refreshing
	if stale {
		l.refreshing = true
	}
	d.inv.mu.Unlock()
	if !stale {
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer func() {
			d.inv.mu.Lock()
			l.refreshing = false
			d.inv.mu.Unlock()
		}()
		ch := c.channel()
		if ch == nil {
			return
		}
		ctx, cancel := c.authCtx()
		defer cancel()
		env, err := ch.Call(ctx, control.Out{Msg: &admin.RefreshCapabilitiesV1{}}, d.timing.RequestTimeout)
		if err != nil {
			return
		}
		if up, ok := env.Payload.(*agentwire.CapabilityUpdateV1); ok {
			d.st.capRecovered.Add(1)
			c.applyCapabilities(up)
		}
	}()
}

// inventoryLater runs f on the connection's inventory goroutine, after
// every inventory write queued before it: the inventory's authority writes
// stay in order without queueing ahead of lease answers and completions on
// the work goroutine. Read goroutine only. The goroutine runs only while
// writes are queued (lazyQueue): an idle connection holds none.
func (c *conn) inventoryLater(f func()) { c.inv.push(invQueue, f, nil) }

// invQueue bounds the inventory writes queued per connection; when full
// the read goroutine waits (as with the work queue).
const invQueue = 16

// noteGone records the end of a registered transport after its queued
// inventory writes, and forgets its live state. Teardown, on the read
// goroutine.
func (c *conn) noteGone() {
	d := c.d
	d.inv.mu.Lock()
	_, had := d.inv.live[c.transport]
	delete(d.inv.live, c.transport)
	d.inv.mu.Unlock()
	if inv := d.inventory(); had && inv != nil {
		info := c.info()
		c.inventoryLater(func() {
			ctx, cancel := context.WithTimeout(context.Background(), d.timing.RequestTimeout)
			defer cancel()
			hb := info.LastHeartbeat
			if !hb.IsZero() {
				hb = d.toAuth(hb)
			}
			if err := inv.PutPresence(ctx, authority.Presence{Runner: info.Runner, Session: info.Session, Daemon: d.cfg.ID, LastHeartbeat: hb}); err != nil {
				// The presence stays "connected" until it expires (presence.go).
				d.authorityFailed("inventory_presence", err, "runner", info.Runner.String())
			}
		})
	}
	c.inv.wait() // the read goroutine queues no more
}

// applyCapabilities records a capability snapshot (CapabilityUpdateV1 or
// the answer to RefreshCapabilitiesV1), validated by the decoder, and
// calls Hooks.OnCapabilities.
func (c *conn) applyCapabilities(m *agentwire.CapabilityUpdateV1) authority.Capabilities {
	d := c.d
	now := d.now()
	ac := capsOf(m.Full, m.Digest)
	d.inv.mu.Lock()
	l := d.inv.get(c.transport)
	l.caps, l.capsAt = ac, now
	d.inv.mu.Unlock()
	if inv := d.inventory(); inv != nil {
		ctx, cancel := c.authCtx()
		defer cancel()
		runner, _, _, _ := c.ident()
		if err := inv.PutCapabilities(ctx, runner, ac, now); err != nil {
			d.authorityFailed("inventory_capabilities", err, "runner", runner.String())
		}
	}
	if h := d.cfg.Hooks.OnCapabilities; h != nil {
		h(c.info(), m.Full)
	}
	return ac
}

// applyHealth records a health report (a summary, or a probe's result).
func (c *conn) applyHealth(h authority.Health) {
	d := c.d
	d.inv.mu.Lock()
	d.inv.get(c.transport).health = h
	d.inv.mu.Unlock()
	if inv := d.inventory(); inv != nil {
		ctx, cancel := c.authCtx()
		defer cancel()
		runner, _, _, _ := c.ident()
		if err := inv.PutHealth(ctx, runner, h); err != nil {
			d.authorityFailed("inventory_health", err, "runner", runner.String())
		}
	}
}

// onInventoryMessage handles the agent's capability updates, health
// summaries and probe requests. It reports whether m was one of them.
// Read goroutine: the authority writes run on the work goroutine.
func (c *conn) onInventoryMessage(env *wire.Envelope, m wire.Message) bool {
	switch m := m.(type) {
	case *agentwire.CapabilityUpdateV1:
		if !c.registered() {
			return true
		}
		c.inventoryLater(func() { c.applyCapabilities(m) })
	case *health.HealthSummaryV1:
		if !c.registered() {
			return true
		}
		h := healthOf(m, "", c.d.now())
		c.inventoryLater(func() { c.applyHealth(h) })
	case *health.ProbeRequestV1:
		// The agent asks how the daemon is (e.g. its doctor's clock probe):
		// answered at once with the daemon's own view, never a program.
		c.reply(env, c.d.selfProbe(m.Probe))
	default:
		return false
	}
	return true
}

// selfProbe is the daemon's answer to a peer's ProbeRequestV1: its server
// time (the clock probe) and that it serves this transport.
func (d *Daemon) selfProbe(k health.ProbeKind) *health.ProbeResponseV1 {
	start := time.Now()
	checks := []health.HealthCheckV1{{Name: "daemon", Status: health.Healthy, Message: "serving " + d.cfg.ID}}
	if k == health.ProbeClock || k == health.ProbeFull {
		checks = append(checks, health.HealthCheckV1{Name: "server_time", Status: health.Healthy,
			Message: d.now().UTC().Format(time.RFC3339Nano)})
	}
	return &health.ProbeResponseV1{Probe: k, Summary: health.HealthSummaryV1{Status: health.Healthy, Checks: checks},
		DurationMs: uint32(time.Since(start).Milliseconds())}
}

// Runners lists the inventory: every runner the authority's inventory
// knows (at most authority.MaxInventoryList), with the live state of the
// runners connected to this daemon laid over it, by runner id.
func (d *Daemon) Runners(ctx context.Context) ([]RunnerInfo, error) {
	byID := map[wire.RunnerId]*RunnerInfo{}
	if inv := d.inventory(); inv != nil {
		recs, err := inv.Runners(ctx, 0)
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			ri := d.infoFromAuthority(r)
			byID[r.Runner] = &ri
		}
	}
	d.overlayLive(byID, nil)
	out := make([]RunnerInfo, 0, len(byID))
	for _, ri := range byID {
		out = append(out, *ri)
	}
	slices.SortFunc(out, func(a, b RunnerInfo) int { return a.Runner.ULID.Compare(b.Runner.ULID) })
	return out, nil
}

// Runner returns one runner of the inventory; ErrUnknownRunner if neither
// the authority nor this daemon knows it.
func (d *Daemon) Runner(ctx context.Context, runner wire.RunnerId) (RunnerInfo, error) {
	byID := map[wire.RunnerId]*RunnerInfo{}
	if inv := d.inventory(); inv != nil {
		r, err := inv.Runner(ctx, runner)
		switch {
		case err == nil:
			ri := d.infoFromAuthority(r)
			byID[runner] = &ri
		case !errors.Is(err, authority.ErrNotFound):
			return RunnerInfo{}, err
		}
	}
	d.overlayLive(byID, &runner)
	ri, ok := byID[runner]
	if !ok {
		return RunnerInfo{}, ErrUnknownRunner
	}
	return *ri, nil
}

func infoOf(r authority.RunnerRecord) RunnerInfo {
	p := r.Presence
	return RunnerInfo{Runner: r.Runner, Capabilities: r.Capabilities, CapabilitiesUpdated: r.CapsUpdated,
		Connected: p.Connected, Daemon: p.Daemon, Session: p.Session, Role: agentwire.PeerRole(p.Role), Backend: p.Backend,
		Protocol: p.Protocol, AgentVersion: p.AgentVersion, ConnectedAt: p.ConnectedAt, LastHeartbeat: p.LastHeartbeat,
		Health: r.Health, Drained: r.Drain.Drained, DrainReason: r.Drain.Reason, DrainChanged: r.Drain.Changed}
}

// overlayLive lays this daemon's registered transports (the newest one per
// runner) over byID; only, when set, restricts it to one runner.
func (d *Daemon) overlayLive(byID map[wire.RunnerId]*RunnerInfo, only *wire.RunnerId) {
	newest := map[wire.RunnerId]*conn{}
	for _, c := range d.allConns() {
		r, _, _, _ := c.ident()
		if (only != nil && r != *only) || !c.registered() || c.isFenced() {
			continue
		}
		if o := newest[r]; o == nil || c.connectedAt.After(o.connectedAt) {
			newest[r] = c
		}
	}
	d.mu.Lock()
	local := map[wire.RunnerId]string{}
	for r, reason := range d.drained {
		local[r] = reason
	}
	d.mu.Unlock()
	for r, c := range newest {
		ri := byID[r]
		if ri == nil {
			ri = &RunnerInfo{Runner: r}
			byID[r] = ri
		}
		s := c.info()
		ri.Connected, ri.Local, ri.Daemon, ri.Session, ri.Role = true, true, d.cfg.ID, s.Session, s.Role
		ri.Backend, ri.Protocol, ri.AgentVersion, ri.ConnectedAt, ri.LastHeartbeat = s.Backend, s.Protocol.String(), s.AgentVersion, s.ConnectedAt, s.LastHeartbeat
		d.inv.mu.Lock()
		if l := d.inv.live[c.transport]; l != nil {
			if !l.capsAt.IsZero() && !l.capsAt.Before(ri.CapabilitiesUpdated) {
				ri.Capabilities, ri.CapabilitiesUpdated = l.caps, l.capsAt
			}
			if !l.health.ReportedAt.IsZero() && !l.health.ReportedAt.Before(ri.Health.ReportedAt) {
				ri.Health = l.health
			}
		}
		d.inv.mu.Unlock()
	}
	if d.inventory() == nil { // drains live here only
		for r, reason := range local {
			if ri := byID[r]; ri != nil {
				ri.Drained, ri.DrainReason = true, reason
			}
		}
	}
}

// allConns returns this daemon's transports.
func (d *Daemon) allConns() []*conn {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*conn, 0, len(d.conns))
	for _, c := range d.conns {
		out = append(out, c)
	}
	return out
}

// isDrained reports whether runner is drained: per the authority's
// inventory (set by any daemon sharing it), or without one per this
// daemon's memory (storeDrain).
func (d *Daemon) isDrained(ctx context.Context, runner wire.RunnerId) (bool, error) {
	st, err := d.drainState(ctx, runner)
	return st.Drained, err
}

func (d *Daemon) drainState(ctx context.Context, runner wire.RunnerId) (authority.Drain, error) {
	if inv := d.inventory(); inv != nil {
		return inv.DrainState(ctx, runner)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	reason, drained := d.drained[runner]
	return authority.Drain{Drained: drained, Reason: reason}, nil
}

// resendDrain tells a freshly resynced agent that its runner is drained
// (the drain may have been set on another daemon, or before it
// reconnected). Work goroutine.
func (c *conn) resendDrain() {
	d := c.d
	runner, _, _, _ := c.ident()
	ctx, cancel := c.authCtx()
	defer cancel()
	st, err := d.drainState(ctx, runner)
	if err != nil || !st.Drained {
		return // the common case reads without the lock: a later drain reaches this conn through sendRunner
	}
	// Drained: read again under drainMu, so a resume stored meanwhile
	// (and sent) is not overtaken by this drain.
	d.drainMu.Lock()
	defer d.drainMu.Unlock()
	if st, err = d.drainState(ctx, runner); err != nil || !st.Drained {
		return
	}
	if ch := c.channel(); ch != nil {
		if _, err := ch.SendMsg(&admin.DrainV1{Reason: wire.TruncateUTF8(st.Reason, admin.MaxText)}); err == nil {
			c.markDrainSent(true)
		}
	}
}

// markDrainSent records that DrainV1 (drained) or ResumeV1 was sent on c.
func (c *conn) markDrainSent(drained bool) {
	c.d.inv.mu.Lock()
	c.d.inv.get(c.transport).toldDrained = drained
	c.d.inv.mu.Unlock()
}

// ensureResumed sends ResumeV1 before an offer to an agent this daemon
// told it was drained when the drain has since ended — resumed on another
// daemon sharing the authority — so the agent does not refuse the offer
// as draining. The control stream keeps the two in order.
func (c *conn) ensureResumed() {
	c.d.inv.mu.Lock()
	l := c.d.inv.live[c.transport]
	told := l != nil && l.toldDrained
	c.d.inv.mu.Unlock()
	if !told {
		return
	}
	if ch := c.channel(); ch != nil {
		if _, err := ch.SendMsg(&admin.ResumeV1{}); err == nil {
			c.markDrainSent(false)
		}
	}
}

// adminAudit records an operator's admin command on a runner (§97, §279).
func (d *Daemon) adminAudit(ctx context.Context, runner wire.RunnerId, reason telemetry.AuditReason, err error) {
	attrs := []telemetry.AuditAttr{telemetry.Runner(runner), telemetry.Reason(reason)}
	if err != nil {
		attrs = append(attrs, telemetry.ErrorText(err))
	}
	d.audit.Emit(ctx, telemetry.EventAdminCommand, attrs...)
}

// adminCall sends an admin command to runner's current transport and waits
// for the correlated answer (ctx and the request timeout bound it).
func (d *Daemon) adminCall(ctx context.Context, runner wire.RunnerId, m wire.Message) (*conn, *wire.Envelope, error) {
	c := d.runnerConn(runner)
	if c == nil || !c.registered() {
		return nil, nil, ErrNotConnected
	}
	ch := c.channel()
	if ch == nil {
		return nil, nil, ErrNotConnected
	}
	env, err := ch.Call(ctx, control.Out{Msg: m}, d.timing.RequestTimeout)
	if err != nil {
		return c, nil, err
	}
	if ack, ok := env.Payload.(*admin.AdminAckV1); ok && !ack.Accepted {
		return c, env, ErrNotSupported
	}
	return c, env, nil
}

// RefreshCapabilities asks the runner's agent for its current capabilities
// (admin RefreshCapabilitiesV1, §94, §97), records the snapshot it answers
// with and returns it. ErrNotConnected when the runner has no transport on
// this daemon, ErrNotSupported when the agent refuses the command.
func (d *Daemon) RefreshCapabilities(ctx context.Context, runner wire.RunnerId) (authority.Capabilities, error) {
	c, env, err := d.adminCall(ctx, runner, &admin.RefreshCapabilitiesV1{})
	var out authority.Capabilities
	if err == nil {
		up, ok := env.Payload.(*agentwire.CapabilityUpdateV1)
		if !ok {
			err = errUnexpected(env)
		} else {
			out = c.applyCapabilities(up)
		}
	}
	d.adminAudit(ctx, runner, telemetry.ReasonAdminRefresh, err)
	return out, err
}

// ProbeResult is a health probe's answer.
type ProbeResult struct {
	Probe    health.ProbeKind
	Health   authority.Health
	Duration time.Duration // as the agent measured it
}

// ProbeRunner asks the runner's agent to run one of its built-in health
// probes (admin RunHealthProbeV1, §96–97), records the result as the
// runner's health and returns it. Errors as RefreshCapabilities.
func (d *Daemon) ProbeRunner(ctx context.Context, runner wire.RunnerId, probe health.ProbeKind) (ProbeResult, error) {
	m := &admin.RunHealthProbeV1{Probe: probe}
	if err := m.Validate(); err != nil {
		return ProbeResult{}, err
	}
	c, env, err := d.adminCall(ctx, runner, m)
	var out ProbeResult
	if err == nil {
		resp, ok := env.Payload.(*health.ProbeResponseV1)
		if !ok {
			err = errUnexpected(env)
		} else {
			out = ProbeResult{Probe: resp.Probe, Health: healthOf(&resp.Summary, resp.Probe.String(), d.now()),
				Duration: time.Duration(resp.DurationMs) * time.Millisecond}
			c.applyHealth(out.Health)
		}
	}
	d.adminAudit(ctx, runner, telemetry.ReasonAdminProbe, err)
	return out, err
}

func errUnexpected(env *wire.Envelope) error {
	return errors.New("daemon: the agent answered " + nameOf(env.Payload.MessageType()))
}
