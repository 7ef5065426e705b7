package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/wire"
)

// TestProcessDaemonKilledAgentNoticesInSeconds runs forgeyard-daemon as a
// process with a 200 ms heartbeat interval and a library agent registered
// to it over loopback QUIC, then SIGKILLs the daemon (no GoAway, no
// CONNECTION_CLOSE, no stateless reset). The agent must end the link with
// ErrHeartbeatTimeout within 3 intervals + 1 interval of tolerance — not
// after the QUIC idle timeout (45 s) — and a daemon restarted on the same
// port with the same authority gets it back under the same session.
// killHarness is a forgeyard-daemon process with heartbeat interval every
// and a library agent registered to it over loopback QUIC.
type killHarness struct {
	t         *testing.T
	d         *process
	a         *agent.Agent
	start     func(logName string) *process
	connected chan agent.Status
	disc      chan error
}

// Its agent advertises no optional feature: without RestartTokenV1 it
// learns of a restart by the heartbeat probe and the stateless reset (what
// the tests using it measure).
func newKillHarness(t *testing.T, every time.Duration) *killHarness {
	return newKillHarnessOn(t, every, config.BackendQUIC, 0)
}

// newKillHarnessOn is newKillHarness with the agent on backend (quic,
// webtransport or yamux) advertising features.
func newKillHarnessOn(t *testing.T, every time.Duration, backend string, features wire.FeatureSet) *killHarness {
	dir := t.TempDir()
	daemonBin, _ := buildCommands(t, filepath.Join(dir, "bin"))
	pkiDir := filepath.Join(dir, "pki")
	var cp config.ControlPlane
	if _, err := agentsetup.DevAgent(pkiDir, "1", &cp); err != nil {
		t.Fatal(err)
	}
	cp.ServerName = "localhost"
	cred, err := agentsetup.LoadCredential(cp)
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "daemon.toml")
	if err := os.WriteFile(conf, []byte("[timing]\nheartbeat_interval = \""+every.String()+"\"\nmax_backoff = \"200ms\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	flag := map[string]string{config.BackendQUIC: "--listen", config.BackendWebTransport: "--listen-webtransport", config.BackendYamux: "--listen-yamux"}[backend]
	port := freeUDPPort(t)
	if backend == config.BackendYamux {
		port = freeTCPPort(t)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	h := &killHarness{t: t, connected: make(chan agent.Status, 4), disc: make(chan error, 16)}
	h.start = func(name string) *process {
		return startProcess(t, daemonBin, filepath.Join(dir, name), "--config", conf, "--dev-pki", pkiDir,
			"--sqlite", filepath.Join(dir, "authority.db"), flag, addr, "--log-format", "json", "--log-level", "debug")
	}
	h.d = h.start("daemon-1.log")

	e, err := config.ParseEndpoint(backend + "://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	dialer, daddr, err := agentsetup.Dialer(e, cred.Client, quic.Config{}, yamux.Config{})
	if err != nil {
		t.Fatal(err)
	}
	h.a, err = agent.New(agent.Config{Runner: cred.Runner, Signer: cred.Signer, CertChain: cred.CertChain,
		Endpoints: []agent.Endpoint{{Address: daddr, Dialer: dialer, Backend: backend}},
		Executor:  agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}), RequestTimeout: 2 * time.Second,
		Backoff:  agent.Backoff{Base: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Fallback: agent.Fallback{ProbeInterval: -1},
		Features: features,
		Hooks: agent.Hooks{OnConnected: func(s agent.Status) { h.connected <- s },
			OnDisconnected: func(err error) { h.disc <- err }}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- h.a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		_ = h.a.Close()
		<-ran
	})
	return h
}

// await returns the agent's next connection.
func (h *killHarness) await(what string) agent.Status {
	h.t.Helper()
	select {
	case s := <-h.connected:
		return s
	case <-time.After(30 * time.Second):
		h.t.Fatalf("agent not connected (%s); daemon log:\n%s", what, h.d.log())
	}
	return agent.Status{}
}

// acked waits for n heartbeat acks (polled: no event crosses to here).
func (h *killHarness) acked(n int64) {
	h.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); h.a.Stats().HeartbeatsAcked < n; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			h.t.Fatalf("no heartbeat acks; daemon log:\n%s", h.d.log())
		}
	}
}

// kill SIGKILLs the daemon and reaps it (its port is free afterwards).
func (h *killHarness) kill() time.Time {
	h.t.Helper()
	if err := h.d.cmd.Process.Kill(); err != nil {
		h.t.Fatal(err)
	}
	return time.Now()
}

func (h *killHarness) reap() {
	err := <-h.d.done
	h.d.done <- err
}

