package relay

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// Defaults for the zero fields of Config.
const (
	DefaultDialTimeout       = 3 * time.Second
	DefaultMaxConns          = 10000
	DefaultMaxStreamsPerConn = 256
	DefaultCopyBuffer        = 32 << 10
	DefaultHeaderTimeout     = 10 * time.Second
	DefaultCloseGrace        = time.Second
	// DefaultAgentStreamWindow is the per-stream receive window (bytes,
	// yamux Config.MaxStreamWindow) of the relay's agent-facing TLS+yamux
	// listener: forgeyard-relay's limits.stream_window default. It is
	// smaller than the backend's 16 MiB default on purpose. When the
	// relay's QUIC side drains a stream more slowly than the agent fills
	// it (loopback, a busy relay, a slow daemon), the backlog waits in
	// hashicorp/yamux's per-stream receive buffer, a bytes.Buffer that
	// reallocates (a fresh, zeroed slice of twice the backlog) every time
	// its tail is reached with more than half of it unread, until its
	// capacity exceeds twice the window: 53–77 MiB allocated and cleared
	// for a 64 MiB upload at 16 MiB, and the relayed path's CPU per GiB
	// ×1.3–1.4 (docs/perf.md §5). A 2 MiB window bounds that to 7–42 MiB per
	// stream and what one stream holds in the relay to about twice the
	// window, and lets TCP flow control push back on the agent; it still
	// carries 0.75 × 2 MiB / RTT per stream (about 125 Mbit/s at 100 ms).
	DefaultAgentStreamWindow = 2 << 20
	// DefaultBulkChunk is the largest write of a bulk (log, CAS) stream;
	// a control write waits behind at most one chunk per bulk stream.
	DefaultBulkChunk = 16 << 10
)

// Config configures a Relay. The zero value is not usable: Upstreams and
// (unless Dialer is set) UpstreamTLS are required. New validates and copies
// it; zero fields take the Default* constants.
type Config struct {
	// Upstreams are the daemon QUIC endpoints ("host:port"), tried in
	// order for every agent connection: the first that completes a
	// handshake within DialTimeout carries it.
	Upstreams []string
	// UpstreamTLS is the TLS client configuration towards the daemons:
	// RootCAs (the CA of the daemons' server certificate), ServerName
	// (empty: each endpoint's host), and the relay's own
	// client certificate when the daemons require one. The relay's
	// certificate must not carry a forgeyard://runner/ URI: the daemon
	// then treats the connection as relayed and trusts only the agent's
	// RegisterAgentV1.cert_chain and key proof (ARCHITECTURE.md decision
	// 10). Cloned per dial.
	UpstreamTLS *tls.Config
	// UpstreamQUIC tunes the QUIC connections to the daemons.
	UpstreamQUIC quic.Config
	// Dialer, if set, replaces the QUIC dialer built from UpstreamTLS and
	// UpstreamQUIC (tests; other upstream backends).
	Dialer semantics.BackendDialer
	// DialTimeout bounds one upstream dial attempt. 0: DefaultDialTimeout.
	DialTimeout time.Duration
	// MaxConns bounds concurrent agent connections; beyond it agents are
	// closed with wire.CloseOverloaded. 0: DefaultMaxConns.
	MaxConns int
	// MaxStreamsPerConn bounds the streams in flight on one agent
	// connection, both directions together; a stream beyond it is reset
	// with semantics.StreamRefused (the connection is not harmed).
	// 0: DefaultMaxStreamsPerConn.
	MaxStreamsPerConn int
	// CopyBuffer is the buffer of one copy direction of one stream, so a
	// connection buffers at most 2 × MaxStreamsPerConn × CopyBuffer bytes
	// in the relay. 0: DefaultCopyBuffer.
	CopyBuffer int
	// HeaderTimeout bounds the wait for a new stream's StreamHeader; a
	// stream that does not send it in time is reset with
	// semantics.StreamProtocolError. 0: DefaultHeaderTimeout.
	HeaderTimeout time.Duration
	// CloseGrace is how long, after one side closed, the relay keeps
	// writing what it already read from that side before it closes the
	// other side with the same code. 0: DefaultCloseGrace.
	CloseGrace time.Duration
	// BulkQueueThreshold and BulkMaxWait tune the pacing of bulk streams
	// behind control streams (see the package doc); 0 means
	// semantics.DefaultBulkQueueThreshold and semantics.DefaultBulkMaxWait; a
	// negative BulkQueueThreshold ignores the backend queue (BulkHinter).
	BulkQueueThreshold int
	BulkMaxWait        time.Duration
	// Logger receives connection events (never payloads); nil discards.
	Logger *slog.Logger
	// Registerer, if set, receives the relay's Prometheus collectors
	// (forgeyard_relay_*). Registering twice on one registry fails New.
	Registerer prometheus.Registerer
}

