package config

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// Daemon defaults (zero values in a Daemon mean these). The timing values
// equal semantics/daemon's Default* constants.
const (
	DefaultDaemonListen      = "0.0.0.0:7443"
	DefaultHeartbeatInterval = 10 * time.Second
	DefaultRenewInterval     = 10 * time.Second
	DefaultLeaseTTL          = 60 * time.Second
	DefaultRevokeGrace       = 15 * time.Second
	DefaultMaxBackoff        = 30 * time.Second
	// MaxAlternateEndpoints bounds alternate_endpoints (the wire bound of
	// RegistrationAcceptedV1 and GoAwayV1).
	MaxAlternateEndpoints = agentwire.MaxAlternateEndpoints
)

// Daemon is the forgeyard-daemon configuration file.
//
//	id = "daemon-1"
//	protocol_min = "1.0"
//	protocol_max = "1.0"
//	alternate_endpoints = ["quic://daemon-2.example:7443"]
//
//	[listen]
//	quic = "0.0.0.0:7443"
//	yamux = "0.0.0.0:7444"         # optional
//	webtransport = "0.0.0.0:443"   # optional
//
//	[tls]
//	certificate = "/etc/forgeyard/server.pem"
//	private_key = "/etc/forgeyard/server-key.pem"
//	client_ca = "/etc/forgeyard/runner-ca.pem"
//
//	[authority]
//	sqlite = "/var/lib/forgeyard/authority.db"
//	# or: postgres_dsn_file = "/etc/forgeyard/postgres.dsn"
//
//	[timing]
//	heartbeat_interval = "10s"
//	renew_interval = "10s"
//	lease_ttl = "60s"
//	revoke_grace = "15s"
//	max_backoff = "30s"
//
//	[log]
//	level = "info"
//	format = "text"
//
//	[admin]                        # optional operator endpoint (see Admin)
//	listen = "127.0.0.1:9464"
//	token_file = "/etc/forgeyard/admin.token"
//	socket = "/run/forgeyard/admin.sock"
type Daemon struct {
	// ID names this daemon in logs and in session records ("": the host
	// name and the first listen address, which a restart keeps: the
	// restarted process finds its predecessor's sessions by it).
	ID string `toml:"id"`
	// ProtocolMin and ProtocolMax bound the versions this daemon accepts
	// (0.0: wire.Supported.Min / Max). ProtocolMin is also the downgrade
	// floor (§274).
	ProtocolMin Version `toml:"protocol_min"`
	ProtocolMax Version `toml:"protocol_max"`
	// Listen holds one address per backend. All empty: QUIC on
	// DefaultDaemonListen.
	Listen Listen `toml:"listen"`
	// TLS names the server credential files. certificate and private_key
	// are required; client_ca is required (agents authenticate with mTLS).
	TLS ServerTLS `toml:"tls"`
	// Authority selects the durable store: exactly one of sqlite and
	// postgres_dsn_file.
	Authority AuthorityConfig `toml:"authority"`
	// Timing sets the intervals the daemon hands to agents.
	Timing Timing `toml:"timing"`
	// AlternateEndpoints are advertised to agents for failover and in
	// GoAway; each is normalized like an agent endpoint.
	AlternateEndpoints []string `toml:"alternate_endpoints"`
	// Log selects the log level and format.
	Log Logging `toml:"log"`
	// Admin configures the operator HTTP endpoint (off when Listen is "").
	Admin Admin `toml:"admin"`
	// Telemetry configures trace export (off by default).
	Telemetry Telemetry `toml:"telemetry"`
	// Enrollment enables runner enrollment and certificate renewal
	// (§20–21) and tunes the revocation check (§224).
	Enrollment Enrollment `toml:"enrollment"`
	// Data: log and CAS storage and their limits.
	Data Data `toml:"data"`
	// Admission: handshake and registration admission control.
	Admission Admission `toml:"admission"`
	// Limits: per-connection stream limits and message rates. Data,
	// Admission and Limits convert to the daemon's one daemon.Limits
	// (internal/setup/daemonsetup.Limits converts them), whose doc lists every limit and its default.
	Limits ConnLimits `toml:"limits"`
}

