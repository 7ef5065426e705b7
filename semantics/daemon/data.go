package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wcas "forgeyard.dev/transport/wire/cas"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// maxDataWaits bounds the control requests of one connection the data
// plane answers off the read goroutine at once (logs-finalized barriers,
// NeedObjects batches); more are answered RateLimited.
const maxDataWaits = 64

// Retention of finished attempts' state (oldest forgotten first, see
// recent). A full daemon keeps per attempt: for outputs, the attempt id in
// the ring, a map slot (id and slice header) and the declared refs
// (48 bytes each), ~130 B with one output; for ended, the id in the ring
// and a map slot, ~40 B. At 4096 each: ~0.6 MiB in all, whatever the
// number of agents. docs/perf.md, "Retained state per finished attempt".
const (
	// maxRecordedOutputs bounds the OutputsFinalizedV1 records kept
	// (FinalizedOutputs).
	maxRecordedOutputs = 4096
	// maxEndedAttempts bounds the attempts remembered as ended.
	maxEndedAttempts = 4096
)

// Errors of the data plane authorization.
var (
	// ErrDataForbidden: the stream's lease is not an accepted lease of the
	// agent session on this connection, or names another attempt.
	ErrDataForbidden = errors.New("daemon: lease does not authorize this transfer")
)

// connKey carries the *conn that opened a data stream in the ctx given to
// logs.Receiver.Serve and cas.Session.Handle, so the authorizers check the
// lease against that connection's session.
type connKey struct{}

func connFrom(ctx context.Context) *conn {
	c, _ := ctx.Value(connKey{}).(*conn)
	return c
}

// setupData creates the log receiver and the CAS server from cfg.
func (d *Daemon) setupData() error {
	sink := d.cfg.LogSink
	if sink == nil && d.cfg.LogDir != "" {
		fs, err := logs.NewFileSink(d.cfg.LogDir, logs.FileSinkOptions{})
		if err != nil {
			return fmt.Errorf("daemon: log sink: %w", err)
		}
		sink, d.ownSink = fs, fs
	}
	d.dataHealth = newDataHealth()
	d.logSink = sink
	if sink != nil {
		lim := d.cfg.Bounds.Data.withDefaults()
		r, err := logs.NewReceiver(logs.ReceiverConfig{Sink: watchedSink{sink, d}, AuthorizeContext: d.authorizeLog,
			Ack:       func(m wlogs.LogAckV1) { d.sendToAttempt(m.Attempt, &m) },
			Resume:    func(m wlogs.LogResumeRequestV1) { d.sendToAttempt(m.Attempt, &m) },
			RateBytes: lim.LogRateBytes, BurstBytes: lim.LogBurstBytes,
			MaxAttemptBytes: lim.MaxAttemptLogBytes, MaxAttempts: lim.MaxLogAttempts, Metrics: d.cfg.Metrics,
			OnStream: func(_ context.Context, h wlogs.LogStreamHeaderV1) {
				if f := d.cfg.Hooks.OnLogStream; f != nil {
					f(h)
				}
			}})
		if err != nil {
			return fmt.Errorf("daemon: log receiver: %w", err)
		}
		d.logRecv = r
	}
	if d.cfg.ContentStore != nil {
		lim := d.cfg.Bounds.Data.withDefaults()
		s, err := cas.NewServer(cas.ServerConfig{Store: watchedStore{d.cfg.ContentStore, d}, Authorizer: cas.AuthorizerFunc(d.authorizeCAS),
			MaxConcurrent: lim.CASMaxConcurrent, MaxPerConn: lim.CASMaxPerConn, Bandwidth: lim.CASBandwidth, Metrics: d.cfg.Metrics})
		if err != nil {
			return fmt.Errorf("daemon: CAS server: %w", err)
		}
		d.casSrv = s
	}
	d.logConns = map[wire.JobAttemptId]*conn{}
	d.outputs = newRecent[wire.JobAttemptId, []wire.CasObjectRef](maxRecordedOutputs)
	d.ended = newRecent[wire.JobAttemptId, struct{}](maxEndedAttempts)
	d.finalSeq = newRecent[wire.JobAttemptId, uint64](maxEndedAttempts)
	return nil
}

