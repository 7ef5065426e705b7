// Package agent is the agent side of the control protocol: it races the
// daemon's endpoints by backend class (happy eyeballs; a backend wins only
// when its hello round trip completes, fallback.go), remembers the winner
// per network and moves back to a better backend with hysteresis,
// negotiates, registers with a
// key proof, resynchronises its attempts, answers lease offers (duplicates
// get the same answer and never a second execution), runs attempts on an
// Executor, renews leases, sends heartbeats, obeys cancellation, and
// retries completions with the same MessageId across reconnects until the
// daemon acknowledges them (§77).
//
// Executors write the attempt's log (Output.Log) and store outputs
// (Output.PutOutput): each attempt has a logs.Writer spooled under
// Config.SpoolDir and reattached to every new connection; before the
// completion is sent the agent passes the logs-finalized barrier, uploads
// the outputs (cas.Uploader) and sends OutputsFinalizedV1 (§243).
//
// One Agent is one agent session (AgentSessionId): reconnects keep it (a new
// transport session each time) and keep running attempts (§14); a new
// process, i.e. a new Agent, is a new session that inherits nothing.
package agent

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/session"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/admin"
	agentwire "forgeyard.dev/transport/wire/agent"
	"go.opentelemetry.io/otel/trace"
)

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("agent: closed")

// Agent is one agent session. Methods are safe for concurrent use.
type Agent struct {
	cfg     Config
	session wire.AgentSessionId
	log     *slog.Logger
	now     func() time.Time
	caps    agentwire.RunnerCapabilitiesV1
	digest  wire.CapabilityDigest
	execs   bool // the role runs attempts

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	runMu  sync.Mutex

	mu           sync.Mutex
	link         *link         // current registered transport, nil when none
	linkCh       chan struct{} // closed and replaced when link changes
	attempts     map[wire.JobAttemptId]*attempt
	answers      map[wire.LeaseId]OfferEvent // the last answerRetention answers (ansRing)
	ansRing      []wire.LeaseId              // fixed capacity answerRetention, oldest at ansNext once full
	ansNext      int
	draining     bool
	epoch        uint64
	hbEvery      time.Duration
	renewEvery   time.Duration
	maxBackoff   time.Duration
	alternates   []string
	fb           Fallback
	classStagger []time.Duration // class offsets (daemon's once registered)
	network      string          // network identity at the last connect
	memory       map[string]remembered
	lastBackend  string
	reason       string // why the current backend (Status.FallbackReason)
	probeNote    string // the background probe's state
	changes      map[BackendChange]int64
	preferred    []string // GoAway alternates, dialed first until preferUntil
	preferUntil  time.Time
	lastAck      time.Time
	hbSeq        uint64

	// Data plane (data.go), for roles that run attempts.
	spool string
	store *cas.FSStore
	up    *cas.Uploader
	down  *cas.Downloader

	// Secrets delivered for leased attempts (secret.go).
	sec secretStore

	st agentStats
}

type link struct {
	ep        Endpoint
	bc        semantics.BackendConn
	sc        *semantics.Conn
	ch        *control.Channel
	transport wire.TransportSessionId
	epoch     uint64
	protocol  wire.ProtocolVersion
	features  wire.FeatureSet
	ctx       context.Context // ends with the link; data streams live on it
	lcancel   context.CancelFunc
	runDone   chan struct{} // closed when the control read loop ended
	closeOnce sync.Once
	ack       *agentwire.HelloAckV1
	goaway    chan struct{}
	goOnce    sync.Once
	reconnect time.Duration
}

// traceOut sets o's trace context from the span in ctx when the daemon
// negotiated FeatureTraceContextV1 (§211).
func (l *link) traceOut(ctx context.Context, o control.Out) control.Out {
	if l.features.Has(wire.FeatureTraceContextV1) {
		o.Trace, o.HasTrace = telemetry.Inject(ctx)
	}
	return o
}

type attempt struct {
	job Job
	// trace is the span context of the attempt's lease.ack span: the
	// attempt.complete span continues it.
	trace    context.Context
	cancel   context.CancelFunc
	phase    agentwire.AttemptPhase
	finished bool
	discard  bool
	io       *attemptIO
	compl    *agentwire.AttemptCompletionV1
	complID  wire.MessageId
	result   Result
	// secretsDone: Execute returned; its secrets were zeroed and later
	// deliveries are refused (secret.go). Under Agent.mu.
	secretsDone bool
}

type agentStats struct {
	reconnects, registrations, resyncs, dupOffers, accepted, rejected atomic.Int64
	started, complSent, complRetried, cancels, hbSent, hbAcked        atomic.Int64
	acks                                                              [4]atomic.Int64
	dialFailures                                                      atomic.Int64
	logFinalizeFailed, outputsUploaded, outputsFailed                 atomic.Int64
	probes, probesOK, moves                                           atomic.Int64
	payloadsFetched, payloadsFailed                                   atomic.Int64
}

// Stats are the agent's counters.
type Stats struct {
	Reconnects         int64 // registrations after the first
	Registrations      int64
	Resyncs            int64
	DuplicatesAbsorbed int64 // duplicate offers answered from memory
	LeasesAccepted     int64
	LeasesRejected     int64
	AttemptsStarted    int64
	CompletionsSent    int64
	CompletionsRetried int64
	CompletionAcks     [4]int64 // by CompletionAckKind
	Cancels            int64
	HeartbeatsSent     int64
	HeartbeatsAcked    int64
	DialFailures       int64
	LogFinalizeFailed  int64 // attempts completed without a passed logs-finalized barrier
	OutputsUploaded    int64 // outputs uploaded (or already held) before completions
	OutputsFailed      int64 // local outputs that could not be uploaded (left out of completions)
	PayloadsFetched    int64 // payloads downloaded and verified (Config.FetchPayload)
	PayloadsFailed     int64 // attempts ended InfraError because their payload could not be fetched
	Probes             int64 // background probes of a better backend
	ProbesSucceeded    int64
	MovesBack          int64 // moves to a better backend after probing
	// BackendChanges counts registrations over a different backend than
	// the previous one, by from/to backend; the first registration counts
	// from the best configured backend when it is a fallback.
	BackendChanges map[BackendChange]int64
}

