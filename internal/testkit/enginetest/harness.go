package enginetest

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/webtransport"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// FastTiming keeps every test in the millisecond range. Heartbeats run
// every 100 ms, but the liveness window is not 300 ms: a link is judged
// dead after 3 intervals plus HeartbeatGrace (1.3 s), like an agent
// started by World.StartAgent (FastAgentHeartbeatMisses), so a test
// process starved of CPU for a few hundred milliseconds (two `make test`
// runs on two cores) does not lose its links. A test whose subject is
// dead-link detection sets its own window (TestDeadPathDetectedWithinMisses).
func FastTiming() daemon.Timing {
	return daemon.Timing{HeartbeatInterval: 100 * time.Millisecond, HeartbeatGrace: time.Second, RenewInterval: 50 * time.Millisecond,
		LeaseTTL: 2 * time.Second, RevokeGrace: 500 * time.Millisecond, RegistrationTimeout: 2 * time.Second,
		RequestTimeout: 500 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}
}

// FastAgentHeartbeatMisses is the liveness window of an agent started by
// World.StartAgent, in heartbeat intervals: 13 × FastTiming's 100 ms, the
// daemon's 3 intervals + HeartbeatGrace. A test that measures the agent's
// own detection sets agent.Config.HeartbeatMisses (0 for the default 3).
const FastAgentHeartbeatMisses = 13

// Backend is one backend under test.
type Backend struct {
	Name   string
	Listen func(t *testing.T, conf *tls.Config) (semantics.BackendListener, string)
	Dialer func(t *testing.T, conf *tls.Config) semantics.BackendDialer
}

var listenSeq atomic.Int64

func ListenOn(n *memory.Network) func(t *testing.T, conf *tls.Config) (semantics.BackendListener, string) {
	return func(t *testing.T, conf *tls.Config) (semantics.BackendListener, string) {
		addr := fmt.Sprintf("daemon-%d", listenSeq.Add(1))
		l, err := n.Listen(addr, conf)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		return l, addr
	}
}

func MemoryBackend() Backend {
	n := memory.NewNetwork()
	return Backend{Name: "memory",
		Listen: ListenOn(n),
		Dialer: func(t *testing.T, conf *tls.Config) semantics.BackendDialer {
			return &memory.Dialer{Network: n, TLSConfig: conf}
		}}
}

func QuicBackend() Backend {
	return loopbackBackend("quic",
		func(conf *tls.Config) (*quic.Listener, error) { return quic.Listen("127.0.0.1:0", conf, quic.Config{}) },
		func(conf *tls.Config) semantics.BackendDialer { return quic.Dialer{TLS: conf} })
}

func YamuxBackend() Backend {
	return loopbackBackend("yamux",
		func(conf *tls.Config) (*yamux.Listener, error) {
			return yamux.Listen("127.0.0.1:0", conf, yamux.Config{})
		},
		func(conf *tls.Config) semantics.BackendDialer { return yamux.Dialer{TLS: conf} })
}

func WebtransportBackend() Backend {
	return loopbackBackend("webtransport",
		func(conf *tls.Config) (*webtransport.Listener, error) {
			return webtransport.Listen("127.0.0.1:0", conf, webtransport.Config{})
		},
		func(conf *tls.Config) semantics.BackendDialer { return webtransport.Dialer{TLS: conf} })
}

// loopbackBackend is a real backend: listen opens its listener on a
// loopback port (closed when the test ends), dial makes its dialer.
func loopbackBackend[L semantics.BackendListener](name string, listen func(*tls.Config) (L, error), dial func(*tls.Config) semantics.BackendDialer) Backend {
	return Backend{Name: name,
		Listen: func(t *testing.T, conf *tls.Config) (semantics.BackendListener, string) {
			l, err := listen(conf)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			return l, l.Addr().String()
		},
		Dialer: func(t *testing.T, conf *tls.Config) semantics.BackendDialer { return dial(conf) }}
}

// Backends runs f on memory and on the real backends.
func Backends(t *testing.T, f func(t *testing.T, b Backend)) {
	for _, mk := range []func() Backend{MemoryBackend, QuicBackend, YamuxBackend} {
		b := mk()
		t.Run(b.Name, func(t *testing.T) { f(t, b) })
	}
}

