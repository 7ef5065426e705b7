package daemonsetup_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/daemonsetup"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// crashedAuthority is the authority as the first daemon of a restart
// test sees it: the core only, no inventory facet, so that the
// connections its crash drops are not recorded as ended (a SIGKILLed
// process records nothing; authority.Peers.HeldBy must still list them).
type crashedAuthority struct{ authority.Authority }

// restartWorld is a daemon engine on a QUIC listener that can be crashed
// (quic.Listener.Abort) and replaced by a new engine on the same address,
// authority and keys, which sends the restart hints of its predecessor's
// sessions as forgeyard-daemon does (RestartPeers, serversetup.HintRestart).
type restartWorld struct {
	t        *testing.T
	pki      *trusttest.PKI
	au       authority.Authority
	resetKey [32]byte
	addr     string
	d        *daemon.Daemon
	ln       *quic.Listener
	served   chan struct{}
}

const restartDaemonID = "restart-test/daemon"

func newRestartWorld(t *testing.T) *restartWorld {
	w := &restartWorld{t: t, pki: trusttest.NewPKI(t), au: enginetest.SqliteAuth(t), addr: "127.0.0.1:0"}
	if _, err := rand.Read(w.resetKey[:]); err != nil {
		t.Fatal(err)
	}
	return w
}

// start runs a daemon engine (tokens: with a restart token key and the
// feature; else as a daemon from before restart tokens) on w.addr, with
// au as its authority.
func (w *restartWorld) start(au authority.Authority, tokens bool) {
	t := w.t
	cfg := daemon.Config{ID: restartDaemonID, Authority: au, RunnerCAs: w.pki.CAPool(), Timing: enginetest.FastTiming(),
		Features: wire.Implemented, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cfg.Timing.HeartbeatInterval = time.Minute // idle agents: their next heartbeat is a minute away
	if tokens {
		cfg.RestartTokenKey = serversetup.RestartTokenKey(&w.resetKey)
	} else {
		cfg.Features = wire.Features(wire.FeatureLogResumeV1, wire.FeatureCasRangeResumeV1, wire.FeatureLogCompressionV1,
			wire.FeatureTraceContextV1, wire.FeatureRetryAfterV1)
	}
	d, err := daemon.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	key := w.resetKey
	ln, err := quic.Listen(w.addr, w.pki.ServerConfig(t, "localhost"), quic.Config{StatelessResetKey: &key})
	if err != nil {
		t.Fatal(err)
	}
	w.addr = ln.Addr().String()
	w.d, w.ln, w.served = d, ln, make(chan struct{})
	served := w.served
	go func() { defer close(served); _ = d.Serve(context.Background(), ln) }()
	t.Cleanup(func() {
		ln.Abort()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = d.Shutdown(ctx)
		<-served
	})
}

// crash drops the daemon's socket and connections without a word to the
// agents (what SIGKILL does), then stops its engine.
func (w *restartWorld) crash() {
	w.ln.Abort()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = w.d.Shutdown(ctx)
	<-w.served
}

// restart starts the next daemon on the same address and authority and
// sends its predecessor's agents their restart hints; it returns how many
// were sent.
func (w *restartWorld) restart(tokens bool) int {
	t := w.t
	var key []byte
	if tokens {
		key = serversetup.RestartTokenKey(&w.resetKey)
	}
	// As forgeyard-daemon: read before anything registers, told once the
	// listener accepts.
	peers, err := daemonsetup.RestartPeers(context.Background(), authority.PeersOf(w.au), restartDaemonID, key)
	if err != nil {
		t.Fatal(err)
	}
	w.start(w.au, tokens)
	return serversetup.HintRestart(context.Background(), slog.New(slog.NewTextHandler(io.Discard, nil)), peers,
		[]serversetup.Listener{{Backend: config.BackendQUIC, BackendListener: w.ln}}, 0)
}

// startAgent runs an agent (tokens: advertising RestartTokenV1) against
// the world's address; its disconnect errors arrive on the channel.
func (w *restartWorld) startAgent(tokens bool) (*agent.Agent, chan error) {
	t := w.t
	runner := wire.NewRunnerId()
	cert := w.pki.IssueClient(t, runner, trusttest.LeafOptions{})
	disc := make(chan error, 8)
	cfg := agent.Config{Runner: runner, Signer: cert.PrivateKey.(crypto.Signer), CertChain: cert.Certificate,
		Endpoints: []agent.Endpoint{{Address: w.addr, Backend: config.BackendQUIC,
			Dialer: quic.Dialer{TLS: w.pki.ClientConfigWith(t, cert, "localhost")}}},
		Executor: agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}), MaxParallel: 1,
		Backoff: agent.Backoff{Base: 5 * time.Millisecond, Max: 50 * time.Millisecond}, RequestTimeout: 2 * time.Second,
		Features: wire.Implemented, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if !tokens {
		cfg.Features = wire.Features(wire.FeatureLogResumeV1, wire.FeatureCasRangeResumeV1, wire.FeatureLogCompressionV1,
			wire.FeatureTraceContextV1, wire.FeatureRetryAfterV1)
	}
	cfg.Hooks.OnDisconnected = func(err error) { disc <- err }
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(context.Background()) }()
	t.Cleanup(func() { _ = a.Close(); <-done })
	return a, disc
}

