// Package daemon is the daemon side of the agent control protocol: it
// accepts agent connections on any set of backends, runs the handshake
// state machine (hello, negotiation, registration with key proof, resync),
// and drives leases, renewals, cancellation, completions, heartbeats,
// fencing, draining and shutdown against a durable authority.Authority.
//
// The protocol is specified in docs/protocols/internal/agent-daemon.md,
// session.md, leases.md, heartbeat.md and reconnect.md.
//
// The data plane (data.go) is optional: with Config.LogSink (or LogDir)
// the agents' log streams go to a logs.Receiver, with Config.ContentStore
// their CAS streams go to a cas.Server; each stream is authorized against
// the authority's lease: an accepted lease of the connection's agent
// session may write its attempt's log and outputs and read its
// payload_ref, nothing else. Log acks, resume requests, the logs-finalized
// barrier, NeedObjects and OutputsFinalized travel on the control stream.
//
// The daemon never
// sends anything that runs an arbitrary command: only the typed admin
// messages of wire/admin and leases naming a JobSpec (§98); SentTypes lists
// every type it can send.
package daemon

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"sync"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/admin"
	agentwire "forgeyard.dev/transport/wire/agent"
	wcas "forgeyard.dev/transport/wire/cas"
	wlogs "forgeyard.dev/transport/wire/logs"
	"go.opentelemetry.io/otel/trace"
)

// SentTypes is every message type the daemon can send to an agent. It is
// the static list the "daemon cannot send an arbitrary command" test walks
// (§98): session and lease messages, typed admin commands, errors, and
// the data plane's acknowledgements (log acks and resume requests, the
// logs-finalized ack, MissingObjects).
var SentTypes = []wire.MessageTypeId{
	agentwire.MsgHelloAck, agentwire.MsgRegistrationAccepted, agentwire.MsgRegistrationRejected,
	agentwire.MsgLeaseOffer, agentwire.MsgLeaseRenewAck, agentwire.MsgCancelAttempt,
	agentwire.MsgCompletionAck, agentwire.MsgHeartbeatAck, agentwire.MsgResyncResponse,
	agentwire.MsgGoAway, agentwire.MsgSessionFenced, agentwire.MsgLeaseProbe,
	admin.MsgDrain, admin.MsgResume,
	wlogs.MsgLogAck, wlogs.MsgLogResumeRequest, wlogs.MsgLogsFinalizedAck,
	wcas.MsgMissingObjects,
	wire.MsgError,
}

const (
	maxViolations  = 3    // state/role violations before CloseProtocolError
	maxLatencyKeep = 1024 // latency samples kept per kind
	maxSeqSessions = 1 << 16
)

// Daemon serves agents. Create it with New; all methods are safe for
// concurrent use.
type Daemon struct {
	cfg    Config
	timing Timing
	auth   authority.Authority
	log    *slog.Logger
	now    func() time.Time
	proto  wire.ProtocolRange // effective range (MinProtocol applied)

	ctx    context.Context // ends at Shutdown
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	conns     map[wire.TransportSessionId]*conn
	bySession map[wire.AgentSessionId]*conn
	drained   map[wire.RunnerId]string
	offers    map[wire.LeaseId]*offer
	probing   map[wire.LeaseId]time.Time
	hbSeq     map[wint]uint64
	listeners []semantics.BackendListener
	shutdown  bool

	// offerFilter, when set (tests only, see export_test.go), is asked
	// before every offer send; false drops the offer as if it were lost.
	offerFilter atomic.Pointer[func(wire.LeaseId) bool]

	// Data plane (data.go): nil receiver/server when not configured.
	logRecv  *logs.Receiver
	ownSink  *logs.FileSink
	casSrv   *cas.Server
	logConns map[wire.JobAttemptId]*conn // under mu: the connection serving an attempt's log
	// outputs (under mu): the OutputsFinalizedV1 outputs of the last
	// maxRecordedOutputs attempts that declared them (FinalizedOutputs).
	outputs *recent[wire.JobAttemptId, []wire.CasObjectRef]
	// ended (under mu): the last maxEndedAttempts attempts whose log state
	// was forgotten at completion or revocation, so a logs-finalized
	// barrier answered after the end does not re-create it.
	ended *recent[wire.JobAttemptId, struct{}]

	st    stats
	audit *telemetry.Audit
	idst  identityStats // enroll.go
	// hard: admission control, rate-limit counters (admission.go).
	hard hardening
}

