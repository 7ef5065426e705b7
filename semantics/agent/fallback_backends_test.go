package agent_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/internal/tools/netsim"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// fbWorld is one daemon listening on QUIC (reached through a UDP proxy that
// can drop everything, i.e. "UDP silently blocked") and on TLS+yamux.
type fbWorld struct {
	*enginetest.World
	udp       *netsim.UDPProxy
	yamuxAddr string
	sink      *logs.MemorySink
}

func newFBWorld(t *testing.T) *fbWorld {
	t.Helper()
	sink := &logs.MemorySink{}
	w := enginetest.NewWorld(t, enginetest.QuicBackend(), func(c *daemon.Config) { c.LogSink = sink })
	yl, err := yamux.Listen("127.0.0.1:0", w.Pki.ServerConfig(t, "localhost"), yamux.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = yl.Close() })
	served := make(chan struct{})
	go func() { defer close(served); _ = w.D.Serve(context.Background(), yl) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = w.D.Shutdown(ctx)
		<-served
	})
	udp, err := netsim.NewUDPProxy(w.Addr, netsim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = udp.Close() })
	return &fbWorld{World: w, udp: udp, yamuxAddr: yl.Addr().String(), sink: sink}
}

// endpoints: QUIC through the proxy, then TLS+yamux direct; quicDialer
// wraps the QUIC dialer when non-nil.
func (w *fbWorld) endpoints(id enginetest.Identity, wrapQUIC func(semantics.BackendDialer) semantics.BackendDialer) []agent.Endpoint {
	var qd semantics.BackendDialer = quic.Dialer{TLS: w.ClientTLS(id)}
	if wrapQUIC != nil {
		qd = wrapQUIC(qd)
	}
	return []agent.Endpoint{
		{Address: w.udp.Addr(), Dialer: qd, Backend: "quic"},
		{Address: w.yamuxAddr, Dialer: yamux.Dialer{TLS: w.ClientTLS(id)}, Backend: "yamux"},
	}
}

// awaitBackend waits (event: OnConnected) until the agent is registered
// over backend.
func awaitBackend(t *testing.T, a *agent.Agent, changed <-chan struct{}, backend string, within time.Duration) agent.Status {
	t.Helper()
	deadline := time.After(within)
	for {
		if s := a.Status(); s.Connected && s.Backend == backend {
			return s
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("agent not on %s within %v: %+v", backend, within, a.Status())
			return agent.Status{}
		}
	}
}

