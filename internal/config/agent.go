package config

import (
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"time"

	agentwire "forgeyard.dev/transport/wire/agent"
)

// Agent defaults.
const (
	DefaultMaxParallel = 1
	DefaultBackoffBase = 500 * time.Millisecond
	DefaultBackoffMax  = 60 * time.Second
	// DefaultAuthBackoffAfter and DefaultAuthBackoffMax equal
	// semantics/agent's (config imports no semantics package).
	DefaultAuthBackoffAfter = 3
	DefaultAuthBackoffMax   = time.Hour
	// DefaultKeepAliveInterval equals yamux.DefaultKeepAliveInterval.
	DefaultKeepAliveInterval = 10 * time.Second
	minKeepAliveInterval     = time.Second
	maxKeepAliveInterval     = 5 * time.Minute
	// MaxEndpoints bounds control_plane.endpoints.
	MaxEndpoints = 16
)

// Agent is the forgeyard-agent configuration file.
//
//	max_parallel = 2
//	heartbeat_misses = 3       # optional (default shown)
//
//	[control_plane]
//	endpoints = ["quic://forgeyard.example.internal:7443",
//	             "yamux://forgeyard.example.internal:7444",
//	             "webtransport://forgeyard.example.internal:443",
//	             "relay+yamux://relay.example.internal:443"]   # raced last
//	server_name = "forgeyard.example.internal"
//
//	[control_plane.credential]
//	certificate = "/etc/forgeyard/agent.pem"
//	private_key = "/etc/forgeyard/agent-key.pem"
//	ca = "/etc/forgeyard/ca.pem"
//
//	[capabilities]
//	labels = ["linux", "docker"]
//	tools = ["go"]
//
//	[backoff]
//	base = "500ms"
//	max = "60s"
//	auth_after = 3             # a proxy's 407 this many rounds in a row …
//	auth_max = "1h"            # … then 30–60s doubling up to this
//
//	[control_plane] keys for TCP endpoints (yamux, yamux+upgrade, relay+…):
//	keepalive_interval = "10s" # ping interval; shortened automatically
//	disable_keepalive_adapt = false  # when the network cuts idle tunnels
//
//	[log]
//	level = "info"
//
//	[fallback]                 # all optional (defaults shown)
//	class_stagger = ["250ms", "250ms", "500ms"]
//	endpoint_stagger = []      # e.g. ["500ms"] for HA daemons
//	memory_ttl = "30m"
//	probe_interval = "30s"
//	probe_successes = 3
//	disable_memory = false
//	disable_probe = false
type Agent struct {
	// ControlPlane says where the daemon is and how to authenticate.
	ControlPlane ControlPlane `toml:"control_plane"`
	// Capabilities is advertised at registration. Zero os/arch: this
	// machine's runtime.GOOS/GOARCH; zero max_parallel: MaxParallel.
	Capabilities Capabilities `toml:"capabilities"`
	// MaxParallel is how many attempts run at once (0: DefaultMaxParallel;
	// at most 65535).
	MaxParallel int `toml:"max_parallel"`
	// HeartbeatMisses: with no heartbeat ack for this many heartbeat
	// intervals (the daemon's) the agent treats the link as dead and
	// reconnects (0: 3; -1: off, the transport's idle timeout decides; at
	// most 1000). See semantics/agent Config.HeartbeatMisses.
	HeartbeatMisses int `toml:"heartbeat_misses"`
	// Backoff bounds reconnect delays (exponential with full jitter; the
	// daemon's max_backoff overrides Max once registered).
	Backoff Backoff `toml:"backoff"`
	// Log selects the log level and format.
	Log Logging `toml:"log"`
	// Fallback tunes the backend race and the move back (semantics/agent
	// Fallback; zero values mean its defaults).
	Fallback Fallback `toml:"fallback"`
	// Telemetry configures trace export (off by default).
	Telemetry Telemetry `toml:"telemetry"`
}