// Enrollment configures the daemon's runner CA. With an issuing CA the
// listeners also accept connections without a client certificate, on
// which only enrollment is possible.
type Enrollment struct {
	// IssuerCertificate and IssuerPrivateKey are the CA that signs agent
	// certificates (usually the tls.client_ca, or an intermediate under
	// it). Both or neither; neither disables enrollment and renewal.
	IssuerCertificate string `toml:"issuer_certificate"`
	IssuerPrivateKey  string `toml:"issuer_private_key"`
	// CertificateValidity is the lifetime of issued certificates
	// (0: 30 days).
	CertificateValidity Duration `toml:"certificate_validity"`
	// RevocationPoll is how often the daemon re-checks its live sessions
	// against the authority (0: 2s; it bounds how long a revocation made
	// elsewhere takes to close a session here).
	RevocationPoll Duration `toml:"revocation_poll"`
}

// Listen holds per-backend listen addresses ("host:port"; port 0 picks a
// free port). Empty means the backend is not served.
type Listen struct {
	QUIC         string `toml:"quic"`
	Yamux        string `toml:"yamux"`
	WebTransport string `toml:"webtransport"`
	// StatelessResetKeyFile names a file of at least 32 secret bytes
	// keying the QUIC and WebTransport listeners' stateless resets, so
	// agents of a crashed or restarted daemon learn it at their next
	// packet. Empty: the key is derived from tls.private_key (the same
	// across restarts while that file is). Set it to share one key among
	// daemons behind one address.
	StatelessResetKeyFile string `toml:"stateless_reset_key_file"`
}

// Empty reports whether no backend is configured.
func (l Listen) Empty() bool { return l.QUIC == "" && l.Yamux == "" && l.WebTransport == "" }

// ServerTLS names the daemon's PEM files. All three are file paths; inline
// PEM is rejected (§283).
type ServerTLS struct {
	Certificate string `toml:"certificate"`
	PrivateKey  string `toml:"private_key"`
	ClientCA    string `toml:"client_ca"`
	// ReloadInterval is how often the certificate and key files are
	// checked for replacement (0: one minute); SIGHUP reloads at once.
	ReloadInterval Duration `toml:"reload_interval"`
	// Curves restricts the TLS key-exchange groups, in preference order
	// ("x25519mlkem768", "x25519", "p256", "p384", "p521"). Empty: Go's
	// default (the post-quantum hybrid first). ["x25519"] is the
	// opt-in for faster admission (see ParseCurves).
	Curves []string `toml:"curves"`
	// DisableSessionTickets stops issuing TLS session tickets: every
	// agent connection is a full certificate handshake. By default the
	// daemon issues tickets under keys kept in the authority (shared by
	// the daemons of an HA set, surviving restarts), so a reconnecting
	// agent resumes without certificate signatures (issue 25 item 4).
	DisableSessionTickets bool `toml:"disable_session_tickets"`
	// SessionTicketRotation is the daemon's ticket key rotation period
	// (0: DefaultSessionTicketRotation, 24h; 1m–168h): a new key
	// encrypts each period, the keys of the two periods before still
	// decrypt. Every daemon sharing an authority must use the same value.
	// The relay keeps no keys in an authority and refuses the key.
	SessionTicketRotation Duration `toml:"session_ticket_rotation"`
}

// DefaultSessionTicketRotation is the default tls.session_ticket_rotation.
const DefaultSessionTicketRotation = 24 * time.Hour

// Bounds of tls.session_ticket_rotation: crypto/tls never accepts a
// ticket older than seven days, and a key decrypts for three periods.
const (
	MinSessionTicketRotation = time.Minute
	MaxSessionTicketRotation = 7 * 24 * time.Hour
)

// AuthorityConfig selects the authority store.
type AuthorityConfig struct {
	// SQLite is the path of the SQLite database file (created if missing).
	SQLite string `toml:"sqlite"`
	// PostgresDSNFile is the path of a file holding the PostgreSQL DSN
	// (a secret: it usually carries a password, so it is never inline).
	PostgresDSNFile string `toml:"postgres_dsn_file"`
}