func TestProcessDaemonKilledAgentNoticesInSeconds(t *testing.T) {
	const every = 200 * time.Millisecond
	const limit = agent.DefaultHeartbeatMisses*every + every
	h := newKillHarness(t, every)
	s1 := h.await("first daemon")
	h.acked(2)

	killed := h.kill()
	var end error
	select {
	case end = <-h.disc:
	case <-time.After(quic.DefaultMaxIdleTimeout / 3):
		t.Fatalf("the agent did not notice the killed daemon within %v", quic.DefaultMaxIdleTimeout/3)
	}
	el := time.Since(killed)
	t.Logf("SIGKILLed daemon noticed after %v (interval %v, limit %v, QUIC idle timeout %v)", el.Round(time.Millisecond), every, limit, quic.DefaultMaxIdleTimeout)
	if !errors.Is(end, agent.ErrHeartbeatTimeout) {
		t.Fatalf("link ended with %v, want ErrHeartbeatTimeout", end)
	}
	if el > limit {
		t.Fatalf("noticed after %v, want ≤ %v (3 intervals + 1)", el, limit)
	}
	h.reap()

	h.d = h.start("daemon-2.log")
	s2 := h.await("restarted daemon")
	st := h.a.Stats()
	if st.HeartbeatTimeouts != 1 || st.Reconnects < 1 || s2.Transport == s1.Transport {
		t.Fatalf("after the restart: %d heartbeat timeouts, %d reconnects, transport %s → %s", st.HeartbeatTimeouts, st.Reconnects, s1.Transport, s2.Transport)
	}
	t.Logf("back on the restarted daemon after %v from the kill (session %s)", time.Since(killed).Round(time.Millisecond), h.a.Session())
}

// TestProcessDaemonRestartResetsAgents: a daemon SIGKILLed and restarted at
// once answers the old connection's next packet with a QUIC stateless
// reset (its key derives from the unchanged TLS key file), so the agent
// reconnects at its next heartbeat — not after 3 missed intervals, and
// not after the QUIC idle timeout.
func TestProcessDaemonRestartResetsAgents(t *testing.T) {
	const every = 2 * time.Second // dead-link detection alone would take 6 s
	h := newKillHarness(t, every)
	h.await("first daemon")
	h.acked(1)

	killed := h.kill()
	h.reap()
	h.d = h.start("daemon-2.log")
	var end error
	select {
	case end = <-h.disc:
	case <-time.After(quic.DefaultMaxIdleTimeout / 3):
		t.Fatalf("the agent did not notice the restarted daemon within %v", quic.DefaultMaxIdleTimeout/3)
	}
	el := time.Since(killed)
	if errors.Is(end, agent.ErrHeartbeatTimeout) || !strings.Contains(end.Error(), "stateless reset") {
		t.Fatalf("link ended with %v after %v, want a stateless reset from the restarted daemon", end, el)
	}
	h.await("restarted daemon")
	st := h.a.Stats()
	if st.HeartbeatTimeouts != 0 || st.Reconnects < 1 {
		t.Fatalf("after the restart: %d heartbeat timeouts, %d reconnects", st.HeartbeatTimeouts, st.Reconnects)
	}
	t.Logf("restarted daemon reset the agent %v after the kill (heartbeat interval %v), back after %v", el.Round(time.Millisecond), every, time.Since(killed).Round(time.Millisecond))
}

// TestProcessDaemonRestartNoticedWithin2s: an idle agent (its next
// heartbeat 5 s away) learns within 2 s that its daemon was
// SIGKILLed and restarted, on every backend. Over QUIC and WebTransport
// the restarted daemon sends a restart hint to each session its previous
// process held (from the authority), carrying the session's restart
// token; the agent, which got the token at registration, ends the link at
// once (ErrDaemonRestarted), without a heartbeat. Over TLS+yamux the
// kernel closed the dead process's sockets: the agent reads EOF at once.
func TestProcessDaemonRestartNoticedWithin2s(t *testing.T) {
	const within = 2 * time.Second
	for _, backend := range []string{config.BackendQUIC, config.BackendWebTransport, config.BackendYamux} {
		t.Run(backend, func(t *testing.T) {
			// 5 s: the kill comes right after the first ack, so the
			// agent's next packet would be the heartbeat 5 s later.
			h := newKillHarnessOn(t, 5*time.Second, backend, wire.Implemented) // as forgeyard-agent: restart tokens
			h.await("first daemon")
			h.acked(1) // idle from here until the next heartbeat, an interval later

			killed := h.kill()
			h.reap()
			restarted := time.Now()
			h.d = h.start("daemon-2.log")
			var end error
			select {
			case end = <-h.disc:
			case <-time.After(15 * time.Second):
				t.Fatalf("the agent did not notice the restarted daemon within 15 s; daemon log:\n%s", h.d.log())
			}
			noticed := time.Now()
			from := restarted // a QUIC agent can learn only from the new process
			if backend == config.BackendYamux {
				from = killed
			}
			el := noticed.Sub(from)
			t.Logf("%s: noticed %v after the %s (%v after the kill): %v", backend, el.Round(time.Millisecond),
				map[bool]string{true: "kill", false: "restart"}[from.Equal(killed)], noticed.Sub(killed).Round(time.Millisecond), end)
			if errors.Is(end, agent.ErrHeartbeatTimeout) || el > within {
				t.Fatalf("noticed after %v with %v, want within %v; daemon log:\n%s", el, end, within, h.d.log())
			}
			h.await("restarted daemon")
			st := h.a.Stats()
			if backend != config.BackendYamux && (!errors.Is(end, agent.ErrDaemonRestarted) || st.RestartTokenEnds != 1) {
				t.Fatalf("link ended with %v, %d by a restart token (%d hints probed); want ErrDaemonRestarted, 1",
					end, st.RestartTokenEnds, st.RestartHints)
			}
		})
	}
}