// orDefault sets *v to def when it is zero (Config's zero-means-default
// fields).
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

func (c Config) withDefaults() (Config, error) {
	if len(c.Upstreams) == 0 {
		return c, errors.New("relay: Config.Upstreams is empty")
	}
	for i, u := range c.Upstreams {
		if u == "" {
			return c, fmt.Errorf("relay: Config.Upstreams[%d] is empty", i)
		}
	}
	for _, f := range []struct {
		name     string
		negative bool
	}{
		{"DialTimeout", c.DialTimeout < 0},
		{"MaxConns", c.MaxConns < 0},
		{"MaxStreamsPerConn", c.MaxStreamsPerConn < 0},
		{"CopyBuffer", c.CopyBuffer < 0},
		{"HeaderTimeout", c.HeaderTimeout < 0},
		{"CloseGrace", c.CloseGrace < 0},
		{"BulkMaxWait", c.BulkMaxWait < 0},
	} {
		if f.negative {
			return c, errors.New("relay: Config." + f.name + " is negative")
		}
	}
	orDefault(&c.DialTimeout, DefaultDialTimeout)
	orDefault(&c.HeaderTimeout, DefaultHeaderTimeout)
	orDefault(&c.CloseGrace, DefaultCloseGrace)
	orDefault(&c.BulkMaxWait, semantics.DefaultBulkMaxWait)
	orDefault(&c.MaxConns, DefaultMaxConns)
	orDefault(&c.MaxStreamsPerConn, DefaultMaxStreamsPerConn)
	orDefault(&c.CopyBuffer, DefaultCopyBuffer)
	orDefault(&c.BulkQueueThreshold, semantics.DefaultBulkQueueThreshold)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Dialer == nil {
		if c.UpstreamTLS == nil {
			return c, errors.New("relay: Config.UpstreamTLS is required (RootCAs of the daemons)")
		}
		if err := c.UpstreamQUIC.Validate(); err != nil {
			return c, fmt.Errorf("relay: Config.UpstreamQUIC: %w", err)
		}
	}
	c.Upstreams = append([]string(nil), c.Upstreams...)
	return c, nil
}

// dialers returns one dialer per upstream: c.Dialer for all, or QUIC
// dialers whose TLS ServerName defaults to the endpoint's host.
func (c Config) dialers() []semantics.BackendDialer {
	out := make([]semantics.BackendDialer, len(c.Upstreams))
	for i, addr := range c.Upstreams {
		if c.Dialer != nil {
			out[i] = c.Dialer
			continue
		}
		tc := c.UpstreamTLS.Clone()
		if tc.ServerName == "" {
			if host, _, err := net.SplitHostPort(addr); err == nil {
				tc.ServerName = host
			}
		}
		out[i] = quic.Dialer{TLS: tc, Config: c.UpstreamQUIC}
	}
	return out
}