// LogReceiver returns the daemon's log receiver (nil when log streams are
// refused), for stats and attempt state.
func (d *Daemon) LogReceiver() *logs.Receiver { return d.logRecv }

// CASServer returns the daemon's CAS server (nil when CAS is refused), for
// stats.
func (d *Daemon) CASServer() *cas.Server { return d.casSrv }

// FinalizedOutputs returns the outputs an agent declared for attempt in
// OutputsFinalizedV1 (§243), and whether it did. The last
// maxRecordedOutputs (4096) attempts that declared outputs are remembered.
func (d *Daemon) FinalizedOutputs(attempt wire.JobAttemptId) ([]wire.CasObjectRef, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	o, ok := d.outputs.get(attempt)
	return append([]wire.CasObjectRef(nil), o...), ok
}

// sendToAttempt sends m on the control channel of the connection that
// serves attempt's log; dropped when none (the agent resumes from its next
// Attach).
func (d *Daemon) sendToAttempt(attempt wire.JobAttemptId, m wire.Message) {
	d.mu.Lock()
	c := d.logConns[attempt]
	d.mu.Unlock()
	if c == nil {
		return
	}
	if ch := c.channel(); ch != nil {
		_, _ = ch.SendMsg(m)
	}
}

// leaseOf returns the lease when it is an accepted (or offered, see below)
// lease of c's agent session and c is an active, unfenced agent transport.
func (c *conn) leaseOf(ctx context.Context, id wire.LeaseId) (authority.Lease, error) {
	_, sess, _, role := c.ident()
	st := c.getState()
	if role != agentwire.RoleAgent || c.isFenced() || st < stateActive || st > stateDraining {
		return authority.Lease{}, ErrDataForbidden
	}
	actx, cancel := context.WithTimeout(ctx, c.d.timing.RequestTimeout)
	defer cancel()
	l, err := c.d.auth.Lease(actx, id)
	if err != nil {
		if errors.Is(err, authority.ErrNotFound) {
			return authority.Lease{}, ErrDataForbidden
		}
		return authority.Lease{}, err
	}
	// Offered counts too: the agent opens the attempt's log stream right
	// after answering the offer, and the stream may be served before the
	// control stream's LeaseAcceptedV1 is recorded.
	if l.Session != sess || (l.State != authority.LeaseAccepted && l.State != authority.LeaseOffered) {
		return authority.Lease{}, ErrDataForbidden
	}
	return l, nil
}

// barrierAllowed checks a data barrier (LogsFinalizedV1,
// OutputsFinalizedV1) about attempt under lease: true when lease is c's
// lease of that attempt (leaseOf); otherwise it answers env, Forbidden
// ("lease does not authorize this attempt's <what>") or, when the authority
// could not tell, a retryable internal error, and returns false.
func (c *conn) barrierAllowed(ctx context.Context, env *wire.Envelope, lease wire.LeaseId, attempt wire.JobAttemptId, what string) bool {
	l, err := c.leaseOf(ctx, lease)
	if err == nil && l.Attempt == attempt {
		return true
	}
	if errors.Is(err, ErrDataForbidden) || err == nil {
		c.replyErr(env, wire.ErrCodeForbidden, wire.RetryNever, "lease does not authorize this attempt's "+what)
	} else {
		c.replyErr(env, wire.ErrCodeInternal, wire.RetryBackoff, msgAuthorityUnavailable)
	}
	return false
}

// authorizeLog admits a log stream for attempt under lease when the lease
// is an accepted lease of the connection's session for that attempt; the
// connection then receives the attempt's LogAck/LogResume messages.
func (d *Daemon) authorizeLog(ctx context.Context, attempt wire.JobAttemptId, lease wire.LeaseId) error {
	c := connFrom(ctx)
	if c == nil {
		return ErrDataForbidden
	}
	l, err := c.leaseOf(ctx, lease)
	switch {
	case errors.Is(err, ErrDataForbidden):
		return err
	case err != nil:
		// The authority timed out or is unreachable: retryable, never
		// StreamForbidden (the agent would give up on the attempt's log).
		return fmt.Errorf("%w: %w", logs.ErrUnavailable, err)
	}
	if l.Attempt != attempt {
		return ErrDataForbidden
	}
	d.mu.Lock()
	d.logConns[attempt] = c
	d.mu.Unlock()
	return nil
}

