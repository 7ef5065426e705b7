package config

import (
	"fmt"
	"io"
	"log/slog"
	"time"
)

// Relay defaults (zero values in a Relay mean these). The limits equal
// relay.Default* (package relay imports backends, so config cannot import
// it; a test keeps them equal).
const (
	// DefaultRelayListenYamux is TCP 443: a stock corporate proxy allows
	// CONNECT to port 443 only, and the one listener serves both forms of
	// TLS+yamux (raw, ALPN forgeyard/1, and the HTTP/1.1 Upgrade form,
	// ALPN http/1.1), so relay+yamux://host:443 and
	// relay+yamux+upgrade://host:443 both reach it. Binding 443 needs root
	// or CAP_NET_BIND_SERVICE.
	DefaultRelayListenYamux       = "0.0.0.0:443"
	DefaultRelayDialTimeout       = 3 * time.Second
	DefaultRelayMaxConnections    = 10000
	DefaultRelayMaxStreamsPerConn = 256
	DefaultRelayCopyBuffer        = 32 << 10
	DefaultRelayShutdownTimeout   = 10 * time.Second
	maxRelayCopyBuffer            = 1 << 20
	maxRelayStreamsPerConn        = 1 << 16
	maxRelayUpstreams             = 32
	minRelayCopyBuffer            = 1 << 10
	maxRelayDialTimeout           = time.Minute
	maxRelayMaxConnections        = 1 << 20
	relayEndpointKey              = "upstream.endpoints[%d]"
)

const (
	// DefaultRelayStreamWindow is limits.stream_window: the per-stream
	// receive window of the agent-facing TLS+yamux listener (equal to
	// relay.DefaultAgentStreamWindow, whose doc says why it is below the
	// backend's 16 MiB).
	DefaultRelayStreamWindow = 2 << 20
	// The stream window's range: yamux's smallest window, and the
	// backend's default (enough for ~1 Gbit/s at 100 ms).
	minRelayStreamWindow = 256 << 10
	maxRelayStreamWindow = 16 << 20
)

// Relay is the forgeyard-relay configuration file.
//
//	[listen]                          # agent-facing; at least one
//	yamux = "0.0.0.0:443"             # TLS+yamux over TCP, raw and HTTP Upgrade form
//	webtransport = "0.0.0.0:443"      # WebTransport over HTTP/3 (UDP 443; no clash with TCP 443)
//
//	[tls]                             # agent-facing server credential (mTLS)
//	certificate = "/etc/forgeyard/relay-server.pem"
//	private_key = "/etc/forgeyard/relay-server-key.pem"
//	client_ca = "/etc/forgeyard/runner-ca.pem"
//
//	[upstream]                        # the daemons, over QUIC
//	endpoints = ["quic://daemon-1.example:7443", "quic://daemon-2.example:7443"]
//	ca = "/etc/forgeyard/daemon-ca.pem"
//	certificate = "/etc/forgeyard/relay-client.pem"   # names no runner
//	private_key = "/etc/forgeyard/relay-client-key.pem"
//	server_name = ""                  # default: each endpoint's host
//	dial_timeout = "3s"
//
//	[limits]
//	max_connections = 10000
//	max_streams_per_connection = 256
//	copy_buffer = 32768
//	stream_window = 2097152           # TLS+yamux per-stream receive window towards agents
//
//	[log]
//	level = "info"
//
//	[admin]
//	listen = "127.0.0.1:9465"         # /metrics, /healthz
type Relay struct {
	// Listen holds the agent-facing addresses; QUIC is not served (agents
	// that can use QUIC reach the daemon directly). All empty: yamux on
	// DefaultRelayListenYamux.
	Listen RelayListen `toml:"listen"`
	// TLS is the agent-facing server credential; client_ca (the CA of
	// agent certificates) is required: agents authenticate with mTLS.
	TLS ServerTLS `toml:"tls"`
	// Upstream describes the daemons and the relay's credential towards
	// them.
	Upstream RelayUpstream `toml:"upstream"`
	// Limits bound the relay's resources.
	Limits RelayLimits `toml:"limits"`
	// ShutdownTimeout bounds a graceful shutdown (0: 10s).
	ShutdownTimeout Duration `toml:"shutdown_timeout"`
	Log             Logging  `toml:"log"`
	// Admin serves /metrics and /healthz (off when Listen is "").
	Admin Admin `toml:"admin"`
}

