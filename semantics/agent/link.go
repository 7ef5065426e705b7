package agent

import (
	"context"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/admin"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/health"
)

type link struct {
	ep        Endpoint
	bc        semantics.BackendConn
	sc        *semantics.Conn
	ch        *control.Channel
	transport wire.TransportSessionId
	epoch     uint64
	protocol  wire.ProtocolVersion
	features  wire.FeatureSet
	ctx       context.Context // ends with the link; data streams live on it
	lcancel   context.CancelFunc
	runDone   chan struct{} // closed when the control read loop ended
	closeOnce sync.Once
	ack       *agentwire.HelloAckV1
	goaway    chan struct{}
	goOnce    sync.Once
	reconnect time.Duration
	// dead is closed by the heartbeat loop when no heartbeat was acked
	// for Config.HeartbeatMisses intervals (heartbeat.go); serve makes it.
	dead     chan struct{}
	deadOnce sync.Once
	deadErr  error // why dead was closed (set inside deadOnce, before the close)
	// capDigest is the capability digest the daemon behind this link last
	// got (registration or CapabilityUpdateV1); under Agent.mu.
	capDigest wire.CapabilityDigest
}

// traceOut sets o's trace context from the span in ctx when the daemon
// negotiated FeatureTraceContextV1 (§211).
func (l *link) traceOut(ctx context.Context, o control.Out) control.Out {
	if l.features.Has(wire.FeatureTraceContextV1) {
		o.Trace, o.HasTrace = telemetry.Inject(ctx)
	}
	return o
}

// close ends the link: the connection with code, then its read loop.
func (l *link) close(code wire.CloseCode, reason string) {
	l.closeOnce.Do(func() {
		l.lcancel()
		_ = l.bc.CloseWithCode(code, reason)
		<-l.runDone
	})
}

func (a *Agent) setLink(l *link) {
	a.mu.Lock()
	a.link = l
	close(a.linkCh)
	a.linkCh = make(chan struct{})
	a.mu.Unlock()
}

func (a *Agent) clearLink(l *link) {
	a.mu.Lock()
	if a.link == l {
		a.link = nil
		close(a.linkCh)
		a.linkCh = make(chan struct{})
	}
	a.mu.Unlock()
}

// currentLink returns the registered link and a channel closed when it
// changes.
func (a *Agent) currentLink() (*link, <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.link, a.linkCh
}

// handle dispatches a message from the daemon. It runs on the link's read
// goroutine: never Call here.
func (a *Agent) handle(l *link, env *wire.Envelope) {
	if a.handleRole(l, env) { // service.go: roles that run no attempts
		return
	}
	if a.handleData(l, env.Payload) {
		return
	}
	switch m := env.Payload.(type) {
	case *agentwire.LeaseOfferV1:
		a.onOffer(l, env, m)
	case *agentwire.CancelAttemptV1:
		a.stopAttempt(m.Attempt, m.Reason, false)
		_ = l.ch.Reply(env, &agentwire.CancelAckV1{Attempt: m.Attempt, Lease: m.Lease})
	case *agentwire.LeaseProbeV1:
		a.mu.Lock()
		at := a.attempts[m.Attempt]
		a.mu.Unlock()
		if at != nil && at.job.Lease == m.Lease {
			a.wg.Add(1)
			go func() { defer a.wg.Done(); a.renew(a.ctx, l, at) }()
		}
	case *agentwire.GoAwayV1:
		a.mu.Lock()
		a.preferred = append([]string(nil), m.AlternateEndpoints...)
		a.preferUntil = a.now().Add(time.Duration(m.ReconnectInMs+m.TryForMs) * time.Millisecond)
		a.mu.Unlock()
		l.reconnect = time.Duration(m.ReconnectInMs) * time.Millisecond
		l.goOnce.Do(func() { close(l.goaway) })
	case *agentwire.SessionFencedV1:
		a.log.Info("transport fenced by a newer one", "holder", m.HolderTransport.String())
		_ = l.bc.CloseWithCode(wire.CloseSessionFenced, "fenced")
	case *admin.DrainV1:
		a.mu.Lock()
		a.draining = true
		a.mu.Unlock()
		_ = l.ch.Reply(env, &admin.AdminAckV1{Acked: admin.MsgDrain, Accepted: true})
	case *admin.ResumeV1:
		a.mu.Lock()
		a.draining = false
		a.mu.Unlock()
		_ = l.ch.Reply(env, &admin.AdminAckV1{Acked: admin.MsgResume, Accepted: true})
	case *admin.RefreshCapabilitiesV1:
		a.answerRefresh(l, env) // inventory.go
	case *admin.RunHealthProbeV1:
		a.answerProbe(l, env, m.Probe) // health.go
	case *health.ProbeRequestV1:
		a.answerProbe(l, env, m.Probe)
	case *agentwire.SecretMaterialV1:
		// Secrets travel only on a secret stream (secret.go): refused here.
		m.Zero()
		l.ch.SetOutcome(telemetry.OutcomeRejected)
		_ = l.ch.ReplyError(env.MessageID, wire.ErrCodeInvalidState, wire.RetryNever, "secret material is accepted only on a secret stream")
	case *agentwire.ServerTimeV1:
		a.observeServerTime(m.ServerTimeMs, time.Time{}, a.now()) // clock.go
	case *agentwire.RestartTokenV1:
		a.armRestartToken(l, m) // heartbeat.go
	case *wire.WireErrorV1:
		// Diagnostics only; uncorrelated errors are logged. A failing data
		// store on the daemon is remembered: the logs-finalized barrier is
		// then retried with the log kept spooled (finishData).
		if m.Code == wire.ErrCodeStorageUnavailable {
			a.storageFault.Store(time.Now().UnixNano())
		}
		a.log.Debug("daemon message", "type", m.MessageType().String())
	default:
		l.ch.SetOutcome(telemetry.OutcomeRejected)
		_ = l.ch.ReplyError(env.MessageID, wire.ErrCodeInvalidState, wire.RetryNever, "not expected by the agent")
	}
}