// Status is the agent's current view.
type Status struct {
	Connected        bool
	Endpoint         string
	Backend          string
	Protocol         wire.ProtocolVersion
	Features         wire.FeatureSet // negotiated: the daemon's and the agent's in common
	Transport        wire.TransportSessionId
	Epoch            uint64
	LastHeartbeatAck time.Time
	Running          []wire.JobAttemptId
	Draining         bool
	// Class is the current endpoint's fallback class ("quic",
	// "webtransport", "tcp", "relay"; "" when not connected).
	Class string
	// FallbackReason says why this backend was chosen (which candidates
	// failed or were slower, a remembered choice, or a move back); when
	// the agent is probing a better backend, the probe's progress follows.
	FallbackReason string
	// Network is the network identity the choice is remembered under.
	Network string
}

// New checks cfg and returns an Agent with a fresh AgentSessionId.
func New(cfg Config) (*Agent, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Protocol == (wire.ProtocolRange{}) {
		cfg.Protocol = wire.Supported
	}
	if cfg.MaxParallel == 0 {
		cfg.MaxParallel = DefaultMaxParallel
	}
	if cfg.Backoff.Base <= 0 {
		cfg.Backoff.Base = DefaultBackoffBase
	}
	if cfg.Backoff.Max <= 0 {
		cfg.Backoff.Max = DefaultBackoffMax
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.Version == "" {
		cfg.Version = "forgeyard-agent"
	}
	cfg.Endpoints = append([]Endpoint(nil), cfg.Endpoints...)
	a := &Agent{cfg: cfg, session: wire.NewAgentSessionId(), log: cfg.Logger, now: cfg.Now,
		linkCh: make(chan struct{}), attempts: map[wire.JobAttemptId]*attempt{}, answers: map[wire.LeaseId]OfferEvent{},
		ansRing: make([]wire.LeaseId, 0, answerRetention),
		fb:      cfg.Fallback.withDefaults(), memory: map[string]remembered{}, changes: map[BackendChange]int64{},
		hbEvery: 10 * time.Second, renewEvery: 10 * time.Second, maxBackoff: cfg.Backoff.Max,
		execs: cfg.Role == agentwire.RoleAgent || cfg.Role == agentwire.RoleInternalWorker}
	a.classStagger = slices.Clone(a.fb.ClassStagger)
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	a.log = a.log.With("runner", cfg.Runner.String(), "agent_session", a.session.String())
	if a.now == nil {
		a.now = time.Now
	}
	a.caps = cfg.Capabilities
	if a.caps.OS == "" {
		a.caps.OS = runtime.GOOS
	}
	if a.caps.Arch == "" {
		a.caps.Arch = runtime.GOARCH
	}
	if a.caps.MaxParallel == 0 {
		a.caps.MaxParallel = uint16(cfg.MaxParallel)
	}
	if err := a.caps.Validate(); err != nil {
		return nil, err
	}
	a.digest = wire.CapabilityDigest{Digest: sha256.Sum256(a.caps.AppendPostcard(nil))}
	if a.execs {
		if err := a.setupData(); err != nil {
			return nil, err
		}
	}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	return a, nil
}

// Session returns the agent session id (fixed for the Agent's life).
func (a *Agent) Session() wire.AgentSessionId { return a.session }

// Close stops the agent: Run returns, running attempts are cancelled.
func (a *Agent) Close() error {
	a.cancel()
	a.runMu.Lock() // wait for Run
	defer a.runMu.Unlock()
	a.wg.Wait()
	if a.spool != "" {
		_ = os.RemoveAll(a.spool)
	}
	return nil
}

// Status returns the current status.
func (a *Agent) Status() Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := Status{Epoch: a.epoch, LastHeartbeatAck: a.lastAck, Draining: a.draining, Network: a.network}
	if l := a.link; l != nil {
		s.Connected, s.Endpoint, s.Backend, s.Protocol, s.Transport = true, l.ep.Address, l.bc.Backend(), l.protocol, l.transport
		s.Features = l.features
		s.Class = l.ep.class().String()
		s.FallbackReason = a.reason
		if a.probeNote != "" {
			s.FallbackReason += "; " + a.probeNote
		}
	}
	for id, at := range a.attempts {
		if !at.finished {
			s.Running = append(s.Running, id)
		}
	}
	return s
}

