package agent

import (
	"context"
	"errors"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// handshake sets up the control stream on bc and completes the hello round
// trip (TransportHelloV1 → HelloAckV1), bounded by ctx; the link lives in
// runCtx. On failure bc is closed.
func (a *Agent) handshake(ctx, runCtx context.Context, ep Endpoint, bc semantics.BackendConn) (*link, error) {
	rto := a.cfg.RequestTimeout
	sc, err := semantics.NewConn(bc, semantics.Config{Limits: a.cfg.Limits, Logger: a.log, Metrics: a.cfg.Metrics})
	if err != nil {
		_ = bc.CloseWithCode(wire.CloseNormal, "agent leaving")
		return nil, err
	}
	octx, ocancel := context.WithTimeout(ctx, rto)
	st, err := sc.OpenStream(octx, wire.StreamControl)
	ocancel()
	if err != nil {
		_ = bc.CloseWithCode(wire.CloseNormal, "agent leaving")
		return nil, err
	}
	lctx, lcancel := context.WithCancel(runCtx)
	l := &link{ep: ep, bc: bc, sc: sc, ctx: lctx, lcancel: lcancel, goaway: make(chan struct{}), runDone: make(chan struct{}),
		ch: control.New(st, control.Config{Now: a.now, Logger: a.log, WriteTimeout: rto, Metrics: a.cfg.Metrics})}
	go func() {
		defer close(l.runDone)
		_ = l.ch.Run(func(env *wire.Envelope) { a.handle(l, env) }, func(de *control.DecodeError) {
			_ = l.ch.ReplyError(de.MessageID, de.Code, wire.RetryNever, "frame rejected")
		})
	}()
	// transport.handshake: hello → HelloAck (the trace context is not
	// negotiated yet, so nothing is propagated).
	_, hsp := a.cfg.Tracing.Start(ctx, telemetry.SpanHandshake, telemetry.AttrBackend(ep.Backend))
	helloSent := time.Now()
	env, err := l.ch.Call(ctx, control.Out{Msg: &agentwire.TransportHelloV1{Role: a.cfg.Role, Versions: a.cfg.Protocol,
		Features: a.cfg.Features, HasAgentSession: true, AgentSession: a.session, AgentVersion: a.cfg.Version}}, rto)
	telemetry.End(hsp, err)
	if err != nil {
		l.close(wire.CloseNormal, "agent leaving")
		return nil, err
	}
	var ack *agentwire.HelloAckV1
	switch m := env.Payload.(type) {
	case *agentwire.HelloAckV1:
		ack = m
		a.observeServerTime(m.ServerTimeMs, a.now().Add(-time.Since(helloSent)), a.now())
	case *agentwire.RegistrationRejectedV1:
		if m.Code == wire.ErrCodeUnsupportedVersion {
			l.close(wire.CloseVersionMismatch, m.Message)
			a.log.Error("daemon refused our protocol version", "endpoint", ep.Address, "message", m.Message)
			return nil, &VersionError{Message: m.Message, ServerRange: m.ServerRange, Endpoint: ep.Address}
		}
		l.close(wire.CloseNormal, "agent leaving")
		return nil, &RejectedError{Code: m.Code, Retry: m.Retry, Message: m.Message, Endpoint: ep.Address}
	case *agentwire.RegistrationDeferredV1:
		l.close(wire.CloseNormal, "agent leaving")
		return nil, deferredError(m, ep)
	default:
		l.close(wire.CloseNormal, "agent leaving")
		return nil, errors.New("agent: unexpected answer to hello")
	}
	l.ack = ack
	l.transport, l.protocol, l.features = ack.TransportSession, ack.Negotiated, ack.Features.Intersect(a.cfg.Features)
	l.ch.SetProtocol(ack.Negotiated)
	return l, nil
}

// register registers the agent session over the handshaken l (a new epoch)
// and resyncs. On failure l is closed.
func (a *Agent) register(ctx context.Context, l *link) (err error) {
	defer func() {
		if err != nil {
			l.close(wire.CloseNormal, "agent leaving")
		}
	}()
	rto := a.cfg.RequestTimeout
	ep := l.ep
	signer, chain := a.credentials() // enroll.go: Config.Credentials or Signer/CertChain
	proof, err := session.SignKeyProof(signer, l.ack.Challenge, l.ack.TransportSession, a.session)
	if err != nil {
		return err
	}
	a.mu.Lock()
	prevEpoch := a.epoch
	a.mu.Unlock()
	caps, digest := a.capabilities()
	a.mu.Lock()
	l.capDigest = digest
	a.mu.Unlock()
	reg := &agentwire.RegisterAgentV1{Runner: a.cfg.Runner, Session: a.session, AgentVersion: a.cfg.Version,
		Capabilities: caps, CapabilityDigest: digest, KeyProof: proof, CertChain: chain}
	if prevEpoch > 0 {
		reg.HasResumeEpoch, reg.ResumeEpoch = true, prevEpoch
	}
	rctx, rsp := a.cfg.Tracing.Start(ctx, telemetry.SpanRegister, telemetry.AttrRunner(a.cfg.Runner), telemetry.AttrBackend(ep.Backend))
	regSent := time.Now()
	env, err := l.ch.Call(ctx, l.traceOut(rctx, control.Out{Msg: reg}), rto)
	if err == nil {
		if rj, ok := env.Payload.(*agentwire.RegistrationRejectedV1); ok {
			telemetry.End(rsp, errors.New("registration rejected: "+rj.Code.String()))
		} else if rd, ok := env.Payload.(*agentwire.RegistrationDeferredV1); ok {
			telemetry.End(rsp, errors.New("registration deferred: "+rd.Code.String()))
		} else {
			rsp.End()
		}
	} else {
		telemetry.End(rsp, err)
	}
	if err != nil {
		return err
	}
	var acc *agentwire.RegistrationAcceptedV1
	switch m := env.Payload.(type) {
	case *agentwire.RegistrationAcceptedV1:
		acc = m
		a.observeServerTime(m.ServerTimeMs, a.now().Add(-time.Since(regSent)), a.now())
	case *agentwire.RegistrationRejectedV1:
		re := &RejectedError{Code: m.Code, Retry: m.Retry, Message: m.Message, Endpoint: ep.Address}
		a.log.Error("registration rejected", "endpoint", ep.Address, "err", re)
		return re
	case *agentwire.RegistrationDeferredV1:
		return deferredError(m, ep)
	default:
		return errors.New("agent: unexpected answer to registration")
	}
	l.epoch = acc.Epoch
	a.mu.Lock()
	a.epoch = acc.Epoch
	a.hbEvery = time.Duration(acc.HeartbeatIntervalMs) * time.Millisecond
	a.renewEvery = time.Duration(acc.LeaseRenewIntervalMs) * time.Millisecond
	a.maxBackoff = time.Duration(acc.MaxBackoffMs) * time.Millisecond
	a.alternates = append([]string(nil), acc.AlternateEndpoints...)
	if len(acc.FallbackStaggerMs) > 0 {
		a.classStagger = a.classStagger[:0]
		for _, ms := range acc.FallbackStaggerMs {
			a.classStagger = append(a.classStagger, time.Duration(ms)*time.Millisecond)
		}
	}
	a.mu.Unlock()
	if a.st.registrations.Add(1) > 1 {
		a.st.reconnects.Add(1)
	}
	// Resync (always, even with no attempts).
	if a.execs {
		if err := a.resync(ctx, l); err != nil {
			return err
		}
	}
	return nil
}

func (a *Agent) resync(ctx context.Context, l *link) error {
	a.mu.Lock()
	claims := make([]agentwire.ActiveAttemptResyncV1, 0, len(a.attempts))
	for id, at := range a.attempts {
		if len(claims) == agentwire.MaxActiveAttempts {
			break
		}
		c := agentwire.ActiveAttemptResyncV1{Attempt: id, Lease: at.job.Lease, Epoch: l.epoch, Phase: at.phase}
		if at.compl != nil {
			c.HasCompletion, c.Completion = true, at.complID
		}
		claims = append(claims, c)
	}
	a.mu.Unlock()
	sctx, sp := a.cfg.Tracing.Start(ctx, telemetry.SpanResync, telemetry.AttrRunner(a.cfg.Runner))
	defer sp.End()
	env, err := l.ch.Call(ctx, l.traceOut(sctx, control.Out{Msg: &agentwire.AgentResyncV1{Session: a.session, Epoch: l.epoch,
		ActiveAttempts: claims, CapabilityDigest: a.capabilityDigest()}}), a.cfg.RequestTimeout)
	if err != nil {
		return err
	}
	resp, ok := env.Payload.(*agentwire.ResyncResponseV1)
	if !ok {
		return errors.New("agent: unexpected answer to resync")
	}
	a.st.resyncs.Add(1)
	for _, r := range resp.Results {
		switch r.Decision.Kind {
		case agentwire.DecisionStale:
			a.stopAttempt(r.Attempt, agentwire.CancelLeaseRevoked, true)
		case agentwire.DecisionCancel:
			a.stopAttempt(r.Attempt, r.Decision.Reason, false)
		case agentwire.DecisionContinue:
			a.mu.Lock()
			at := a.attempts[r.Attempt]
			a.mu.Unlock()
			if at != nil {
				a.leaseUntil(at, r.Decision.ExpiresAtMs)
			}
		}
	}
	return nil
}

// deferredError is the daemon's RegistrationDeferredV1 as a retryable
// *RejectedError carrying its retry hint (Run obeys it).
func deferredError(m *agentwire.RegistrationDeferredV1, ep Endpoint) *RejectedError {
	return &RejectedError{Code: m.Code, Retry: wire.RetryBackoff, Message: m.Message, Endpoint: ep.Address,
		RetryAfter: time.Duration(m.RetryAfterMs) * time.Millisecond}
}