func connectedSignal(c *agent.Config) <-chan struct{} {
	ch := make(chan struct{}, 64)
	prev := c.Hooks.OnConnected
	c.Hooks.OnConnected = func(s agent.Status) {
		if prev != nil {
			prev(s)
		}
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	return ch
}

// TestFallbackUDPDroppedRegistersOverYamux: QUIC's packets are silently
// dropped; the agent registers over TLS+yamux within 1.5 s (yamux starts at
// +500 ms) and says why.
func TestFallbackUDPDroppedRegistersOverYamux(t *testing.T) {
	w := newFBWorld(t)
	w.udp.Blackhole(true)
	id := w.NewIdentity()
	var connected <-chan struct{}
	start := time.Now()
	m := telemetry.NewMetrics()
	a, _, _ := w.StartAgent(id, enginetest.NewCountingExec(false), func(c *agent.Config) {
		c.Endpoints = w.endpoints(id, nil)
		c.RequestTimeout = 5 * time.Second
		c.Fallback.ProbeInterval = -1
		c.Metrics = m
		connected = connectedSignal(c)
	})
	s := awaitBackend(t, a, connected, "yamux", 5*time.Second)
	el := time.Since(start)
	t.Logf("UDP silently dropped: registered over %s after %v; reason: %s", s.Backend, el, s.FallbackReason)
	if el > 1500*time.Millisecond {
		t.Fatalf("registered after %v, want ≤ 1.5 s", el)
	}
	if el < 500*time.Millisecond {
		t.Fatalf("registered after %v: TLS+yamux started before its +500 ms offset", el)
	}
	if s.Class != "tcp" || !strings.Contains(s.FallbackReason, "yamux "+w.yamuxAddr+" answered hello") ||
		!strings.Contains(s.FallbackReason, "quic "+w.udp.Addr()+" had not answered") {
		t.Fatalf("status %+v", s)
	}
	if n := a.Stats().BackendChanges[agent.BackendChange{From: "quic", To: "yamux"}]; n != 1 {
		t.Fatalf("BackendChanges %v", a.Stats().BackendChanges)
	}
	_, fams := enginetest.ScrapeFamilies(t, m)
	if v := enginetest.FamilyValue(fams, "forgeyard_transport_fallback_events_total", "from", "quic", "to", "yamux"); v != 1 {
		t.Fatalf("forgeyard_transport_fallback_events_total{from=quic,to=yamux} = %v, want 1", v)
	}
}

// silentServer accepts TLS+yamux connections (the handshake succeeds) and
// then either never answers or drops them: a captive or intercepting
// network, or a server that dies before Welcome.
func silentServer(t *testing.T, w *enginetest.World, drop bool) string {
	t.Helper()
	l, err := yamux.Listen("127.0.0.1:0", w.Pki.ServerConfig(t, "localhost"), yamux.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []semantics.BackendConn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept(context.Background())
			if err != nil {
				return
			}
			if drop {
				_ = c.CloseWithCode(wire.CloseInternalError, "server died")
				continue
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
		mu.Lock()
		for _, c := range held {
			_ = c.CloseWithCode(wire.CloseShutdown, "")
		}
		mu.Unlock()
	})
	return l.Addr().String()
}

// TestFallbackHandshakeWithoutWelcomeDoesNotWin: the preferred endpoint's
// TLS handshake succeeds at once but no Welcome (HelloAck) ever comes, or
// the server dies right after; the agent must register over the real
// daemon (which starts 500 ms later) well before the request timeout.
func TestFallbackHandshakeWithoutWelcomeDoesNotWin(t *testing.T) {
	for _, drop := range []bool{false, true} {
		t.Run(fmt.Sprintf("drop=%v", drop), func(t *testing.T) {
			w := newFBWorld(t)
			bad := silentServer(t, w.World, drop)
			id := w.NewIdentity()
			var connected <-chan struct{}
			start := time.Now()
			a, _, _ := w.StartAgent(id, enginetest.NewCountingExec(false), func(c *agent.Config) {
				c.Endpoints = []agent.Endpoint{
					// Preferred class, but a dead end after the handshake.
					{Address: bad, Dialer: yamux.Dialer{TLS: w.ClientTLS(id)}, Backend: "captive", Class: agent.ClassQUIC},
					{Address: w.yamuxAddr, Dialer: yamux.Dialer{TLS: w.ClientTLS(id)}, Backend: "yamux"},
				}
				c.RequestTimeout = 5 * time.Second
				c.Fallback.ProbeInterval = -1
				connected = connectedSignal(c)
			})
			s := awaitBackend(t, a, connected, "yamux", 5*time.Second)
			el := time.Since(start)
			t.Logf("registered over %s after %v: %s", s.Endpoint, el, s.FallbackReason)
			if s.Endpoint != w.yamuxAddr || el > 2*time.Second {
				t.Fatalf("on %s after %v (request timeout 5 s): the handshake-only endpoint won", s.Endpoint, el)
			}
			if a.Stats().Registrations != 1 {
				t.Fatalf("registrations %d", a.Stats().Registrations)
			}
		})
	}
}

// patternDialer fails or passes dials by a rule over the call number and
// signals every call.
type patternDialer struct {
	inner semantics.BackendDialer
	n     atomic.Int64
	pass  func(n int64) bool
	calls chan int64
}

func (p *patternDialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	n := p.n.Add(1) - 1
	defer func() {
		select {
		case p.calls <- n:
		default:
		}
	}()
	if !p.pass(n) {
		return nil, errors.New("test: path blocked")
	}
	return p.inner.Dial(ctx, addr)
}

// TestFallbackProbeHysteresis: the QUIC path alternates (every other probe
// fails): the agent stays on TLS+yamux however long it probes. Never a
// flap.
func TestFallbackProbeHysteresis(t *testing.T) {
	w := newFBWorld(t)
	id := w.NewIdentity()
	pd := &patternDialer{pass: func(n int64) bool { return n%2 == 1 }, calls: make(chan int64, 256)}
	var connected <-chan struct{}
	a, _, _ := w.StartAgent(id, enginetest.NewCountingExec(false), func(c *agent.Config) {
		c.Endpoints = w.endpoints(id, func(d semantics.BackendDialer) semantics.BackendDialer { pd.inner = d; return pd })
		c.Fallback = agent.Fallback{ProbeInterval: 20 * time.Millisecond, ProbeSuccesses: 2}
		connected = connectedSignal(c)
	})
	awaitBackend(t, a, connected, "yamux", 5*time.Second)
	const probes = 16
	deadline := time.After(10 * time.Second)
	for seen := int64(0); seen < probes; {
		select {
		case n := <-pd.calls:
			seen = max(seen, n)
		case <-deadline:
			t.Fatalf("only %d probes", a.Stats().Probes)
		}
	}
	st := a.Stats()
	if st.MovesBack != 0 || a.Status().Backend != "yamux" || st.Registrations != 1 {
		t.Fatalf("flapped: %+v", st)
	}
	if st.ProbesSucceeded < probes/2-1 || st.Probes-st.ProbesSucceeded < probes/2-1 {
		t.Fatalf("probes %d, succeeded %d: the pattern did not alternate", st.Probes, st.ProbesSucceeded)
	}
	if s := a.Status(); !strings.Contains(s.FallbackReason, "consecutive probes needed") && !strings.Contains(s.FallbackReason, "probe of the preferred backend failed") {
		t.Fatalf("reason %q", s.FallbackReason)
	}
}

// TestFallbackMoveBackKeepsAttempt: on TLS+yamux with an attempt running
// and writing its log, UDP is restored; after 3 consecutive good probes the
// agent moves to QUIC under the same agent session (new epoch), the attempt
// keeps running, its log arrives complete and in order, and its completion
// is acknowledged exactly once.
func TestFallbackMoveBackKeepsAttempt(t *testing.T) {
	w := newFBWorld(t)
	w.udp.Blackhole(true)
	id := w.NewIdentity()
	const lines = 300
	line := func(i int) string { return fmt.Sprintf("line %04d of the move-back test\n", i) }
	exec := enginetest.NewHalfwayLog(lines, line)
	half, cont, runs := exec.Half, exec.Cont, &exec.Runs
	var connected <-chan struct{}
	var changes atomic.Int64
	done := make(chan agent.AttemptDone, 4)
	a, _, _ := w.StartAgent(id, exec, enginetest.SpoolIn(t.TempDir()), func(c *agent.Config) {
		c.Endpoints = w.endpoints(id, nil)
		c.RequestTimeout = 2 * time.Second
		c.Fallback = agent.Fallback{ProbeInterval: 50 * time.Millisecond, ProbeSuccesses: 3}
		c.Hooks.OnBackendChange = func(agent.BackendChange, string) { changes.Add(1) }
		c.Hooks.OnAttemptDone = func(d agent.AttemptDone) { done <- d }
		connected = connectedSignal(c)
	})
	s1 := awaitBackend(t, a, connected, "yamux", 5*time.Second)
	w.AwaitActive(id.Runner)
	l, err := w.D.OfferLease(context.Background(), id.Runner, enginetest.Offer(31))
	if err != nil {
		t.Fatal(err)
	}
	<-half
	w.udp.Blackhole(false) // UDP is back
	restored := time.Now()
	s2 := awaitBackend(t, a, connected, "quic", 10*time.Second)
	t.Logf("moved back to QUIC %v after UDP was restored: %s", time.Since(restored), s2.FallbackReason)
	close(cont)
	ev := w.AwaitCompletion(l.Attempt, agentwire.AckAccepted)
	if ev.Result.Kind != agentwire.ResultSucceeded {
		t.Fatalf("result %v", ev.Result)
	}
	select {
	case d := <-done:
		if d.Ack != agentwire.AckAccepted {
			t.Fatalf("ack %v", d.Ack)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("completion never acknowledged")
	}
	if n, _ := w.Auth.Completions(context.Background(), l.Attempt); n != 1 {
		t.Fatalf("completions %d", n)
	}
	var want strings.Builder
	for i := 0; i < lines; i++ {
		want.WriteString(line(i))
	}
	if got := enginetest.Stdout(t, w.sink, l.Attempt); got != want.String() {
		t.Fatalf("sink holds %d bytes, want %d", len(got), want.Len())
	}
	st := a.Stats()
	if runs.Load() != 1 || st.MovesBack != 1 || st.CompletionAcks[agentwire.AckAccepted] != 1 || st.ProbesSucceeded < 3 {
		t.Fatalf("runs %d, stats %+v", runs.Load(), st)
	}
	if s2.Epoch <= s1.Epoch || a.Session() != ev.Session {
		t.Fatalf("epoch %d → %d, session %s vs %s", s1.Epoch, s2.Epoch, a.Session(), ev.Session)
	}
	if !strings.Contains(s2.FallbackReason, "moved back to quic") {
		t.Fatalf("reason %q", s2.FallbackReason)
	}
	if st.BackendChanges[agent.BackendChange{From: "yamux", To: "quic"}] != 1 || changes.Load() != 2 {
		t.Fatalf("changes %v (hook %d)", st.BackendChanges, changes.Load())
	}
	// No other agent session: the move did not look like a new agent.
	for _, si := range w.D.Sessions() {
		if si.Runner == id.Runner && si.Session != a.Session() {
			t.Fatalf("sessions %+v", w.D.Sessions())
		}
	}
	select {
	case d := <-done:
		t.Fatalf("second completion ack: %+v", d)
	default:
	}
}
