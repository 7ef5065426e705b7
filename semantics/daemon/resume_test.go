package daemon_test

import (
	"context"
	"crypto"
	"crypto/tls"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// resumingAgent is one agent's dialer with its own TLS session cache.
type resumingAgent struct {
	t      *testing.T
	w      *enginetest.World
	id     enginetest.Identity
	d      semantics.BackendDialer
	stored chan struct{}
}

func newResumingAgent(t *testing.T, w *enginetest.World, id enginetest.Identity) *resumingAgent {
	cc := w.ClientTLS(id)
	a := &resumingAgent{t: t, w: w, id: id, stored: make(chan struct{}, 16)}
	cc.ClientSessionCache = trusttest.NotifyingCache{ClientSessionCache: tls.NewLRUClientSessionCache(8), Stored: a.stored}
	a.d = w.B.Dialer(t, cc)
	return a
}

// dial connects, checks whether the TLS session resumed, and waits until
// the daemon's new ticket is in the cache (so the next dial can resume).
func (a *resumingAgent) dial(resume bool) *enginetest.RawClient {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bc, err := a.d.Dial(ctx, a.w.Addr)
	if err != nil {
		a.t.Fatal(err)
	}
	if got := bc.ConnectionState().DidResume; got != resume {
		a.t.Fatalf("DidResume %v, want %v", got, resume)
	}
	select {
	case <-a.stored:
	case <-time.After(5 * time.Second):
		a.t.Fatal("no session ticket reached the agent")
	}
	return enginetest.RawOn(a.t, bc, a.id)
}

// TestResumedSessionIdentityChecks (issue 25 item 4): on a resumed TLS
// session the daemon checks identity and revocation exactly as on a full
// handshake: the resumed agent registers as its own runner only (not as
// another one, even with that runner's valid chain and key proof); once
// its runner is disabled, or its certificate revoked, a resumed
// connection's registration is refused.
func TestResumedSessionIdentityChecks(t *testing.T) {
	for _, mk := range []func() enginetest.Backend{enginetest.QuicBackend, enginetest.YamuxBackend} {
		b := mk()
		t.Run(b.Name, func(t *testing.T) {
			pki := trusttest.NewPKI(t)
			w := enginetest.NewIDWorld(t, b, pki, enginetest.SqliteAuth(t))
			ctx := context.Background()

			id := w.NewIdentity()
			ag := newResumingAgent(t, w, id)
			// SessionInfo.TLSResumed (the daemon's metric) tells the two apart.
			tlsResumed := func(sess wire.AgentSessionId) bool {
				t.Helper()
				for _, s := range w.D.Sessions() {
					if s.Session == sess {
						return s.TLSResumed
					}
				}
				t.Fatalf("session %v not listed", sess)
				return false
			}
			rc := ag.dial(false)
			rc.Join(wire.NewAgentSessionId())
			if tlsResumed(rc.Sess) {
				t.Fatal("SessionInfo of a full handshake says TLSResumed")
			}
			_ = rc.Bc.CloseWithCode(wire.CloseNormal, "reconnect")

			rc = ag.dial(true)
			rc.Join(wire.NewAgentSessionId()) // a resumed session registers its own runner
			if !tlsResumed(rc.Sess) {
				t.Fatal("SessionInfo of a resumed handshake does not say TLSResumed")
			}

			// Identity binding: another runner's chain and key proof over
			// this agent's resumed TLS session.
			other := w.NewIdentity()
			forge := ag.dial(true)
			forge.Hello(agentwire.RoleAgent)
			if rj, ok := forge.RegisterWith(wire.NewAgentSessionId(), other.Runner, other.Cert.PrivateKey.(crypto.Signer), other.Cert.Certificate).(*agentwire.RegistrationRejectedV1); !ok || rj.Code != wire.ErrCodeForbidden {
				t.Fatalf("registering another runner over a resumed session: %#v", rj)
			}

			if err := w.D.DisableRunner(ctx, id.Runner, "decommissioned"); err != nil {
				t.Fatal(err)
			}
			if code := rc.CloseCode(); code != wire.CloseRunnerDisabled {
				t.Fatalf("close code %v, want RunnerDisabled", code)
			}
			rc = ag.dial(true)
			rc.Hello(agentwire.RoleAgent)
			if rj, ok := rc.Register(wire.NewAgentSessionId()).(*agentwire.RegistrationRejectedV1); !ok || rj.Code != wire.ErrCodeRunnerDisabled {
				t.Fatalf("disabled runner on a resumed session: %#v", rj)
			}

			// Certificate revoked by serial after its session's ticket.
			id2 := w.NewIdentity()
			ids := authority.IdentitiesOf(w.Auth)
			serial := trust.SerialString(id2.Cert.Leaf)
			if err := ids.RecordCertificate(ctx, authority.IssuedCertificate{Serial: serial, Runner: id2.Runner,
				NotAfter: id2.Cert.Leaf.NotAfter, IssuedAt: time.Now()}); err != nil {
				t.Fatal(err)
			}
			ag2 := newResumingAgent(t, w, id2)
			rc = ag2.dial(false)
			rc.Join(wire.NewAgentSessionId())
			_ = rc.Bc.CloseWithCode(wire.CloseNormal, "reconnect")
			if err := ids.RevokeCertificate(ctx, serial, "key leaked", time.Now()); err != nil {
				t.Fatal(err)
			}
			rc = ag2.dial(true)
			rc.Hello(agentwire.RoleAgent)
			if rj, ok := rc.Register(wire.NewAgentSessionId()).(*agentwire.RegistrationRejectedV1); !ok || rj.Message != trust.MsgCredentialRevoked {
				t.Fatalf("revoked certificate on a resumed session: %#v", rj)
			}
		})
	}
}
