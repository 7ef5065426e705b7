package daemon_test

import (
	"context"
	"crypto"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// hostEvents is what a host scheduler learns through daemon.Hooks. Hooks
// run on daemon goroutines and must not block: they record and return.
type hostEvents struct {
	mu          sync.Mutex
	lines       map[string]bool
	completions chan daemon.CompletionEvent
	outputs     []wire.CasObjectRef
}

func (e *hostEvents) note(format string, args ...any) {
	e.mu.Lock()
	e.lines[fmt.Sprintf(format, args...)] = true
	e.mu.Unlock()
}

func (e *hostEvents) hooks() daemon.Hooks {
	return daemon.Hooks{
		OnRegistered: func(s daemon.SessionInfo) { e.note("runner connected: role %v over %s", s.Role, s.Backend) },
		OnCapabilities: func(_ daemon.SessionInfo, c agentwire.RunnerCapabilitiesV1) {
			e.note("capabilities: %s/%s labels %v", c.OS, c.Arch, c.Labels)
		},
		OnLeaseAnswer: func(a daemon.LeaseAnswerEvent) { e.note("lease answered: accepted=%v", a.Accepted) },
		OnPhase:       func(p daemon.PhaseEvent) { e.note("phase: %v", p.Phase) },
		OnLogStream:   func(wlogs.LogStreamHeaderV1) { e.note("log stream opened") },
		OnOutputs: func(o daemon.OutputsEvent) {
			e.mu.Lock()
			e.outputs = o.Outputs
			e.mu.Unlock()
			e.note("outputs declared: %d", len(o.Outputs))
		},
		OnCompletion: func(c daemon.CompletionEvent) { e.completions <- c },
		OnDisconnect: func(daemon.SessionInfo, error) {},
	}
}

// buildExecutor is a custom agent.Executor: it logs two lines, stores one
// output and succeeds — or returns Cancelled when the daemon cancels it.
type buildExecutor struct{}

func (buildExecutor) Execute(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
	out.Phase(agentwire.PhaseRunning)
	src, err := job.OpenPayload()
	if err != nil {
		return agent.Result{Kind: agentwire.ResultInfraError, Message: "no payload"}
	}
	_ = src.Close()
	_ = out.Log(wlogs.LogStdout, []byte("compiling\n"))
	if ctx.Err() != nil {
		return agent.Result{Kind: agentwire.ResultCancelled}
	}
	_ = out.Log(wlogs.LogStdout, []byte("linking\n"))
	ref, err := out.PutOutput([]byte("a built artifact"))
	if err != nil {
		return agent.Result{Kind: agentwire.ResultInfraError, Message: "storing the artifact failed"}
	}
	return agent.Result{Kind: agentwire.ResultSucceeded, Outputs: []wire.CasObjectRef{ref}}
}

// Example_host is a host program embedding the daemon: a real QUIC
// listener on loopback, the SQLite authority, file stores for logs and CAS
// objects, and scheduler callbacks; and an agent with a custom Executor
// that logs and uploads an output. One lease is offered; the host prints
// what its hooks saw, the completion, and checks the stores.
func Example_host() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir, _ := os.MkdirTemp("", "forgeyard-host")
	defer os.RemoveAll(dir)

	// Development certificates (production: your CA; see docs/operations.md).
	pki, err := trust.GenerateDevPKI(filepath.Join(dir, "pki"), trust.DevPKIOptions{Agents: []string{"builder-1"}})
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

	// The daemon: SQLite authority, file-backed logs and CAS, hooks.
	auth, err := authority.OpenSQLite(ctx, filepath.Join(dir, "authority.db"))
	if err != nil {
		panic(err)
	}
	defer auth.Close()
	store, err := cas.NewFSStore(cas.FSStoreConfig{Dir: filepath.Join(dir, "cas")})
	if err != nil {
		panic(err)
	}
	ev := &hostEvents{lines: map[string]bool{}, completions: make(chan daemon.CompletionEvent, 1)}
	d, err := daemon.New(daemon.Config{Authority: auth, LogDir: filepath.Join(dir, "logs"), ContentStore: store,
		Features: wire.Implemented, Hooks: ev.hooks()})
	if err != nil {
		panic(err)
	}
	l, err := quic.Listen("127.0.0.1:0", serverTLS, quic.Config{})
	if err != nil {
		panic(err)
	}
	go func() { _ = d.Serve(ctx, l) }()

	// The agent: QUIC to the daemon, its capabilities, the custom executor.
	connected := make(chan struct{}, 1)
	cert := clientTLS.Certificates[0]
	a, err := agent.New(agent.Config{
		Runner:       runner.Runner,
		Signer:       cert.PrivateKey.(crypto.Signer),
		CertChain:    cert.Certificate,
		Endpoints:    []agent.Endpoint{{Address: l.Addr().String(), Backend: "quic", Dialer: &quic.Dialer{TLS: clientTLS}}},
		Features:     wire.Implemented,
		Capabilities: agentwire.RunnerCapabilitiesV1{OS: "linux", Arch: "amd64", Labels: []string{"gpu"}, MaxParallel: 1},
		SpoolDir:     filepath.Join(dir, "spool"),
		FetchPayload: true,
		Executor:     buildExecutor{},
		Hooks: agent.Hooks{OnConnected: func(agent.Status) {
			select {
			case connected <- struct{}{}:
			default:
			}
		}},
	})
	if err != nil {
		panic(err)
	}
	go func() { _ = a.Run(ctx) }()
	<-connected

	// The scheduler stores the job's payload (its inputs) in the CAS and
	// offers one lease to the runner; the agent fetches and verifies the
	// payload before the executor runs (Job.OpenPayload).
	payload := []byte("the sources to build")
	ref := wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(payload), Size: uint64(len(payload))}
	if p, err := store.Create(ref); err != nil || p.Append(payload) != nil || p.Commit() != nil {
		panic(fmt.Sprint("storing the payload: ", err))
	}
	lease, err := d.OfferLease(ctx, runner.Runner, daemon.LeaseOffer{Job: wire.NewJobId(),
		Spec: wire.JobSpecId{Digest: wire.Digest{1}}, Payload: ref})
	if err != nil {
		panic(err)
	}
	c := <-ev.completions
	fmt.Println("completion:", c.Result.Kind, "ack", c.Ack)

	ev.mu.Lock()
	var lines []string
	for line := range ev.lines {
		lines = append(lines, line)
	}
	outs := ev.outputs
	ev.mu.Unlock()
	sort.Strings(lines)
	fmt.Println(strings.Join(lines, "\n"))
	for _, o := range outs {
		st, _ := store.Stat(o)
		fmt.Println("output stored and verified:", st.Complete)
	}
	n, _ := auth.Completions(ctx, lease.Attempt)
	fmt.Println("completions recorded:", n)

	_ = a.Close()
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	defer scancel()
	_ = d.Shutdown(sctx)
	// Output:
	// completion: Succeeded ack Accepted
	// capabilities: linux/amd64 labels [gpu]
	// lease answered: accepted=true
	// log stream opened
	// outputs declared: 1
	// phase: Running
	// runner connected: role Agent over quic
	// output stored and verified: true
	// completions recorded: 1
}
