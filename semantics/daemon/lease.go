package daemon

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	"go.opentelemetry.io/otel/trace"
)

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

// offerMessage is the LeaseOfferV1 of lease l for a transport of epoch
// epoch: the one place an offer is built (OfferLease validates it before
// recording the lease, sendOffer sends it).
func offerMessage(l authority.Lease, epoch uint64) *agentwire.LeaseOfferV1 {
	return &agentwire.LeaseOfferV1{Lease: l.ID, Attempt: l.Attempt, Job: l.Job, SpecID: l.Spec,
		ExpiresAtMs: uint64(l.ExpiresAt.UnixMilli()), TTLMs: ms32(l.TTL), PayloadRef: l.Payload, Session: l.Session, Epoch: epoch}
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
	// Drained on this daemon or, through the authority's inventory, on
	// any daemon sharing it (inventory.go).
	if drained, err := d.isDrained(ctx, runner); err != nil {
		return authority.Lease{}, err
	} else if drained {
		return authority.Lease{}, ErrDraining
	}
	c.ensureResumed() // a drain this daemon announced ended elsewhere (inventory.go)
	ttl := o.TTL
	if ttl <= 0 {
		ttl = d.timing.LeaseTTL
	}
	if o.Attempt == (wire.JobAttemptId{}) {
		o.Attempt = wire.NewJobAttemptId()
	}
	now := d.now()
	at := d.authNow() // lease times are on the authority's clock (dbclock.go)
	l := authority.Lease{ID: wire.NewLeaseId(), Attempt: o.Attempt, Job: o.Job, Runner: runner, Session: sess,
		Spec: o.Spec, Payload: o.Payload, TTL: ttl, ExpiresAt: at.Add(ttl), State: authority.LeaseOffered, CreatedAt: at}
	if err := offerMessage(l, 1).Validate(); err != nil {
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
		left := of.lease.ExpiresAt.Sub(d.authNow())
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

func (c *conn) sendOffer(of *offer) {
	l := of.lease
	_, _, epoch, _ := c.ident()
	if of.settled.Load() {
		return
	}
	if f := c.d.offerFilter.Load(); f != nil && !(*f)(l.ID) {
		return
	}
	if !of.sentAt.IsZero() && of.resent() {
		c.d.st.resends.Add(1)
	}
	l.ExpiresAt = c.d.toLocal(l.ExpiresAt) // the agent reads it on this daemon's clock
	out := control.Out{ID: of.msgID, Msg: offerMessage(l, epoch)}
	if of.hasTrace && c.traced() {
		out.Trace, out.HasTrace = of.trace, true
	}
	_, _ = c.channel().Send(out)
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

// onLeaseAnswer records an offer's answer; it returns the message's
// outcome for forgeyard_transport_messages_total.
func (c *conn) onLeaseAnswer(env *wire.Envelope, lease wire.LeaseId, attempt wire.JobAttemptId, accepted bool, reason agentwire.LeaseRejectReason, msg string) telemetry.Outcome {
	d := c.d
	_, sp := c.span(env, telemetry.SpanLeaseAck, telemetry.AttrLease(lease), telemetry.AttrAttempt(attempt))
	var spanErr error
	defer func() { telemetry.End(sp, spanErr) }()
	now := d.now()
	d.mu.Lock()
	of := d.offers[lease]
	d.mu.Unlock()
	if of != nil {
		// Recorded and settled as one step against settleFromAuthority.
		of.answering.Lock()
		defer of.answering.Unlock()
	}
	var err error
	if accepted {
		actx, acancel := c.authCtx()
		defer acancel()
		_, err = d.auth.AcceptLease(actx, lease, attempt, c.ref(), now)
		if errors.Is(err, authority.ErrStaleLease) {
			// The first answer was lost in a cut and the attempt already
			// completed on a later transport: the re-sent offer's answer
			// is late, not stale.
			actx, acancel := c.authCtx()
			defer acancel()
			if l, lerr := d.auth.Lease(actx, lease); lerr == nil && l.State == authority.LeaseCompleted &&
				l.Session == c.session && l.Attempt == attempt {
				err = nil
			}
		}
	} else {
		actx, acancel := c.authCtx()
		defer acancel()
		err = d.auth.RejectLease(actx, lease, attempt, c.ref(), now)
	}
	ev := LeaseAnswerEvent{Runner: c.runner, Session: c.session, Lease: lease, Attempt: attempt, Accepted: accepted, Reason: reason, Message: msg, Err: err}
	first := false
	// A fenced or failed recording is not an answer: the offer keeps being
	// re-sent on the session's current transport.
	definitive := err == nil || errors.Is(err, authority.ErrStaleLease) || errors.Is(err, authority.ErrStaleSession)
	if of != nil && definitive {
		first = of.finish(ev)
		if first && err == nil && accepted && !of.adopted {
			lat := time.Since(of.created())
			d.st.offerLat.add(lat)
			d.cfg.Metrics.ObserveLeaseOfferToAck(lat)
		}
	}
	switch {
	case err != nil:
	case !first:
		ev.Duplicate = true
		d.st.dupAns.Add(1)
	case accepted:
		d.st.leasesAccepted.Add(1)
	default:
		d.st.leasesRejected.Add(1)
	}
	if h := d.cfg.Hooks.OnLeaseAnswer; h != nil {
		h(ev)
	}
	spanErr = err
	if errors.Is(err, authority.ErrStaleLease) || errors.Is(err, authority.ErrStaleSession) {
		d.audit.Emit(context.Background(), telemetry.EventStaleLeaseReplay, telemetry.Runner(c.runner), telemetry.Session(c.session),
			telemetry.Transport(c.transport), telemetry.Remote(c.bc.RemoteAddr()), telemetry.Code(wire.ErrCodeStaleLease),
			telemetry.Reason(telemetry.ReasonLeaseSuperseded))
	}
	switch {
	case errors.Is(err, authority.ErrFenced):
		c.fencedErr(env)
		return telemetry.OutcomeRejected
	case errors.Is(err, authority.ErrStaleLease), errors.Is(err, authority.ErrStaleSession):
		c.replyErr(env, wire.ErrCodeStaleLease, wire.RetryNever, "lease no longer offered to this session")
		return telemetry.OutcomeRejected
	case err != nil:
		// The offer is re-sent (the answer was not recorded): the agent
		// answers it again from its answer cache.
		op := "reject_lease"
		if accepted {
			op = "accept_lease"
		}
		return c.authUnavailable(env, op, err, "lease", lease.String())
	}
	return telemetry.OutcomeOK
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
		if !l.ExpiresAt.After(d.authNow()) {
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
