package quic

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"forgeyard.dev/transport/semantics"
)

// ALPN is the application protocol every Forgeyard QUIC connection
// negotiates. A peer that negotiates anything else is rejected.
const ALPN = "forgeyard/1"

// Defaults for Config zero values.
const (
	// DefaultKeepAlivePeriod keeps NAT bindings alive (§216) without
	// excessive traffic.
	DefaultKeepAlivePeriod = 15 * time.Second
	// DefaultMaxIdleTimeout closes a connection that received nothing for
	// this long (§217–218); three missed keepalives.
	DefaultMaxIdleTimeout = 45 * time.Second
	// DefaultHandshakeTimeout bounds the whole QUIC+TLS handshake.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultMaxIncomingStreams is the QUIC stream credit granted to the
	// peer, per direction type, for the default Limits:
	// semantics.DefaultMaxStreams plus semantics.DefaultMaxRefusals (see
	// the package doc). A Config with Limits derives its own
	// (Limits.StreamCredit).
	DefaultMaxIncomingStreams = semantics.DefaultMaxStreams + semantics.DefaultMaxRefusals
	// DefaultStreamReceiveWindow is the largest per-stream receive window
	// (flow-control credit): the ceiling of quic-go's auto-tuning, which
	// doubles a stream's window while half of it is read within two
	// smoothed RTTs. What a stream can have in flight is also bounded by
	// the connection's window, whose growth follows the path (see
	// WindowRate), so on loopback and LANs a bulk stream keeps about its
	// initial 256 KiB in flight ahead of a control frame, and on a 50 or
	// 100 ms path it opens to the bandwidth-delay product (docs/perf.md §12).
	DefaultStreamReceiveWindow = 8 << 20
	// DefaultConnectionReceiveWindow is the largest per-connection receive
	// window; it bounds the memory one peer can make this side buffer.
	DefaultConnectionReceiveWindow = 16 << 20
	// DefaultWindowRate is Config.WindowRate's default: 1 Gbit/s.
	DefaultWindowRate = 125_000_000
	// RecommendedDelayHintMaxRTT is the Config.DelayHintMaxRTT to use
	// when enabling the DelayHint: active on paths whose minimum RTT is at
	// most 5 ms (loopback, LAN, a data centre).
	RecommendedDelayHintMaxRTT = 5 * time.Millisecond
	// initialReceiveWindow is where quic-go's auto-tuning starts (clipped
	// to the max), for streams and the connection alike: the in-flight
	// bound of the old 256 KiB default, which halved the control p99 under
	// bulk on loopback against quic-go's defaults (docs/perf/backends-quic.md).
	initialReceiveWindow = 256 << 10
	// minReceiveWindow keeps a window from being configured so small that
	// a single packet cannot be received.
	minReceiveWindow = 16 << 10
	// maxStreamCredit bounds MaxIncomingStreams (QUIC allows 2^60).
	maxStreamCredit = 1 << 20
	// DefaultMaxHandshakes bounds a Listener's incoming handshakes in
	// progress (Config.MaxHandshakes), queued or working: the memory
	// bound (a waiting attempt holds a quic-go connection, ~40 KiB); the
	// queue's time bound (HandshakeQueueWait) usually refuses first.
	DefaultMaxHandshakes = 4096
	// DefaultHandshakeQueueWait is Config.HandshakeQueueWait: below
	// quic-go clients' default handshake idle timeout (5 s), so that an
	// attempt that waited still finishes before its client gives up.
	DefaultHandshakeQueueWait = 3 * time.Second

	// AdmissionWindow is how many seconds of the host's measured intake
	// (Config.Backlog) may be in progress at once, from the first
	// Initial to registration: short against the agents' 5 s handshake
	// idle timeout and 10 s request timeout, long enough that the
	// pipeline never runs dry while the rate can still grow.
	AdmissionWindow = 2 * time.Second
	// MinAdmissionWindow is the end-to-end bound before the host's rate
	// is measured, and its floor.
	MinAdmissionWindow = 512
	// DefaultRefusalBackoff is the agents' Config.RefusalBackoff.
	DefaultRefusalBackoff = 250 * time.Millisecond
	// MaxRefusalBackoff bounds one wait after a refusal.
	MaxRefusalBackoff = 4 * time.Second
)