// RelayListen holds the relay's agent-facing listen addresses.
type RelayListen struct {
	Yamux        string `toml:"yamux"`
	WebTransport string `toml:"webtransport"`
}

// RelayUpstream is the daemon side of the relay.
type RelayUpstream struct {
	// Endpoints are daemon QUIC endpoints ("quic://host[:port]" or
	// "host:port"), tried in order for every agent connection.
	Endpoints []string `toml:"endpoints"`
	// CA is the PEM file of the CA that signs the daemons' server
	// certificates (empty: the system roots).
	CA string `toml:"ca"`
	// Certificate and PrivateKey are the relay's client certificate towards
	// the daemons (both or neither). It must be signed by a CA in the
	// daemons' tls.client_ca and must not carry a forgeyard://runner/ URI.
	Certificate string `toml:"certificate"`
	PrivateKey  string `toml:"private_key"`
	// ServerName overrides the name checked in the daemons' certificates.
	ServerName string `toml:"server_name"`
	// DialTimeout bounds one dial attempt per endpoint (0: 3s).
	DialTimeout Duration `toml:"dial_timeout"`
}

// RelayLimits are the relay's limits; zero fields take the defaults.
type RelayLimits struct {
	MaxConnections          int `toml:"max_connections"`
	MaxStreamsPerConnection int `toml:"max_streams_per_connection"`
	CopyBuffer              int `toml:"copy_buffer"`
	// StreamWindow is the per-stream receive window (bytes) of the
	// agent-facing TLS+yamux listener: what one agent stream can have in
	// flight towards the relay, so agent → relay goodput per stream is at
	// most about 0.75 × StreamWindow / RTT, and what one backlogged stream
	// holds in the relay (its buffer grows to about twice the window).
	StreamWindow int `toml:"stream_window"`
}

// ApplyDefaults fills zero fields with the defaults.
func (r *Relay) ApplyDefaults() {
	if r.Listen.Yamux == "" && r.Listen.WebTransport == "" {
		r.Listen.Yamux = DefaultRelayListenYamux
	}
	if r.Upstream.DialTimeout.Duration == 0 {
		r.Upstream.DialTimeout.Duration = DefaultRelayDialTimeout
	}
	if r.Limits.MaxConnections == 0 {
		r.Limits.MaxConnections = DefaultRelayMaxConnections
	}
	if r.Limits.MaxStreamsPerConnection == 0 {
		r.Limits.MaxStreamsPerConnection = DefaultRelayMaxStreamsPerConn
	}
	if r.Limits.CopyBuffer == 0 {
		r.Limits.CopyBuffer = DefaultRelayCopyBuffer
	}
	if r.Limits.StreamWindow == 0 {
		r.Limits.StreamWindow = DefaultRelayStreamWindow
	}
	if r.ShutdownTimeout.Duration == 0 {
		r.ShutdownTimeout.Duration = DefaultRelayShutdownTimeout
	}
}