// AllBackends runs f on memory and on every real backend, WebTransport
// included.
func AllBackends(t *testing.T, f func(t *testing.T, b Backend)) {
	for _, mk := range []func() Backend{MemoryBackend, QuicBackend, YamuxBackend, WebtransportBackend} {
		b := mk()
		t.Run(b.Name, func(t *testing.T) { f(t, b) })
	}
}

// RecDialer records every connection it dials so a test can cut them.
type RecDialer struct {
	Inner semantics.BackendDialer
	mu    sync.Mutex
	conns []semantics.BackendConn
}

func (r *RecDialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	c, err := r.Inner.Dial(ctx, addr)
	if err == nil {
		r.mu.Lock()
		r.conns = append(r.conns, c)
		r.mu.Unlock()
	}
	return c, err
}

// Cut breaks the latest connection: a network cut on memory, an abrupt
// close on real backends. It reports whether there was one.
func (r *RecDialer) Cut() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.conns) == 0 {
		return false
	}
	c := r.conns[len(r.conns)-1]
	if m, ok := c.(*memory.Conn); ok {
		m.Disconnect()
	} else {
		_ = c.CloseWithCode(wire.CloseInternalError, "test cut")
	}
	return true
}

// World is one daemon on one backend with a PKI and an authority.
type World struct {
	T      *testing.T
	B      Backend
	Pki    *trusttest.PKI
	Auth   authority.Authority
	D      *daemon.Daemon
	Addr   string
	Ev     *Events
	LogBuf *SyncBuffer
}

type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Events collects daemon hook calls.
type Events struct {
	Completions chan daemon.CompletionEvent
	answers     chan daemon.LeaseAnswerEvent
	registered  chan daemon.SessionInfo
	Disconnects chan error
	OnComplete  atomic.Pointer[func(daemon.CompletionEvent)]
}

func NewEvents() *Events {
	return &Events{Completions: make(chan daemon.CompletionEvent, 1024), answers: make(chan daemon.LeaseAnswerEvent, 1024),
		registered: make(chan daemon.SessionInfo, 1024), Disconnects: make(chan error, 1024)}
}

// Hooks returns the daemon hooks that feed e. A hook never blocks the
// daemon: when a channel is full (a test that does not read it, e.g. the
// disconnects of a chaos test that cuts thousands of connections), its
// oldest event is dropped for the new one. A blocking hook would wedge the
// daemon's connection teardown and hang the test instead.
func (e *Events) Hooks() daemon.Hooks {
	return daemon.Hooks{
		OnRegistered: func(s daemon.SessionInfo) { push(e.registered, s) },
		OnCompletion: func(c daemon.CompletionEvent) {
			if f := e.OnComplete.Load(); f != nil {
				(*f)(c)
			}
			push(e.Completions, c)
		},
		OnLeaseAnswer: func(a daemon.LeaseAnswerEvent) { push(e.answers, a) },
		OnDisconnect:  func(_ daemon.SessionInfo, err error) { push(e.Disconnects, err) },
	}
}