// authorizeCAS: an accepted lease of the connection's session may write
// (upload) the outputs of its attempt and read (download) its payload_ref;
// nothing else.
func (d *Daemon) authorizeCAS(ctx context.Context, lease wire.LeaseId, obj wire.CasObjectRef, access cas.Access) error {
	c := connFrom(ctx)
	if c == nil {
		return cas.ErrForbidden
	}
	if c.deviceDataAllowed() {
		return d.authorizeDeviceCAS(c, lease, obj, access) // device.go: an install's artifact
	}
	l, err := c.leaseOf(ctx, lease)
	switch {
	case errors.Is(err, ErrDataForbidden):
		return fmt.Errorf("%w: %v", cas.ErrForbidden, err)
	case err != nil:
		// The authority timed out or is unreachable: retryable, never
		// Forbidden (the agent would give up on its outputs).
		return err
	}
	switch access {
	case cas.AccessWrite:
		return nil
	case cas.AccessRead:
		if l.Payload != (wire.CasObjectRef{}) && obj == l.Payload {
			return nil
		}
	}
	return cas.ErrForbidden
}

// dataAllowed reports whether c may open log and CAS streams: an active
// agent transport.
func (c *conn) dataAllowed() bool {
	_, _, _, role := c.ident()
	st := c.getState()
	return role == agentwire.RoleAgent && !c.isFenced() && st >= stateActive && st <= stateDraining
}

// serveStreams serves the bidirectional streams the peer opens after the
// control stream: CAS streams go to the CAS session, everything else is
// refused (StreamRefused). Each stream is served on the goroutine that read
// its header (semantics.Conn.HandleStreams): no goroutine waits for the
// next one.
func (c *conn) serveStreams(ctx context.Context, sess *cas.Session) {
	c.sc.HandleStreams(func(s *semantics.Stream) {
		k := s.Kind()
		casOK := (k == wire.StreamCasUpload || k == wire.StreamCasDownload) && c.dataAllowed() ||
			k == wire.StreamCasDownload && c.deviceDataAllowed() // device.go: an install's artifact
		if sess != nil && casOK && c.admitCasStream() {
			// Streams carry no trace context: a cas.stream span is a root.
			sctx, sp := c.d.cfg.Tracing.Start(ctx, telemetry.SpanCasStream, telemetry.AttrBackend(c.bc.Backend()))
			telemetry.End(sp, sess.Handle(sctx, s))
			return
		}
		s.CancelRead(semantics.StreamRefused)
		s.CancelWrite(semantics.StreamRefused)
	})
}

// serveUniStreams serves the unidirectional streams the peer opens: log
// streams go to the log receiver, everything else is refused; each on the
// goroutine that read its header, as serveStreams.
func (c *conn) serveUniStreams(ctx context.Context) {
	r := c.d.logRecv
	c.sc.HandleUniStreams(func(rs *semantics.RecvStream) {
		if rs.Kind() == wire.StreamLog && c.deviceDataAllowed() {
			c.serveDeviceLog(rs) // device.go: a test run's log
			return
		}
		if r != nil && rs.Kind() == wire.StreamLog && c.dataAllowed() {
			sctx, sp := c.d.cfg.Tracing.Start(ctx, telemetry.SpanLogStream, telemetry.AttrBackend(c.bc.Backend()))
			err := r.Serve(sctx, rs)
			telemetry.End(sp, err)
			if re, ok := errors.AsType[*logs.RejectError](err); ok && re.Reason == logs.RejectLost {
				c.d.log.Warn("attempt log refused: the agent no longer holds frames it was told were durable and this daemon's log store lacks them; "+lostFramesFix,
					"attempt", re.Attempt.String(), "missing_from", re.NextSeq)
			}
			return
		}
		rs.CancelRead(semantics.StreamRefused)
	})
}

// dataCtx is the ctx of c's data streams: it ends with the connection and
// names c for the authorizers.
func (c *conn) dataCtx() context.Context {
	return context.WithValue(c.sc.Context(), connKey{}, c)
}

// lostFramesFix is the operator's fix named by the warnings of a daemon
// that lacks log frames an agent was told were durable.
const lostFramesFix = `keep data.log_dir on durable storage, and give daemons that share agents one log store ([data] store = "s3")`

