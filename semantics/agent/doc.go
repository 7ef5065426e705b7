// Package agent is the agent side of the control protocol: it races the
// daemon's endpoints by backend class (happy eyeballs; a backend wins only
// when its hello round trip completes, fallback.go), remembers the winner
// per network and moves back to a better backend with hysteresis,
// negotiates, registers with a
// key proof, resynchronises its attempts, answers lease offers (duplicates
// get the same answer and never a second execution), runs attempts on an
// Executor, renews leases, sends heartbeats, obeys cancellation, and
// retries completions with the same MessageId across reconnects until the
// daemon acknowledges them (§77).
//
// Executors write the attempt's log (Output.Log) and store outputs
// (Output.PutOutput): each attempt has a logs.Writer spooled under
// Config.SpoolDir and reattached to every new connection; before the
// completion is sent the agent passes the logs-finalized barrier, uploads
// the outputs (cas.Uploader) and sends OutputsFinalizedV1 (§243).
//
// One Agent is one agent session (AgentSessionId): reconnects keep it (a new
// transport session each time) and keep running attempts (§14); a new
// process, i.e. a new Agent, is a new session that inherits nothing.
//
// Files, by feature:
//
//   - agent.go: the Agent, New, Close
//   - connect.go: Run's connect and reconnect loop, backoff, endpoint order, serving one link
//   - fallback.go: the endpoint race by backend class, remembered choices, probing a better backend
//   - register.go: hello, registration with key proof, resync
//   - link.go: one registered transport and the dispatch of the daemon's messages (handle)
//   - heartbeat.go: heartbeats and the liveness rule (no ack for HeartbeatMisses intervals: the link is dead, reconnect)
//   - lease.go: lease offers and their answers, lease renewal, cancellation
//   - attempt.go: running an attempt on the Executor and delivering its completion
//   - executor.go: the Executor interface and the synthetic executor
//   - data.go: the data plane (log spool, payload fetch, outputs); secret.go: secrets
//   - clock.go: the daemon's clock offset, lease expiry judged on it
//   - inventory.go: capabilities (SetCapabilities, CapabilityUpdateV1, refresh)
//   - health.go: health summaries and the built-in probes
//   - enroll.go: certificate enrollment and renewal
//   - service.go: the Service of a role that runs no attempts (signing worker, device agent) and its family filter
//   - config.go, stats.go: configuration, counters and status
package agent