// push sends v on ch without blocking, dropping the oldest event when ch
// is full.
func push[T any](ch chan T, v T) {
	for {
		select {
		case ch <- v:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}

type WorldOpt func(*daemon.Config)

func NewWorld(t *testing.T, b Backend, opts ...WorldOpt) *World {
	t.Helper()
	auth, err := authority.OpenSQLite(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = auth.Close() })
	return NewWorldWith(t, b, trusttest.NewPKI(t), auth, opts...)
}

func NewWorldWith(t *testing.T, b Backend, pki *trusttest.PKI, auth authority.Authority, opts ...WorldOpt) *World {
	t.Helper()
	return newWorld(t, b, pki, auth, daemon.Config{Features: wire.Implemented}, pki.ServerConfig(t, "localhost"), opts)
}

// newWorld starts a world's daemon on b, serving with srv: cfg with the
// world's authority, the PKI's CAs, FastTiming, the world's hooks and a
// JSON logger into LogBuf, then opts.
func newWorld(t *testing.T, b Backend, pki *trusttest.PKI, auth authority.Authority, cfg daemon.Config, srv *tls.Config, opts []WorldOpt) *World {
	t.Helper()
	w := &World{T: t, B: b, Pki: pki, Auth: auth, Ev: NewEvents(), LogBuf: &SyncBuffer{}}
	cfg.Authority, cfg.RunnerCAs, cfg.Timing, cfg.Hooks = auth, pki.CAPool(), FastTiming(), w.Ev.Hooks()
	cfg.Logger = slog.New(slog.NewJSONHandler(w.LogBuf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	for _, o := range opts {
		o(&cfg)
	}
	d, err := daemon.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.D = d
	l, addr := b.Listen(t, srv)
	w.Addr = addr
	ServeUntilCleanup(t, d, l)
	return w
}

// Identity is a runner's certificate and key.
type Identity struct {
	Runner wire.RunnerId
	Cert   tls.Certificate
}

func (w *World) NewIdentity() Identity {
	r := wire.NewRunnerId()
	return Identity{Runner: r, Cert: w.Pki.IssueClient(w.T, r, trusttest.LeafOptions{})}
}

func (w *World) ClientTLS(id Identity) *tls.Config {
	c := w.Pki.ClientConfigWith(w.T, id.Cert, "localhost")
	return c
}

type AgentOpt func(*agent.Config)

// StartAgent runs an agent for id against this world's daemon; runErr
// receives Run's result.
func (w *World) StartAgent(id Identity, exec agent.Executor, opts ...AgentOpt) (*agent.Agent, *RecDialer, chan error) {
	w.T.Helper()
	rd := &RecDialer{Inner: w.B.Dialer(w.T, w.ClientTLS(id))}
	cfg := agent.Config{Runner: id.Runner, Signer: id.Cert.PrivateKey.(crypto.Signer), CertChain: id.Cert.Certificate,
		Endpoints: []agent.Endpoint{{Address: w.Addr, Dialer: rd, Backend: w.B.Name}}, Executor: exec, MaxParallel: 64,
		Backoff: agent.Backoff{Base: 5 * time.Millisecond, Max: 50 * time.Millisecond}, RequestTimeout: 500 * time.Millisecond,
		Features: wire.Implemented, HeartbeatMisses: FastAgentHeartbeatMisses}
	for _, o := range opts {
		o(&cfg)
	}
	connected := make(chan struct{}, 1)
	user := cfg.Hooks.OnConnected
	cfg.Hooks.OnConnected = func(s agent.Status) {
		if user != nil {
			user(s)
		}
		select {
		case connected <- struct{}{}:
		default:
		}
	}
	a, err := agent.New(cfg)
	if err != nil {
		w.T.Fatal(err)
	}
	connEvents.Store(a, connected)
	runErr := make(chan error, 1)
	done := make(chan struct{})
	go func() { defer close(done); runErr <- a.Run(context.Background()) }()
	w.T.Cleanup(func() {
		_ = a.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			w.T.Error("agent Run did not return after Close")
		}
	})
	return a, rd, runErr
}

// AwaitRegistered waits for n registrations of runner.
func (w *World) AwaitRegistered(runner wire.RunnerId) daemon.SessionInfo {
	w.T.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case s := <-w.Ev.registered:
			if s.Runner == runner {
				return s
			}
		case <-deadline:
			w.T.Fatalf("runner %s never registered; daemon log tail:\n%s", runner, w.logTail(30))
		}
	}
}

// connEvents maps each test agent to the channel its OnConnected hook
// signals.
var connEvents sync.Map

// AwaitConnected waits until the agent reports a registered, resynced
// transport: it checks Status and otherwise waits for the next
// OnConnected event.
func AwaitConnected(t *testing.T, a *agent.Agent) agent.Status {
	t.Helper()
	v, ok := connEvents.Load(a)
	if !ok {
		t.Fatal("agent not started by startAgent")
	}
	deadline := time.After(10 * time.Second)
	for {
		if s := a.Status(); s.Connected {
			return s
		}
		select {
		case <-v.(chan struct{}):
		case <-deadline:
			t.Fatalf("agent never connected: %+v", a.Status())
			return agent.Status{}
		}
	}
}