// Config tunes a Listener or Dialer. The zero value is ready to use: every
// zero field takes the default named beside it. Config is copied on entry
// (Listen, Dial); changing it afterwards has no effect. Validate reports the
// first invalid field by name.
type Config struct {
	// KeepAlivePeriod is how often a keepalive PING is sent when nothing
	// else is (0: DefaultKeepAlivePeriod; negative: no keepalives). quic-go
	// caps it at half the negotiated idle timeout.
	KeepAlivePeriod time.Duration
	// MaxIdleTimeout closes the connection when nothing was received for
	// this long (0: DefaultMaxIdleTimeout). The effective value is the
	// minimum of both sides'. The error is semantics.IdleTimeoutError().
	MaxIdleTimeout time.Duration
	// HandshakeTimeout bounds the QUIC+TLS handshake
	// (0: DefaultHandshakeTimeout). quic-go's HandshakeIdleTimeout is set
	// to half of it (quic-go aborts after twice that).
	HandshakeTimeout time.Duration
	// RefusalBackoff, when positive, makes a Dialer whose attempt the
	// server refuses before its handshake — QUIC CONNECTION_REFUSED, as a
	// Listener at MaxHandshakes or refused by Admit answers — wait and try
	// again within the same Dial instead of failing it: the n-th wait is
	// uniform in [d/2, d], d = min(RefusalBackoff·2ⁿ, MaxRefusalBackoff),
	// for as long as the dial's context and HandshakeTimeout allow. So the
	// server's pre-handshake admission paces the client (at the cost of a
	// refused Initial, no cryptography) rather than failing its connection
	// attempt. 0: off (a refusal fails the dial at once, as before);
	// DefaultRefusalBackoff is what the agents use. Listeners ignore it.
	RefusalBackoff time.Duration
	// Limits are the semantics.Limits the semantics.Conn over these
	// connections enforces (zero: the defaults). The stream credit is
	// derived from them (below), so give the backend the same Limits as
	// the daemon or agent that serves its connections.
	Limits semantics.Limits
	// MaxIncomingStreams and MaxIncomingUniStreams are the QUIC stream
	// credit granted to the peer: how many bidirectional/unidirectional
	// streams it may have open at once (0: Limits.StreamCredit(), that is
	// Limits.MaxStreams + Limits.MaxRefusals, DefaultMaxIncomingStreams
	// for the default Limits; must be ≤ 2^20). Set them only to override
	// the derived credit.
	MaxIncomingStreams, MaxIncomingUniStreams int64
	// StreamReceiveWindow is the largest flow-control window of one stream
	// in bytes (0: DefaultStreamReceiveWindow; ≥ 16 KiB). Windows start at
	// 256 KiB (or this, if smaller) and grow towards it. It bounds how
	// many bytes of one stream can be in flight or buffered unread, and so
	// how much bulk data can sit ahead of a control frame.
	StreamReceiveWindow uint64
	// ConnectionReceiveWindow is the largest flow-control window of the
	// connection in bytes (0: DefaultConnectionReceiveWindow; ≥
	// StreamReceiveWindow). It bounds the receive memory one connection can
	// make this side hold.
	ConnectionReceiveWindow uint64
	// WindowRate (bytes per second; 0: DefaultWindowRate) is the fastest
	// path the connection's receive window grows for: beyond its initial
	// 256 KiB the window grows (when quic-go's auto-tuning asks) only up to
	// twice the bandwidth-delay product of a WindowRate path with the
	// connection's minimum RTT, 2 × MinRTT × WindowRate. The minimum RTT
	// leaves out queueing delay, so bulk on loopback or a LAN, where the
	// smoothed RTT grows with the queue and would grow the window with it,
	// keeps its initial window, while a 50 ms path may open to 12.5 MB at
	// the default. Negative: no path bound (quic-go's auto-tuning alone, up
	// to ConnectionReceiveWindow).
	WindowRate int64
	// Budget, when not nil, is a receive-memory budget shared by every
	// connection using it (several Configs may share one). Window growth
	// beyond the initial window (256 KiB or less) is granted only while
	// the budget has room; a connection's share is returned when it
	// closes. Nil: each connection is bounded by ConnectionReceiveWindow
	// only.
	Budget *MemoryBudget
	// DelayHintMaxRTT bounds where the connection's DelayHint is active:
	// while the path's minimum RTT is at most this long, the connection
	// reports (as semantics.BulkHinter) its queueing delay converted to
	// bytes at its send rate, and semantics.Conn holds bulk (log, CAS)
	// chunks while that is above its BulkQueueThreshold, so control frames
	// wait behind less data in flight (docs/perf.md §2). On longer paths it
	// reports 0 (bulk is paced by quic-go alone): a delay-based hold would
	// yield to loss-based competing traffic on a shared WAN bottleneck.
	// 0 or negative: off (the default). It cuts control latency under
	// saturating bulk on loopback (p50 10–25× lower) but, on this
	// project's loaded 2-core benchmark machine, also single-stream bulk
	// throughput by half or more; measure before enabling (LAN
	// deployments whose CPUs are not saturated: RecommendedDelayHintMaxRTT).
	DelayHintMaxRTT time.Duration
	// StatelessResetKey, when not nil, makes a Listener answer the packets
	// of connections it does not know — those of a previous process of
	// this server, after a crash or a restart — with a QUIC stateless reset
	// (RFC 9000 §10.3), so their peers notice at their next packet instead
	// of after MaxIdleTimeout. The key must be secret and stay the same
	// across restarts of the server (ResetKey derives one from the
	// server's private key file); it also keys the address-validation
	// (Retry) tokens. Nil: no stateless resets. Dialers ignore it.
	StatelessResetKey *[32]byte
	// MaxHandshakes bounds a Listener's incoming handshakes in progress,
	// from the client's first packet until the connection is taken by
	// Accept, queued or working (admit.go). A connection attempt beyond it
	// — or one that would wait longer than HandshakeQueueWait for a worker
	// at the measured handshake rate — is refused with QUIC's
	// CONNECTION_REFUSED before any cryptographic work, and reported to
	// OnHandshakeFailure with reason semantics.HandshakeOverloaded; above
	// half of it the listener validates client addresses with a Retry
	// first (one round trip, no state kept), as quic-go recommends under
	// load. The cap is fixed: it never shrinks because handshakes (or
	// their peers) are slow. 0: DefaultMaxHandshakes; negative:
	// unbounded. Dialers ignore it.
	MaxHandshakes int
	// HandshakeWorkers is how many handshakes a Listener works on at once
	// (from the ClientHello to the server's signature; the others wait in
	// FIFO order). 0: DefaultHandshakeWorkers (2 per CPU of GOMAXPROCS).
	// Dialers ignore it.
	HandshakeWorkers int
	// HandshakeQueueWait bounds an attempt's wait for a worker; an
	// attempt arriving when the wait at the measured rate would be longer
	// is refused at once. 0: DefaultHandshakeQueueWait. Dialers ignore it.
	HandshakeQueueWait time.Duration
	// Admit, when not nil, is asked about every incoming connection
	// attempt before its handshake starts (it runs on the packet path:
	// keep it to a few atomic loads). A non-nil error refuses the attempt
	// like MaxHandshakes does (CONNECTION_REFUSED, reported as
	// semantics.HandshakeOverloaded with this error). The daemon uses it
	// for its connection cap. Dialers ignore it.
	Admit func(remote net.Addr) error
	// Backlog, when not nil, reports the host's part of an attempt's way
	// in: the connections this listener handed over that the host has not
	// yet taken in (the daemon: awaiting registration), and the rate at
	// which it takes them in while some wait (0: not measured yet). A new
	// attempt is then also refused while the attempts in progress — queued,
	// handshaking, and the host's — exceed what the host takes in within
	// AdmissionWindow (at least MinAdmissionWindow attempts), and a refused
	// attempt's appointment is spread at the slower of the two rates. So
	// the way in is bounded end to end: an admitted attempt registers well
	// within its agent's timeouts and no paid handshake waits them out.
	// It runs on the packet path, like Admit. Dialers ignore it.
	Backlog func() (pending int, perSecond float64)
	// Logger receives the backend's few log lines (nil: slog.Default()).
	Logger *slog.Logger
	// OnHandshakeFailure, when not nil, is called once for every incoming
	// connection whose QUIC+TLS handshake failed (a TLS alert sent or
	// received, the handshake timeout) or that a Listener rejected after it
	// (wrong ALPN). Listeners only; a Dialer ignores it. It runs on its own
	// goroutine after the connection is gone and never delays a handshake,
	// but it is called concurrently: it must be safe for that and fast
	// (count, log, hand off). Client-certificate verification itself is
	// unchanged (the tls.Config decides).
	OnHandshakeFailure func(semantics.HandshakeFailure)
}

