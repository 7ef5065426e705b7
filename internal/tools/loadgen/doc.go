// Package loadgen is the fleet behind cmd/forgeyard-loadgen: N real agents
// (semantics/agent with the synthetic executor, real mTLS, real
// registration, heartbeats, leases, logs and CAS outputs) in one process
// against one forgeyard-daemon process, which it can start, SIGKILL and
// restart itself; the raw transport baseline (backends/quic/rawbench,
// backends/yamux/rawbench) measured by the same method; and the summary
// (a text table and JSON) a person compares across runs.
//
// Files: pki.go (the dev CA and N cached runner certificates), daemon.go
// (the daemon process: start, discovery from its JSON log, /proc, /metrics,
// /healthz), fleet.go (the agents, their dialers and counters, progress),
// leases.go (offers at a steady rate through the daemon's matrix driver),
// run.go (one scenario: cold start, steady window, restarts, drain, raw
// baseline), raw.go (the raw baseline server and its measurement),
// stats.go (histogram quantiles, percentiles), report.go (summary, table,
// JSON), ladder.go (the `make scale` ladder and its markdown table).
package loadgen