// AwaitActive waits until the runner can take leases (registered and
// resynced) by polling Sessions (no event marks the end of the resync).
func (w *World) AwaitActive(runner wire.RunnerId) {
	w.T.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range w.D.Sessions() {
			if s.Runner == runner && s.State == session.Active.String() {
				return
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	w.T.Fatalf("runner %s never became active; sessions %+v; daemon log tail:\n%s", runner, w.D.Sessions(), w.logTail(30))
}

// OfferLease offers o to runner and waits for the answer, as a scheduler
// on a loaded machine does: an offer refused because the runner is between
// a reconnect and its resync (daemon.ErrNotConnected — a starved test
// process misses heartbeats) is offered again, for the same attempt, once
// the runner is active, until ctx ends. Other errors are returned.
func (w *World) OfferLease(ctx context.Context, runner wire.RunnerId, o daemon.LeaseOffer) (authority.Lease, error) {
	w.T.Helper()
	if o.Attempt == (wire.JobAttemptId{}) {
		o.Attempt = wire.NewJobAttemptId()
	}
	for {
		l, err := w.D.OfferLease(ctx, runner, o)
		if !errors.Is(err, daemon.ErrNotConnected) || ctx.Err() != nil {
			return l, err
		}
		w.AwaitActive(runner)
	}
}

// logTail returns the daemon log's last n lines (for failure messages).
func (w *World) logTail(n int) string {
	lines := strings.Split(strings.TrimSpace(w.LogBuf.String()), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (w *World) AwaitCompletion(attempt wire.JobAttemptId, ack agentwire.CompletionAckKind) daemon.CompletionEvent {
	w.T.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case c := <-w.Ev.Completions:
			if c.Attempt == attempt && c.Ack == ack {
				return c
			}
		case <-deadline:
			w.T.Fatalf("no %s completion for %s", ack, attempt)
		}
	}
}

func Spec(i int) wire.JobSpecId {
	var s wire.JobSpecId
	s.Digest[0], s.Digest[1], s.Digest[31] = byte(i), byte(i>>8), 1
	return s
}

func Offer(i int) daemon.LeaseOffer {
	return daemon.LeaseOffer{Job: wire.NewJobId(), Spec: Spec(i),
		Payload: wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: wire.Digest{1, byte(i)}, Size: 10}}
}

// CountingExec counts executions per attempt and blocks until released
// (or its context ends).
type CountingExec struct {
	mu      sync.Mutex
	runs    map[wire.JobAttemptId]int
	started chan agent.Job
	Release chan struct{}
	hold    bool
}

func NewCountingExec(hold bool) *CountingExec {
	return &CountingExec{runs: map[wire.JobAttemptId]int{}, started: make(chan agent.Job, 1024), Release: make(chan struct{}), hold: hold}
}

func (e *CountingExec) Execute(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
	e.mu.Lock()
	e.runs[job.Attempt]++
	e.mu.Unlock()
	e.started <- job
	out.Phase(agentwire.PhaseRunning)
	if e.hold {
		select {
		case <-ctx.Done():
			return agent.Result{Kind: agentwire.ResultCancelled}
		case <-e.Release:
		}
	}
	return agent.Result{Kind: agentwire.ResultSucceeded}
}

func (e *CountingExec) Count(a wire.JobAttemptId) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[a]
}

func AwaitStart(t *testing.T, e *CountingExec) agent.Job {
	t.Helper()
	select {
	case j := <-e.started:
		return j
	case <-time.After(10 * time.Second):
		t.Fatal("executor never started")
		return agent.Job{}
	}
}

// ---- raw client: a hand-driven agent for protocol-violation tests ----

type RawClient struct {
	T     *testing.T
	Bc    semantics.BackendConn
	Sc    *semantics.Conn
	Ch    *control.Channel
	In    chan *wire.Envelope
	Ack   *agentwire.HelloAckV1
	Id    Identity
	Sess  wire.AgentSessionId
	Epoch uint64
}

func (w *World) DialRaw(id Identity) *RawClient {
	w.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bc, err := w.B.Dialer(w.T, w.ClientTLS(id)).Dial(ctx, w.Addr)
	if err != nil {
		w.T.Fatal(err)
	}
	return RawOn(w.T, bc, id)
}

// RawOn runs a raw client on an established connection.
func RawOn(t *testing.T, bc semantics.BackendConn, id Identity) *RawClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sc, err := semantics.NewConn(bc, semantics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := sc.OpenStream(ctx, wire.StreamControl)
	if err != nil {
		t.Fatal(err)
	}
	rc := &RawClient{T: t, Bc: bc, Sc: sc, Ch: control.New(st, control.Config{}), In: make(chan *wire.Envelope, 256), Id: id}
	go func() { _ = rc.Ch.Run(func(e *wire.Envelope) { rc.In <- e }, nil) }()
	t.Cleanup(func() { _ = bc.CloseWithCode(wire.CloseNormal, "") })
	return rc
}

func (rc *RawClient) Call(m wire.Message) (*wire.Envelope, error) {
	return rc.Ch.Call(context.Background(), control.Out{Msg: m}, 2*time.Second)
}