// Relay carries agent connections to daemons: for every agent connection
// accepted by Serve it dials one upstream connection and copies streams
// one-to-one in both directions (see the package doc). Safe for concurrent
// use.
type Relay struct {
	cfg     Config
	m       *metrics
	dialers []semantics.BackendDialer // by Upstreams index

	ctx    context.Context // cancelled by Shutdown: connections close
	cancel context.CancelFunc

	mu        sync.Mutex
	listeners map[semantics.BackendListener]struct{}
	closed    bool
	conns     sync.WaitGroup // every handle goroutine and Serve loop
	active    atomic.Int64

	st   stats
	bufs sync.Pool // copy buffers of CopyBuffer bytes
}

type stats struct {
	accepted, refused, dialFailures, streams, streamsRefused atomic.Int64
	toDaemon, toAgent                                        atomic.Int64
}

// Stats are a Relay's counters since New.
type Stats struct {
	Active         int64 // agent connections currently relayed
	Accepted       int64 // agent connections accepted (before admission)
	Refused        int64 // agent connections closed with CloseOverloaded
	DialFailures   int64 // failed upstream dial attempts (one per endpoint tried)
	Streams        int64 // streams copied (both openers)
	StreamsRefused int64 // streams reset with StreamRefused (per-connection limit)
	BytesToDaemon  int64
	BytesToAgent   int64
}

// New validates cfg and returns a Relay that serves nothing yet (see
// Serve). It fails on an invalid Config or when registering the metrics
// fails.
func New(cfg Config) (*Relay, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	r := &Relay{cfg: cfg, m: m, dialers: cfg.dialers(), listeners: map[semantics.BackendListener]struct{}{}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	return r, nil
}

// ErrClosed is returned by Serve after Shutdown or Close.
var ErrClosed = errors.New("relay: closed")

// Serve accepts agent connections from l until ctx is done, l fails, or
// the Relay shuts down, and relays each one. It may run concurrently for
// several listeners (typically one TLS+yamux and one WebTransport). It
// returns nil after Shutdown/Close, ctx's error when ctx ended, or l's
// Accept error. Serve does not close l; Shutdown does (so a pending Accept
// returns). Connections accepted by Serve outlive ctx: they end with
// Shutdown or Close.
func (r *Relay) Serve(ctx context.Context, l semantics.BackendListener) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrClosed
	}
	r.listeners[l] = struct{}{}
	r.conns.Add(1)
	r.mu.Unlock()
	defer r.conns.Done()
	defer func() {
		r.mu.Lock()
		delete(r.listeners, l)
		r.mu.Unlock()
	}()
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(r.ctx, cancel)
	defer stop()
	// This accept loop has the shape of semantics/daemon's Serve, but the
	// relay's own closed flag and context decide when an Accept error is the
	// end (the relay does not import the daemon).
	for {
		bc, err := l.Accept(actx)
		if err != nil {
			r.mu.Lock()
			closed := r.closed
			r.mu.Unlock()
			if closed || r.ctx.Err() != nil {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("relay: accept: %w", err)
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_ = bc.CloseWithCode(wire.CloseShutdown, "relay shutting down")
			return nil
		}
		r.conns.Add(1)
		r.mu.Unlock()
		go func() {
			defer r.conns.Done()
			r.handle(bc)
		}()
	}
}

// ServeConn relays one agent connection accepted elsewhere, returning when
// it ended (both sides closed). It applies the same admission limit as
// Serve.
func (r *Relay) ServeConn(bc semantics.BackendConn) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		_ = bc.CloseWithCode(wire.CloseShutdown, "relay shutting down")
		return
	}
	r.conns.Add(1)
	r.mu.Unlock()
	defer r.conns.Done()
	r.handle(bc)
}

// Shutdown stops accepting (closing the listeners given to Serve), closes
// every relayed connection on both sides with wire.CloseShutdown so agents
// reconnect elsewhere, and waits for the relay's goroutines until ctx is
// done. Idempotent.
func (r *Relay) Shutdown(ctx context.Context) error {
	r.mu.Lock()
	r.closed = true
	ls := make([]semantics.BackendListener, 0, len(r.listeners))
	for l := range r.listeners {
		ls = append(ls, l)
	}
	r.mu.Unlock()
	for _, l := range ls {
		_ = l.Close()
	}
	r.cancel()
	done := make(chan struct{})
	go func() {
		r.conns.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("relay: shutdown: %w", ctx.Err())
	}
}

