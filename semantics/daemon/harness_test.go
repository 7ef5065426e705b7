package daemon_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/webtransport"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/pgtest"
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

func TestMain(m *testing.M) {
	code := m.Run()
	pgtest.StopShared()
	if code == 0 {
		if err := goleak.Find(goleak.IgnoreCurrent(),
			goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
			goleak.IgnoreAnyFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// fastTiming keeps every test in the millisecond range.
func fastTiming() daemon.Timing {
	return daemon.Timing{HeartbeatInterval: 100 * time.Millisecond, RenewInterval: 50 * time.Millisecond,
		LeaseTTL: 2 * time.Second, RevokeGrace: 500 * time.Millisecond, RegistrationTimeout: 2 * time.Second,
		RequestTimeout: 500 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}
}

// backend is one backend under test.
type backend struct {
	name   string
	listen func(t *testing.T, conf *tls.Config) (semantics.BackendListener, string)
	dialer func(t *testing.T, conf *tls.Config) semantics.BackendDialer
}

var listenSeq atomic.Int64

func listenOn(n *memory.Network) func(t *testing.T, conf *tls.Config) (semantics.BackendListener, string) {
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

func memoryBackend() backend {
	n := memory.NewNetwork()
	return backend{name: "memory",
		listen: listenOn(n),
		dialer: func(t *testing.T, conf *tls.Config) semantics.BackendDialer {
			return &memory.Dialer{Network: n, TLSConfig: conf}
		}}
}

func quicBackend() backend {
	return backend{name: "quic",
		listen: func(t *testing.T, conf *tls.Config) (semantics.BackendListener, string) {
			l, err := quic.Listen("127.0.0.1:0", conf, quic.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			return l, l.Addr().String()
		},
		dialer: func(t *testing.T, conf *tls.Config) semantics.BackendDialer { return quic.Dialer{TLS: conf} }}
}

func yamuxBackend() backend {
	return backend{name: "yamux",
		listen: func(t *testing.T, conf *tls.Config) (semantics.BackendListener, string) {
			l, err := yamux.Listen("127.0.0.1:0", conf, yamux.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			return l, l.Addr().String()
		},
		dialer: func(t *testing.T, conf *tls.Config) semantics.BackendDialer { return yamux.Dialer{TLS: conf} }}
}

func webtransportBackend() backend {
	return backend{name: "webtransport",
		listen: func(t *testing.T, conf *tls.Config) (semantics.BackendListener, string) {
			l, err := webtransport.Listen("127.0.0.1:0", conf, webtransport.Config{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			return l, l.Addr().String()
		},
		dialer: func(t *testing.T, conf *tls.Config) semantics.BackendDialer { return webtransport.Dialer{TLS: conf} }}
}

// backends runs f on memory and on the real backends.
func backends(t *testing.T, f func(t *testing.T, b backend)) {
	for _, mk := range []func() backend{memoryBackend, quicBackend, yamuxBackend} {
		b := mk()
		t.Run(b.name, func(t *testing.T) { f(t, b) })
	}
}

// recDialer records every connection it dials so a test can cut them.
type recDialer struct {
	inner semantics.BackendDialer
	mu    sync.Mutex
	conns []semantics.BackendConn
}

func (r *recDialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	c, err := r.inner.Dial(ctx, addr)
	if err == nil {
		r.mu.Lock()
		r.conns = append(r.conns, c)
		r.mu.Unlock()
	}
	return c, err
}

// cut breaks the latest connection: a network cut on memory, an abrupt
// close on real backends. It reports whether there was one.
func (r *recDialer) cut() bool {
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

// world is one daemon on one backend with a PKI and an authority.
type world struct {
	t      *testing.T
	b      backend
	pki    *trusttest.PKI
	auth   authority.Authority
	d      *daemon.Daemon
	addr   string
	ev     *events
	logBuf *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// events collects daemon hook calls.
type events struct {
	completions chan daemon.CompletionEvent
	answers     chan daemon.LeaseAnswerEvent
	registered  chan daemon.SessionInfo
	disconnects chan error
	onComplete  atomic.Pointer[func(daemon.CompletionEvent)]
}

func newEvents() *events {
	return &events{completions: make(chan daemon.CompletionEvent, 1024), answers: make(chan daemon.LeaseAnswerEvent, 1024),
		registered: make(chan daemon.SessionInfo, 1024), disconnects: make(chan error, 1024)}
}

func (e *events) hooks() daemon.Hooks {
	return daemon.Hooks{
		OnRegistered: func(s daemon.SessionInfo) { e.registered <- s },
		OnCompletion: func(c daemon.CompletionEvent) {
			if f := e.onComplete.Load(); f != nil {
				(*f)(c)
			}
			e.completions <- c
		},
		OnLeaseAnswer: func(a daemon.LeaseAnswerEvent) { e.answers <- a },
		OnDisconnect:  func(_ daemon.SessionInfo, err error) { e.disconnects <- err },
	}
}

type worldOpt func(*daemon.Config)

func newWorld(t *testing.T, b backend, opts ...worldOpt) *world {
	t.Helper()
	auth, err := authority.OpenSQLite(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = auth.Close() })
	return newWorldWith(t, b, trusttest.NewPKI(t), auth, opts...)
}

func newWorldWith(t *testing.T, b backend, pki *trusttest.PKI, auth authority.Authority, opts ...worldOpt) *world {
	t.Helper()
	w := &world{t: t, b: b, pki: pki, auth: auth, ev: newEvents(), logBuf: &syncBuffer{}}
	cfg := daemon.Config{Authority: auth, RunnerCAs: pki.CAPool(), Timing: fastTiming(), Hooks: w.ev.hooks(), Features: wire.Implemented,
		Logger: slog.New(slog.NewJSONHandler(w.logBuf, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	for _, o := range opts {
		o(&cfg)
	}
	d, err := daemon.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.d = d
	l, addr := b.listen(t, pki.ServerConfig(t, "localhost"))
	w.addr = addr
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := d.Serve(context.Background(), l); err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = d.Shutdown(ctx)
		<-served
	})
	return w
}

// identity is a runner's certificate and key.
type identity struct {
	runner wire.RunnerId
	cert   tls.Certificate
}

func (w *world) newIdentity() identity {
	r := wire.NewRunnerId()
	return identity{runner: r, cert: w.pki.IssueClient(w.t, r, trusttest.LeafOptions{})}
}

func (w *world) clientTLS(id identity) *tls.Config {
	c := w.pki.ClientConfigWith(w.t, id.cert, "localhost")
	return c
}

type agentOpt func(*agent.Config)

// startAgent runs an agent for id against this world's daemon; runErr
// receives Run's result.
func (w *world) startAgent(id identity, exec agent.Executor, opts ...agentOpt) (*agent.Agent, *recDialer, chan error) {
	w.t.Helper()
	rd := &recDialer{inner: w.b.dialer(w.t, w.clientTLS(id))}
	cfg := agent.Config{Runner: id.runner, Signer: id.cert.PrivateKey.(crypto.Signer), CertChain: id.cert.Certificate,
		Endpoints: []agent.Endpoint{{Address: w.addr, Dialer: rd, Backend: w.b.name}}, Executor: exec, MaxParallel: 64,
		Backoff: agent.Backoff{Base: 5 * time.Millisecond, Max: 50 * time.Millisecond}, RequestTimeout: 500 * time.Millisecond,
		Features: wire.Implemented}
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
		w.t.Fatal(err)
	}
	connEvents.Store(a, connected)
	runErr := make(chan error, 1)
	done := make(chan struct{})
	go func() { defer close(done); runErr <- a.Run(context.Background()) }()
	w.t.Cleanup(func() {
		_ = a.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			w.t.Error("agent Run did not return after Close")
		}
	})
	return a, rd, runErr
}

// awaitRegistered waits for n registrations of runner.
func (w *world) awaitRegistered(runner wire.RunnerId) daemon.SessionInfo {
	w.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case s := <-w.ev.registered:
			if s.Runner == runner {
				return s
			}
		case <-deadline:
			w.t.Fatalf("runner %s never registered; daemon log tail:\n%s", runner, w.logTail(30))
		}
	}
}

// connEvents maps each test agent to the channel its OnConnected hook
// signals.
var connEvents sync.Map

// awaitConnected waits until the agent reports a registered, resynced
// transport: it checks Status and otherwise waits for the next
// OnConnected event.
func awaitConnected(t *testing.T, a *agent.Agent) agent.Status {
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
			t.Fatal("agent never connected")
			return agent.Status{}
		}
	}
}

// awaitActive waits until the runner can take leases (registered and
// resynced) by polling Sessions (no event marks the end of the resync).
func (w *world) awaitActive(runner wire.RunnerId) {
	w.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, s := range w.d.Sessions() {
			if s.Runner == runner && s.State == session.Active.String() {
				return
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	w.t.Fatalf("runner %s never became active; sessions %+v; daemon log tail:\n%s", runner, w.d.Sessions(), w.logTail(30))
}

// logTail returns the daemon log's last n lines (for failure messages).
func (w *world) logTail(n int) string {
	lines := strings.Split(strings.TrimSpace(w.logBuf.String()), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func (w *world) awaitCompletion(attempt wire.JobAttemptId, ack agentwire.CompletionAckKind) daemon.CompletionEvent {
	w.t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case c := <-w.ev.completions:
			if c.Attempt == attempt && c.Ack == ack {
				return c
			}
		case <-deadline:
			w.t.Fatalf("no %s completion for %s", ack, attempt)
		}
	}
}

func spec(i int) wire.JobSpecId {
	var s wire.JobSpecId
	s.Digest[0], s.Digest[1], s.Digest[31] = byte(i), byte(i>>8), 1
	return s
}

func offer(i int) daemon.LeaseOffer {
	return daemon.LeaseOffer{Job: wire.NewJobId(), Spec: spec(i),
		Payload: wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: wire.Digest{1, byte(i)}, Size: 10}}
}

// countingExec counts executions per attempt and blocks until released
// (or its context ends).
type countingExec struct {
	mu      sync.Mutex
	runs    map[wire.JobAttemptId]int
	started chan agent.Job
	release chan struct{}
	hold    bool
}

func newCountingExec(hold bool) *countingExec {
	return &countingExec{runs: map[wire.JobAttemptId]int{}, started: make(chan agent.Job, 1024), release: make(chan struct{}), hold: hold}
}

func (e *countingExec) Execute(ctx context.Context, job agent.Job, out agent.Output) agent.Result {
	e.mu.Lock()
	e.runs[job.Attempt]++
	e.mu.Unlock()
	e.started <- job
	out.Phase(agentwire.PhaseRunning)
	if e.hold {
		select {
		case <-ctx.Done():
			return agent.Result{Kind: agentwire.ResultCancelled}
		case <-e.release:
		}
	}
	return agent.Result{Kind: agentwire.ResultSucceeded}
}

func (e *countingExec) count(a wire.JobAttemptId) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.runs[a]
}

func awaitStart(t *testing.T, e *countingExec) agent.Job {
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

type rawClient struct {
	t     *testing.T
	bc    semantics.BackendConn
	sc    *semantics.Conn
	ch    *control.Channel
	in    chan *wire.Envelope
	ack   *agentwire.HelloAckV1
	id    identity
	sess  wire.AgentSessionId
	epoch uint64
}

func (w *world) dialRaw(id identity) *rawClient {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	bc, err := w.b.dialer(w.t, w.clientTLS(id)).Dial(ctx, w.addr)
	if err != nil {
		w.t.Fatal(err)
	}
	return rawOn(w.t, bc, id)
}

// rawOn runs a raw client on an established connection.
func rawOn(t *testing.T, bc semantics.BackendConn, id identity) *rawClient {
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
	rc := &rawClient{t: t, bc: bc, sc: sc, ch: control.New(st, control.Config{}), in: make(chan *wire.Envelope, 256), id: id}
	go func() { _ = rc.ch.Run(func(e *wire.Envelope) { rc.in <- e }, nil) }()
	t.Cleanup(func() { _ = bc.CloseWithCode(wire.CloseNormal, "") })
	return rc
}

func (rc *rawClient) call(m wire.Message) (*wire.Envelope, error) {
	return rc.ch.Call(context.Background(), control.Out{Msg: m}, 2*time.Second)
}

func (rc *rawClient) hello(role agentwire.PeerRole) {
	rc.t.Helper()
	env, err := rc.call(&agentwire.TransportHelloV1{Role: role, Versions: wire.Supported, AgentVersion: "raw"})
	if err != nil {
		rc.t.Fatal(err)
	}
	ack, ok := env.Payload.(*agentwire.HelloAckV1)
	if !ok {
		rc.t.Fatalf("hello answered with %T", env.Payload)
	}
	rc.ack = ack
}

func (rc *rawClient) register(sess wire.AgentSessionId) wire.Message {
	rc.t.Helper()
	return rc.registerWith(sess, rc.id.runner, rc.id.cert.PrivateKey.(crypto.Signer), rc.id.cert.Certificate)
}

// registerWith registers claiming runner, proving with signer and sending
// chain — the pieces a forger would vary.
func (rc *rawClient) registerWith(sess wire.AgentSessionId, runner wire.RunnerId, signer crypto.Signer, chain [][]byte) wire.Message {
	rc.t.Helper()
	proof, err := session.SignKeyProof(signer, rc.ack.Challenge, rc.ack.TransportSession, sess)
	if err != nil {
		rc.t.Fatal(err)
	}
	env, err := rc.call(&agentwire.RegisterAgentV1{Runner: runner, Session: sess, AgentVersion: "raw",
		Capabilities:     agentwire.RunnerCapabilitiesV1{OS: "linux", Arch: "amd64", MaxParallel: 1},
		CapabilityDigest: wire.CapabilityDigest{Digest: wire.Digest{9}}, KeyProof: proof, CertChain: chain})
	if err != nil {
		rc.t.Fatal(err)
	}
	if acc, ok := env.Payload.(*agentwire.RegistrationAcceptedV1); ok {
		rc.sess, rc.epoch = sess, acc.Epoch
	}
	return env.Payload
}

// join does hello, register and an empty resync.
func (rc *rawClient) join(sess wire.AgentSessionId) {
	rc.t.Helper()
	rc.hello(agentwire.RoleAgent)
	if m, ok := rc.register(sess).(*agentwire.RegistrationAcceptedV1); !ok {
		rc.t.Fatalf("registration answered with %#v", m)
	}
	env, err := rc.call(&agentwire.AgentResyncV1{Session: sess, Epoch: rc.epoch, CapabilityDigest: wire.CapabilityDigest{Digest: wire.Digest{9}}})
	if err != nil {
		rc.t.Fatal(err)
	}
	if _, ok := env.Payload.(*agentwire.ResyncResponseV1); !ok {
		rc.t.Fatalf("resync answered with %T", env.Payload)
	}
}

// next returns the next unsolicited message of type T.
func next[T wire.Message](t *testing.T, rc *rawClient) (T, *wire.Envelope) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case e := <-rc.in:
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

// closeCode waits for the raw client's connection to close and returns the
// close code.
func (rc *rawClient) closeCode() wire.CloseCode {
	rc.t.Helper()
	select {
	case <-rc.bc.Context().Done():
	case <-time.After(10 * time.Second):
		rc.t.Fatal("connection not closed")
	}
	var ce *semantics.ConnError
	if err := context.Cause(rc.bc.Context()); err != nil {
		if asConnErr(err, &ce) {
			return ce.Code
		}
		rc.t.Fatalf("close cause %v is not a ConnError", err)
	}
	return 0
}

func asConnErr(err error, ce **semantics.ConnError) bool { return errors.As(err, ce) }

func controlOut(m wire.Message) control.Out { return control.Out{Msg: m} }