// Fallback mirrors agent.Fallback.
type Fallback struct {
	// ClassStagger: start offset of each backend class after the previous
	// (QUIC → WebTransport → TLS+yamux → relay); the last entry repeats.
	// Empty: 250ms, 250ms, 500ms. The daemon's registration answer
	// overrides it.
	ClassStagger []Duration `toml:"class_stagger"`
	// EndpointStagger: endpoints of the same class (a failover list, e.g.
	// two HA daemons over QUIC) start this long after the previous one
	// started, instead of once it failed; entry i is the gap before the
	// (i+2)-th, the last entry repeats. Empty: sequential failover. With
	// a daemon that died (no answer at all) the next endpoint is otherwise
	// tried only after the dead one's handshake timeout (5 s over QUIC).
	EndpointStagger []Duration `toml:"endpoint_stagger"`
	// MemoryTTL: how long the last good backend is remembered per network
	// (0: 30m).
	MemoryTTL Duration `toml:"memory_ttl"`
	// DisableMemory turns the per-network memory off.
	DisableMemory bool `toml:"disable_memory"`
	// ProbeInterval: how often a better backend is probed while on a
	// fallback (0: 30s).
	ProbeInterval Duration `toml:"probe_interval"`
	// DisableProbe turns the background probe, and so the move back, off.
	DisableProbe bool `toml:"disable_probe"`
	// ProbeSuccesses: consecutive good probes needed to move back (0: 3).
	ProbeSuccesses int `toml:"probe_successes"`
}

// Proxy settings of ControlPlane.Proxy.
const (
	// ProxyFromEnvironment (the empty string) uses HTTPS_PROXY/NO_PROXY.
	ProxyFromEnvironment = ""
	// ProxyNone dials every TCP endpoint directly.
	ProxyNone = "none"
)

// ControlPlane is the agent's view of the daemon(s).
type ControlPlane struct {
	// Endpoints are tried in order with failover; at least one, at most
	// MaxEndpoints. See ParseEndpoint for the accepted forms.
	Endpoints []string `toml:"endpoints"`
	// ServerName is checked against the daemon certificate ("": the
	// endpoint's host).
	ServerName string `toml:"server_name"`
	// Credential names the agent's PEM files.
	Credential Credential `toml:"credential"`
	// Proxy is the HTTP CONNECT proxy for the TCP endpoints (yamux,
	// yamux+upgrade and their relay forms; UDP endpoints never use it):
	// "" (ProxyFromEnvironment) reads HTTPS_PROXY/https_proxy and
	// NO_PROXY/no_proxy, "none" dials directly, and
	// "http://[user:pass@]host:port" names the proxy (basic auth from the
	// userinfo).
	Proxy string `toml:"proxy"`
	// NoProxy lists targets reached directly when Proxy names a proxy
	// (NO_PROXY syntax: hosts, .domains, IPs, CIDRs, "*").
	NoProxy string `toml:"no_proxy"`
	// KeepAliveInterval is how often the agent pings over its TCP
	// endpoints' connections (TLS+yamux, direct, through the proxy, or to
	// a relay) so that a proxy or NAT that drops idle tunnels does not cut
	// them (0: DefaultKeepAliveInterval, 10s; 1s–5m). UDP endpoints (QUIC,
	// WebTransport) keep their own.
	KeepAliveInterval Duration `toml:"keepalive_interval"`
	// DisableKeepAliveAdapt keeps KeepAliveInterval fixed. By default an
	// agent whose connection is lost after ≥ 2 s of silence below the
	// interval halves its keepalive to below that time (at least 1s) at
	// once, logs it once, and tries the configured interval again after
	// 30 min (internal/setup/agentsetup/keepalive.go).
	DisableKeepAliveAdapt bool `toml:"disable_keepalive_adapt"`
	// Curves restricts the TLS key-exchange groups the agent offers, like
	// the daemon's tls.curves (empty: Go's default, the post-quantum
	// hybrid first; ["x25519"]: the faster opt-in, set on both sides).
	Curves []string `toml:"curves"`
	// DisableSessionResumption makes every connection a full TLS
	// handshake. By default the agent keeps the daemon's session tickets
	// (in memory, dropped when its certificate changes) and resumes on
	// reconnection, which spares the daemon the certificate signatures;
	// identity, revocation and expiry are checked as on a full handshake.
	DisableSessionResumption bool `toml:"disable_session_resumption"`
}

// Credential names the agent's certificate (bound to its RunnerId), its
// private key and the CA that signs the daemon certificate. All three are
// required file paths; inline PEM is rejected (§283).
type Credential struct {
	Certificate string `toml:"certificate"`
	PrivateKey  string `toml:"private_key"`
	CA          string `toml:"ca"`
}