// WithLimits returns a copy of c with Limits l and the stream credit
// derived from it: the peer may open l.StreamCredit() (l.MaxStreams +
// l.MaxRefusals) streams of each direction type, so semantics.Conn can
// refuse the excess itself (see the package doc). Setting Config.Limits
// has the same effect on the credit.
func (c Config) WithLimits(l semantics.Limits) Config {
	n := int64(l.StreamCredit())
	c.Limits = l
	c.MaxIncomingStreams, c.MaxIncomingUniStreams = n, n
	return c
}

// Validate reports the first invalid field by name.
func (c *Config) Validate() error {
	if err := c.Limits.Validate(); err != nil {
		return fmt.Errorf("quic: Config.Limits: %w", err)
	}
	switch {
	case c.MaxIdleTimeout < 0:
		return fmt.Errorf("quic: Config.MaxIdleTimeout is negative (%v)", c.MaxIdleTimeout)
	case c.HandshakeTimeout < 0:
		return fmt.Errorf("quic: Config.HandshakeTimeout is negative (%v)", c.HandshakeTimeout)
	case c.HandshakeWorkers < 0:
		return fmt.Errorf("quic: Config.HandshakeWorkers is negative (%d)", c.HandshakeWorkers)
	case c.HandshakeQueueWait < 0:
		return fmt.Errorf("quic: Config.HandshakeQueueWait is negative (%v)", c.HandshakeQueueWait)
	case c.MaxIncomingStreams < 0 || c.MaxIncomingStreams > maxStreamCredit:
		return fmt.Errorf("quic: Config.MaxIncomingStreams = %d is outside 0..%d", c.MaxIncomingStreams, maxStreamCredit)
	case c.MaxIncomingUniStreams < 0 || c.MaxIncomingUniStreams > maxStreamCredit:
		return fmt.Errorf("quic: Config.MaxIncomingUniStreams = %d is outside 0..%d", c.MaxIncomingUniStreams, maxStreamCredit)
	case c.StreamReceiveWindow != 0 && c.StreamReceiveWindow < minReceiveWindow:
		return fmt.Errorf("quic: Config.StreamReceiveWindow = %d is below %d", c.StreamReceiveWindow, minReceiveWindow)
	case c.ConnectionReceiveWindow != 0 && c.ConnectionReceiveWindow < minReceiveWindow:
		return fmt.Errorf("quic: Config.ConnectionReceiveWindow = %d is below %d", c.ConnectionReceiveWindow, minReceiveWindow)
	}
	d := c.withDefaults()
	if d.MaxIncomingStreams > maxStreamCredit || d.MaxIncomingUniStreams > maxStreamCredit {
		return fmt.Errorf("quic: the stream credit derived from Config.Limits (%d) is above %d", d.MaxIncomingStreams, maxStreamCredit)
	}
	if d.ConnectionReceiveWindow < d.StreamReceiveWindow {
		return fmt.Errorf("quic: Config.ConnectionReceiveWindow (%d) is below StreamReceiveWindow (%d)",
			d.ConnectionReceiveWindow, d.StreamReceiveWindow)
	}
	if d.KeepAlivePeriod > 0 && d.KeepAlivePeriod >= d.MaxIdleTimeout {
		return fmt.Errorf("quic: Config.KeepAlivePeriod (%v) must be below MaxIdleTimeout (%v)",
			d.KeepAlivePeriod, d.MaxIdleTimeout)
	}
	return nil
}

