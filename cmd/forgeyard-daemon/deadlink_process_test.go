package main

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/semantics/agent"
)

// TestProcessDaemonKilledAgentNoticesInSeconds runs forgeyard-daemon as a
// process with a 200 ms heartbeat interval and a library agent registered
// to it over loopback QUIC, then SIGKILLs the daemon (no GoAway, no
// CONNECTION_CLOSE, no stateless reset). The agent must end the link with
// ErrHeartbeatTimeout within 3 intervals + 1 interval of tolerance — not
// after the QUIC idle timeout (45 s) — and a daemon restarted on the same
// port with the same authority gets it back under the same session.
func TestProcessDaemonKilledAgentNoticesInSeconds(t *testing.T) {
	const every = 200 * time.Millisecond
	const limit = agent.DefaultHeartbeatMisses*every + every
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
	if err := os.WriteFile(conf, []byte("[timing]\nheartbeat_interval = \"200ms\"\nmax_backoff = \"200ms\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(freeUDPPort(t))
	startDaemon := func(name string) *process {
		return startProcess(t, daemonBin, filepath.Join(dir, name), "--config", conf, "--dev-pki", pkiDir,
			"--sqlite", filepath.Join(dir, "authority.db"), "--listen", addr, "--log-format", "json", "--log-level", "debug")
	}
	d := startDaemon("daemon-1.log")

	e, err := config.ParseEndpoint("quic://" + addr)
	if err != nil {
		t.Fatal(err)
	}
	dialer, daddr, err := agentsetup.Dialer(e, cred.Client, quic.Config{}, yamux.Config{})
	if err != nil {
		t.Fatal(err)
	}
	connected := make(chan agent.Status, 4)
	disc := make(chan error, 16)
	a, err := agent.New(agent.Config{Runner: cred.Runner, Signer: cred.Signer, CertChain: cred.CertChain,
		Endpoints: []agent.Endpoint{{Address: daddr, Dialer: dialer, Backend: "quic"}},
		Executor:  agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}), RequestTimeout: 2 * time.Second,
		Backoff:  agent.Backoff{Base: 20 * time.Millisecond, Max: 200 * time.Millisecond},
		Fallback: agent.Fallback{ProbeInterval: -1},
		Hooks: agent.Hooks{OnConnected: func(s agent.Status) { connected <- s },
			OnDisconnected: func(err error) { disc <- err }}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()
	defer func() {
		cancel()
		_ = a.Close()
		<-ran
	}()
	await := func(what string) agent.Status {
		t.Helper()
		select {
		case s := <-connected:
			return s
		case <-time.After(30 * time.Second):
			t.Fatalf("agent not connected (%s); daemon log:\n%s", what, d.log())
		}
		return agent.Status{}
	}
	s1 := await("first daemon")
	// Heartbeats flow before the kill (polled: no event crosses to here).
	for deadline := time.Now().Add(10 * time.Second); a.Stats().HeartbeatsAcked < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no heartbeat acks; daemon log:\n%s", d.log())
		}
	}

	if err := d.cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	killed := time.Now()
	var end error
	select {
	case end = <-disc:
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
	<-d.done // reaped; the port is free
	d.done <- nil

	d = startDaemon("daemon-2.log")
	s2 := await("restarted daemon")
	st := a.Stats()
	if st.HeartbeatTimeouts != 1 || st.Reconnects < 1 || s2.Transport == s1.Transport {
		t.Fatalf("after the restart: %d heartbeat timeouts, %d reconnects, transport %s → %s", st.HeartbeatTimeouts, st.Reconnects, s1.Transport, s2.Transport)
	}
	t.Logf("back on the restarted daemon after %v from the kill (session %s)", time.Since(killed).Round(time.Millisecond), a.Session())
}