// Timing holds the daemon's protocol intervals. Zero fields take the
// Default* constants of this package.
type Timing struct {
	HeartbeatInterval Duration `toml:"heartbeat_interval"`
	RenewInterval     Duration `toml:"renew_interval"`
	LeaseTTL          Duration `toml:"lease_ttl"`
	RevokeGrace       Duration `toml:"revoke_grace"`
	MaxBackoff        Duration `toml:"max_backoff"`
	// MaxHeartbeatsPerSecond is the daemon-wide heartbeat budget (Nomad's
	// max_heartbeats_per_second): an agent registering while n sessions
	// are registered heartbeats every clamp(n / budget,
	// heartbeat_interval, max_heartbeat_interval). 0: 1000; -1: no budget.
	MaxHeartbeatsPerSecond float64 `toml:"max_heartbeats_per_second"`
	// MaxHeartbeatInterval caps the budgeted interval (0: 60s).
	MaxHeartbeatInterval Duration `toml:"max_heartbeat_interval"`
	// HeartbeatGrace is added to the 3 missed intervals before a silent
	// transport is closed (Nomad's heartbeat_grace; 0: none).
	HeartbeatGrace Duration `toml:"heartbeat_grace"`
}

// WithDefaults returns t with zero fields set to the defaults.
func (t Timing) WithDefaults() Timing {
	def := func(d *Duration, v time.Duration) {
		if d.Duration == 0 {
			d.Duration = v
		}
	}
	def(&t.HeartbeatInterval, DefaultHeartbeatInterval)
	def(&t.RenewInterval, DefaultRenewInterval)
	def(&t.LeaseTTL, DefaultLeaseTTL)
	def(&t.RevokeGrace, DefaultRevokeGrace)
	def(&t.MaxBackoff, DefaultMaxBackoff)
	return t
}

// ApplyDefaults fills zero fields with defaults: QUIC on
// DefaultDaemonListen when no backend is configured, the protocol range of
// this build, and the Timing defaults.
func (d *Daemon) ApplyDefaults() {
	if d.Listen.Empty() {
		d.Listen.QUIC = DefaultDaemonListen
	}
	if d.ProtocolMin.IsZero() {
		d.ProtocolMin.ProtocolVersion = wire.Supported.Min
	}
	if d.ProtocolMax.IsZero() {
		d.ProtocolMax.ProtocolVersion = wire.Supported.Max
	}
	d.Timing = d.Timing.WithDefaults()
	if d.TLS.SessionTicketRotation.Duration == 0 {
		d.TLS.SessionTicketRotation.Duration = DefaultSessionTicketRotation
	}
}

// NewLogger is the logger of d's [log] section (cli.RunRole).
func (d *Daemon) NewLogger(w io.Writer) *slog.Logger { return d.Log.NewLogger(w) }