type wint = wire.AgentSessionId

// New validates cfg and returns a Daemon whose background loop (lease
// expiry with grace and probes, dedup pruning) runs until Shutdown.
func New(cfg Config) (*Daemon, error) {
	if cfg.Authority == nil {
		return nil, errors.New("daemon: Config.Authority is required")
	}
	if err := cfg.validateLimits(); err != nil {
		return nil, err
	}
	if cfg.Protocol == (wire.ProtocolRange{}) {
		cfg.Protocol = wire.Supported
	}
	if !cfg.Protocol.Valid() {
		return nil, fmt.Errorf("daemon: Config.Protocol %s is not a valid range", cfg.Protocol)
	}
	if len(cfg.Timing.FallbackStagger) > agentwire.MaxFallbackStagger {
		return nil, fmt.Errorf("daemon: Config.Timing.FallbackStagger has %d entries (max %d)", len(cfg.Timing.FallbackStagger), agentwire.MaxFallbackStagger)
	}
	if len(cfg.AlternateEndpoints) > agentwire.MaxAlternateEndpoints {
		return nil, fmt.Errorf("daemon: Config.AlternateEndpoints has %d entries (max %d)", len(cfg.AlternateEndpoints), agentwire.MaxAlternateEndpoints)
	}
	seen := map[string]bool{}
	for i, e := range cfg.AlternateEndpoints {
		if e == "" || len(e) > agentwire.MaxEndpoint || seen[e] {
			return nil, fmt.Errorf("daemon: Config.AlternateEndpoints[%d] %q is empty, longer than %d bytes or repeated", i, e, agentwire.MaxEndpoint)
		}
		seen[e] = true
	}
	if cfg.Protocol.Max.Less(cfg.MinProtocol) {
		return nil, fmt.Errorf("daemon: Config.MinProtocol %s is above Config.Protocol %s", cfg.MinProtocol, cfg.Protocol)
	}
	if cfg.ID == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		cfg.ID = "daemon-" + hex.EncodeToString(b[:])
	}
	if cfg.DedupRetention <= 0 {
		cfg.DedupRetention = DefaultDedupRetention
	}
	cfg.AlternateEndpoints = append([]string(nil), cfg.AlternateEndpoints...)
	d := &Daemon{cfg: cfg, timing: cfg.Timing.withDefaults(), auth: cfg.Authority, log: cfg.Logger, now: cfg.Now,
		conns: map[wire.TransportSessionId]*conn{}, bySession: map[wire.AgentSessionId]*conn{},
		drained: map[wire.RunnerId]string{}, offers: map[wire.LeaseId]*offer{}, probing: map[wire.LeaseId]time.Time{},
		hbSeq: map[wint]uint64{}}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	d.log = d.log.With("daemon", cfg.ID)
	d.audit = telemetry.NewAudit(d.log)
	d.initHardening()
	if d.now == nil {
		d.now = time.Now
	}
	d.proto = cfg.Protocol
	if d.proto.Min.Less(cfg.MinProtocol) {
		d.proto.Min = cfg.MinProtocol
	}
	if err := d.setupData(); err != nil {
		return nil, err
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	d.wg.Add(1)
	go d.maintenance()
	if p := cfg.Identity.RevocationPoll; p >= 0 {
		if p == 0 {
			p = DefaultRevocationPoll
		}
		d.wg.Add(1)
		go d.revocationLoop(p)
	}
	return d, nil
}

