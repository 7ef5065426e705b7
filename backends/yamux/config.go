package yamux

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	hyamux "github.com/hashicorp/yamux"

	"forgeyard.dev/transport/semantics"
)

// ALPN is the TLS application protocol this backend negotiates.
const ALPN = "forgeyard/1"

// Defaults for the zero fields of Config.
const (
	DefaultMaxStreamWindow    = 16 << 20 // bytes
	DefaultKeepAliveInterval  = 10 * time.Second
	DefaultIdleTimeout        = 30 * time.Second
	DefaultWriteTimeout       = 10 * time.Second
	DefaultAcceptBacklog      = 256
	DefaultMaxIncomingStreams = 1024
	DefaultHandshakeTimeout   = 10 * time.Second
	DefaultCloseTimeout       = time.Second
	DefaultNotSentLowat       = 128 << 10 // bytes
	DefaultStreamCloseTimeout = time.Minute

	// BulkChunk is the bulk chunk a Conn asks semantics.NewConn for
	// (semantics.BulkChunkHinter): every write is one yamux frame with a
	// channel hand-off to yamux's send loop and a wake-up of the peer's
	// reader, so 16 KiB chunks (semantics.DefaultBulkChunk) held one
	// stream's bulk to 0.85× raw yamux's 64 KiB writes (docs/perf.md §2).
	BulkChunk = 64 << 10

	// MinStreamWindow is yamux's initial (and smallest allowed) window.
	MinStreamWindow = 256 << 10
)