// Validate checks d after ApplyDefaults (call ApplyDefaults first when d
// was built in code). It returns the first problem as an *Error.
//
// The limit keys of [limits], [admission] and [data] are not checked here:
// internal/setup/daemonsetup.Limits converts them to daemon.Limits and
// validates them with its rules, the only copy (this package must not link
// the daemon engine, which the agent and the relay do not link either),
// naming the TOML key of an invalid value.
func (d *Daemon) Validate() error {
	if err := d.Telemetry.Validate(); err != nil {
		return err
	}
	if _, err := ParseCurves("tls.curves", d.TLS.Curves); err != nil {
		return err
	}
	if d.TLS.ReloadInterval.Duration < 0 {
		return invalid("tls.reload_interval", "%v is negative (0: one minute)", d.TLS.ReloadInterval.Duration)
	}
	if r := d.TLS.SessionTicketRotation.Duration; r < MinSessionTicketRotation || r > MaxSessionTicketRotation {
		return invalid("tls.session_ticket_rotation", "%v must be %v–%v (0: the default %v; tls.disable_session_tickets = true turns tickets off)",
			r, MinSessionTicketRotation, MaxSessionTicketRotation, DefaultSessionTicketRotation)
	}
	if d.Listen.Empty() {
		return invalid("listen", "no backend to listen on (set listen.quic, listen.yamux or listen.webtransport)")
	}
	for _, l := range []struct{ key, v string }{
		{"listen.quic", d.Listen.QUIC}, {"listen.yamux", d.Listen.Yamux}, {"listen.webtransport", d.Listen.WebTransport},
	} {
		if err := checkListen(l.key, l.v); err != nil {
			return err
		}
	}
	r := d.Protocol()
	if !r.Valid() {
		return invalid("protocol_min", "%v is above protocol_max %v", d.ProtocolMin.ProtocolVersion, d.ProtocolMax.ProtocolVersion)
	}
	if !wire.Supported.Contains(r.Max) && !wire.Supported.Contains(r.Min) {
		return invalid("protocol_max", "range %v does not overlap what this build supports (%v)", r, wire.Supported)
	}
	for _, f := range []struct{ key, v string }{
		{"tls.certificate", d.TLS.Certificate}, {"tls.private_key", d.TLS.PrivateKey}, {"tls.client_ca", d.TLS.ClientCA},
	} {
		if err := checkFileRef(f.key, f.v); err != nil {
			return err
		}
		if f.v == "" {
			return invalid(f.key, "required: path of a PEM file")
		}
	}
	if err := checkFileRef("authority.sqlite", d.Authority.SQLite); err != nil {
		return err
	}
	if err := checkFileRef("authority.postgres_dsn_file", d.Authority.PostgresDSNFile); err != nil {
		return err
	}
	if strings.Contains(d.Authority.PostgresDSNFile, "://") || strings.Contains(d.Authority.PostgresDSNFile, "password=") {
		return invalid("authority.postgres_dsn_file", "looks like an inline DSN; put the DSN in a file (mode 0600) and give its path (§283)")
	}
	switch {
	case d.Authority.SQLite == "" && d.Authority.PostgresDSNFile == "":
		return invalid("authority", "set exactly one of authority.sqlite and authority.postgres_dsn_file")
	case d.Authority.SQLite != "" && d.Authority.PostgresDSNFile != "":
		return invalid("authority", "authority.sqlite and authority.postgres_dsn_file are mutually exclusive")
	}
	e := d.Enrollment
	if (e.IssuerCertificate == "") != (e.IssuerPrivateKey == "") {
		return invalid("enrollment", "set both enrollment.issuer_certificate and enrollment.issuer_private_key, or neither")
	}
	for _, f := range []struct{ key, v string }{
		{"enrollment.issuer_certificate", e.IssuerCertificate}, {"enrollment.issuer_private_key", e.IssuerPrivateKey},
	} {
		if err := checkFileRef(f.key, f.v); err != nil {
			return err
		}
	}
	if e.CertificateValidity.Duration < 0 || e.RevocationPoll.Duration < 0 {
		return invalid("enrollment", "certificate_validity and revocation_poll must not be negative")
	}
	t := d.Timing
	if t.RenewInterval.Duration >= t.LeaseTTL.Duration {
		return invalid("timing.renew_interval", "%v must be shorter than timing.lease_ttl (%v) so a lease is renewed before it expires", t.RenewInterval.Duration, t.LeaseTTL.Duration)
	}
	if t.HeartbeatInterval.Duration < 10*time.Millisecond {
		return invalid("timing.heartbeat_interval", "%v is below the 10ms minimum", t.HeartbeatInterval.Duration)
	}
	if t.RevokeGrace.Duration > t.LeaseTTL.Duration {
		return invalid("timing.revoke_grace", "%v must not exceed timing.lease_ttl (%v)", t.RevokeGrace.Duration, t.LeaseTTL.Duration)
	}
	if len(d.AlternateEndpoints) > MaxAlternateEndpoints {
		return invalid("alternate_endpoints", "%d entries; at most %d", len(d.AlternateEndpoints), MaxAlternateEndpoints)
	}
	for i, a := range d.AlternateEndpoints {
		if _, err := ParseEndpoint(a); err != nil {
			return invalid(fmt.Sprintf("alternate_endpoints[%d]", i), "%v", err)
		}
	}
	if err := d.Data.Validate(); err != nil {
		return err
	}
	if err := d.Admin.Validate(); err != nil {
		return err
	}
	return d.Log.validate("log.")
}

// AdminListen returns the admin address to bind ("" when off; Validate
// must have passed): Admin.Listen with a missing host set to
// DefaultAdminHost.
func (d *Daemon) AdminListen() string {
	a, _ := AdminAddr("admin.listen", d.Admin.Listen, d.Admin.AllowRemote)
	return a
}

// Protocol returns the configured protocol range.
func (d *Daemon) Protocol() wire.ProtocolRange {
	return wire.ProtocolRange{Min: d.ProtocolMin.ProtocolVersion, Max: d.ProtocolMax.ProtocolVersion}
}

// Alternates returns AlternateEndpoints normalized (Validate must have
// passed).
func (d *Daemon) Alternates() []string {
	out := make([]string, 0, len(d.AlternateEndpoints))
	for _, a := range d.AlternateEndpoints {
		if e, err := ParseEndpoint(a); err == nil {
			out = append(out, e.String())
		}
	}
	return out
}