// Timing returns the effective timing policy (defaults applied).
func (d *Daemon) Timing() Timing { return d.timing }

// Serve accepts connections from l until l fails or Shutdown. Call it once
// per listener; any set of backends can be served at once. It returns nil
// after Shutdown, otherwise the listener's error.
func (d *Daemon) Serve(ctx context.Context, l semantics.BackendListener) error {
	d.mu.Lock()
	if d.shutdown {
		d.mu.Unlock()
		return ErrShutdown
	}
	d.listeners = append(d.listeners, l)
	d.mu.Unlock()
	// Connections live on the caller's ctx, not on this accept loop: when
	// Shutdown closes the listener, Serve returns but the connections stay up
	// long enough to receive their GoAway and close with CloseShutdown.
	connCtx := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-d.ctx.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		bc, err := l.Accept(ctx)
		if err != nil {
			d.mu.Lock()
			down := d.shutdown
			d.mu.Unlock()
			if down || d.ctx.Err() != nil {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.ServeConn(connCtx, bc)
		}()
	}
}

// ServeConn runs the control protocol on one connection until it ends (for
// tests and relays). When ctx ends the connection is closed with
// CloseShutdown. A connection refused by admission control (Config.
// Admission) is closed at once with CloseOverloaded.
func (d *Daemon) ServeConn(ctx context.Context, bc semantics.BackendConn) {
	d.serveAdmitted(ctx, bc)
}

// Sessions lists the transports connected to this daemon.
func (d *Daemon) Sessions() []SessionInfo {
	d.mu.Lock()
	cs := make([]*conn, 0, len(d.conns))
	for _, c := range d.conns {
		cs = append(cs, c)
	}
	d.mu.Unlock()
	out := make([]SessionInfo, 0, len(cs))
	for _, c := range cs {
		out = append(out, c.info())
	}
	return out
}

// current returns the active transport holding runner's current session.
func (d *Daemon) runnerConn(runner wire.RunnerId) *conn {
	d.mu.Lock()
	defer d.mu.Unlock()
	var best *conn
	for _, c := range d.bySession {
		if r, _, _, _ := c.ident(); r == runner && !c.isFenced() {
			if best == nil || c.connectedAt.After(best.connectedAt) {
				best = c
			}
		}
	}
	return best
}

func (d *Daemon) sessionConn(s wire.AgentSessionId) *conn {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.bySession[s]
}

// ---- leases ----

type offer struct {
	lease   authority.Lease
	msgID   wire.MessageId
	sentAt  time.Time
	start   time.Time // monotonic, for latency
	kick    chan struct{}
	done    chan struct{}
	once    sync.Once
	answer  LeaseAnswerEvent
	resends atomic.Int64
	expired bool // set before done closes
	settled atomic.Bool
	// adopted: the lease was created elsewhere (another daemon, or before a
	// restart) and nobody waits on done; the answer only reaches the
	// authority.
	adopted bool
	// trace is the lease.dispatch span's context, sent in the offer's
	// envelope to agents that negotiated FeatureTraceContextV1.
	trace    wire.TraceContext
	hasTrace bool
	// answering serializes recording an answer (onLeaseAnswer) with
	// settling from the authority (settleFromAuthority), so an answer
	// recorded here is never mistaken for one recorded elsewhere.
	answering sync.Mutex
}

// offerMessageID is the MessageId of every LeaseOfferV1 of lease id, on
// every daemon: the 48-bit time of the lease id and 80 bits of a SHA-256
// of it. A daemon re-sending an offer created by another daemon thus uses
// the same MessageId (the agent dedups by lease id in any case).
func offerMessageID(id wire.LeaseId) wire.MessageId {
	h := sha256.Sum256(append([]byte("forgeyard/lease-offer\x00"), id.ULID[:]...))
	var m wire.MessageId
	copy(m.ULID[:6], id.ULID[:6])
	copy(m.ULID[6:], h[:10])
	return m
}