// Config tunes the backend. The zero value is valid and means "the default"
// for every field. Negative durations and sizes are rejected by Validate,
// except NotSentLowat, where a negative value disables TCP_NOTSENT_LOWAT.
// Listen and Dialer.Dial copy the Config; changing it afterwards has no
// effect.
type Config struct {
	// MaxStreamWindow is the per-stream receive window in bytes (yamux
	// MaxStreamWindowSize). At least MinStreamWindow; 0 means
	// DefaultMaxStreamWindow (16 MiB, enough for ~1 Gbit/s at 100 ms).
	// yamux has no connection-level window: a connection may buffer up to
	// MaxIncomingStreams × MaxStreamWindow bytes from a peer that writes
	// and an application that does not read.
	MaxStreamWindow uint32
	// KeepAliveInterval is how often an idle connection sends a yamux ping
	// so the peer's idle deadline does not fire. 0 means the default (10 s).
	KeepAliveInterval time.Duration
	// IdleTimeout closes the connection with CloseIdleTimeout when nothing
	// at all was received for this long (up to 1/64 longer: the socket's
	// read deadline is moved a few times a second, not on every read). It
	// must exceed KeepAliveInterval. 0 means the default (30 s).
	IdleTimeout time.Duration
	// WriteTimeout bounds every write to the socket (to between it and 1/64
	// more: the write deadline is moved a few times a second, not on every
	// frame) and yamux's wait for its send queue (ConnectionWriteTimeout).
	// A stalled write closes the connection with CloseIdleTimeout. 0 means
	// the default (10 s).
	WriteTimeout time.Duration
	// Limits are the semantics.Limits the semantics.Conn over these
	// connections enforces (zero: the defaults). AcceptBacklog and
	// MaxIncomingStreams are derived from them (below), so give the
	// backend the same Limits as the daemon or agent that serves its
	// connections.
	Limits semantics.Limits
	// AcceptBacklog bounds streams (per direction kind) waiting for
	// AcceptStream/AcceptUniStream; streams beyond it are refused with
	// StreamRefused. It is also yamux's AcceptBacklog, which bounds the
	// peer's streams opened before the first Accept call (yamux resets
	// streams beyond it). 0 means the larger of DefaultAcceptBacklog (256)
	// and Limits.StreamCredit() (MaxStreams + MaxRefusals, 272 for the
	// default Limits), so a burst of every stream the Limits admit fits.
	AcceptBacklog int
	// MaxIncomingStreams is the hard cap of concurrently open
	// peer-initiated streams, a backstop below the semantics layer's limits
	// (yamux itself bounds only windows). Streams above it are refused with
	// StreamRefused. 0 means the larger of DefaultMaxIncomingStreams (1024)
	// and Limits.StreamCredit().
	MaxIncomingStreams int
	// HandshakeTimeout bounds TCP connect, the TLS handshake and the
	// control-stream setup. 0 means the default (10 s).
	HandshakeTimeout time.Duration
	// CloseTimeout bounds how long CloseWithCode waits for its close record
	// to be written and for the peer to drop the connection. 0 means 1 s.
	CloseTimeout time.Duration
	// NotSentLowat sets TCP_NOTSENT_LOWAT (bytes) on the socket, bounding
	// unsent bytes queued in the kernel so control frames do not wait behind
	// megabytes of bulk data. 0 means the default (128 KiB); negative leaves
	// the kernel default (unbounded). Ignored where unsupported.
	NotSentLowat int
	// RecvBuffer, if positive, sets SO_RCVBUF (bytes; the kernel doubles
	// it), which bounds data sent but not yet read by this side's yamux
	// reader and so how long a peer's control frame can queue behind bulk
	// data in this socket. It disables receive-buffer autotuning and caps
	// throughput at about RecvBuffer/RTT, so the default 0 leaves the kernel
	// autotuning on. See docs/perf/backends-yamux.md.
	RecvBuffer int
	// StreamCloseTimeout is how long a stream may stay half-closed after
	// both sides' application is done before yamux forcibly resets it.
	// 0 means 1 minute.
	StreamCloseTimeout time.Duration
	// Logger receives yamux's log lines and this backend's diagnostics.
	// nil discards them; nothing is ever written to stderr.
	Logger *slog.Logger
	// OnHandshakeFailure, when not nil, is called once for every incoming
	// connection whose server handshake failed: the TLS handshake (client
	// certificate rejected or missing, the peer's alert, not TLS, timeout)
	// or, after it, the ALPN check or the HTTP/1.1 Upgrade request (reason
	// protocol, or timeout). Handshakes aborted by Listener.Close are not
	// reported. Listeners only; Dialer ignores it. It is called on the
	// handshake's goroutine, concurrently for different connections, while
	// that handshake holds one of the listener's 64 handshake slots: it must
	// be safe for concurrent use and fast (count, log, hand off).
	OnHandshakeFailure func(semantics.HandshakeFailure)
}

// Validate reports the first invalid field by name.
func (c *Config) Validate() error {
	if err := c.Limits.Validate(); err != nil {
		return fmt.Errorf("yamux: Config.Limits: %w", err)
	}
	if c.MaxStreamWindow != 0 && c.MaxStreamWindow < MinStreamWindow {
		return fmt.Errorf("yamux: Config.MaxStreamWindow %d is below the minimum %d", c.MaxStreamWindow, MinStreamWindow)
	}
	// The fields that must not be negative, in the order they are checked.
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"KeepAliveInterval", int64(c.KeepAliveInterval)},
		{"IdleTimeout", int64(c.IdleTimeout)},
		{"WriteTimeout", int64(c.WriteTimeout)},
		{"AcceptBacklog", int64(c.AcceptBacklog)},
		{"MaxIncomingStreams", int64(c.MaxIncomingStreams)},
		{"HandshakeTimeout", int64(c.HandshakeTimeout)},
		{"CloseTimeout", int64(c.CloseTimeout)},
		{"RecvBuffer", int64(c.RecvBuffer)},
		{"StreamCloseTimeout", int64(c.StreamCloseTimeout)},
	} {
		if f.v < 0 {
			return fmt.Errorf("yamux: Config.%s is negative", f.name)
		}
	}
	d := c.withDefaults()
	if d.IdleTimeout <= d.KeepAliveInterval {
		return fmt.Errorf("yamux: Config.IdleTimeout (%v) must exceed KeepAliveInterval (%v)", d.IdleTimeout, d.KeepAliveInterval)
	}
	return nil
}