// Stats returns the counters.
func (a *Agent) Stats() Stats {
	s := &a.st
	out := Stats{Reconnects: s.reconnects.Load(), Registrations: s.registrations.Load(), Resyncs: s.resyncs.Load(),
		DuplicatesAbsorbed: s.dupOffers.Load(), LeasesAccepted: s.accepted.Load(), LeasesRejected: s.rejected.Load(),
		AttemptsStarted: s.started.Load(), CompletionsSent: s.complSent.Load(), CompletionsRetried: s.complRetried.Load(),
		Cancels: s.cancels.Load(), HeartbeatsSent: s.hbSent.Load(), HeartbeatsAcked: s.hbAcked.Load(), DialFailures: s.dialFailures.Load(),
		LogFinalizeFailed: s.logFinalizeFailed.Load(), OutputsUploaded: s.outputsUploaded.Load(), OutputsFailed: s.outputsFailed.Load(),
		PayloadsFetched: s.payloadsFetched.Load(), PayloadsFailed: s.payloadsFailed.Load(),
		Probes: s.probes.Load(), ProbesSucceeded: s.probesOK.Load(), MovesBack: s.moves.Load(),
		BackendChanges: map[BackendChange]int64{}}
	a.mu.Lock()
	for k, v := range a.changes {
		out.BackendChanges[k] = v
	}
	a.mu.Unlock()
	for i := range s.acks {
		out.CompletionAcks[i] = s.acks[i].Load()
	}
	return out
}