func (o *offer) resent() bool { return o.resends.Add(1) > 1 }

func (o *offer) created() time.Time { return o.start }

func (o *offer) finish(a LeaseAnswerEvent) bool { return o.finishThen(a, nil) }

// finishThen settles the offer with a once; the first settlement runs
// first (if not nil) before the waiter is released.
func (o *offer) finishThen(a LeaseAnswerEvent, first func()) bool {
	was := false
	o.once.Do(func() {
		o.answer = a
		was = true
		o.settled.Store(true)
		if first != nil {
			first()
		}
		close(o.done)
	})
	return was
}

// OfferLease creates a lease in the authority, bound to the runner's current
// agent session, sends LeaseOfferV1 and re-sends it with the same MessageId
// until the agent answers or the lease expires (duplicates are safe, §67).
// If the agent reconnects to another daemon sharing the authority, that
// daemon re-sends the offer after the agent's resync, and this daemon
// learns the answer from the authority, which it reads on every re-send
// period and before declaring expiry (§227–230).
// It waits for the answer: it returns the lease (State accepted) when the
// agent accepted (here or through another daemon; also when the attempt
// already completed), a *RejectedError when it rejected (through another
// daemon: Reason RejectOther, the reason is not recorded), an error
// wrapping ErrLeaseRevoked when the lease was revoked unanswered,
// ErrOfferExpired, or ctx's error (the offer keeps being re-sent until it
// expires). ErrNotConnected, ErrDraining and ErrRoleForbidden are returned
// before anything is recorded.
func (d *Daemon) OfferLease(ctx context.Context, runner wire.RunnerId, o LeaseOffer) (authority.Lease, error) {
	if d.ctx.Err() != nil {
		return authority.Lease{}, ErrShutdown
	}
	c := d.runnerConn(runner)
	if c == nil || !c.active() {
		return authority.Lease{}, ErrNotConnected
	}
	_, sess, _, role := c.ident()
	if role != agentwire.RoleAgent && role != agentwire.RoleInternalWorker {
		return authority.Lease{}, ErrRoleForbidden
	}
	d.mu.Lock()
	_, drained := d.drained[runner]
	d.mu.Unlock()
	if drained {
		return authority.Lease{}, ErrDraining
	}
	ttl := o.TTL
	if ttl <= 0 {
		ttl = d.timing.LeaseTTL
	}
	if o.Attempt == (wire.JobAttemptId{}) {
		o.Attempt = wire.NewJobAttemptId()
	}
	now := d.now()
	l := authority.Lease{ID: wire.NewLeaseId(), Attempt: o.Attempt, Job: o.Job, Runner: runner, Session: sess,
		Spec: o.Spec, Payload: o.Payload, TTL: ttl, ExpiresAt: now.Add(ttl), State: authority.LeaseOffered, CreatedAt: now}
	probe := agentwire.LeaseOfferV1{Lease: l.ID, Attempt: l.Attempt, Job: l.Job, SpecID: l.Spec, ExpiresAtMs: uint64(l.ExpiresAt.UnixMilli()),
		TTLMs: ms32(ttl), PayloadRef: l.Payload, Session: sess, Epoch: 1}
	if err := probe.Validate(); err != nil {
		return authority.Lease{}, fmt.Errorf("daemon: invalid lease offer: %w", err)
	}
	// Tracked before it exists in the authority, so a concurrent resync of
	// the session on this daemon never adopts it as a foreign offer.
	of := &offer{lease: l, msgID: offerMessageID(l.ID), sentAt: now, start: time.Now(), kick: make(chan struct{}, 1), done: make(chan struct{})}
	_, sp := d.cfg.Tracing.Start(ctx, telemetry.SpanDispatch, telemetry.AttrRunner(runner), telemetry.AttrLease(l.ID), telemetry.AttrAttempt(l.Attempt))
	of.trace, of.hasTrace = telemetry.Inject(trace.ContextWithSpan(ctx, sp))
	var spanErr error
	defer func() { telemetry.End(sp, spanErr) }()
	d.mu.Lock()
	d.offers[l.ID] = of
	d.mu.Unlock()
	if err := d.auth.CreateLease(ctx, l); err != nil {
		d.mu.Lock()
		delete(d.offers, l.ID)
		d.mu.Unlock()
		spanErr = err
		return authority.Lease{}, err
	}
	d.st.leasesOffered.Add(1)
	d.wg.Add(1)
	go d.offerLoop(of)
	select {
	case <-of.done:
	case <-ctx.Done():
		spanErr = ctx.Err()
		return l, ctx.Err()
	}
	a := of.answer
	switch {
	case a.Err != nil:
		spanErr = a.Err
		return l, a.Err
	case a.Accepted:
		l.State = authority.LeaseAccepted
		return l, nil
	case of.expired:
		spanErr = ErrOfferExpired
		return l, ErrOfferExpired
	default:
		l.State = authority.LeaseRejected
		spanErr = &RejectedError{Reason: a.Reason, Message: a.Message}
		return l, spanErr
	}
}

