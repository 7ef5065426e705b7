// Package daemon is the daemon side of the agent control protocol: it
// accepts agent connections on any set of backends, runs the handshake
// state machine (hello, negotiation, registration with key proof, resync),
// and drives leases, renewals, cancellation, completions, heartbeats,
// fencing, draining and shutdown against a durable authority.Authority.
//
// The protocol is specified in docs/protocols/internal/agent-daemon.md,
// session.md, leases.md, heartbeat.md and reconnect.md.
//
// The data plane (data.go) is optional: with Config.LogSink (or LogDir)
// the agents' log streams go to a logs.Receiver, with Config.ContentStore
// their CAS streams go to a cas.Server; each stream is authorized against
// the authority's lease: an accepted lease of the connection's agent
// session may write its attempt's log and outputs and read its
// payload_ref, nothing else. Log acks, resume requests, the logs-finalized
// barrier, NeedObjects and OutputsFinalized travel on the control stream.
//
// The daemon never
// sends anything that runs an arbitrary command: only the typed admin
// messages of wire/admin and leases naming a JobSpec (§98). Every envelope
// it writes passes one check (send.go): its type must be registered as
// daemon-sendable for the peer's role in the session package's direction
// and role tables; SentTypes is derived from them. Error replies carry the
// stable code and a fixed text, never an internal error's (safetext.go).
//
// Files, by feature:
//
//   - daemon.go: the Daemon, New, Serve, the session index, the background loop
//   - conn.go: one transport — its state, read loop, dispatch (handle), replies and violations
//   - register.go: hello and version negotiation, registration with key proof, fencing
//   - resync.go: AgentResyncV1 (continue, cancel or stale per attempt)
//   - heartbeat.go: heartbeats, liveness and phase re-assertion
//   - lease.go: lease offers (OfferLease, re-sends, adoption after resync) and their answers
//   - renew.go: lease renewal, expiry with grace and probes
//   - cancel.go, complete.go: cancellation; phases and completions
//   - drain.go: drain, resume and disable a runner; Shutdown with GoAway
//   - inventory.go: the runner inventory (capabilities, presence, health,
//     drain state; in the authority's Inventory when it has one), Runners,
//     Runner, RefreshCapabilities, ProbeRunner, admin-command audit
//   - send.go: the send-path check; safetext.go: the peer's error texts;
//     servertime.go: ServerTimeV1
//   - data.go: the data plane (logs, CAS); secret.go: secret delivery
//   - enroll.go: certificate enrollment, renewal and revocation
//   - sign.go: Sign, a signature from a signing worker (§99); device.go: the device operations and their fenced reservations (§100); peers.go: the registration labels of those peers
//   - admission.go, ratelimit.go: admission control and per-connection rates
//   - config.go, stats.go, result.go, recent.go: configuration, counters, helpers
package daemon