// WithDefaults returns c with every zero field filled as Listen and Dial
// fill it: the effective configuration (the stream credit derived from
// Limits, the windows, the timeouts). Call Validate first for a Config
// built in code.
func (c Config) WithDefaults() Config { return c.withDefaults() }

// withDefaults returns c with zero fields filled.
//
// A plain zero-means-default field is one cmp.Or (the shared idiom, as in
// backends/yamux's and semantics.Limits.WithDefaults); the fills derived from
// Limits or another field stay spelled out.
func (c Config) withDefaults() Config {
	c.KeepAlivePeriod = cmp.Or(c.KeepAlivePeriod, DefaultKeepAlivePeriod)
	c.MaxIdleTimeout = cmp.Or(c.MaxIdleTimeout, DefaultMaxIdleTimeout)
	c.HandshakeTimeout = cmp.Or(c.HandshakeTimeout, DefaultHandshakeTimeout)
	if c.MaxIncomingStreams == 0 {
		c.MaxIncomingStreams = int64(c.Limits.StreamCredit())
	}
	if c.MaxIncomingUniStreams == 0 {
		c.MaxIncomingUniStreams = int64(c.Limits.StreamCredit())
	}
	c.StreamReceiveWindow = cmp.Or(c.StreamReceiveWindow, DefaultStreamReceiveWindow)
	if c.ConnectionReceiveWindow == 0 {
		c.ConnectionReceiveWindow = max(DefaultConnectionReceiveWindow, c.StreamReceiveWindow)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.MaxHandshakes = cmp.Or(c.MaxHandshakes, DefaultMaxHandshakes)
	if c.HandshakeWorkers == 0 {
		c.HandshakeWorkers = DefaultHandshakeWorkers()
	}
	c.HandshakeQueueWait = cmp.Or(c.HandshakeQueueWait, DefaultHandshakeQueueWait)
	return c
}

// streamCredit is the smaller stream credit of a filled Config.
func (c Config) streamCredit() int { return int(min(c.MaxIncomingStreams, c.MaxIncomingUniStreams)) }

// StreamCredit returns the smaller of the stream credits (bidirectional,
// unidirectional) a connection with c grants the peer: MaxIncomingStreams
// and MaxIncomingUniStreams, or Limits.StreamCredit() when zero.
func (c Config) StreamCredit() int { return c.withDefaults().streamCredit() }

// checked validates c and returns it with defaults filled.
func (c Config) checked() (Config, error) {
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c.withDefaults(), nil
}

// QUICConfig validates c and returns the quic-go configuration it stands
// for (defaults filled, a fresh value on every call). It exists for
// backends/webtransport, which runs HTTP/3 over the same QUIC settings;
// nothing else should need it.
func (c Config) QUICConfig() (*quicgo.Config, error) {
	c, err := c.checked()
	if err != nil {
		return nil, err
	}
	return c.quicConfig(), nil
}

// quicConfig converts a checked Config.
func (c Config) quicConfig() *quicgo.Config {
	keepAlive := c.KeepAlivePeriod
	if keepAlive < 0 {
		keepAlive = 0 // quic-go: 0 = no keepalives
	}
	qc := &quicgo.Config{
		HandshakeIdleTimeout:           c.HandshakeTimeout / 2,
		MaxIdleTimeout:                 c.MaxIdleTimeout,
		KeepAlivePeriod:                keepAlive,
		MaxIncomingStreams:             c.MaxIncomingStreams,
		MaxIncomingUniStreams:          c.MaxIncomingUniStreams,
		InitialStreamReceiveWindow:     min(initialReceiveWindow, c.StreamReceiveWindow),
		MaxStreamReceiveWindow:         c.StreamReceiveWindow,
		InitialConnectionReceiveWindow: min(2*initialReceiveWindow, c.ConnectionReceiveWindow),
		MaxConnectionReceiveWindow:     c.ConnectionReceiveWindow,
	}
	if c.WindowRate >= 0 || c.Budget != nil {
		g := &windowGate{initial: qc.InitialConnectionReceiveWindow, rate: c.WindowRate, budget: c.Budget}
		g.rate = cmp.Or(g.rate, DefaultWindowRate)
		qc.AllowConnectionWindowIncrease = g.allow
	}
	return qc
}

// windowGate is quic-go's AllowConnectionWindowIncrease for one Config:
// a connection's receive window may grow to 2 × MinRTT × rate (rate < 0:
// no bound) and, with a budget, while the budget has room.
type windowGate struct {
	initial uint64
	rate    int64
	budget  *MemoryBudget

	mu      sync.Mutex
	granted map[*quicgo.Conn]uint64 // growth beyond initial per live connection; guarded by mu
}

// allow must not call into the connection beyond its atomic statistics
// (quic-go holds the flow controller's lock).
func (g *windowGate) allow(c *quicgo.Conn, delta uint64) bool {
	if g.rate < 0 {
		return g.budget.allow(c, delta)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	grown := g.granted[c]
	if g.initial+grown+delta > pathWindow(c.ConnectionStats().MinRTT, g.rate) {
		return false
	}
	if g.budget != nil && !g.budget.allow(c, delta) {
		return false
	}
	if g.granted == nil {
		g.granted = make(map[*quicgo.Conn]uint64)
	}
	if _, ok := g.granted[c]; !ok {
		context.AfterFunc(c.Context(), func() {
			g.mu.Lock()
			delete(g.granted, c)
			g.mu.Unlock()
		})
	}
	g.granted[c] = grown + delta
	return true
}

// pathWindow is the largest receive window for a path of minimum RTT rtt
// and rate bytes per second: twice its bandwidth-delay product.
func pathWindow(rtt time.Duration, rate int64) uint64 {
	return uint64(2 * rtt.Seconds() * float64(rate))
}

// MemoryBudget is a receive-memory budget in bytes shared by connections
// (Config.Budget). It is safe for concurrent use. The zero value is a
// budget of 0 bytes: connections keep their initial windows only.
type MemoryBudget struct {
	mu    sync.Mutex
	limit uint64                  // guarded by mu
	used  uint64                  // guarded by mu
	conns map[*quicgo.Conn]uint64 // bytes granted per live connection; guarded by mu
}

// NewMemoryBudget returns a budget of limit bytes.
func NewMemoryBudget(limit uint64) *MemoryBudget {
	return &MemoryBudget{limit: limit}
}

// Used returns the bytes currently granted to live connections.
func (b *MemoryBudget) Used() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// allow is quic-go's AllowConnectionWindowIncrease. It must not call into
// the connection; it only registers a release hook on the conn's context.
func (b *MemoryBudget) allow(c *quicgo.Conn, delta uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used+delta > b.limit {
		return false
	}
	if b.conns == nil {
		b.conns = make(map[*quicgo.Conn]uint64)
	}
	if _, ok := b.conns[c]; !ok {
		context.AfterFunc(c.Context(), func() { b.release(c) })
	}
	b.used += delta
	b.conns[c] += delta
	return true
}

func (b *MemoryBudget) release(c *quicgo.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= b.conns[c]
	delete(b.conns, c)
}

// DefaultHandshakeWorkers is Config.HandshakeWorkers' default: two per CPU
// the Go scheduler runs on, so that a handshake waiting for a packet to be
// sent does not leave a CPU idle.
func DefaultHandshakeWorkers() int { return 2 * runtime.GOMAXPROCS(0) }