func (rc *RawClient) Hello(role agentwire.PeerRole) {
	rc.T.Helper()
	env, err := rc.Call(&agentwire.TransportHelloV1{Role: role, Versions: wire.Supported, AgentVersion: "raw"})
	if err != nil {
		rc.T.Fatal(err)
	}
	ack, ok := env.Payload.(*agentwire.HelloAckV1)
	if !ok {
		rc.T.Fatalf("hello answered with %T", env.Payload)
	}
	rc.Ack = ack
}

func (rc *RawClient) Register(sess wire.AgentSessionId) wire.Message {
	rc.T.Helper()
	return rc.RegisterWith(sess, rc.Id.Runner, rc.Id.Cert.PrivateKey.(crypto.Signer), rc.Id.Cert.Certificate)
}

// RegisterWith registers claiming runner, proving with signer and sending
// chain — the pieces a forger would vary.
func (rc *RawClient) RegisterWith(sess wire.AgentSessionId, runner wire.RunnerId, signer crypto.Signer, chain [][]byte) wire.Message {
	rc.T.Helper()
	proof, err := session.SignKeyProof(signer, rc.Ack.Challenge, rc.Ack.TransportSession, sess)
	if err != nil {
		rc.T.Fatal(err)
	}
	env, err := rc.Call(&agentwire.RegisterAgentV1{Runner: runner, Session: sess, AgentVersion: "raw",
		Capabilities:     agentwire.RunnerCapabilitiesV1{OS: "linux", Arch: "amd64", MaxParallel: 1},
		CapabilityDigest: wire.CapabilityDigest{Digest: wire.Digest{9}}, KeyProof: proof, CertChain: chain})
	if err != nil {
		rc.T.Fatal(err)
	}
	if acc, ok := env.Payload.(*agentwire.RegistrationAcceptedV1); ok {
		rc.Sess, rc.Epoch = sess, acc.Epoch
	}
	return env.Payload
}

// Join does hello, register and an empty resync.
func (rc *RawClient) Join(sess wire.AgentSessionId) {
	rc.T.Helper()
	rc.Hello(agentwire.RoleAgent)
	if m, ok := rc.Register(sess).(*agentwire.RegistrationAcceptedV1); !ok {
		rc.T.Fatalf("registration answered with %#v", m)
	}
	env, err := rc.Call(&agentwire.AgentResyncV1{Session: sess, Epoch: rc.Epoch, CapabilityDigest: wire.CapabilityDigest{Digest: wire.Digest{9}}})
	if err != nil {
		rc.T.Fatal(err)
	}
	if _, ok := env.Payload.(*agentwire.ResyncResponseV1); !ok {
		rc.T.Fatalf("resync answered with %T", env.Payload)
	}
}

// Next returns the next unsolicited message of type T.
func Next[T wire.Message](t *testing.T, rc *RawClient) (T, *wire.Envelope) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case e := <-rc.In:
			if m, ok := e.Payload.(T); ok {
				return m, e
			}
		case <-deadline:
			var zero T
			t.Fatalf("no %T arrived", zero)
			return zero, nil
		}
	}
}

// CloseCode waits for the raw client's connection to close and returns the
// close code.
func (rc *RawClient) CloseCode() wire.CloseCode {
	rc.T.Helper()
	select {
	case <-rc.Bc.Context().Done():
	case <-time.After(10 * time.Second):
		rc.T.Fatal("connection not closed")
	}
	var ce *semantics.ConnError
	if err := context.Cause(rc.Bc.Context()); err != nil {
		if asConnErr(err, &ce) {
			return ce.Code
		}
		rc.T.Fatalf("close cause %v is not a ConnError", err)
	}
	return 0
}

func asConnErr(err error, ce **semantics.ConnError) bool { return errors.As(err, ce) }

func ControlOut(m wire.Message) control.Out { return control.Out{Msg: m} }

// ServeUntilCleanup serves l with d until the test ends, then shuts d down
// (2 s for the drain) and waits for Serve to return.
func ServeUntilCleanup(t testing.TB, d *daemon.Daemon, l semantics.BackendListener) {
	t.Helper()
	served := make(chan struct{})
	go func() {
		defer close(served)
		// ErrShutdown: the test ended (and its cleanup shut d down)
		// before this goroutine got to call Serve, as a short test can on
		// a starved machine.
		if err := d.Serve(context.Background(), l); err != nil && !errors.Is(err, daemon.ErrShutdown) {
			t.Errorf("Serve: %v", err)
		}
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = d.Shutdown(ctx)
		<-served
	})
}