// Capabilities mirrors agent.RunnerCapabilitiesV1.
type Capabilities struct {
	OS        string   `toml:"os"`
	Arch      string   `toml:"arch"`
	Labels    []string `toml:"labels"`
	Tools     []string `toml:"tools"`
	CPUMillis uint32   `toml:"cpu_millis"`
	MemBytes  uint64   `toml:"mem_bytes"`
	DiskBytes uint64   `toml:"disk_bytes"`
}

// Backoff is the reconnect backoff. Zero fields: DefaultBackoffBase,
// DefaultBackoffMax, DefaultAuthBackoffAfter, DefaultAuthBackoffMax.
type Backoff struct {
	Base Duration `toml:"base"`
	Max  Duration `toml:"max"`
	// AuthAfter and AuthMax slow the agent down after repeated
	// authentication failures on the path (a proxy's 407): after AuthAfter
	// consecutive connect rounds with one, the waits double from 30–60s up
	// to AuthMax (30–60 min by default), so a wrong proxy password does not
	// lock the directory account (semantics/agent Backoff).
	AuthAfter int      `toml:"auth_after"`
	AuthMax   Duration `toml:"auth_max"`
}

// ApplyDefaults fills zero fields with their defaults.
func (a *Agent) ApplyDefaults() {
	if a.MaxParallel == 0 {
		a.MaxParallel = DefaultMaxParallel
	}
	if a.Capabilities.OS == "" {
		a.Capabilities.OS = runtime.GOOS
	}
	if a.Capabilities.Arch == "" {
		a.Capabilities.Arch = runtime.GOARCH
	}
	if a.Backoff.Base.Duration == 0 {
		a.Backoff.Base.Duration = DefaultBackoffBase
	}
	if a.Backoff.Max.Duration == 0 {
		a.Backoff.Max.Duration = DefaultBackoffMax
	}
	if a.Backoff.AuthAfter == 0 {
		a.Backoff.AuthAfter = DefaultAuthBackoffAfter
	}
	if a.Backoff.AuthMax.Duration == 0 {
		a.Backoff.AuthMax.Duration = DefaultAuthBackoffMax
	}
	if a.ControlPlane.KeepAliveInterval.Duration == 0 {
		a.ControlPlane.KeepAliveInterval.Duration = DefaultKeepAliveInterval
	}
}

