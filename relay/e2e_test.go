package relay_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/relay"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// realDaemon is a semantics/daemon serving QUIC on loopback with mTLS
// (client certificates of pki required) and RunnerCAs = pki's CA.
type realDaemon struct {
	d           *daemon.Daemon
	auth        authority.Authority
	addr        string
	registered  chan daemon.SessionInfo
	completions chan daemon.CompletionEvent
}

func startDaemon(t *testing.T, pki *trusttest.PKI) *realDaemon {
	t.Helper()
	ctx := testCtx(t)
	auth, err := authority.OpenSQLite(ctx, ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = auth.Close() })
	rd := &realDaemon{auth: auth, registered: make(chan daemon.SessionInfo, 16), completions: make(chan daemon.CompletionEvent, 16)}
	rd.d, err = daemon.New(daemon.Config{Authority: auth, RunnerCAs: pki.CAPool(),
		Hooks: daemon.Hooks{
			OnRegistered: func(s daemon.SessionInfo) { rd.registered <- s },
			OnCompletion: func(ev daemon.CompletionEvent) { rd.completions <- ev },
		}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := quic.Listen("127.0.0.1:0", pki.ServerConfig(t, serverName), quic.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rd.addr = ln.Addr().String()
	sctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = rd.d.Serve(sctx, ln)
	}()
	t.Cleanup(func() {
		c, cc := context.WithTimeout(context.Background(), 5*time.Second)
		defer cc()
		_ = rd.d.Shutdown(c)
		cancel()
		_ = ln.Close()
		<-served
	})
	return rd
}

// startRelay runs a relay in front of upstreams with an agent-facing
// listener of backend; it returns the relay and the agent dialer factory.
func startRelay(t *testing.T, pki *trusttest.PKI, backend string, upstreams ...string) (*relay.Relay, semantics.BackendListener) {
	t.Helper()
	cfg := upstreamTLS(t, pki)
	cfg.Upstreams = upstreams
	r, err := relay.New(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := agentListener(t, pki, backend)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Serve(context.Background(), ln)
	}()
	t.Cleanup(func() {
		_ = r.Close()
		<-done
	})
	return r, ln
}

// newAgent builds an agent for runner (certificate of pki) that reaches
// the daemon through the relay listener ln; signer overrides the key that
// signs the registration (nil: the certificate's own key).
func newAgent(t *testing.T, pki *trusttest.PKI, backend string, ln semantics.BackendListener, runner wire.RunnerId, signer crypto.Signer, hooks agent.Hooks) *agent.Agent {
	t.Helper()
	tlsConf := pki.ClientConfig(t, runner, serverName)
	cert := tlsConf.Certificates[0]
	if signer == nil {
		signer = cert.PrivateKey.(crypto.Signer)
	}
	dialer := agentDialer(backend, tlsConf)
	a, err := agent.New(agent.Config{
		Runner: runner, Signer: signer, CertChain: cert.Certificate,
		Endpoints: []agent.Endpoint{{Address: ln.Addr().String(), Backend: backend, Dialer: dialer}},
		Executor:  agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}),
		Hooks:     hooks,
		SpoolDir:  t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestEndToEnd: agent → relay (yamux or WebTransport) → daemon (QUIC)
// registers with its own key proof and runs a lease to an acknowledged
// completion; the daemon sees a QUIC transport.
func TestEndToEnd(t *testing.T) {
	backends(t, func(t *testing.T, backend string) {
		ctx := testCtx(t)
		pki := trusttest.NewPKI(t)
		rd := startDaemon(t, pki)
		r, ln := startRelay(t, pki, backend, rd.addr)
		runner := wire.NewRunnerId()
		connected := make(chan agent.Status, 4)
		done := make(chan agent.AttemptDone, 4)
		a := newAgent(t, pki, backend, ln, runner, nil, agent.Hooks{
			OnConnected:   func(s agent.Status) { connected <- s },
			OnAttemptDone: func(d agent.AttemptDone) { done <- d },
		})
		runErr := make(chan error, 1)
		go func() { runErr <- a.Run(ctx) }()
		t.Cleanup(func() {
			_ = a.Close()
			if err := <-runErr; err != nil {
				t.Errorf("agent Run: %v", err)
			}
		})
		var info daemon.SessionInfo
		select {
		case info = <-rd.registered:
		case err := <-runErr:
			t.Fatalf("agent Run returned %v before registering", err)
		case <-ctx.Done():
			t.Fatal("no registration")
		}
		if info.Runner != runner || info.Backend != "quic" {
			t.Fatalf("daemon registered %+v", info)
		}
		if st := <-connected; st.Backend != backend {
			t.Fatalf("agent status %+v", st)
		}
		lease, err := rd.d.OfferLease(ctx, runner, daemon.LeaseOffer{Job: wire.NewJobId(),
			Spec:    wire.JobSpecId{Digest: wire.Digest{1}},
			Payload: wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: wire.Digest{2}, Size: 512}})
		if err != nil {
			t.Fatal(err)
		}
		select {
		case ev := <-rd.completions:
			if ev.Attempt != lease.Attempt || ev.Runner != runner {
				t.Fatalf("completion %+v for lease %+v", ev, lease)
			}
		case <-ctx.Done():
			t.Fatal("no completion")
		}
		select {
		case d := <-done:
			if d.Ack != agentwire.AckAccepted {
				t.Fatalf("completion ack %v", d.Ack)
			}
		case <-ctx.Done():
			t.Fatal("agent saw no completion ack")
		}
		n, err := rd.auth.Completions(ctx, lease.Attempt)
		if err != nil || n != 1 {
			t.Fatalf("authority recorded %d completions (%v), want 1", n, err)
		}
		if st := r.Stats(); st.Streams < 1 || st.BytesToDaemon == 0 || st.BytesToAgent == 0 || st.Active != 1 {
			t.Fatalf("relay stats %+v", st)
		}
	})
}

// TestRelayCannotImpersonate: whoever sits at the relay has the runner's
// certificate (it is public: the agent sends it) but not its key. A
// registration for that runner signed by any other key is refused by the
// daemon with Forbidden and the connection closed with
// CloseAuthenticationFailure, both through a relay and directly with the
// relay's own TLS identity.
func TestRelayCannotImpersonate(t *testing.T) {
	ctx := testCtx(t)
	pki := trusttest.NewPKI(t)
	rd := startDaemon(t, pki)
	_, ln := startRelay(t, pki, "yamux", rd.addr)
	victim := wire.NewRunnerId()
	attackerKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("through the relay", func(t *testing.T) {
		disconnected := make(chan error, 4)
		a := newAgent(t, pki, "yamux", ln, victim, attackerKey, agent.Hooks{OnDisconnected: func(err error) { disconnected <- err }})
		defer a.Close()
		err := a.Run(ctx)
		var rej *agent.RejectedError
		if !errors.As(err, &rej) || rej.Code != wire.ErrCodeForbidden || rej.Retry != wire.RetryNever {
			t.Fatalf("agent Run = %v, want a Forbidden/Never rejection", err)
		}
		t.Logf("rejected: %v", err)
	})

	t.Run("relay identity talking to the daemon directly", func(t *testing.T) {
		up := upstreamTLS(t, pki)
		tlsConf := pki.ClientConfig(t, victim, serverName) // the victim's public chain
		a, err := agent.New(agent.Config{
			Runner: victim, Signer: attackerKey, CertChain: tlsConf.Certificates[0].Certificate,
			Endpoints: []agent.Endpoint{{Address: rd.addr, Backend: "quic", Dialer: quic.Dialer{TLS: up.UpstreamTLS}}},
			Executor:  agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}),
			SpoolDir:  t.TempDir(),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		err = a.Run(ctx)
		var rej *agent.RejectedError
		if !errors.As(err, &rej) || rej.Code != wire.ErrCodeForbidden {
			t.Fatalf("agent Run = %v, want a Forbidden rejection", err)
		}
	})

	select {
	case s := <-rd.registered:
		t.Fatalf("daemon registered %+v", s)
	default:
	}
	if st := rd.d.Stats(); st.Registrations != 0 || st.Rejections < 2 {
		t.Fatalf("daemon stats: registrations %d rejections %d", st.Registrations, st.Rejections)
	}
}

// TestDaemonGoAwayReachesAgent: a draining daemon's GoAway crosses the
// relay; the agent leaves, and its close crosses back so the daemon's
// Shutdown completes without waiting for its timeout.
func TestDaemonGoAwayReachesAgent(t *testing.T) {
	ctx := testCtx(t)
	pki := trusttest.NewPKI(t)
	rd := startDaemon(t, pki)
	_, ln := startRelay(t, pki, "yamux", rd.addr)
	runner := wire.NewRunnerId()
	disconnected := make(chan error, 4)
	a := newAgent(t, pki, "yamux", ln, runner, nil, agent.Hooks{OnDisconnected: func(err error) { disconnected <- err }})
	go func() { _ = a.Run(ctx) }()
	defer a.Close()
	select {
	case <-rd.registered:
	case <-ctx.Done():
		t.Fatal("no registration")
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := rd.d.Shutdown(sctx); err != nil {
		t.Fatalf("daemon Shutdown: %v (the agent's close did not come back through the relay)", err)
	}
	select {
	case err := <-disconnected:
		if err == nil || !strings.Contains(err.Error(), "GoAway") {
			t.Fatalf("agent disconnected with %v, want the daemon's GoAway", err)
		}
	case <-ctx.Done():
		t.Fatal("agent not disconnected")
	}
}