// offerLoop sends an offer and re-sends it every period (and when kicked
// after a resync) on the session's transport on this daemon, until it is
// answered or expires. From the second round on it first reads the lease
// from the authority: an answer recorded through another daemon settles the
// offer. An adopted offer also ends when its session leaves this daemon
// (the daemon the agent reconnects to adopts it in turn).
func (d *Daemon) offerLoop(of *offer) {
	defer d.wg.Done()
	defer func() {
		d.mu.Lock()
		if d.offers[of.lease.ID] == of {
			delete(d.offers, of.lease.ID)
		}
		d.mu.Unlock()
	}()
	period := min(d.timing.RenewInterval, d.timing.RequestTimeout)
	t := time.NewTicker(period)
	defer t.Stop()
	for round := 0; ; round++ {
		if round > 0 && d.settleFromAuthority(of) {
			return
		}
		c := d.sessionConn(of.lease.Session)
		if of.adopted && c == nil {
			of.finish(LeaseAnswerEvent{Err: ErrNotConnected})
			return
		}
		if c != nil && c.active() {
			c.sendOffer(of)
		}
		left := of.lease.ExpiresAt.Sub(d.now())
		if left <= 0 {
			if d.settleFromAuthority(of) {
				return
			}
			of.once.Do(func() { of.expired = true; of.settled.Store(true); close(of.done) })
			return
		}
		exp := time.NewTimer(left)
		select {
		case <-of.done:
			exp.Stop()
			return
		case <-d.ctx.Done():
			exp.Stop()
			of.finish(LeaseAnswerEvent{Err: ErrShutdown})
			return
		case <-t.C:
		case <-of.kick:
		case <-exp.C:
		}
		exp.Stop()
	}
}

// settleFromAuthority reads the offer's lease from the authority and
// settles the offer if it was answered, completed or revoked elsewhere
// (another daemon, another transport). It reports whether the offer is
// settled; authority errors leave it pending.
func (d *Daemon) settleFromAuthority(of *offer) bool {
	of.answering.Lock()
	defer of.answering.Unlock()
	if of.settled.Load() {
		return true
	}
	ctx, cancel := context.WithTimeout(d.ctx, d.timing.RequestTimeout)
	l, err := d.auth.Lease(ctx, of.lease.ID)
	cancel()
	if err != nil {
		return false
	}
	ev := LeaseAnswerEvent{Runner: l.Runner, Session: l.Session, Lease: l.ID, Attempt: l.Attempt}
	switch l.State {
	case authority.LeaseAccepted, authority.LeaseCompleted:
		ev.Accepted = true
	case authority.LeaseRejected:
		ev.Reason, ev.Message = agentwire.RejectOther, "rejected through another daemon or transport (reason not recorded)"
	case authority.LeaseRevoked:
		ev.Err = fmt.Errorf("%w: %s", ErrLeaseRevoked, l.RevokeReason)
	default:
		return false
	}
	of.finishThen(ev, func() { d.st.settledElsewhere.Add(1) })
	return true
}

