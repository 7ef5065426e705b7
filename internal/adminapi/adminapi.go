// Package adminapi is the JSON contract of forgeyard-daemon's operator
// admin endpoint and a client for it (used by `forgeyard transport ...`).
//
// Endpoints (all GET, JSON unless noted):
//
//	/healthz    telemetry.DaemonHealth; 503 when down. Never needs a token.
//	/metrics    Prometheus text exposition.
//	/status     Status: listeners, certificate, connections, authority, draining.
//	/sessions   []Session: every transport and the agent session on it.
//	/protocols  Protocols: supported and configured versions, features,
//	            minimum protocol policy, connected agents per version.
//
// Over TCP (admin.listen) every endpoint except /healthz needs
// "Authorization: Bearer <token>" where the token is the content of
// admin.token_file (compared in constant time); /metrics is exempt when
// admin.public_metrics is set. Without admin.token_file the TCP endpoint
// serves only /healthz and /metrics. Over the unix socket (admin.socket,
// mode 0600) the file permissions authenticate and no token is needed.
//
// Errors are JSON {"error": "..."} with a status code; the message says
// what to do.
package adminapi

import (
	"time"

	"forgeyard.dev/transport/semantics/telemetry"
)

// Endpoint paths.
const (
	PathHealth    = "/healthz"
	PathReady     = "/readyz"
	PathMetrics   = "/metrics"
	PathStatus    = "/status"
	PathSessions  = "/sessions"
	PathProtocols = "/protocols"
)

// Listener states in Status.
const (
	ListenerUp   = "up"
	ListenerDown = "down"
)

// Status is the daemon's transport status summary (GET /status). Status,
// Problems, CheckedAt, Certificate and the counters are those of
// telemetry.DaemonHealth, with the authority and draining folded in.
type Status struct {
	Status    telemetry.HealthStatus `json:"status"`
	Problems  []string               `json:"problems,omitempty"`
	CheckedAt time.Time              `json:"checked_at"`
	// Daemon is the daemon's id (config key id), "" when none is set.
	Daemon string `json:"daemon"`
	// Host is the daemon's host name; Version its build's module version
	// (internal/buildinfo).
	Host      string    `json:"host,omitempty"`
	Version   string    `json:"version,omitempty"`
	StartedAt time.Time `json:"started_at"`
	// Draining: the daemon is shutting down and sending GoAway to agents.
	Draining    bool                  `json:"draining"`
	Listeners   []Listener            `json:"listeners"`
	Certificate *telemetry.CertHealth `json:"certificate,omitempty"`
	// Connections counts open transports; ConnectionsByBackend splits them.
	Connections          int            `json:"connections"`
	ConnectionsByBackend map[string]int `json:"connections_by_backend"`
	// Sessions counts registered, unfenced agent sessions.
	Sessions int `json:"sessions"`
	// HandshakeFailures counts TLS handshakes that failed over a
	// certificate since start (see telemetry.DaemonHealth).
	HandshakeFailures int64 `json:"handshake_failures"`
	// RegistrationFailures counts refused hellos and registrations.
	RegistrationFailures int64     `json:"registration_failures"`
	Authority            Authority `json:"authority"`
}

// Listener is one backend listener of the daemon.
type Listener struct {
	Backend string `json:"backend"`
	Address string `json:"address"`
	State   string `json:"state"` // ListenerUp or ListenerDown
	Error   string `json:"error,omitempty"`
}

// Authority is the durable store and whether it answered a probe.
type Authority struct {
	Backend   string  `json:"backend"` // "sqlite" or "postgres"
	Reachable bool    `json:"reachable"`
	LatencyMs float64 `json:"latency_ms"`
	Error     string  `json:"error,omitempty"`
}

// Session is one /sessions entry: a transport and the agent session on it.
// Ids are their canonical strings. Its fields overlap Runner's but not its
// JSON: a session always has them (no omitempty), a runner may not.
type Session struct {
	Runner        string    `json:"runner"`
	Session       string    `json:"session"`
	Transport     string    `json:"transport"`
	Epoch         uint64    `json:"epoch"`
	Role          string    `json:"role"`
	Backend       string    `json:"backend"`
	Remote        string    `json:"remote"`
	Protocol      string    `json:"protocol"`
	AgentVersion  string    `json:"agent_version"`
	State         string    `json:"state"`
	Fenced        bool      `json:"fenced"`
	LastHeartbeat time.Time `json:"last_heartbeat,omitzero"`
	ConnectedAt   time.Time `json:"connected_at"`
}

// Protocols is GET /protocols.
type Protocols struct {
	// Supported is what this daemon build can speak ("1.0–1.0").
	Supported Range `json:"supported"`
	// Configured is protocol_min..protocol_max.
	Configured Range `json:"configured"`
	// MinProtocol is the downgrade floor (§274): agents whose best common
	// version is below it are refused.
	MinProtocol string `json:"min_protocol"`
	// Features are the optional features the daemon offers (names).
	Features []string `json:"features"`
	// Agents counts connected transports per negotiated version.
	Agents []VersionCount `json:"agents"`
}

// Range is a protocol version range.
type Range struct {
	Min string `json:"min"`
	Max string `json:"max"`
}

// VersionCount is the number of connected transports on one version.
type VersionCount struct {
	Protocol string `json:"protocol"`
	Agents   int    `json:"agents"`
}

// ErrorBody is the JSON body of an error answer.
type ErrorBody struct {
	Error string `json:"error"`
}
