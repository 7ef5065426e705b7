package adminapi

import "time"

// The runner inventory and its admin commands (issue 16 items 3–5):
//
//	GET  /runners                            []Runner, by runner id
//	GET  /runners/{runner}                   Runner; 404 when unknown
//	POST /runners/{runner}/drain             RunnerCommand{reason} → CommandResult
//	POST /runners/{runner}/resume            → CommandResult
//	POST /runners/{runner}/refresh-capabilities → CommandResult (capabilities)
//	POST /runners/{runner}/probe             RunnerCommand{probe} → CommandResult (health)
//
// They need the same authentication as /status (bearer token over TCP,
// or the admin socket). Each command is audited by the daemon
// (runner.admin_command). Drain and resume are recorded in the authority
// even when the runner is not connected to this daemon (Delivered false
// then); refresh and probe need the runner connected to this daemon.

// PathRunners is the runner inventory; /runners/{runner}[/command] below it.
const PathRunners = "/runners"

// Runner commands (the last path element of a POST).
const (
	CommandDrain   = "drain"
	CommandResume  = "resume"
	CommandRefresh = "refresh-capabilities"
	CommandProbe   = "probe"
)

// Probe kinds accepted in RunnerCommand.Probe (lower-case health.ProbeKind
// names); empty means "full".
var ProbeKinds = []string{"connectivity", "disk", "clock", "full"}

// Runner is one runner of the inventory. Ids are canonical strings, times
// UTC; a zero time is omitted.
type Runner struct {
	Runner       string       `json:"runner"`
	Capabilities Capabilities `json:"capabilities"`
	// Connected: a registered transport is up on Daemon; Local: on the
	// daemon that answered.
	Connected     bool      `json:"connected"`
	Local         bool      `json:"local"`
	Daemon        string    `json:"daemon,omitempty"`
	Session       string    `json:"session,omitempty"`
	Role          string    `json:"role,omitempty"`
	Backend       string    `json:"backend,omitempty"`
	Protocol      string    `json:"protocol,omitempty"`
	AgentVersion  string    `json:"agent_version,omitempty"`
	ConnectedAt   time.Time `json:"connected_at,omitzero"`
	LastHeartbeat time.Time `json:"last_heartbeat,omitzero"`
	Health        Health    `json:"health"`
	Drained       bool      `json:"drained"`
	DrainReason   string    `json:"drain_reason,omitempty"`
	DrainChanged  time.Time `json:"drain_changed,omitzero"`
}

// Capabilities is a runner's reported capability snapshot.
type Capabilities struct {
	OS          string    `json:"os,omitempty"`
	Arch        string    `json:"arch,omitempty"`
	Labels      []string  `json:"labels"`
	MaxParallel uint16    `json:"max_parallel"`
	CPUMillis   uint32    `json:"cpu_millis"`
	MemBytes    uint64    `json:"mem_bytes"`
	DiskBytes   uint64    `json:"disk_bytes"`
	Tools       []string  `json:"tools"`
	Digest      string    `json:"digest,omitempty"` // hex
	Updated     time.Time `json:"updated,omitzero"`
}

// Health is a runner's last health report (a summary or a probe result).
type Health struct {
	Status     string        `json:"status,omitempty"` // Healthy, Degraded, Unhealthy; empty: never reported
	Probe      string        `json:"probe,omitempty"`  // set when the report is a probe's result
	Checks     []HealthCheck `json:"checks"`
	UptimeMs   uint64        `json:"uptime_ms,omitempty"`
	ReportedAt time.Time     `json:"reported_at,omitzero"`
}

// HealthCheck is one named check.
type HealthCheck struct {
	Name    string `json:"name"`
	Status  string `json:"status"`
	Message string `json:"message,omitempty"`
}

// RunnerCommand is the body of a runner command POST.
type RunnerCommand struct {
	Reason string `json:"reason,omitempty"` // drain: operator text (≤ 256 bytes), shown by the agent
	Probe  string `json:"probe,omitempty"`  // probe: one of ProbeKinds
}

// CommandResult is a runner command's answer.
type CommandResult struct {
	Runner  string `json:"runner"`
	Command string `json:"command"`
	// Delivered: the runner's agent was told (drain, resume) or answered
	// (refresh, probe) through this daemon.
	Delivered    bool          `json:"delivered"`
	Message      string        `json:"message,omitempty"`
	Capabilities *Capabilities `json:"capabilities,omitempty"` // refresh-capabilities
	Health       *Health       `json:"health,omitempty"`       // probe
	DurationMs   int64         `json:"duration_ms,omitempty"`  // probe, as the agent measured it
}