// Run connects and serves until ctx ends or Close (it then returns nil),
// or until every endpoint refused the agent permanently: a *VersionError
// (no common protocol version) or a *RejectedError (authentication,
// disabled runner, stale session). Transient failures are retried with
// backoff, reconnecting under the same AgentSessionId. Only one Run runs at
// a time; after ctx ended Run may be called again (same session), after
// Close it returns nil at once.
//
// Each connect races the endpoints (fallback.go): the first whose hello
// round trip completes registers, the others are closed.
func (a *Agent) Run(ctx context.Context) error {
	a.runMu.Lock()
	defer a.runMu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(a.ctx, cancel)
	defer stop()
	failures := 0
	for {
		if ctx.Err() != nil {
			return nil
		}
		eps := a.endpoints()
		network := a.fb.NetworkID()
		a.mu.Lock()
		a.network = network
		a.mu.Unlock()
		var perm error
		permCount, registered := 0, false
		var wait time.Duration
		remaining := eps
		for len(remaining) > 0 && !registered {
			p, memo := a.planRace(remaining)
			w, failed := a.race(ctx, remaining, p)
			for _, err := range failed {
				if ctx.Err() != nil {
					return nil
				}
				if isPermanent(err) {
					permCount++
					if perm == nil {
						perm = err
					}
					continue
				}
				a.st.dialFailures.Add(1) // logged by race as it happened
			}
			if w == nil {
				break
			}
			reason := describeRace(remaining, w, failed, memo)
			var rest []Endpoint
			for i := range remaining {
				if _, bad := failed[i]; !bad && i != w.i {
					rest = append(rest, remaining[i])
				}
			}
			remaining = rest
			l := w.l
			err := a.register(ctx, l)
			if err == nil {
				registered, failures = true, 0
				a.noteRegistered(l.ep, reason, eps)
				for l != nil {
					next, _ := a.serve(ctx, l, eps)
					if l.reconnect > 0 {
						wait = l.reconnect
					}
					if l = next; l != nil {
						a.noteRegistered(l.ep, a.moveReason(l), eps)
					}
				}
				break
			}
			if ctx.Err() != nil {
				return nil
			}
			if isPermanent(err) {
				permCount++
				if perm == nil {
					perm = err
				}
				continue
			}
			a.st.dialFailures.Add(1)
			a.log.Debug("endpoint failed", "endpoint", w.l.ep.Address, "err", err)
		}
		if !registered && permCount == len(eps) && perm != nil {
			return perm
		}
		if wait == 0 {
			wait = a.backoff(failures)
			failures++
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

func isPermanent(err error) bool {
	var ve *VersionError
	var re *RejectedError
	return errors.As(err, &ve) || errors.As(err, &re) && re.permanent()
}

func (a *Agent) moveReason(l *link) string {
	return fmt.Sprintf("moved back to %s %s after %d consecutive successful probes", l.ep.Backend, l.ep.Address, a.fb.ProbeSuccesses)
}

// backoff returns a full-jitter wait for the n-th consecutive failure.
func (a *Agent) backoff(n int) time.Duration {
	a.mu.Lock()
	ceiling := a.maxBackoff
	a.mu.Unlock()
	return fullJitter(a.cfg.Backoff.Base, ceiling, n, rand.Int64N)
}

// fullJitter is the n-th wait: uniform in [0, min(ceiling, base·2ⁿ)], drawn
// with randN (rand.Int64N).
func fullJitter(base, ceiling time.Duration, n int, randN func(int64) int64) time.Duration {
	d := base
	for i := 0; i < n && d < ceiling; i++ {
		d *= 2
	}
	d = min(d, ceiling)
	return time.Duration(randN(int64(d) + 1))
}

// endpoints returns the dial order: a GoAway's alternates while its
// try_for window lasts, the configured endpoints, then the alternates from
// the last registration (alternates are dialed with the first endpoint's
// dialer).
func (a *Agent) endpoints() []Endpoint {
	a.mu.Lock()
	defer a.mu.Unlock()
	var eps []Endpoint
	seen := map[string]bool{}
	first := a.cfg.Endpoints[0]
	alt := func(addr string) {
		if !seen[addr] {
			seen[addr] = true
			eps = append(eps, Endpoint{Address: addr, Dialer: first.Dialer, Backend: first.Backend, Class: first.Class})
		}
	}
	// After a GoAway its alternates come first for try_for_ms.
	if a.now().Before(a.preferUntil) {
		for _, addr := range a.preferred {
			alt(addr)
		}
	}
	for _, e := range a.cfg.Endpoints {
		if !seen[e.Address] {
			seen[e.Address] = true
			eps = append(eps, e)
		}
	}
	for _, addr := range a.alternates {
		alt(addr)
	}
	return eps
}

// close ends the link: the connection with code, then its read loop.
func (l *link) close(code wire.CloseCode, reason string) {
	l.closeOnce.Do(func() {
		l.lcancel()
		_ = l.bc.CloseWithCode(code, reason)
		<-l.runDone
	})
}

// handshake sets up the control stream on bc and completes the hello round
// trip (TransportHelloV1 → HelloAckV1), bounded by ctx; the link lives in
// runCtx. On failure bc is closed.
func (a *Agent) handshake(ctx, runCtx context.Context, ep Endpoint, bc semantics.BackendConn) (*link, error) {
	rto := a.cfg.RequestTimeout
	sc, err := semantics.NewConn(bc, semantics.Config{Limits: a.cfg.Limits, Logger: a.log, Metrics: a.cfg.Metrics})
	if err != nil {
		_ = bc.CloseWithCode(wire.CloseNormal, "agent leaving")
		return nil, err
	}
	octx, ocancel := context.WithTimeout(ctx, rto)
	st, err := sc.OpenStream(octx, wire.StreamControl)
	ocancel()
	if err != nil {
		_ = bc.CloseWithCode(wire.CloseNormal, "agent leaving")
		return nil, err
	}
	lctx, lcancel := context.WithCancel(runCtx)
	l := &link{ep: ep, bc: bc, sc: sc, ctx: lctx, lcancel: lcancel, goaway: make(chan struct{}), runDone: make(chan struct{}),
		ch: control.New(st, control.Config{Now: a.now, Logger: a.log, WriteTimeout: rto, Metrics: a.cfg.Metrics})}
	go func() {
		defer close(l.runDone)
		_ = l.ch.Run(func(env *wire.Envelope) { a.handle(l, env) }, func(de *control.DecodeError) {
			_ = l.ch.ReplyError(de.MessageID, de.Code, wire.RetryNever, "frame rejected")
		})
	}()
	// transport.handshake: hello → HelloAck (the trace context is not
	// negotiated yet, so nothing is propagated).
	_, hsp := a.cfg.Tracing.Start(ctx, telemetry.SpanHandshake, telemetry.AttrBackend(ep.Backend))
	env, err := l.ch.Call(ctx, control.Out{Msg: &agentwire.TransportHelloV1{Role: a.cfg.Role, Versions: a.cfg.Protocol,
		Features: a.cfg.Features, HasAgentSession: true, AgentSession: a.session, AgentVersion: a.cfg.Version}}, rto)
	telemetry.End(hsp, err)
	if err != nil {
		l.close(wire.CloseNormal, "agent leaving")
		return nil, err
	}
	var ack *agentwire.HelloAckV1
	switch m := env.Payload.(type) {
	case *agentwire.HelloAckV1:
		ack = m
	case *agentwire.RegistrationRejectedV1:
		if m.Code == wire.ErrCodeUnsupportedVersion {
			l.close(wire.CloseVersionMismatch, m.Message)
			a.log.Error("daemon refused our protocol version", "endpoint", ep.Address, "message", m.Message)
			return nil, &VersionError{Message: m.Message, ServerRange: m.ServerRange, Endpoint: ep.Address}
		}
		l.close(wire.CloseNormal, "agent leaving")
		return nil, &RejectedError{Code: m.Code, Retry: m.Retry, Message: m.Message, Endpoint: ep.Address}
	default:
		l.close(wire.CloseNormal, "agent leaving")
		return nil, errors.New("agent: unexpected answer to hello")
	}
	l.ack = ack
	l.transport, l.protocol, l.features = ack.TransportSession, ack.Negotiated, ack.Features.Intersect(a.cfg.Features)
	l.ch.SetProtocol(ack.Negotiated)
	return l, nil
}

// register registers the agent session over the handshaken l (a new epoch)
// and resyncs. On failure l is closed.
func (a *Agent) register(ctx context.Context, l *link) (err error) {
	defer func() {
		if err != nil {
			l.close(wire.CloseNormal, "agent leaving")
		}
	}()
	rto := a.cfg.RequestTimeout
	ep := l.ep
	signer, chain := a.credentials() // renew.go: Config.Credentials or Signer/CertChain
	proof, err := session.SignKeyProof(signer, l.ack.Challenge, l.ack.TransportSession, a.session)
	if err != nil {
		return err
	}
	a.mu.Lock()
	prevEpoch := a.epoch
	a.mu.Unlock()
	reg := &agentwire.RegisterAgentV1{Runner: a.cfg.Runner, Session: a.session, AgentVersion: a.cfg.Version,
		Capabilities: a.caps, CapabilityDigest: a.digest, KeyProof: proof, CertChain: chain}
	if prevEpoch > 0 {
		reg.HasResumeEpoch, reg.ResumeEpoch = true, prevEpoch
	}
	rctx, rsp := a.cfg.Tracing.Start(ctx, telemetry.SpanRegister, telemetry.AttrRunner(a.cfg.Runner), telemetry.AttrBackend(ep.Backend))
	env, err := l.ch.Call(ctx, l.traceOut(rctx, control.Out{Msg: reg}), rto)
	if err == nil {
		if rj, ok := env.Payload.(*agentwire.RegistrationRejectedV1); ok {
			telemetry.End(rsp, errors.New("registration rejected: "+rj.Code.String()))
		} else {
			rsp.End()
		}
	} else {
		telemetry.End(rsp, err)
	}
	if err != nil {
		return err
	}
	var acc *agentwire.RegistrationAcceptedV1
	switch m := env.Payload.(type) {
	case *agentwire.RegistrationAcceptedV1:
		acc = m
	case *agentwire.RegistrationRejectedV1:
		re := &RejectedError{Code: m.Code, Retry: m.Retry, Message: m.Message, Endpoint: ep.Address}
		a.log.Error("registration rejected", "endpoint", ep.Address, "err", re)
		return re
	default:
		return errors.New("agent: unexpected answer to registration")
	}
	l.epoch = acc.Epoch
	a.mu.Lock()
	a.epoch = acc.Epoch
	a.hbEvery = time.Duration(acc.HeartbeatIntervalMs) * time.Millisecond
	a.renewEvery = time.Duration(acc.LeaseRenewIntervalMs) * time.Millisecond
	a.maxBackoff = time.Duration(acc.MaxBackoffMs) * time.Millisecond
	a.alternates = append([]string(nil), acc.AlternateEndpoints...)
	if len(acc.FallbackStaggerMs) > 0 {
		a.classStagger = a.classStagger[:0]
		for _, ms := range acc.FallbackStaggerMs {
			a.classStagger = append(a.classStagger, time.Duration(ms)*time.Millisecond)
		}
	}
	a.mu.Unlock()
	if a.st.registrations.Add(1) > 1 {
		a.st.reconnects.Add(1)
	}
	// Resync (always, even with no attempts).
	if a.execs {
		if err := a.resync(ctx, l); err != nil {
			return err
		}
	}
	return nil
}

// serve runs the registered l until it ends. While l is on a fallback
// class it probes the better endpoints among eps; when a probe earns the
// move, serve registers the probe's link (the daemon fences l), closes l
// and returns the new link (next != nil) for the caller to serve.
func (a *Agent) serve(ctx context.Context, l *link, eps []Endpoint) (next *link, endErr error) {
	closeCode, closeReason := wire.CloseNormal, "agent leaving"
	defer func() { l.close(closeCode, closeReason) }()
	a.setLink(l)
	a.attachAll(l)
	if h := a.cfg.Hooks.OnConnected; h != nil {
		h(a.Status())
	}
	lctx := l.ctx
	var loops sync.WaitGroup
	loops.Add(1)
	go func() { defer loops.Done(); a.heartbeatLoop(lctx, l) }()
	if a.execs {
		loops.Add(1)
		go func() { defer loops.Done(); a.renewLoop(lctx, l) }()
	}
	loops.Add(1)
	go func() { defer loops.Done(); a.serveSecrets(lctx, l) }() // secret.go
	if a.cfg.Credentials != nil {
		loops.Add(1)
		go func() { defer loops.Done(); a.certRenewLoop(lctx, l) }() // renew.go
	}
	moves := make(chan *link)
	loops.Add(1)
	go func() { defer loops.Done(); a.probeLoop(lctx, l.ep, eps, moves) }()
	for next == nil && endErr == nil {
		select {
		case <-l.sc.Done():
			endErr = l.sc.Err()
		case <-l.runDone:
			endErr = l.ch.Err()
		case <-ctx.Done():
			closeCode, closeReason = wire.CloseShutdown, "agent stopping"
			endErr = ctx.Err()
		case <-l.goaway:
			endErr = errors.New("agent: daemon sent GoAway")
		case p := <-moves:
			// Register the better transport first; the daemon fences l.
			if err := a.register(ctx, p); err != nil {
				a.log.Info("move back failed; staying", "backend", l.ep.Backend, "to", p.ep.Backend, "err", err)
				a.setProbeNote(fmt.Sprintf("moving back to %s %s failed: %v", p.ep.Backend, p.ep.Address, err))
				loops.Add(1)
				go func() { defer loops.Done(); a.probeLoop(lctx, l.ep, eps, moves) }()
				continue
			}
			a.log.Info("moved to a better backend", "from", l.ep.Backend, "to", p.ep.Backend, "endpoint", p.ep.Address)
			a.st.moves.Add(1)
			next = p
			closeReason = "moved to a better backend"
		}
	}
	l.lcancel()
	if next != nil {
		a.setLink(next)
	} else {
		a.clearLink(l)
	}
	loops.Wait()
	if next != nil {
		return next, nil
	}
	if ctx.Err() != nil {
		endErr = nil
	}
	if h := a.cfg.Hooks.OnDisconnected; h != nil {
		h(endErr)
	}
	return nil, endErr
}

func (a *Agent) setLink(l *link) {
	a.mu.Lock()
	a.link = l
	close(a.linkCh)
	a.linkCh = make(chan struct{})
	a.mu.Unlock()
}

func (a *Agent) clearLink(l *link) {
	a.mu.Lock()
	if a.link == l {
		a.link = nil
		close(a.linkCh)
		a.linkCh = make(chan struct{})
	}
	a.mu.Unlock()
}

// currentLink returns the registered link and a channel closed when it
// changes.
func (a *Agent) currentLink() (*link, <-chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.link, a.linkCh
}

func (a *Agent) resync(ctx context.Context, l *link) error {
	a.mu.Lock()
	claims := make([]agentwire.ActiveAttemptResyncV1, 0, len(a.attempts))
	for id, at := range a.attempts {
		if len(claims) == agentwire.MaxActiveAttempts {
			break
		}
		c := agentwire.ActiveAttemptResyncV1{Attempt: id, Lease: at.job.Lease, Epoch: l.epoch, Phase: at.phase}
		if at.compl != nil {
			c.HasCompletion, c.Completion = true, at.complID
		}
		claims = append(claims, c)
	}
	a.mu.Unlock()
	sctx, sp := a.cfg.Tracing.Start(ctx, telemetry.SpanResync, telemetry.AttrRunner(a.cfg.Runner))
	defer sp.End()
	env, err := l.ch.Call(ctx, l.traceOut(sctx, control.Out{Msg: &agentwire.AgentResyncV1{Session: a.session, Epoch: l.epoch,
		ActiveAttempts: claims, CapabilityDigest: a.digest}}), a.cfg.RequestTimeout)
	if err != nil {
		return err
	}
	resp, ok := env.Payload.(*agentwire.ResyncResponseV1)
	if !ok {
		return errors.New("agent: unexpected answer to resync")
	}
	a.st.resyncs.Add(1)
	for _, r := range resp.Results {
		switch r.Decision.Kind {
		case agentwire.DecisionStale:
			a.stopAttempt(r.Attempt, agentwire.CancelLeaseRevoked, true)
		case agentwire.DecisionCancel:
			a.stopAttempt(r.Attempt, r.Decision.Reason, false)
		}
	}
	return nil
}

// stopAttempt cancels an attempt's executor. discard drops it without a
// completion (Stale). Attempts already waiting for a completion ack are
// left alone: the completion answer is authoritative.
func (a *Agent) stopAttempt(id wire.JobAttemptId, reason agentwire.CancellationReason, discard bool) {
	a.mu.Lock()
	at := a.attempts[id]
	if at == nil || at.compl != nil {
		a.mu.Unlock()
		return
	}
	if discard {
		at.discard = true
	}
	fresh := !at.finished
	a.mu.Unlock()
	at.cancel()
	if fresh {
		a.st.cancels.Add(1)
		if h := a.cfg.Hooks.OnCancel; h != nil {
			h(id, reason)
		}
	}
}

// ---- incoming messages (read goroutine: never Call here) ----

func (a *Agent) handle(l *link, env *wire.Envelope) {
	if a.handleData(l, env.Payload) {
		return
	}
	switch m := env.Payload.(type) {
	case *agentwire.LeaseOfferV1:
		a.onOffer(l, env, m)
	case *agentwire.CancelAttemptV1:
		a.stopAttempt(m.Attempt, m.Reason, false)
		_ = l.ch.Reply(env, &agentwire.CancelAckV1{Attempt: m.Attempt, Lease: m.Lease})
	case *agentwire.LeaseProbeV1:
		a.mu.Lock()
		at := a.attempts[m.Attempt]
		a.mu.Unlock()
		if at != nil && at.job.Lease == m.Lease {
			a.wg.Add(1)
			go func() { defer a.wg.Done(); a.renew(a.ctx, l, at) }()
		}
	case *agentwire.GoAwayV1:
		a.mu.Lock()
		a.preferred = append([]string(nil), m.AlternateEndpoints...)
		a.preferUntil = a.now().Add(time.Duration(m.ReconnectInMs+m.TryForMs) * time.Millisecond)
		a.mu.Unlock()
		l.reconnect = time.Duration(m.ReconnectInMs) * time.Millisecond
		l.goOnce.Do(func() { close(l.goaway) })
	case *agentwire.SessionFencedV1:
		a.log.Info("transport fenced by a newer one", "holder", m.HolderTransport.String())
		_ = l.bc.CloseWithCode(wire.CloseSessionFenced, "fenced")
	case *admin.DrainV1:
		a.mu.Lock()
		a.draining = true
		a.mu.Unlock()
		_ = l.ch.Reply(env, &admin.AdminAckV1{Acked: admin.MsgDrain, Accepted: true})
	case *admin.ResumeV1:
		a.mu.Lock()
		a.draining = false
		a.mu.Unlock()
		_ = l.ch.Reply(env, &admin.AdminAckV1{Acked: admin.MsgResume, Accepted: true})
	case *admin.RefreshCapabilitiesV1, *admin.RunHealthProbeV1:
		_ = l.ch.Reply(env, &admin.AdminAckV1{Acked: m.MessageType(), Accepted: false, Message: "not supported by this agent"})
	case *agentwire.SecretMaterialV1:
		// Secrets travel only on a secret stream (secret.go): refused here.
		m.Zero()
		l.ch.SetOutcome(telemetry.OutcomeRejected)
		_ = l.ch.ReplyError(env.MessageID, wire.ErrCodeInvalidState, wire.RetryNever, "secret material is accepted only on a secret stream")
	case *agentwire.ServerTimeV1, *wire.WireErrorV1:
		// Diagnostics only; uncorrelated errors are logged.
		a.log.Debug("daemon message", "type", m.MessageType().String())
	default:
		l.ch.SetOutcome(telemetry.OutcomeRejected)
		_ = l.ch.ReplyError(env.MessageID, wire.ErrCodeInvalidState, wire.RetryNever, "not expected by the agent")
	}
}

func (a *Agent) onOffer(l *link, env *wire.Envelope, m *agentwire.LeaseOfferV1) {
	pctx := context.Background()
	if l.features.Has(wire.FeatureTraceContextV1) {
		pctx = telemetry.ExtractEnvelope(pctx, env)
	}
	sctx, sp := a.cfg.Tracing.Start(pctx, telemetry.SpanLeaseAck, telemetry.AttrLease(m.Lease), telemetry.AttrAttempt(m.Attempt))
	defer sp.End()
	a.mu.Lock()
	if prev, ok := a.answers[m.Lease]; ok {
		a.mu.Unlock()
		a.st.dupOffers.Add(1)
		l.ch.SetOutcome(telemetry.OutcomeDuplicate)
		a.sendAnswer(sctx, l, env, m, prev)
		prev.Duplicate = true
		if h := a.cfg.Hooks.OnOffer; h != nil {
			h(prev)
		}
		return
	}
	ev := OfferEvent{Lease: m.Lease, Attempt: m.Attempt}
	running := 0
	for _, at := range a.attempts {
		if !at.finished {
			running++
		}
	}
	_, dupAttempt := a.attempts[m.Attempt]
	switch {
	case !a.execs:
		ev.Reason = agentwire.RejectUnsupportedSpec
	case m.Session != a.session:
		ev.Reason = agentwire.RejectOther
	case a.draining:
		ev.Reason = agentwire.RejectDraining
	case dupAttempt:
		ev.Reason = agentwire.RejectDuplicateAttempt
	case running >= a.cfg.MaxParallel:
		ev.Reason = agentwire.RejectAtCapacity
	case int64(m.ExpiresAtMs) < a.now().UnixMilli():
		ev.Reason = agentwire.RejectExpired
	default:
		ev.Accepted = true
	}
	var at *attempt
	var actx context.Context
	if ev.Accepted {
		var cancel context.CancelFunc
		actx, cancel = context.WithCancel(a.ctx)
		at = &attempt{cancel: cancel, job: Job{Lease: m.Lease, Attempt: m.Attempt, Job: m.Job, Spec: m.SpecID, Payload: m.PayloadRef},
			trace: trace.ContextWithSpanContext(context.Background(), sp.SpanContext())}
		at.io = a.newAttemptIO(at.job, a.epoch)
		a.attempts[m.Attempt] = at
		a.st.accepted.Add(1)
	} else {
		a.st.rejected.Add(1)
	}
	a.rememberAnswer(ev)
	a.mu.Unlock()
	a.sendAnswer(sctx, l, env, m, ev)
	if h := a.cfg.Hooks.OnOffer; h != nil {
		h(ev)
	}
	if at != nil {
		a.st.started.Add(1)
		if h := a.cfg.Hooks.OnAttemptStarted; h != nil {
			h(at.job)
		}
		if cur, _ := a.currentLink(); cur != nil {
			a.attachLog(cur, at, 0)
		}
		a.wg.Add(1)
		go a.execute(actx, at)
	}
}

// rememberAnswer records an offer's answer for duplicate offers, keeping
// the last answerRetention (a ring of lease ids, allocated once, and the
// map: fixed memory, no re-sliced queue); under a.mu.
func (a *Agent) rememberAnswer(ev OfferEvent) {
	if _, ok := a.answers[ev.Lease]; !ok {
		if len(a.ansRing) < answerRetention {
			a.ansRing = append(a.ansRing, ev.Lease)
		} else {
			delete(a.answers, a.ansRing[a.ansNext])
			a.ansRing[a.ansNext] = ev.Lease
			a.ansNext = (a.ansNext + 1) % answerRetention
		}
	}
	a.answers[ev.Lease] = ev
}

func (a *Agent) sendAnswer(ctx context.Context, l *link, env *wire.Envelope, m *agentwire.LeaseOfferV1, ev OfferEvent) {
	var msg wire.Message
	if ev.Accepted {
		msg = &agentwire.LeaseAcceptedV1{Lease: m.Lease, Attempt: m.Attempt, Session: a.session}
	} else {
		msg = &agentwire.LeaseRejectedV1{Lease: m.Lease, Attempt: m.Attempt, Reason: ev.Reason, Message: ev.Reason.String()}
	}
	_ = l.ch.ReplyOut(env, l.traceOut(ctx, control.Out{Msg: msg}))
}

// ---- execution ----

type output struct {
	a  *Agent
	at *attempt
}

func (o output) Phase(p agentwire.AttemptPhase) {
	a := o.a
	a.mu.Lock()
	o.at.phase = p
	l := a.link
	a.mu.Unlock()
	if l != nil {
		_, _ = l.ch.SendMsg(&agentwire.PhaseChangeV1{Attempt: o.at.job.Attempt, Lease: o.at.job.Lease, Phase: p, AtMs: uint64(a.now().UnixMilli())})
	}
}

func (a *Agent) execute(ctx context.Context, at *attempt) {
	defer a.wg.Done()
	var res Result
	if src, err := a.fetchPayload(ctx, at); err != nil {
		res = Result{Kind: agentwire.ResultInfraError, Message: "payload download failed: " + err.Error()}
		if ctx.Err() != nil {
			res = Result{Kind: agentwire.ResultCancelled}
		}
	} else {
		job := at.job
		job.payload = src
		res = a.cfg.Executor.Execute(a.withSecrets(ctx, at), job, output{a: a, at: at})
	}
	a.dropSecrets(at)
	at.cancel()
	wr := agentwire.ExecutionResultV1{Kind: res.Kind}
	switch res.Kind {
	case agentwire.ResultSucceeded:
		wr.ExitCode = res.ExitCode
	case agentwire.ResultFailed:
		wr.ExitCode, wr.Message = res.ExitCode, res.Message
		if wr.Message == "" {
			wr.Message = "failed"
		}
	case agentwire.ResultInfraError:
		wr.Message = res.Message
		if wr.Message == "" {
			wr.Message = "infrastructure error"
		}
	case agentwire.ResultCancelled, agentwire.ResultTimedOut:
	default:
		wr = agentwire.ExecutionResultV1{Kind: agentwire.ResultInfraError, Message: "executor returned an unknown result kind"}
	}
	wr.Message = wire.TruncateUTF8(wr.Message, agentwire.MaxMessage)
	outs := slices.Clone(res.Outputs)
	if io := at.io; io != nil {
		io.mu.Lock()
		for _, r := range io.outs {
			if !slices.Contains(outs, r) {
				outs = append(outs, r)
			}
		}
		io.mu.Unlock()
	}
	if len(outs) > agentwire.MaxOutputs {
		outs = outs[:agentwire.MaxOutputs]
	}
	a.mu.Lock()
	discard := at.discard
	a.mu.Unlock()
	if !discard {
		outs = a.finishData(at, outs)
	} else if at.io != nil && at.io.w != nil {
		at.io.w.Close()
		_ = os.RemoveAll(filepath.Join(a.spool, "logs", at.job.Attempt.String()))
	}
	res.Outputs = outs
	a.mu.Lock()
	at.finished = true
	if at.discard {
		delete(a.attempts, at.job.Attempt)
		a.mu.Unlock()
		return
	}
	at.result = res
	at.complID = wire.NewMessageId()
	at.compl = &agentwire.AttemptCompletionV1{Job: at.job.Job, Attempt: at.job.Attempt, Lease: at.job.Lease, Spec: at.job.Spec,
		Result: wr, Outputs: outs}
	a.mu.Unlock()
	a.complete(at)
}

// complete sends the completion with one MessageId until the daemon
// acknowledges it, across reconnects (§77, §122).
func (a *Agent) complete(at *attempt) {
	pctx := at.trace
	if pctx == nil {
		pctx = context.Background()
	}
	cctx, sp := a.cfg.Tracing.Start(pctx, telemetry.SpanComplete, telemetry.AttrLease(at.job.Lease), telemetry.AttrAttempt(at.job.Attempt))
	defer sp.End()
	retries := 0
	for {
		l, changed := a.currentLink()
		if l == nil {
			select {
			case <-changed:
				continue
			case <-a.ctx.Done():
				return
			}
		}
		if retries == 0 {
			a.st.complSent.Add(1)
		} else {
			a.st.complRetried.Add(1)
		}
		env, err := l.ch.Call(a.ctx, l.traceOut(cctx, control.Out{ID: at.complID, Msg: at.compl}), a.cfg.RequestTimeout)
		if err == nil {
			if ack, ok := env.Payload.(*agentwire.CompletionAckV1); ok {
				a.mu.Lock()
				delete(a.attempts, at.job.Attempt)
				a.mu.Unlock()
				if int(ack.Kind) < len(a.st.acks) {
					a.st.acks[ack.Kind].Add(1)
				}
				if h := a.cfg.Hooks.OnAttemptDone; h != nil {
					h(AttemptDone{Job: at.job, Result: at.result, Ack: ack.Kind, Retries: retries})
				}
				return
			}
		}
		retries++
		if a.ctx.Err() != nil {
			return
		}
		// Retry on the next transport, or after a short pause on this one
		// (fenced answers, timeouts).
		t := time.NewTimer(min(a.cfg.RequestTimeout, 100*time.Millisecond))
		select {
		case <-changed:
		case <-t.C:
		case <-a.ctx.Done():
		}
		t.Stop()
	}
}

func (a *Agent) renewLoop(ctx context.Context, l *link) {
	a.mu.Lock()
	every := a.renewEvery
	a.mu.Unlock()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		var live []*attempt
		for _, at := range a.attempts {
			if !at.finished {
				live = append(live, at)
			}
		}
		a.mu.Unlock()
		var wg sync.WaitGroup
		for _, at := range live {
			wg.Add(1)
			go func() { defer wg.Done(); a.renew(ctx, l, at) }()
		}
		wg.Wait()
	}
}

func (a *Agent) renew(ctx context.Context, l *link, at *attempt) {
	a.mu.Lock()
	phase := at.phase
	a.mu.Unlock()
	env, err := l.ch.Call(ctx, control.Out{Msg: &agentwire.LeaseRenewV1{Lease: at.job.Lease, Attempt: at.job.Attempt, ObservedPhase: phase},
		Priority: semantics.PriorityLease, UsePriority: true}, a.cfg.RequestTimeout)
	if err != nil {
		return
	}
	ack, ok := env.Payload.(*agentwire.LeaseRenewAckV1)
	if !ok {
		return
	}
	switch ack.Outcome.Kind {
	case agentwire.RenewRevoked:
		a.stopAttempt(at.job.Attempt, ack.Outcome.Reason, false)
	case agentwire.RenewUnknown:
		a.stopAttempt(at.job.Attempt, agentwire.CancelLeaseRevoked, false)
	}
}

func (a *Agent) heartbeatLoop(ctx context.Context, l *link) {
	a.mu.Lock()
	every := a.hbEvery
	a.mu.Unlock()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		a.mu.Lock()
		a.hbSeq++
		hb := &agentwire.HeartbeatV1{Runner: a.cfg.Runner, Session: a.session, Seq: a.hbSeq, CapabilityDigest: a.digest}
		for id, at := range a.attempts {
			if !at.finished && len(hb.ActiveAttempts) < agentwire.MaxActiveAttempts {
				hb.ActiveAttempts = append(hb.ActiveAttempts, agentwire.ActiveAttemptV1{Attempt: id, Lease: at.job.Lease, Phase: at.phase})
			}
		}
		hb.Resources.RunningJobs = uint16(len(hb.ActiveAttempts))
		a.mu.Unlock()
		a.st.hbSent.Add(1)
		// Heartbeats are never replayed (§235): one send, one wait.
		sent := time.Now()
		env, err := l.ch.Call(ctx, control.Out{Msg: hb, Priority: semantics.PriorityLease, UsePriority: true}, every)
		if err != nil {
			continue
		}
		if _, ok := env.Payload.(*agentwire.HeartbeatAckV1); ok {
			a.cfg.Metrics.ObserveHeartbeatRTT(time.Since(sent))
			a.st.hbAcked.Add(1)
			a.mu.Lock()
			a.lastAck = a.now()
			a.mu.Unlock()
		}
	}
}