// await polls cond (the agent's counters have no event) until it holds or
// 10 s passed.
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestRestartTokenEndsLink: a daemon engine gives a QUIC agent its restart
// token, crashes, and the next engine on the same address, authority and
// keys sends its predecessor's session a hint carrying the token: the
// idle agent (its next heartbeat a minute away) ends the link at once
// with ErrDaemonRestarted — no heartbeat probe, no stateless reset — and
// registers with the new daemon, which gives it the token of its new
// transport.
func TestRestartTokenEndsLink(t *testing.T) {
	w := newRestartWorld(t)
	w.start(crashedAuthority{w.au}, true)
	a, disc := w.startAgent(true)
	await(t, "the restart token armed", func() bool { return a.Stats().RestartTokens == 1 })
	if n := w.d.Stats().RestartTokens; n != 1 {
		t.Fatalf("the daemon gave %d restart tokens, want 1", n)
	}
	before := a.Stats()
	w.crash()
	start := time.Now()
	if n := w.restart(true); n != 1 {
		t.Fatalf("%d restart hints sent, want 1 (one per session)", n)
	}
	var err error
	select {
	case err = <-disc:
	case <-time.After(10 * time.Second):
		t.Fatalf("the link did not end within 10 s of the restart: %+v", a.Stats())
	}
	el := time.Since(start)
	st := a.Stats()
	if !errors.Is(err, agent.ErrDaemonRestarted) {
		t.Fatalf("link ended after %v with %v, want ErrDaemonRestarted (the token path)", el, err)
	}
	if st.RestartTokenEnds != 1 || st.RestartHints != 0 || st.RestartHintTimeouts != 0 || st.HeartbeatsSent != before.HeartbeatsSent {
		t.Fatalf("token ends %d, hints probed %d, hint timeouts %d, heartbeats %d → %d; want 1, 0, 0 and no heartbeat",
			st.RestartTokenEnds, st.RestartHints, st.RestartHintTimeouts, before.HeartbeatsSent, st.HeartbeatsSent)
	}
	t.Logf("the agent ended its link %v after the restarted daemon listened", el.Round(time.Millisecond))
	await(t, "registration with the restarted daemon and its new token", func() bool {
		return w.d.Stats().Registrations == 1 && a.Stats().RestartTokens == 2
	})
}

// TestRestartHintCompatibility: restart hints between builds with and
// without restart tokens (docs/protocols/internal/compatibility.md: the
// token message only to agents that negotiated RestartTokenV1). An agent
// that does not advertise the feature gets no token and answers the
// restarted daemon's hint — which carries a token under the format-1
// header it reads as a tokenless hint — with a heartbeat probe; an agent
// of a daemon without tokens likewise probes its tokenless hint. Either
// way the link ends (the stateless reset its probe draws, or the hint's
// window), and never by the token path.
func TestRestartHintCompatibility(t *testing.T) {
	for _, c := range []struct {
		name                 string
		agentTokens, daemons bool
	}{
		{"old agent, new daemon", false, true},
		{"new agent, old daemon", true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newRestartWorld(t)
			w.start(crashedAuthority{w.au}, c.daemons)
			a, disc := w.startAgent(c.agentTokens)
			await(t, "registration", func() bool { return a.Stats().Resyncs >= 1 })
			w.crash()
			if n := w.restart(c.daemons); n != 1 {
				t.Fatalf("%d restart hints sent, want 1", n)
			}
			var err error
			select {
			case err = <-disc:
			case <-time.After(10 * time.Second):
				t.Fatalf("the link did not end within 10 s of the restart: %+v", a.Stats())
			}
			st := a.Stats()
			if errors.Is(err, agent.ErrDaemonRestarted) || st.RestartTokens != 0 || st.RestartTokenEnds != 0 {
				t.Fatalf("link ended with %v; tokens %d, token ends %d; want no token", err, st.RestartTokens, st.RestartTokenEnds)
			}
			// The hint is probed — unless a packet the agent sent anyway
			// (an acknowledgement of the crashed daemon's last packet)
			// reached the restarted daemon first and drew the stateless
			// reset before the hint was read (seen once on a loaded
			// machine): that ends the link the same way, without a token.
			if st.RestartHints < 1 && (err == nil || !strings.Contains(err.Error(), "stateless reset")) {
				t.Fatalf("link ended with %v and %d hints probed; want a probe, or the stateless reset a probe draws", err, st.RestartHints)
			}
			await(t, "registration with the restarted daemon", func() bool { return w.d.Stats().Registrations == 1 })
			if n := w.d.Stats().RestartTokens; n != 0 {
				t.Fatalf("the restarted daemon gave %d restart tokens, want 0", n)
			}
		})
	}
}
