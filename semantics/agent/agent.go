// Package agent is the agent side of the control protocol: it dials the
// daemon's endpoints in order with failover, negotiates, registers with a
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
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/admin"
	agentwire "forgeyard.dev/transport/wire/agent"
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

	mu          sync.Mutex
	link        *link         // current registered transport, nil when none
	linkCh      chan struct{} // closed and replaced when link changes
	attempts    map[wire.JobAttemptId]*attempt
	answers     map[wire.LeaseId]OfferEvent
	ansOrder    []wire.LeaseId
	draining    bool
	epoch       uint64
	hbEvery     time.Duration
	renewEvery  time.Duration
	maxBackoff  time.Duration
	alternates  []string
	stagger     []time.Duration // fallback dial delays (happy eyeballs)
	preferred   []string        // GoAway alternates, dialed first until preferUntil
	preferUntil time.Time
	lastAck     time.Time
	hbSeq       uint64

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
	goaway    chan struct{}
	goOnce    sync.Once
	reconnect time.Duration
}

type attempt struct {
	job      Job
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
		stagger: append([]time.Duration(nil), cfg.FallbackStagger...),
		hbEvery: 10 * time.Second, renewEvery: 10 * time.Second, maxBackoff: cfg.Backoff.Max,
		execs: cfg.Role == agentwire.RoleAgent || cfg.Role == agentwire.RoleInternalWorker}
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
	s := Status{Epoch: a.epoch, LastHeartbeatAck: a.lastAck, Draining: a.draining}
	if l := a.link; l != nil {
		s.Connected, s.Endpoint, s.Backend, s.Protocol, s.Transport = true, l.ep.Address, l.bc.Backend(), l.protocol, l.transport
		s.Features = l.features
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
		PayloadsFetched: s.payloadsFetched.Load(), PayloadsFailed: s.payloadsFailed.Load()}
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
		var perm error
		permCount, registered := 0, false
		var wait time.Duration
		remaining := eps
		for len(remaining) > 0 && !registered {
			w, bc, failed := a.dialStaggered(ctx, remaining)
			for i, err := range failed {
				a.st.dialFailures.Add(1)
				a.log.Debug("endpoint failed", "endpoint", remaining[i].Address, "err", err)
			}
			if w < 0 {
				break
			}
			ep := remaining[w]
			var rest []Endpoint
			for i := range remaining {
				if _, bad := failed[i]; !bad && i != w {
					rest = append(rest, remaining[i])
				}
			}
			remaining = rest
			l, err := a.runLink(ctx, ep, bc)
			if l != nil { // registered at some point
				registered = true
				failures = 0
				if l.reconnect > 0 {
					wait = l.reconnect
				}
				break
			}
			if ctx.Err() != nil {
				return nil
			}
			var ve *VersionError
			var re *RejectedError
			if errors.As(err, &ve) || errors.As(err, &re) && re.permanent() {
				permCount++
				if perm == nil {
					perm = err
				}
				continue
			}
			a.st.dialFailures.Add(1)
			a.log.Debug("endpoint failed", "endpoint", ep.Address, "err", err)
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

// backoff returns a full-jitter wait for the n-th consecutive failure.
func (a *Agent) backoff(n int) time.Duration {
	a.mu.Lock()
	ceiling := a.maxBackoff
	a.mu.Unlock()
	d := a.cfg.Backoff.Base
	for i := 0; i < n && d < ceiling; i++ {
		d *= 2
	}
	d = min(d, ceiling)
	return time.Duration(rand.Int64N(int64(d) + 1))
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
	alt := func(addr string) {
		if !seen[addr] {
			seen[addr] = true
			eps = append(eps, Endpoint{Address: addr, Dialer: a.cfg.Endpoints[0].Dialer, Backend: a.cfg.Endpoints[0].Backend})
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
	for _, alt := range a.alternates {
		if !seen[alt] {
			seen[alt] = true
			eps = append(eps, Endpoint{Address: alt, Dialer: a.cfg.Endpoints[0].Dialer, Backend: a.cfg.Endpoints[0].Backend})
		}
	}
	return eps
}

type dialResult struct {
	i   int
	bc  semantics.BackendConn
	err error
}

// dialStaggered dials eps in order, happy-eyeballs style: the i-th fallback
// starts stagger[i-1] (the last entry repeats) after the previous dial
// started, or at once when every dial in flight failed; without a stagger
// the dials are sequential. It returns the index and connection of the
// first success (-1 if none) and the errors of the dials that failed;
// later successes are closed.
func (a *Agent) dialStaggered(ctx context.Context, eps []Endpoint) (int, semantics.BackendConn, map[int]error) {
	a.mu.Lock()
	stagger := append([]time.Duration(nil), a.stagger...)
	a.mu.Unlock()
	race, cancel := context.WithCancel(ctx) // ends the losers once a dial won
	results := make(chan dialResult, len(eps))
	next, inflight := 0, 0
	failed := map[int]error{}
	start := func() {
		i := next
		next++
		inflight++
		go func() {
			dctx, dcancel := context.WithTimeout(race, a.cfg.RequestTimeout) // each dial its own deadline
			defer dcancel()
			bc, err := eps[i].Dialer.Dial(dctx, eps[i].Address)
			results <- dialResult{i, bc, err}
		}()
	}
	var timer *time.Timer
	var tick <-chan time.Time
	arm := func() {
		if timer != nil {
			timer.Stop()
		}
		tick = nil
		if next < len(eps) && len(stagger) > 0 {
			timer = time.NewTimer(stagger[min(next-1, len(stagger)-1)])
			tick = timer.C
		}
	}
	start()
	arm()
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for inflight > 0 {
		select {
		case r := <-results:
			inflight--
			if r.err != nil {
				failed[r.i] = r.err
				if inflight == 0 && next < len(eps) {
					start()
					arm()
				}
				continue
			}
			// The winner: abort the other dials and close any that
			// completed anyway, in the background.
			cancel()
			go func(n int) {
				for ; n > 0; n-- {
					if l := <-results; l.err == nil {
						_ = l.bc.CloseWithCode(wire.CloseNormal, "lost the dial race")
					}
				}
			}(inflight)
			return r.i, r.bc, failed
		case <-tick:
			start()
			arm()
		}
	}
	cancel()
	return -1, nil, failed
}

// runLink serves the connection bc to ep until it ends. It returns the link if it
// registered (nil otherwise) and the error that ended it.
func (a *Agent) runLink(ctx context.Context, ep Endpoint, bc semantics.BackendConn) (*link, error) {
	rto := a.cfg.RequestTimeout
	closeCode, closeReason := wire.CloseNormal, "agent leaving"
	defer func() { _ = bc.CloseWithCode(closeCode, closeReason) }()
	sc, err := semantics.NewConn(bc, semantics.Config{Limits: a.cfg.Limits, Logger: a.log})
	if err != nil {
		return nil, err
	}
	octx, ocancel := context.WithTimeout(ctx, rto)
	st, err := sc.OpenStream(octx, wire.StreamControl)
	ocancel()
	if err != nil {
		return nil, err
	}
	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	l := &link{ep: ep, bc: bc, sc: sc, ctx: lctx, goaway: make(chan struct{}),
		ch: control.New(st, control.Config{Now: a.now, Logger: a.log, WriteTimeout: rto})}
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		_ = l.ch.Run(func(env *wire.Envelope) { a.handle(l, env) }, func(de *control.DecodeError) {
			_ = l.ch.ReplyError(de.MessageID, de.Code, wire.RetryNever, "frame rejected")
		})
	}()
	defer func() {
		_ = bc.CloseWithCode(closeCode, closeReason)
		<-runDone
	}()

	// Hello.
	env, err := l.ch.Call(ctx, control.Out{Msg: &agentwire.TransportHelloV1{Role: a.cfg.Role, Versions: a.cfg.Protocol,
		Features: a.cfg.Features, HasAgentSession: true, AgentSession: a.session, AgentVersion: a.cfg.Version}}, rto)
	if err != nil {
		return nil, err
	}
	var ack *agentwire.HelloAckV1
	switch m := env.Payload.(type) {
	case *agentwire.HelloAckV1:
		ack = m
	case *agentwire.RegistrationRejectedV1:
		if m.Code == wire.ErrCodeUnsupportedVersion {
			closeCode, closeReason = wire.CloseVersionMismatch, m.Message
			a.log.Error("daemon refused our protocol version", "endpoint", ep.Address, "message", m.Message)
			return nil, &VersionError{Message: m.Message, ServerRange: m.ServerRange, Endpoint: ep.Address}
		}
		return nil, &RejectedError{Code: m.Code, Retry: m.Retry, Message: m.Message, Endpoint: ep.Address}
	default:
		return nil, errors.New("agent: unexpected answer to hello")
	}
	l.transport, l.protocol, l.features = ack.TransportSession, ack.Negotiated, ack.Features.Intersect(a.cfg.Features)
	l.ch.SetProtocol(ack.Negotiated)

	// Register.
	proof, err := session.SignKeyProof(a.cfg.Signer, ack.Challenge, ack.TransportSession, a.session)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	prevEpoch := a.epoch
	a.mu.Unlock()
	reg := &agentwire.RegisterAgentV1{Runner: a.cfg.Runner, Session: a.session, AgentVersion: a.cfg.Version,
		Capabilities: a.caps, CapabilityDigest: a.digest, KeyProof: proof, CertChain: a.cfg.CertChain}
	if prevEpoch > 0 {
		reg.HasResumeEpoch, reg.ResumeEpoch = true, prevEpoch
	}
	env, err = l.ch.Call(ctx, control.Out{Msg: reg}, rto)
	if err != nil {
		return nil, err
	}
	var acc *agentwire.RegistrationAcceptedV1
	switch m := env.Payload.(type) {
	case *agentwire.RegistrationAcceptedV1:
		acc = m
	case *agentwire.RegistrationRejectedV1:
		re := &RejectedError{Code: m.Code, Retry: m.Retry, Message: m.Message, Endpoint: ep.Address}
		a.log.Error("registration rejected", "endpoint", ep.Address, "err", re)
		return nil, re
	default:
		return nil, errors.New("agent: unexpected answer to registration")
	}
	l.epoch = acc.Epoch
	a.mu.Lock()
	a.epoch = acc.Epoch
	a.hbEvery = time.Duration(acc.HeartbeatIntervalMs) * time.Millisecond
	a.renewEvery = time.Duration(acc.LeaseRenewIntervalMs) * time.Millisecond
	a.maxBackoff = time.Duration(acc.MaxBackoffMs) * time.Millisecond
	a.alternates = append([]string(nil), acc.AlternateEndpoints...)
	a.stagger = a.stagger[:0]
	for _, ms := range acc.FallbackStaggerMs {
		a.stagger = append(a.stagger, time.Duration(ms)*time.Millisecond)
	}
	a.mu.Unlock()
	if a.st.registrations.Add(1) > 1 {
		a.st.reconnects.Add(1)
	}

	// Resync (always, even with no attempts).
	if a.execs {
		if err := a.resync(ctx, l); err != nil {
			return l, err
		}
	}
	a.setLink(l)
	a.attachAll(l)
	if h := a.cfg.Hooks.OnConnected; h != nil {
		h(a.Status())
	}
	var loops sync.WaitGroup
	loops.Add(1)
	go func() { defer loops.Done(); a.heartbeatLoop(lctx, l) }()
	if a.execs {
		loops.Add(1)
		go func() { defer loops.Done(); a.renewLoop(lctx, l) }()
	}
	loops.Add(1)
	go func() { defer loops.Done(); a.serveSecrets(lctx, l) }()
	var endErr error
	select {
	case <-sc.Done():
		endErr = sc.Err()
	case <-runDone:
		endErr = l.ch.Err()
	case <-ctx.Done():
		closeCode, closeReason = wire.CloseShutdown, "agent stopping"
	case <-l.goaway:
		endErr = errors.New("agent: daemon sent GoAway")
	}
	lcancel()
	a.clearLink(l)
	loops.Wait()
	if h := a.cfg.Hooks.OnDisconnected; h != nil {
		h(endErr)
	}
	return l, endErr
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
	env, err := l.ch.Call(ctx, control.Out{Msg: &agentwire.AgentResyncV1{Session: a.session, Epoch: l.epoch,
		ActiveAttempts: claims, CapabilityDigest: a.digest}}, a.cfg.RequestTimeout)
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
		_ = l.ch.ReplyError(env.MessageID, wire.ErrCodeInvalidState, wire.RetryNever, "secret material is accepted only on a secret stream")
	case *agentwire.ServerTimeV1, *wire.WireErrorV1:
		// Diagnostics only; uncorrelated errors are logged.
		a.log.Debug("daemon message", "type", m.MessageType().String())
	default:
		_ = l.ch.ReplyError(env.MessageID, wire.ErrCodeInvalidState, wire.RetryNever, "not expected by the agent")
	}
}

func (a *Agent) onOffer(l *link, env *wire.Envelope, m *agentwire.LeaseOfferV1) {
	a.mu.Lock()
	if prev, ok := a.answers[m.Lease]; ok {
		a.mu.Unlock()
		a.st.dupOffers.Add(1)
		a.sendAnswer(l, env, m, prev)
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
		at = &attempt{cancel: cancel, job: Job{Lease: m.Lease, Attempt: m.Attempt, Job: m.Job, Spec: m.SpecID, Payload: m.PayloadRef}}
		at.io = a.newAttemptIO(at.job, a.epoch)
		a.attempts[m.Attempt] = at
		a.st.accepted.Add(1)
	} else {
		a.st.rejected.Add(1)
	}
	a.answers[m.Lease] = ev
	a.ansOrder = append(a.ansOrder, m.Lease)
	if len(a.ansOrder) > answerRetention {
		delete(a.answers, a.ansOrder[0])
		a.ansOrder = a.ansOrder[1:]
	}
	a.mu.Unlock()
	a.sendAnswer(l, env, m, ev)
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

func (a *Agent) sendAnswer(l *link, env *wire.Envelope, m *agentwire.LeaseOfferV1, ev OfferEvent) {
	var msg wire.Message
	if ev.Accepted {
		msg = &agentwire.LeaseAcceptedV1{Lease: m.Lease, Attempt: m.Attempt, Session: a.session}
	} else {
		msg = &agentwire.LeaseRejectedV1{Lease: m.Lease, Attempt: m.Attempt, Reason: ev.Reason, Message: ev.Reason.String()}
	}
	_ = l.ch.Reply(env, msg)
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
		env, err := l.ch.Call(a.ctx, control.Out{ID: at.complID, Msg: at.compl}, a.cfg.RequestTimeout)
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
		env, err := l.ch.Call(ctx, control.Out{Msg: hb, Priority: semantics.PriorityLease, UsePriority: true}, every)
		if err != nil {
			continue
		}
		if _, ok := env.Payload.(*agentwire.HeartbeatAckV1); ok {
			a.st.hbAcked.Add(1)
			a.mu.Lock()
			a.lastAck = a.now()
			a.mu.Unlock()
		}
	}
}