// onLogsFinalized answers the logs-finalized barrier (§243) once every
// frame up to LastSeq is durable; without a log sink the daemon keeps no
// logs and acknowledges at once (the agent's log streams were refused, so
// it counts its log as dropped).
func (c *conn) onLogsFinalized(env *wire.Envelope, m *wlogs.LogsFinalizedV1) {
	ctx := c.dataCtx()
	if !c.barrierAllowed(ctx, env, m.Lease, m.Attempt, "log") {
		return
	}
	r := c.d.logRecv
	if r == nil {
		c.reply(env, &wlogs.LogsFinalizedAckV1{Attempt: m.Attempt, LastSeq: m.LastSeq})
		return
	}
	// The agent declared its log final: a completion is not acknowledged
	// while a failing log store keeps it from being durable.
	c.d.mu.Lock()
	c.d.finalSeq.put(m.Attempt, m.LastSeq)
	c.d.mu.Unlock()
	// The frames arrive on the log stream: wait off the read goroutine,
	// bounded by the lease TTL and the connection.
	if !c.acquireWait() {
		c.replyErr(env, wire.ErrCodeRateLimited, wire.RetryBackoff, "too many pending data-plane requests")
		return
	}
	go func() {
		defer c.releaseWait()
		wctx, cancel := context.WithTimeout(ctx, c.d.timing.LeaseTTL)
		defer cancel()
		// A log store that starts failing ends the wait at once: the
		// frames will not become durable here now.
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for {
				select {
				case <-c.d.faultNotify():
					if c.d.hasFault(StoreLogs) {
						cancel()
						return
					}
				case <-stop:
					return
				}
			}
		}()
		if f, bad := c.d.dataFault(StoreLogs); bad && c.d.logSink.Durable(m.Attempt) < m.LastSeq {
			_ = c.ch.ReplyError(env.MessageID, wire.ErrCodeStorageUnavailable, wire.RetryBackoff, f.Text())
			return
		}
		ack, err := r.Finalized(wctx, m)
		// Finalized (re)creates the attempt's state: if the attempt ended
		// meanwhile (its completion may be handled while this waits), drop
		// it again.
		d := c.d
		d.mu.Lock()
		_, ended := d.ended.get(m.Attempt)
		d.mu.Unlock()
		if ended {
			r.Forget(m.Attempt)
		}
		if err != nil {
			if f, bad := c.d.dataFault(StoreLogs); bad && ctx.Err() == nil {
				_ = c.ch.ReplyError(env.MessageID, wire.ErrCodeStorageUnavailable, wire.RetryBackoff, f.Text())
			} else if ctx.Err() == nil {
				_ = c.ch.ReplyError(env.MessageID, wire.ErrCodeInternal, wire.RetryImmediately, "log not durable in time")
			}
			return
		}
		if st, _ := r.Attempt(m.Attempt); ack.LastSeq < m.LastSeq && !st.Refused {
			// The agent sent all it held and frames are still missing: it
			// was told they were durable by an earlier daemon process or
			// another daemon whose log store this one cannot read.
			c.d.log.Warn("attempt log incomplete: frames the agent was told were durable are not in this daemon's log store; "+lostFramesFix,
				"attempt", m.Attempt.String(), "stored_to", ack.LastSeq, "last_seq", m.LastSeq)
		}
		c.d.st.logsFinalized.Add(1)
		_ = c.ch.Reply(env, &ack)
	}()
}