// Validate checks a after ApplyDefaults and returns the first problem as an
// *Error.
func (a *Agent) Validate() error {
	if err := a.Telemetry.Validate(); err != nil {
		return err
	}
	cp := a.ControlPlane
	if len(cp.Endpoints) == 0 {
		return invalid("control_plane.endpoints", "required: at least one endpoint such as \"quic://daemon.example:7443\"")
	}
	if len(cp.Endpoints) > MaxEndpoints {
		return invalid("control_plane.endpoints", "%d endpoints; at most %d", len(cp.Endpoints), MaxEndpoints)
	}
	for i, e := range cp.Endpoints {
		if _, err := ParseEndpoint(e); err != nil {
			return invalid(fmt.Sprintf("control_plane.endpoints[%d]", i), "%v", err)
		}
	}
	for _, f := range []struct{ key, v string }{
		{"control_plane.credential.certificate", cp.Credential.Certificate},
		{"control_plane.credential.private_key", cp.Credential.PrivateKey},
		{"control_plane.credential.ca", cp.Credential.CA},
	} {
		if err := checkFileRef(f.key, f.v); err != nil {
			return err
		}
		if f.v == "" {
			return invalid(f.key, "required: path of a PEM file")
		}
	}
	if a.MaxParallel < 1 || a.MaxParallel > 65535 {
		return invalid("max_parallel", "%d must be 1–65535", a.MaxParallel)
	}
	if a.HeartbeatMisses < -1 || a.HeartbeatMisses > 1000 {
		return invalid("heartbeat_misses", "%d must be 1–1000 (0: the default 3, -1: off)", a.HeartbeatMisses)
	}
	if a.Backoff.Base.Duration > a.Backoff.Max.Duration {
		return invalid("backoff.base", "%v exceeds backoff.max (%v)", a.Backoff.Base.Duration, a.Backoff.Max.Duration)
	}
	if n := a.Backoff.AuthAfter; n < 1 || n > 100 {
		return invalid("backoff.auth_after", "%d must be 1–100 (0: the default %d)", n, DefaultAuthBackoffAfter)
	}
	if d := a.Backoff.AuthMax.Duration; d < time.Minute || d > 24*time.Hour {
		return invalid("backoff.auth_max", "%v must be 1m–24h (0: the default %v)", d, DefaultAuthBackoffMax)
	}
	if d := cp.KeepAliveInterval.Duration; d < minKeepAliveInterval || d > maxKeepAliveInterval {
		return invalid("control_plane.keepalive_interval", "%v must be %v–%v (0: the default %v)", d, minKeepAliveInterval, maxKeepAliveInterval, DefaultKeepAliveInterval)
	}
	if _, err := ParseCurves("control_plane.curves", cp.Curves); err != nil {
		return err
	}
	if p := cp.Proxy; p != ProxyFromEnvironment && p != ProxyNone {
		if err := checkProxyURL(p); err != nil {
			return invalid("control_plane.proxy", "%v (want \"\" for HTTPS_PROXY, \"none\", or http://[user:pass@]host:port)", err)
		}
	}
	if cp.NoProxy != "" && (cp.Proxy == ProxyFromEnvironment || cp.Proxy == ProxyNone) {
		return invalid("control_plane.no_proxy", "needs control_plane.proxy = \"http://host:port\" (with the environment, set NO_PROXY)")
	}
	if len(a.Fallback.ClassStagger) > 8 {
		return invalid("fallback.class_stagger", "%d entries; at most 8", len(a.Fallback.ClassStagger))
	}
	for i, d := range a.Fallback.ClassStagger {
		if d.Duration < 0 || d.Duration > time.Minute {
			return invalid(fmt.Sprintf("fallback.class_stagger[%d]", i), "%v must be 0–1m", d.Duration)
		}
	}
	if len(a.Fallback.EndpointStagger) > 16 {
		return invalid("fallback.endpoint_stagger", "%d entries; at most 16", len(a.Fallback.EndpointStagger))
	}
	for i, d := range a.Fallback.EndpointStagger {
		if d.Duration < 0 || d.Duration > time.Minute {
			return invalid(fmt.Sprintf("fallback.endpoint_stagger[%d]", i), "%v must be 0–1m", d.Duration)
		}
	}
	if a.Fallback.ProbeSuccesses < 0 || a.Fallback.ProbeSuccesses > 100 {
		return invalid("fallback.probe_successes", "%d must be 0–100", a.Fallback.ProbeSuccesses)
	}
	if d := a.Fallback.ProbeInterval.Duration; d > 0 && d < 100*time.Millisecond {
		return invalid("fallback.probe_interval", "%v is below 100ms", d)
	}
	if caps := a.RunnerCapabilities(); caps.Validate() != nil {
		err := caps.Validate()
		return invalid("capabilities", "%v", err)
	}
	return a.Log.validate("log.")
}

// Endpoints returns the normalized endpoints (Validate must have passed).
func (a *Agent) Endpoints() []Endpoint {
	out := make([]Endpoint, 0, len(a.ControlPlane.Endpoints))
	for _, s := range a.ControlPlane.Endpoints {
		if e, err := ParseEndpoint(s); err == nil {
			out = append(out, e)
		}
	}
	return out
}

// RunnerCapabilities returns the wire capability summary.
func (a *Agent) RunnerCapabilities() agentwire.RunnerCapabilitiesV1 {
	c := a.Capabilities
	mp := a.MaxParallel
	if mp > 65535 {
		mp = 65535
	}
	return agentwire.RunnerCapabilitiesV1{
		OS: c.OS, Arch: c.Arch, Labels: c.Labels, Tools: c.Tools,
		MaxParallel: uint16(mp), CPUMillis: c.CPUMillis, MemBytes: c.MemBytes, DiskBytes: c.DiskBytes,
	}
}

// checkProxyURL accepts http://[user:pass@]host[:port] (a scheme-less
// host:port means http). It never echoes a password.
func checkProxyURL(s string) error {
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("not a URL")
	}
	switch {
	case u.Scheme != "http":
		return fmt.Errorf("scheme %q not supported", u.Scheme)
	case u.Hostname() == "":
		return fmt.Errorf("missing host")
	case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "":
		return fmt.Errorf("unexpected path or query")
	}
	return nil
}
