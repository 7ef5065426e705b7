package agent

import (
	"context"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
)

// MaxServiceRequests bounds the requests a Service handles at once; more
// are answered RateLimited (RetryBackoff).
const MaxServiceRequests = 16

// Service serves the typed requests of a peer role that runs no attempts:
// the signing worker's signing family (§99, semantics/signer) or the device
// agent's device family (§100, semantics/device). Set Config.Service and
// Config.Role; the agent then registers with that role, keeps the session up
// (heartbeats, reconnect, fallback, certificate renewal) and hands every
// request of the role's own family to Serve. Everything else that is not a
// session, admin, health or common message — execution messages (lease
// offers, cancels, probes, secrets), logs, CAS, another role's family — is
// answered RoleForbidden and never reaches the Service: a signing worker
// cannot be sent shell-like work.
type Service interface {
	// Serve answers one request, on its own goroutine (at most
	// MaxServiceRequests at once). ctx ends with the transport the request
	// arrived on. The returned message is sent as the answer (correlated
	// to the request); nil sends nothing.
	Serve(ctx context.Context, req ServiceRequest) wire.Message
}

// ServiceFunc adapts a function to Service.
type ServiceFunc func(ctx context.Context, req ServiceRequest) wire.Message

// Serve calls f.
func (f ServiceFunc) Serve(ctx context.Context, req ServiceRequest) wire.Message { return f(ctx, req) }

// ServiceRequest is one request from the daemon.
type ServiceRequest struct {
	// Msg is the validated request.
	Msg wire.Message
	// Conn is the transport the request arrived on, for the data streams
	// the request needs (a device agent downloads an artifact from the
	// daemon's CAS and streams a test log on it).
	Conn *semantics.Conn
	// Protocol is the version negotiated on Conn.
	Protocol wire.ProtocolVersion
}

// handleRole dispatches a message for a role that runs no attempts: the
// role's own family to the Service, execution and foreign families
// refused with RoleForbidden. It reports whether it handled env; session,
// admin, health and common messages are left to handle.
func (a *Agent) handleRole(l *link, env *wire.Envelope) bool {
	if a.execs {
		return false
	}
	t := env.Payload.MessageType()
	switch session.Classify(t) {
	case session.ClassCommon, session.ClassSession, session.ClassAdmin, session.ClassHealth:
		return false
	}
	svc := a.cfg.Service
	if svc == nil || !session.Allowed(a.cfg.Role, t) || session.DirectionOf(t)&session.FromDaemon == 0 {
		l.ch.SetOutcome(telemetry.OutcomeRejected)
		_ = l.ch.ReplyError(env.MessageID, wire.ErrCodeRoleForbidden, wire.RetryNever, "not accepted by a "+a.cfg.Role.String())
		return true
	}
	select {
	case a.svcSem <- struct{}{}:
	default:
		l.ch.SetOutcome(telemetry.OutcomeRejected)
		_ = l.ch.ReplyError(env.MessageID, wire.ErrCodeRateLimited, wire.RetryBackoff, "too many requests in progress")
		return true
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer func() { <-a.svcSem }()
		if m := svc.Serve(l.ctx, ServiceRequest{Msg: env.Payload, Conn: l.sc, Protocol: l.protocol}); m != nil {
			_ = l.ch.Reply(env, m)
		}
	}()
	return true
}