// adoptOffers starts re-sending the leases of c's session that are still
// offered in the authority but not tracked by this daemon: offers created
// by another daemon sharing the authority (or by this one before a
// restart) whose agent reconnected here before it answered (§67, §229).
// Called after the session's resync; expired leases are left to the
// expiry loop.
func (d *Daemon) adoptOffers(c *conn) {
	_, sess, _, role := c.ident()
	if role != agentwire.RoleAgent && role != agentwire.RoleInternalWorker {
		return
	}
	actx, acancel := c.authCtx()
	ls, err := d.auth.SessionLeases(actx, sess, authority.LeaseOffered)
	acancel()
	if err != nil {
		c.logger().Warn("cannot list the session's offered leases", "session", sess.String(), "err", err)
		return
	}
	now := d.now()
	for _, l := range ls {
		if !l.ExpiresAt.After(now) {
			continue
		}
		of := &offer{lease: l, msgID: offerMessageID(l.ID), sentAt: now, start: time.Now(), kick: make(chan struct{}, 1),
			done: make(chan struct{}), adopted: true}
		d.mu.Lock()
		if _, tracked := d.offers[l.ID]; tracked || d.shutdown {
			d.mu.Unlock()
			continue
		}
		d.offers[l.ID] = of
		d.wg.Add(1) // under d.mu before Shutdown sets d.shutdown: never after its Wait
		d.mu.Unlock()
		d.st.adopted.Add(1)
		go d.offerLoop(of)
	}
}

// kickOffers re-sends pending offers of a session now (after resync).
func (d *Daemon) kickOffers(s wire.AgentSessionId) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, of := range d.offers {
		if of.lease.Session == s {
			select {
			case of.kick <- struct{}{}:
			default:
			}
		}
	}
}

