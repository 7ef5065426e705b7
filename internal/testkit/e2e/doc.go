// Package e2e holds end-to-end tests that run the real binaries
// (cmd/forgeyard-daemon, cmd/forgeyard-agent and cmd/forgeyard-relay) as
// separate processes inside Linux network
// namespaces built with internal/testkit/netns, and check how an agent finds its
// way to the daemon on networks that block UDP or allow only an HTTP
// CONNECT proxy: tinyproxy, and squid configured like a stock enterprise
// proxy (Basic auth, CONNECT to 443 only) in front of a relay on TCP 443
// (proxy_test.go). The HA scenario (ha_test.go) runs on the host's
// loopback instead, beside the PostgreSQL (internal/testkit/pgtest) and versitygw
// (internal/testkit/s3test) it shares between two daemon processes: one daemon is
// SIGKILLed mid-attempt and three agent processes move to the other. The
// package has no non-test code.
//
// TestMain builds the binaries once (without -race) into a temporary
// directory. The tests need root, iproute2, nftables, tinyproxy, squid and
// openssl (`make deps`); without them they fail with an actionable message. Under -short
// they skip (with the reason logged) and nothing is built.
//
// Every scenario asserts on facts the processes publish: the agent's
// "connected" log line and --status-file JSON (backend, connected), the
// daemon's "agent registered" and "attempt completed" log lines, its admin
// endpoint's /sessions, its --log-dir files and its SQLite authority.
package e2e