// Close is Shutdown bounded by 10 s.
func (r *Relay) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return r.Shutdown(ctx)
}

// Stats returns a snapshot of the counters.
func (r *Relay) Stats() Stats {
	return Stats{
		Active: r.active.Load(), Accepted: r.st.accepted.Load(), Refused: r.st.refused.Load(),
		DialFailures: r.st.dialFailures.Load(), Streams: r.st.streams.Load(), StreamsRefused: r.st.streamsRefused.Load(),
		BytesToDaemon: r.st.toDaemon.Load(), BytesToAgent: r.st.toAgent.Load(),
	}
}

// handle admits, dials and relays one agent connection.
func (r *Relay) handle(agent semantics.BackendConn) {
	backend := agent.Backend()
	r.st.accepted.Add(1)
	r.m.conns.WithLabelValues(backend).Inc()
	if n := r.active.Add(1); n > int64(r.cfg.MaxConns) {
		r.active.Add(-1)
		r.st.refused.Add(1)
		r.m.refused.WithLabelValues(backend, "connection").Inc()
		r.cfg.Logger.Warn("relay: connection limit reached; refusing agent", "backend", backend,
			"remote", agent.RemoteAddr().String(), "max_conns", r.cfg.MaxConns)
		_ = agent.CloseWithCode(wire.CloseOverloaded, "relay: connection limit reached")
		return
	}
	defer r.active.Add(-1)
	gauge := r.m.active.WithLabelValues(backend)
	gauge.Inc()
	defer gauge.Dec()

	// The dial ends early when the agent leaves or the relay shuts down.
	dctx, cancel := context.WithCancel(r.ctx)
	stop := context.AfterFunc(agent.Context(), cancel)
	up, addr, err := r.dial(dctx, backend)
	stop()
	cancel()
	if err != nil {
		code, reason := wire.CloseShutdown, "relay: no daemon endpoint reachable"
		var ce *semantics.ConnError
		if errors.As(err, &ce) && ce.Remote {
			code, reason = ce.Code, ce.Reason // the daemon refused: tell the agent why
		}
		if r.ctx.Err() != nil {
			reason = "relay shutting down"
		}
		r.cfg.Logger.Warn("relay: upstream unavailable; closing agent", "backend", backend,
			"remote", agent.RemoteAddr().String(), "code", code, "err", err)
		_ = agent.CloseWithCode(code, reason)
		return
	}
	r.cfg.Logger.Debug("relay: connection relayed", "backend", backend, "remote", agent.RemoteAddr().String(), "upstream", addr)
	p := newPair(r, agent, up, backend)
	p.run()
}

// dial tries the upstreams in order, each bounded by DialTimeout.
func (r *Relay) dial(ctx context.Context, backend string) (semantics.BackendConn, string, error) {
	var errs []error
	for i, addr := range r.cfg.Upstreams {
		if ctx.Err() != nil {
			break
		}
		dctx, cancel := context.WithTimeout(ctx, r.cfg.DialTimeout)
		bc, err := r.dialers[i].Dial(dctx, addr)
		cancel()
		if err == nil {
			return bc, addr, nil
		}
		r.st.dialFailures.Add(1)
		r.m.dialFailures.Inc()
		r.cfg.Logger.Info("relay: upstream dial failed", "upstream", addr, "backend", backend, "err", err)
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		var ce *semantics.ConnError
		if errors.As(err, &ce) && ce.Remote && ce.Code == wire.CloseAuthenticationFailure {
			// The daemons share a trust configuration: a relay certificate
			// refused by one is refused by all.
			break
		}
	}
	if len(errs) == 0 {
		return nil, "", ctx.Err()
	}
	return nil, "", errors.Join(errs...)
}