// CancelAttempt records the cancellation in the authority and delivers
// CancelAttemptV1 at cancel priority (§47, §132) on the transport holding
// the lease's session, retrying with the same MessageId every
// RequestTimeout until CancelAckV1. It returns nil once acknowledged, or
// nil at once when no transport of that session is on this daemon (the
// agent learns it at its next renewal or resync). authority.ErrNotFound:
// the attempt has no live lease. If ctx ends before the ack, ctx's error
// is returned; the cancel stays recorded.
func (d *Daemon) CancelAttempt(ctx context.Context, attempt wire.JobAttemptId, reason agentwire.CancellationReason) error {
	l, err := d.auth.CancelAttempt(ctx, attempt, uint32(reason), d.now())
	if err != nil {
		return err
	}
	d.st.cancels.Add(1)
	msg := &agentwire.CancelAttemptV1{Attempt: attempt, Lease: l.ID, Reason: reason}
	id := wire.NewMessageId()
	start := time.Now()
	sctx, sp := d.cfg.Tracing.Start(ctx, telemetry.SpanCancel, telemetry.AttrLease(l.ID), telemetry.AttrAttempt(attempt))
	defer sp.End()
	tc, hasTC := telemetry.Inject(sctx)
	for {
		c := d.sessionConn(l.Session)
		var ch *control.Channel
		if c != nil {
			ch = c.channel()
		}
		if ch == nil || !c.active() {
			return nil
		}
		out := control.Out{ID: id, Msg: msg, Priority: semantics.PriorityCancel, UsePriority: true}
		if hasTC && c.traced() {
			out.Trace, out.HasTrace = tc, true
		}
		_, err := ch.Call(ctx, out, d.timing.RequestTimeout)
		if err == nil {
			lat := time.Since(start)
			d.st.cancelLat.add(lat)
			d.cfg.Metrics.ObserveCancelDelivery(lat)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var we *wire.WireErrorV1
		if errors.As(err, &we) {
			return nil // the agent answered (e.g. unknown attempt): delivered
		}
		select { // the channel closed or timed out: wait a little and retry
		case <-ctx.Done():
			return ctx.Err()
		case <-d.ctx.Done():
			return ErrShutdown
		case <-time.After(min(d.timing.RequestTimeout, 50*time.Millisecond)):
		}
	}
}

// DrainRunner stops offering leases to runner and sends admin DrainV1 to
// its transports (§97). It returns ErrNotConnected if none is connected
// (the drain is still recorded on this daemon).
func (d *Daemon) DrainRunner(ctx context.Context, runner wire.RunnerId, reason string) error {
	d.mu.Lock()
	d.drained[runner] = reason
	d.mu.Unlock()
	return d.sendRunner(runner, &admin.DrainV1{Reason: wire.TruncateUTF8(reason, admin.MaxText)})
}

// ResumeRunner ends a drain and sends admin ResumeV1.
func (d *Daemon) ResumeRunner(ctx context.Context, runner wire.RunnerId) error {
	d.mu.Lock()
	delete(d.drained, runner)
	d.mu.Unlock()
	return d.sendRunner(runner, &admin.ResumeV1{})
}

func (d *Daemon) sendRunner(runner wire.RunnerId, m wire.Message) error {
	n := 0
	for _, c := range d.runnerConns(runner) {
		if ch := c.channel(); ch != nil && c.registered() {
			if _, err := ch.SendMsg(m); err == nil {
				n++
			}
		}
	}
	if n == 0 {
		return ErrNotConnected
	}
	return nil
}

func (d *Daemon) runnerConns(runner wire.RunnerId) []*conn {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*conn
	for _, c := range d.conns {
		if r, _, _, _ := c.ident(); r == runner {
			out = append(out, c)
		}
	}
	return out
}

// DisableRunner disables (revokes) the runner in the authority — its
// sessions end and its live leases are revoked — and closes its transports
// on this daemon with CloseRunnerDisabled.
func (d *Daemon) DisableRunner(ctx context.Context, runner wire.RunnerId, reason string) error {
	if err := d.auth.SetRunnerEnabled(ctx, runner, false, reason, d.now()); err != nil {
		return err
	}
	// The operator's reason is free text: it stays in the authority, not
	// in the audit record.
	d.audit.Emit(ctx, telemetry.EventRunnerRevoked, telemetry.Runner(runner), telemetry.Code(wire.ErrCodeRunnerDisabled),
		telemetry.Reason(telemetry.ReasonRevoked))
	for _, c := range d.runnerConns(runner) {
		c.closeNow(wire.CloseRunnerDisabled, "runner disabled: "+reason)
	}
	return nil
}

// Shutdown refuses new connections, sends GoAwayV1{CloseShutdown} to every agent
// (reconnect_in jittered per agent, alternate endpoints), waits for the
// agents to leave or ctx, then closes the rest with CloseShutdown and stops
// the background loops. It returns ctx's error if agents were still
// connected when ctx ended.
func (d *Daemon) Shutdown(ctx context.Context) error {
	d.mu.Lock()
	d.shutdown = true
	ls := d.listeners
	d.listeners = nil
	conns := make([]*conn, 0, len(d.conns))
	for _, c := range d.conns {
		conns = append(conns, c)
	}
	d.mu.Unlock()
	// Listeners close last: closing a QUIC listener ends the connections
	// accepted from it, and the agents must read their GoAway first. New
	// connections meanwhile are refused by newConn.
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	tryFor := uint32(d.timing.MaxBackoff.Milliseconds())
	for _, c := range conns {
		ch := c.channel()
		if ch == nil || !c.registered() {
			c.closeNow(wire.CloseShutdown, "daemon shutting down")
			continue
		}
		c.setState(stateDraining)
		j, _ := rand.Int(rand.Reader, big.NewInt(max(1, d.timing.HeartbeatInterval.Milliseconds())))
		_, _ = ch.SendMsg(&agentwire.GoAwayV1{Code: wire.CloseShutdown, ReconnectInMs: uint32(j.Int64()) + 1,
			TryForMs: tryFor, AlternateEndpoints: d.cfg.AlternateEndpoints, Message: "daemon shutting down"})
	}
	var err error
	for _, c := range conns {
		select {
		case <-c.done:
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err != nil {
			break
		}
	}
	for _, c := range conns {
		c.closeNow(wire.CloseShutdown, "daemon shutting down")
	}
	d.cancel()
	d.wg.Wait()
	if d.ownSink != nil {
		_ = d.ownSink.Close()
	}
	return err
}

// ---- background loop ----

func (d *Daemon) maintenance() {
	defer d.wg.Done()
	period := d.timing.RenewInterval
	t := time.NewTicker(period)
	defer t.Stop()
	lastPrune := time.Time{}
	for {
		select {
		case <-d.ctx.Done():
			return
		case <-t.C:
		}
		now := d.now()
		d.expireLeases(now)
		d.sweepLogs(time.Now())
		if now.Sub(lastPrune) >= min(d.cfg.DedupRetention, time.Hour) {
			lastPrune = now
			if n, err := d.auth.PruneDedup(d.ctx, now.Add(-d.cfg.DedupRetention)); err == nil {
				d.st.dedupPruned.Add(int64(n))
			}
		}
	}
}

// expireLeases implements lease expiry with grace: a lease expired by more
// than RevokeGrace is revoked; within the grace, if this daemon holds the
// session's transport, the agent is probed (LeaseProbeV1) and a renewal in
// the window saves the lease.
func (d *Daemon) expireLeases(now time.Time) {
	ls, err := d.auth.ExpiredLeases(d.ctx, now, 256)
	if err != nil {
		return
	}
	seen := map[wire.LeaseId]bool{}
	for _, l := range ls {
		seen[l.ID] = true
		if now.Sub(l.ExpiresAt) > d.timing.RevokeGrace {
			if err := d.auth.RevokeLease(d.ctx, l.ID, "lease expired", now); err == nil {
				d.st.leasesRevoked.Add(1)
				d.forgetAttemptLog(l.Attempt)
				if c := d.sessionConn(l.Session); c != nil && c.channel() != nil {
					_, _ = c.channel().Send(control.Out{Msg: &agentwire.CancelAttemptV1{Attempt: l.Attempt, Lease: l.ID, Reason: agentwire.CancelLeaseRevoked},
						Priority: semantics.PriorityCancel, UsePriority: true})
				}
			}
			d.mu.Lock()
			delete(d.probing, l.ID)
			d.mu.Unlock()
			continue
		}
		d.mu.Lock()
		_, probed := d.probing[l.ID]
		if !probed {
			d.probing[l.ID] = now
		}
		d.mu.Unlock()
		if probed {
			continue
		}
		if c := d.sessionConn(l.Session); c != nil && c.channel() != nil && c.active() {
			d.st.probes.Add(1)
			_, _ = c.channel().Send(control.Out{Msg: &agentwire.LeaseProbeV1{Lease: l.ID, Attempt: l.Attempt,
				GraceUntilMs: uint64(l.ExpiresAt.Add(d.timing.RevokeGrace).UnixMilli())}, Priority: semantics.PriorityLease, UsePriority: true})
		}
	}
	d.mu.Lock()
	for id := range d.probing {
		if !seen[id] {
			delete(d.probing, id) // renewed or gone
		}
	}
	d.mu.Unlock()
}