// Validate checks r after ApplyDefaults and returns the first problem as
// an *Error.
func (r *Relay) Validate() error {
	if _, err := ParseCurves("tls.curves", r.TLS.Curves); err != nil {
		return err
	}
	if r.TLS.ReloadInterval.Duration < 0 {
		return invalid("tls.reload_interval", "%v is negative (0: one minute)", r.TLS.ReloadInterval.Duration)
	}
	if r.TLS.SessionTicketRotation.Duration != 0 {
		return invalid("tls.session_ticket_rotation", "is a daemon key: the relay has no authority to keep ticket keys in "+
			"(its session tickets use per-process keys that Go rotates daily); remove it, or set tls.disable_session_tickets = true")
	}
	if r.Listen.Yamux == "" && r.Listen.WebTransport == "" {
		return invalid("listen", "no agent-facing backend (set listen.yamux or listen.webtransport)")
	}
	if err := checkListen("listen.yamux", r.Listen.Yamux); err != nil {
		return err
	}
	if err := checkListen("listen.webtransport", r.Listen.WebTransport); err != nil {
		return err
	}
	for _, f := range []struct {
		key, v   string
		required bool
	}{
		{"tls.certificate", r.TLS.Certificate, true}, {"tls.private_key", r.TLS.PrivateKey, true},
		{"tls.client_ca", r.TLS.ClientCA, true}, {"upstream.ca", r.Upstream.CA, false},
		{"upstream.certificate", r.Upstream.Certificate, false}, {"upstream.private_key", r.Upstream.PrivateKey, false},
	} {
		if err := checkFileRef(f.key, f.v); err != nil {
			return err
		}
		if f.required && f.v == "" {
			return invalid(f.key, "required: path of a PEM file")
		}
	}
	if (r.Upstream.Certificate == "") != (r.Upstream.PrivateKey == "") {
		return invalid("upstream.certificate", "upstream.certificate and upstream.private_key go together (the relay's client certificate towards the daemons)")
	}
	if len(r.Upstream.Endpoints) == 0 {
		return invalid("upstream.endpoints", "required: at least one daemon QUIC endpoint, e.g. [\"quic://daemon.example:7443\"]")
	}
	if len(r.Upstream.Endpoints) > maxRelayUpstreams {
		return invalid("upstream.endpoints", "%d entries; at most %d", len(r.Upstream.Endpoints), maxRelayUpstreams)
	}
	for i, s := range r.Upstream.Endpoints {
		e, err := ParseEndpoint(s)
		if err != nil {
			return invalid(fmt.Sprintf(relayEndpointKey, i), "%v", err)
		}
		if e.Backend != BackendQUIC {
			return invalid(fmt.Sprintf(relayEndpointKey, i), "%q: the relay reaches daemons over QUIC only (quic://host[:port])", s)
		}
	}
	if d := r.Upstream.DialTimeout.Duration; d > maxRelayDialTimeout {
		return invalid("upstream.dial_timeout", "%v is above the %v maximum (a dead endpoint would stall every agent that long)", d, maxRelayDialTimeout)
	}
	l := r.Limits
	switch {
	case l.MaxConnections < 0 || l.MaxConnections > maxRelayMaxConnections:
		return invalid("limits.max_connections", "%d out of range 1–%d", l.MaxConnections, maxRelayMaxConnections)
	case l.MaxStreamsPerConnection < 0 || l.MaxStreamsPerConnection > maxRelayStreamsPerConn:
		return invalid("limits.max_streams_per_connection", "%d out of range 1–%d", l.MaxStreamsPerConnection, maxRelayStreamsPerConn)
	case l.CopyBuffer < minRelayCopyBuffer || l.CopyBuffer > maxRelayCopyBuffer:
		return invalid("limits.copy_buffer", "%d bytes out of range %d–%d", l.CopyBuffer, minRelayCopyBuffer, maxRelayCopyBuffer)
	case l.StreamWindow < minRelayStreamWindow || l.StreamWindow > maxRelayStreamWindow:
		return invalid("limits.stream_window", "%d bytes out of range %d–%d", l.StreamWindow, minRelayStreamWindow, maxRelayStreamWindow)
	}
	if _, err := AdminAddr("admin.listen", r.Admin.Listen, r.Admin.AllowRemote); err != nil {
		return err
	}
	// The [admin] section is the daemon's shape; the relay's endpoint
	// serves only /metrics and /healthz over TCP, without a token. A key
	// it would silently ignore is refused instead.
	const unused = "is not used by forgeyard-relay (its admin endpoint serves only /metrics and /healthz, on admin.listen, without a token); remove it"
	switch {
	case r.Admin.TokenFile != "":
		return invalid("admin.token_file", unused)
	case r.Admin.PublicMetrics:
		return invalid("admin.public_metrics", unused)
	case r.Admin.Socket != "":
		return invalid("admin.socket", unused)
	case r.Admin.Pprof:
		return invalid("admin.pprof", unused)
	}
	return r.Log.validate("log.")
}

// NewLogger is the logger of r's [log] section (cli.RunRole).
func (r *Relay) NewLogger(w io.Writer) *slog.Logger { return r.Log.NewLogger(w) }

// UpstreamAddrs returns the upstream endpoints as "host:port" (Validate
// must have passed).
func (r *Relay) UpstreamAddrs() []string {
	out := make([]string, 0, len(r.Upstream.Endpoints))
	for _, s := range r.Upstream.Endpoints {
		if e, err := ParseEndpoint(s); err == nil {
			out = append(out, e.HostPort)
		}
	}
	return out
}

// AdminListen returns the admin address to bind ("" when off; Validate
// must have passed).
func (r *Relay) AdminListen() string {
	a, _ := AdminAddr("admin.listen", r.Admin.Listen, r.Admin.AllowRemote)
	return a
}
