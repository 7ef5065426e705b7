package daemon_test

import (
	"context"
	"crypto/tls"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/quic/rawbench"
	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// idleAgents is how many idle connections each side of
// TestIdleConnMemory holds.
const idleAgents = 200

// idleMemRatio bounds OURS/RAW heap bytes per idle connection, both ends
// counted (goroutine stacks are bounded apart, idleStackRatio). When the test was added it measured 2.00× (2.40× under -race;
// see docs/perf.md §10, "Idle connection memory"); with the agent's answer
// ring on demand (64 KiB per agent less) 1.54–1.59× (1.35–1.42× under
// -race, heartbeats every 10 s). The bound sits above that so that it
// catches a regression of that size (the ring up front measured 2.07×),
// not the distance still to the 1.2× goal of issue 26 item 1. Lower it as
// the holders are removed. Since the queues, maps, timers and TLS config
// clones an idle connection no longer keeps (2026-12-08): 1.31× (1.28×
// under -race), so the bound is 1.6×.
const idleMemRatio = 1.6

// idleGoroutineExcess bounds goroutines per idle agent (both ends, in this
// process) over raw quic-go's, as an absolute excess: 16 when the test was
// added (ours 20, raw 4; each library agent has its own quic.Transport, 3
// goroutines, where rawbench's clients share one).
// Since HandleStreams and the lazy work queue (daemon side 7 → 5
// goroutines per connection, raw quic-go's 2) ours was 16; measured 15 on
// 2026-12-08 (both ends, after the collections): the bound allows one more.
const idleGoroutineExcess = 12.0

// idleStackRatio bounds OURS/RAW goroutine stack bytes per idle
// connection, both ends, after the forced collections (which shrink
// stacks that use under a quarter of their size). Measured 3.5–3.9× (ours
// 60–64 KiB for 16 goroutines, raw 16.5–17 KiB for 4): about as deep each.
// A long-lived goroutine per connection left with a 32 KiB stack adds
// ≥ 28 KiB (≈ 5.2×) and crosses it; one more goroutine is caught by
// idleGoroutineExcess.
const idleStackRatio = 4.5

// memFigures are HeapInuse, StackInuse and the goroutine count after two
// forced collections.
type memFigures struct {
	heap, stack uint64
	goroutines  int
}

func heapAndGoroutines() memFigures {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memFigures{ms.HeapInuse, ms.StackInuse, runtime.NumGoroutine()}
}

// perConn is the per-connection growth from a to b.
func perConn(a, b memFigures) (heap, stack, goroutines float64) {
	return float64(int64(b.heap)-int64(a.heap)) / idleAgents, float64(int64(b.stack)-int64(a.stack)) / idleAgents,
		float64(b.goroutines-a.goroutines) / idleAgents
}

// TestIdleConnMemory holds idleAgents idle agents on a daemon over the
// real QUIC backend and, in the same process, as many raw quic-go
// connections (backends/quic/rawbench: one stream, one echoed byte), and
// bounds the heap bytes and goroutines each costs, ours against raw. Both
// figures include both ends (daemon and agent, server and client share
// this process), so the ratio is of whole connections. It asserts on
// memory and counts after awaited events, never on time.
func TestIdleConnMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("holds 2×200 connections")
	}
	if os.Getenv("IDLEMEM_CHILD") == "" {
		// Measure in a process of its own: the package's other tests
		// (parallel ones, and garbage they leave) would move HeapInuse.
		cmd := exec.Command(os.Args[0], "-test.run=^TestIdleConnMemory$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "IDLEMEM_CHILD=1")
		out, err := cmd.CombinedOutput()
		t.Logf("child:\n%s", out)
		if err != nil {
			t.Fatalf("the measuring child failed: %v", err)
		}
		return
	}
	pki := trusttest.NewPKI(t)

	// Raw quic-go first.
	m0 := heapAndGoroutines()
	srv, err := rawbench.Listen("127.0.0.1:0", pki.ServerConfig(t, "localhost"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	confs := make([]*tls.Config, idleAgents)
	for i := range confs {
		confs[i] = pki.ClientConfigWith(t, pki.IssueClient(t, wire.NewRunnerId(), trusttest.LeafOptions{}), "localhost")
	}
	cl, err := rawbench.DialN(ctx, srv.Addr().String(), idleAgents, 8, 1, func(i int) *tls.Config { return confs[i] })
	if err != nil {
		t.Fatal(err)
	}
	confs = nil
	rawBytes, rawStack, rawG := perConn(m0, heapAndGoroutines())
	cl.Close()
	cancel()
	<-served

	// Ours: a daemon engine and idleAgents library agents.
	var ln *quic.Listener
	qb := enginetest.QuicBackend()
	inner := qb.Listen
	qb.Listen = func(t *testing.T, conf *tls.Config) (semantics.BackendListener, string) {
		l, a := inner(t, conf)
		ln = l.(*quic.Listener)
		return l, a
	}
	// Idle agents heartbeat as real ones do (every 10 s), not at
	// FastTiming's 100 ms: 200 agents at 10/s each, under -race on a
	// loaded machine, missed their liveness and reconnected in a storm
	// (hundreds of handshakes in flight), and one never connected.
	w := enginetest.NewWorld(t, qb, func(c *daemon.Config) { c.Timing.HeartbeatInterval = 10 * time.Second })
	defer func() {
		if t.Failed() && ln != nil {
			t.Logf("listener handshakes: %+v", ln.HandshakeStats())
		}
	}()
	ids := make([]enginetest.Identity, idleAgents)
	for i := range ids {
		ids[i] = w.NewIdentity()
	}
	exec := enginetest.NewCountingExec(false) // one for all: it is sized for many attempts
	m2 := heapAndGoroutines()
	// A hello answered after the harness's 500 ms (a loaded machine,
	// -race) made an agent redial until AwaitConnected gave up.
	patient := func(c *agent.Config) { c.RequestTimeout = 5 * time.Second }
	for _, id := range ids {
		a, _, _ := w.StartAgent(id, exec, patient)
		enginetest.AwaitConnected(t, a)
	}
	ids = nil
	ourBytes, ourStack, ourG := perConn(m2, heapAndGoroutines())
	if f := os.Getenv("IDLEMEM_GOROUTINES"); f != "" {
		if out, err := os.Create(f); err == nil {
			_ = pprof.Lookup("goroutine").WriteTo(out, 1)
			_ = out.Close()
		}
	}

	t.Logf("per idle connection, both ends: ours %.1f KiB heap, %.1f goroutines, %.1f KiB stacks; raw quic-go %.1f KiB heap, %.1f goroutines, %.1f KiB stacks; ours/raw heap %.2f×, stacks %.2f×",
		ourBytes/1024, ourG, ourStack/1024, rawBytes/1024, rawG, rawStack/1024, ourBytes/rawBytes, ourStack/rawStack)
	if rawBytes <= 0 {
		t.Fatalf("raw quic-go measured %.0f bytes per connection", rawBytes)
	}
	if ourBytes > rawBytes*idleMemRatio {
		t.Errorf("an idle agent costs %.1f KiB, more than %.1f× raw quic-go's %.1f KiB", ourBytes/1024, idleMemRatio, rawBytes/1024)
	}
	if rawStack <= 0 {
		t.Fatalf("raw quic-go measured %.0f stack bytes per connection", rawStack)
	}
	if ourStack > rawStack*idleStackRatio {
		t.Errorf("an idle agent's goroutines hold %.1f KiB of stack, more than %.1f× raw quic-go's %.1f KiB", ourStack/1024, idleStackRatio, rawStack/1024)
	}
	if ourG > rawG+idleGoroutineExcess {
		t.Errorf("an idle agent holds %.1f goroutines, raw quic-go %.1f (allowed excess %.0f)", ourG, rawG, idleGoroutineExcess)
	}
}