// onNeedObjects answers a NeedObjectsV1 batch with the objects the daemon
// lacks (or the lease may not touch).
func (c *conn) onNeedObjects(env *wire.Envelope, m *wcas.NeedObjectsV1) {
	srv := c.d.casSrv
	if srv == nil {
		c.replyErr(env, wire.ErrCodeUnknownMessage, wire.RetryUnsupported, "this daemon has no content store")
		return
	}
	if !c.acquireWait() {
		c.replyErr(env, wire.ErrCodeRateLimited, wire.RetryBackoff, "too many pending data-plane requests")
		return
	}
	go func() {
		defer c.releaseWait()
		if f, bad := c.d.dataFault(StoreCAS); bad {
			// Nothing could be stored: say why, retryable (issue 15 item 4).
			_ = c.ch.ReplyError(env.MessageID, wire.ErrCodeStorageUnavailable, wire.RetryBackoff, f.Text())
			return
		}
		ctx, cancel := context.WithTimeout(c.dataCtx(), c.d.timing.RequestTimeout)
		defer cancel()
		out, err := srv.NeedObjects(ctx, m)
		if f, bad := c.d.dataFault(StoreCAS); err != nil && bad {
			_ = c.ch.ReplyError(env.MessageID, wire.ErrCodeStorageUnavailable, wire.RetryBackoff, f.Text())
			return
		}
		switch {
		case errors.Is(err, cas.ErrProtocol):
			_ = c.ch.ReplyError(env.MessageID, wire.ErrCodeInvalidValue, wire.RetryNever, "invalid NeedObjectsV1")
		case errors.Is(err, cas.ErrAuthUnavailable):
			_ = c.ch.ReplyError(env.MessageID, wire.ErrCodeInternal, wire.RetryBackoff, "authority unavailable; retry later")
		case err != nil:
			_ = c.ch.ReplyError(env.MessageID, wire.ErrCodeInternal, wire.RetryImmediately, "content store unavailable")
		default:
			_ = c.ch.Reply(env, out)
		}
	}()
}

// onOutputsFinalized records the attempt's declared outputs (§243) when
// the lease is the connection's.
func (c *conn) onOutputsFinalized(env *wire.Envelope, m *wcas.OutputsFinalizedV1) {
	if !c.barrierAllowed(c.dataCtx(), env, m.Lease, m.Attempt, "outputs") {
		return
	}
	d := c.d
	d.recordOutputs(m.Attempt, m.Outputs)
	d.st.outputsFinalized.Add(1)
	if h := d.cfg.Hooks.OnOutputs; h != nil {
		runner, _, _, _ := c.ident()
		h(OutputsEvent{Runner: runner, Lease: m.Lease, Attempt: m.Attempt,
			Outputs: append([]wire.CasObjectRef(nil), m.Outputs...)})
	}
}

// recordOutputs remembers an attempt's declared outputs (bounded,
// maxRecordedOutputs): an exactly sized copy, nil for none.
func (d *Daemon) recordOutputs(attempt wire.JobAttemptId, outputs []wire.CasObjectRef) {
	var outs []wire.CasObjectRef
	if len(outputs) > 0 {
		outs = append(make([]wire.CasObjectRef, 0, len(outputs)), outputs...)
	}
	d.mu.Lock()
	d.outputs.put(attempt, outs)
	d.mu.Unlock()
}

// forgetAttemptLog drops the per-attempt log state after a completion or
// a revocation, and remembers (bounded) that the attempt ended.
func (d *Daemon) forgetAttemptLog(attempt wire.JobAttemptId) {
	d.mu.Lock()
	delete(d.logConns, attempt)
	d.ended.put(attempt, struct{}{})
	d.mu.Unlock()
	if d.logRecv != nil {
		d.logRecv.Forget(attempt)
	}
}

// acquireWait takes one of the connection's maxDataWaits slots, without
// blocking.
func (c *conn) acquireWait() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dataWaits >= maxDataWaits {
		return false
	}
	c.dataWaits++
	return true
}

func (c *conn) releaseWait() {
	c.mu.Lock()
	c.dataWaits--
	c.mu.Unlock()
}

// sweepLogs forgets the log state of attempts whose log connection ended
// more than a lease TTL plus the revoke grace ago without the attempt
// coming back on another connection (revoked here, completed through
// another daemon): the receiver's per-attempt table stays bounded by live
// attempts. The sink keeps what was durable.
func (d *Daemon) sweepLogs(now time.Time) {
	limit := d.timing.LeaseTTL + d.timing.RevokeGrace
	var stale []wire.JobAttemptId
	d.mu.Lock()
	for a, c := range d.logConns {
		c.mu.Lock()
		gone := !c.closedAt.IsZero() && now.Sub(c.closedAt) > limit
		c.mu.Unlock()
		if gone {
			stale = append(stale, a)
			delete(d.logConns, a)
		}
	}
	d.mu.Unlock()
	if d.logRecv != nil {
		for _, a := range stale {
			d.logRecv.Forget(a)
		}
	}
}
