package agent

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// ErrClosed is returned by Run after Close.
var ErrClosed = errors.New("agent: closed")

// Agent is one agent session. Methods are safe for concurrent use.
type Agent struct {
	// storageFault is when (UnixNano) a daemon last answered
	// WireErrorV1{StorageUnavailable} to an uncorrelated message (the
	// logs-finalized barrier): finishData then retries the barrier.
	storageFault atomic.Int64
	cfg          Config
	session      wire.AgentSessionId
	log          *slog.Logger
	now          func() time.Time
	caps         agentwire.RunnerCapabilitiesV1 // under mu after New (SetCapabilities, inventory.go)
	digest       wire.CapabilityDigest
	execs        bool // the role runs attempts
	started      time.Time
	clk          clockState // the daemon's clock (clock.go)

	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	runMu  sync.Mutex

	mu           sync.Mutex
	link         *link         // current registered transport, nil when none
	linkCh       chan struct{} // closed and replaced when link changes
	attempts     map[wire.JobAttemptId]*attempt
	answers      map[wire.LeaseId]OfferEvent // the last answerRetention answers (ansRing)
	ansRing      []wire.LeaseId              // grows with the answers (an idle agent holds none) up to answerRetention, then a ring: oldest at ansNext
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
	lastDialErr  string      // Status.LastDialError
	lastDialAt   time.Time   // Status.LastDialErrorAt
	retryAt      time.Time   // Status.NextRetry
	dialErrs     []DialError // Status.DialErrors, newest first

	// Data plane (data.go), for roles that run attempts.
	spool string
	store *cas.FSStore
	up    *cas.Uploader
	down  *cas.Downloader

	// Secrets delivered for leased attempts (secret.go).
	sec secretStore
	// svcSem bounds the Service requests in progress (service.go).
	svcSem chan struct{}

	st agentStats
}

// New checks cfg and returns an Agent with a fresh AgentSessionId.
func New(cfg Config) (*Agent, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if cfg.Protocol == (wire.ProtocolRange{}) {
		cfg.Protocol = wire.Supported
	}
	cfg.MaxParallel = cmp.Or(cfg.MaxParallel, DefaultMaxParallel)
	if cfg.Backoff.Base <= 0 {
		cfg.Backoff.Base = DefaultBackoffBase
	}
	if cfg.Backoff.Max <= 0 {
		cfg.Backoff.Max = DefaultBackoffMax
	}
	cfg.Backoff.AuthAfter = cmp.Or(cfg.Backoff.AuthAfter, DefaultAuthBackoffAfter)
	cfg.Backoff.AuthMax = cmp.Or(cfg.Backoff.AuthMax, DefaultAuthBackoffMax)
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	cfg.LeaseGrace = cmp.Or(cfg.LeaseGrace, DefaultLeaseGrace)
	if cfg.Version == "" {
		cfg.Version = "forgeyard-agent"
	}
	cfg.Endpoints = append([]Endpoint(nil), cfg.Endpoints...)
	a := &Agent{cfg: cfg, session: wire.NewAgentSessionId(), log: cfg.Logger, now: cfg.Now,
		linkCh: make(chan struct{}), attempts: map[wire.JobAttemptId]*attempt{}, answers: map[wire.LeaseId]OfferEvent{},
		fb: cfg.Fallback.withDefaults(), memory: map[string]remembered{}, changes: map[BackendChange]int64{},
		hbEvery: 10 * time.Second, renewEvery: 10 * time.Second, maxBackoff: cfg.Backoff.Max,
		execs:  cfg.Role == agentwire.RoleAgent || cfg.Role == agentwire.RoleInternalWorker,
		svcSem: make(chan struct{}, MaxServiceRequests)}
	a.classStagger = slices.Clone(a.fb.ClassStagger)
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	a.log = a.log.With("runner", cfg.Runner.String(), "agent_session", a.session.String())
	if a.now == nil {
		a.now = time.Now
	}
	a.started = time.Now()
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
