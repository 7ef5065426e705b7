package daemon_test

import (
	"context"
	"crypto"
	"fmt"
	"os"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
)

// Example runs a daemon and an agent over the in-memory backend with a
// development PKI, offers one lease and waits for its completion.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dir, _ := os.MkdirTemp("", "forgeyard-example")
	defer os.RemoveAll(dir)
	pki, err := trust.GenerateDevPKI(dir, trust.DevPKIOptions{Agents: []string{"builder-1"}})
	if err != nil {
		panic(err)
	}
	runner, _ := pki.Agent("builder-1")
	serverTLS, err := trust.ServerConfig(trust.ServerFiles{CertFile: pki.Server.CertFile, KeyFile: pki.Server.KeyFile,
		ClientCAFile: pki.CA.CertFile, RequireClientCert: true})
	if err != nil {
		panic(err)
	}
	clientTLS, err := trust.ClientConfig(trust.ClientFiles{CertFile: runner.CertFile, KeyFile: runner.KeyFile,
		CAFile: pki.CA.CertFile, ServerName: "localhost"})
	if err != nil {
		panic(err)
	}

	// The daemon: an embedded SQLite authority, one memory listener.
	auth, _ := authority.OpenSQLite(ctx, ":memory:")
	defer auth.Close()
	completions := make(chan daemon.CompletionEvent, 1)
	d, err := daemon.New(daemon.Config{Authority: auth,
		Hooks: daemon.Hooks{OnCompletion: func(ev daemon.CompletionEvent) { completions <- ev }}})
	if err != nil {
		panic(err)
	}
	network := memory.NewNetwork()
	l, _ := network.Listen("daemon.example", serverTLS)
	go func() { _ = d.Serve(ctx, l) }()

	// The agent: the runner's certificate key signs the registration.
	connected := make(chan struct{}, 1)
	cert := clientTLS.Certificates[0]
	a, err := agent.New(agent.Config{
		Runner:    runner.Runner,
		Signer:    cert.PrivateKey.(crypto.Signer),
		CertChain: cert.Certificate,
		Endpoints: []agent.Endpoint{{Address: "daemon.example", Backend: "memory",
			Dialer: &memory.Dialer{Network: network, TLSConfig: clientTLS}}},
		Executor: agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}),
		Hooks:    agent.Hooks{OnConnected: func(agent.Status) { connected <- struct{}{} }},
	})
	if err != nil {
		panic(err)
	}
	go func() { _ = a.Run(ctx) }()
	<-connected

	lease, err := d.OfferLease(ctx, runner.Runner, daemon.LeaseOffer{Job: wire.NewJobId(),
		Spec:    wire.JobSpecId{Digest: wire.Digest{1}},
		Payload: wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: wire.Digest{2}, Size: 512}})
	if err != nil {
		panic(err)
	}
	ev := <-completions
	n, _ := auth.Completions(ctx, lease.Attempt)
	fmt.Println("lease", lease.State, "- completion", ev.Ack, "- recorded", n)

	_ = a.Close()
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	_ = d.Shutdown(sctx)
	// Output: lease accepted - completion Accepted - recorded 1
}