// WithDefaults returns c with every zero field filled as Listen and Dial
// fill it: the effective configuration (the accept backlog and stream cap
// derived from Limits, the window, the timeouts). Call Validate first for
// a Config built in code.
func (c Config) WithDefaults() Config { return c.withDefaults() }

// withDefaults returns a copy with zero fields filled.
//
// A plain zero-means-default field is one cmp.Or (the shared idiom, as in
// backends/quic's and semantics.Limits.WithDefaults); the fills derived from
// Limits or another field stay spelled out.
func (c Config) withDefaults() Config {
	c.MaxStreamWindow = cmp.Or(c.MaxStreamWindow, DefaultMaxStreamWindow)
	c.KeepAliveInterval = cmp.Or(c.KeepAliveInterval, DefaultKeepAliveInterval)
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
		if c.IdleTimeout <= c.KeepAliveInterval {
			c.IdleTimeout = 3 * c.KeepAliveInterval
		}
	}
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	if c.AcceptBacklog == 0 {
		c.AcceptBacklog = max(DefaultAcceptBacklog, c.Limits.StreamCredit())
	}
	if c.MaxIncomingStreams == 0 {
		c.MaxIncomingStreams = max(DefaultMaxIncomingStreams, c.Limits.StreamCredit())
	}
	c.HandshakeTimeout = cmp.Or(c.HandshakeTimeout, DefaultHandshakeTimeout)
	c.CloseTimeout = cmp.Or(c.CloseTimeout, DefaultCloseTimeout)
	c.NotSentLowat = cmp.Or(c.NotSentLowat, DefaultNotSentLowat)
	c.StreamCloseTimeout = cmp.Or(c.StreamCloseTimeout, DefaultStreamCloseTimeout)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// prepare validates and fills c.
func (c Config) prepare() (Config, error) {
	if err := c.Validate(); err != nil {
		return Config{}, err
	}
	return c.withDefaults(), nil
}

// yamuxConfig builds the library configuration. yamux's own keepalive is
// off: this package pings from a timer (no goroutine per idle connection)
// and detects dead peers with the socket's idle read deadline.
func (c *Config) yamuxConfig() *hyamux.Config {
	return &hyamux.Config{
		AcceptBacklog:          c.AcceptBacklog,
		EnableKeepAlive:        false,
		KeepAliveInterval:      c.KeepAliveInterval,
		ConnectionWriteTimeout: c.WriteTimeout,
		MaxStreamWindowSize:    c.MaxStreamWindow,
		// No open timeout: yamux would close the session unclassified
		// when an ACK is late. A peer that is alive answers at once (its
		// accept loop never blocks); a dead one is caught by the idle and
		// write deadlines, which name the failure.
		StreamOpenTimeout:  0,
		StreamCloseTimeout: c.StreamCloseTimeout,
		Logger:             slogAdapter{c.Logger},
	}
}

// slogAdapter routes yamux's log.Logger-style lines to slog: "[ERR]" lines
// at Warn (yamux logs peer misbehaviour as errors), everything else at Debug.
type slogAdapter struct{ l *slog.Logger }

func (a slogAdapter) Print(v ...any)                 { a.log(fmt.Sprint(v...)) }
func (a slogAdapter) Println(v ...any)               { a.log(fmt.Sprint(v...)) }
func (a slogAdapter) Printf(format string, v ...any) { a.log(fmt.Sprintf(format, v...)) }

func (a slogAdapter) log(msg string) {
	level := slog.LevelDebug
	if strings.HasPrefix(msg, "[ERR]") {
		level = slog.LevelWarn
	}
	a.l.Log(context.Background(), level, strings.TrimSpace(msg), "backend", "yamux")
}
