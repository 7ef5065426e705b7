package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/google/renameio/v2"

	"forgeyard.dev/transport/internal/buildinfo"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/telemetry/tablecell"
)

// Status file defaults.
const (
	// DefaultStatusFile is where `forgeyard-agent connection status` looks
	// when --status-file is not given; run the agent with the same path.
	DefaultStatusFile = "/run/forgeyard/agent-status.json"
	// DefaultStatusInterval is how often the running agent rewrites the
	// status file (it also rewrites it on every connect and disconnect).
	DefaultStatusInterval = 5 * time.Second
	// HeartbeatStaleAfter makes a connected agent degraded when its last
	// heartbeat ack is older (three default heartbeat intervals).
	HeartbeatStaleAfter = 30 * time.Second
	// maxStatusFile bounds what `connection status` reads.
	maxStatusFile = 1 << 20
)

// agentHealth converts an agent.Status to the health report at now. A
// connection younger than HeartbeatStaleAfter (connectedAt) is not yet
// expected to have a heartbeat ack.
func agentHealth(st agent.Status, connectedAt, now time.Time) telemetry.AgentHealth {
	h := telemetry.AgentHealth{Connected: st.Connected, Endpoint: st.Endpoint, Backend: st.Backend,
		LastHeartbeatAck: st.LastHeartbeatAck, Running: len(st.Running), Draining: st.Draining}
	if st.Connected {
		h.Protocol = st.Protocol.String()
	}
	if !h.LastHeartbeatAck.IsZero() {
		h.LastHeartbeatAck = h.LastHeartbeatAck.UTC()
	}
	stale := HeartbeatStaleAfter
	if st.Connected && now.Sub(connectedAt) < stale && (st.LastHeartbeatAck.IsZero() || st.LastHeartbeatAck.Before(connectedAt)) {
		stale = 0 // first heartbeat not due yet
	}
	h.Evaluate(now, stale)
	return h
}

// statusReport is the status file and `connection status --json`: the
// health report (telemetry.AgentHealth, flattened) plus what an operator
// asks next about the connection.
type statusReport struct {
	telemetry.AgentHealth
	// ProtocolVersion is the negotiated version (protocol) as numbers.
	ProtocolVersion *protocolVersion `json:"protocol_version,omitempty"`
	// Features are the negotiated optional protocol features.
	Features []string `json:"features,omitempty"`
	// Transport and Epoch identify the current transport session.
	Transport string `json:"transport,omitempty"`
	Epoch     uint64 `json:"epoch,omitempty"`
	// FallbackReason says why the agent uses this backend, when the agent
	// exposes it.
	FallbackReason string `json:"fallback_reason,omitempty"`
	// LastDialError is the agent's last failed dial ("backend address:
	// error", the error starting with the hop that failed: proxy, tcp,
	// tls, yamux) and when; kept after a later success. NextRetry is when
	// a disconnected agent dials again.
	LastDialError   string    `json:"last_dial_error,omitempty"`
	LastDialErrorAt time.Time `json:"last_dial_error_at,omitzero"`
	NextRetry       time.Time `json:"next_retry,omitzero"`
	// DialErrors is each failing endpoint's last error, newest first.
	DialErrors []dialError `json:"dial_errors,omitempty"`
}

// protocolVersion is a protocol version as numbers: the shape of
// adminapi.Version, kept here because the agent does not link the daemon's
// admin API.
type protocolVersion struct {
	Major uint16 `json:"major"`
	Minor uint16 `json:"minor"`
}

// dialError is one endpoint's last failed dial in the status file.
type dialError struct {
	Endpoint string    `json:"endpoint"` // "backend host:port"
	Error    string    `json:"error"`
	At       time.Time `json:"at"`
}

// reportOf is agentHealth plus the connection details of st.
func reportOf(st agent.Status, connectedAt, now time.Time) statusReport {
	r := statusReport{AgentHealth: agentHealth(st, connectedAt, now)}
	if st.Connected {
		r.ProtocolVersion = &protocolVersion{Major: st.Protocol.Major, Minor: st.Protocol.Minor}
		for _, f := range st.Features.List() {
			r.Features = append(r.Features, f.String())
		}
		r.Transport, r.Epoch = st.Transport.String(), st.Epoch
		r.FallbackReason = fallbackReason(st)
	} else if !st.NextRetry.IsZero() {
		r.NextRetry = st.NextRetry.UTC()
	}
	r.LastDialError = st.LastDialError
	if !st.LastDialErrorAt.IsZero() {
		r.LastDialErrorAt = st.LastDialErrorAt.UTC()
	}
	for _, d := range st.DialErrors {
		r.DialErrors = append(r.DialErrors, dialError{Endpoint: d.Backend + " " + d.Endpoint, Error: d.Err, At: d.At.UTC()})
	}
	return r
}

// writeTable renders r for humans: the telemetry.AgentHealth rows, then
// the connection details.
func (r *statusReport) writeTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	h := &r.AgentHealth
	fmt.Fprintf(tw, "STATUS\t%s\n", h.Status)
	for _, p := range h.Problems {
		fmt.Fprintf(tw, "PROBLEM\t%s\n", p)
	}
	fmt.Fprintf(tw, "CONNECTED\t%s\n", tablecell.YesNo(h.Connected))
	fmt.Fprintf(tw, "ENDPOINT\t%s\n", tablecell.Dash(h.Endpoint))
	fmt.Fprintf(tw, "BACKEND\t%s\n", tablecell.Dash(h.Backend))
	if r.FallbackReason != "" {
		fmt.Fprintf(tw, "FALLBACK\t%s\n", r.FallbackReason)
	}
	fmt.Fprintf(tw, "PROTOCOL\t%s\n", tablecell.Dash(h.Protocol))
	if h.Connected {
		feats := "none"
		if len(r.Features) > 0 {
			feats = strings.Join(r.Features, ", ")
		}
		fmt.Fprintf(tw, "FEATURES\t%s\n", feats)
		fmt.Fprintf(tw, "TRANSPORT\t%s (epoch %d)\n", tablecell.Dash(r.Transport), r.Epoch)
	}
	if h.LastHeartbeatAck.IsZero() {
		fmt.Fprintf(tw, "LAST HEARTBEAT ACK\tnever\n")
	} else {
		fmt.Fprintf(tw, "LAST HEARTBEAT ACK\t%s (%.1fs ago)\n", h.LastHeartbeatAck.UTC().Format(time.RFC3339), h.HeartbeatAckAge)
	}
	fmt.Fprintf(tw, "RUNNING ATTEMPTS\t%d\n", h.Running)
	if h.Draining {
		fmt.Fprintf(tw, "DRAINING\tyes\n")
	}
	switch {
	case len(r.DialErrors) > 0:
		// One line per failing endpoint, newest first: the proxy's 407 of
		// the relay is not hidden behind the QUIC timeout that followed.
		for _, d := range r.DialErrors {
			fmt.Fprintf(tw, "LAST DIAL ERROR\t%s: %s (%s)\n", d.Endpoint, d.Error, d.At.UTC().Format(time.RFC3339))
		}
	case r.LastDialError != "":
		fmt.Fprintf(tw, "LAST DIAL ERROR\t%s (%s)\n", r.LastDialError, r.LastDialErrorAt.UTC().Format(time.RFC3339))
	}
	if !h.Connected && !r.NextRetry.IsZero() {
		fmt.Fprintf(tw, "NEXT RETRY\t%s\n", r.NextRetry.UTC().Format(time.RFC3339))
	}
	return tw.Flush()
}

// writeStatusFile writes h as JSON to path atomically: a temporary file in
// the same directory, synced, then renamed over path (readers see the old
// or the new report, never a partial one). The directory is not synced: a
// crash may lose the last report, which the next interval rewrites.
func writeStatusFile(path string, h statusReport) error {
	body, err := json.MarshalIndent(&h, "", "  ")
	if err != nil {
		return err
	}
	return renameio.WriteFile(path, append(body, '\n'), 0o644,
		renameio.WithTempDir(filepath.Dir(path)), renameio.WithStaticPermissions(0o644))
}

// agentTelemetry is the running agent's observability: the status file and
// the optional metrics endpoint, both fed by agent hooks and Status.
type agentTelemetry struct {
	statusFile string
	interval   time.Duration
	m          *telemetry.Metrics // nil without --metrics-listen
	log        *slog.Logger
	kick       chan struct{} // connect/disconnect: rewrite now

	mu          sync.Mutex
	a           *agent.Agent
	backend     string    // of the current connection, "" when disconnected
	connected   int       // connections so far
	connectedAt time.Time // of the current connection
}

func newAgentTelemetry(statusFile string, interval time.Duration, metrics bool, log *slog.Logger) *agentTelemetry {
	t := &agentTelemetry{statusFile: statusFile, interval: interval, log: log, kick: make(chan struct{}, 1)}
	if metrics {
		t.m = telemetry.NewMetrics()
		t.m.RegisterRuntimeCollectors()
		buildinfo.MustRegister(t.m.Registry()) // forgeyard_build_info
	}
	return t
}

func (t *agentTelemetry) poke() {
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// hooks returns the agent hooks feeding the connection metrics and the
// status file (the engine feeds the rest: agent.Config.Metrics).
// They never call back into the Agent (hooks may run under its locks).
func (t *agentTelemetry) hooks() agent.Hooks {
	return agent.Hooks{
		OnConnected: func(st agent.Status) {
			t.mu.Lock()
			t.backend = st.Backend
			t.connected++
			t.connectedAt = time.Now()
			again := t.connected > 1
			t.mu.Unlock()
			t.m.ConnOpened(st.Backend)
			if again {
				t.m.Reconnected(st.Backend)
			}
			t.log.Info("connected", "endpoint", st.Endpoint, "backend", st.Backend, "transport", st.Transport)
			t.poke()
		},
		OnDisconnected: func(err error) {
			t.log.Info("disconnected", "err", err)
			t.mu.Lock()
			b := t.backend
			t.backend = ""
			t.mu.Unlock()
			if b != "" {
				t.m.ConnClosed(b)
			}
			t.poke()
		},
	}
}

// status is the agent's status and when its connection started (zero
// values before the agent is attached).
func (t *agentTelemetry) status() (agent.Status, time.Time) {
	t.mu.Lock()
	a, since := t.a, t.connectedAt
	t.mu.Unlock()
	if a == nil {
		return agent.Status{}, time.Time{}
	}
	return a.Status(), since
}

func (t *agentTelemetry) health() telemetry.AgentHealth {
	st, since := t.status()
	return agentHealth(st, since, time.Now())
}

// report is health plus the connection details, for the status file.
func (t *agentTelemetry) report() statusReport {
	st, since := t.status()
	return reportOf(st, since, time.Now())
}

// run writes the status file every interval and on connect/disconnect
// until ctx ends, then writes a final report with connected=false.
func (t *agentTelemetry) run(ctx context.Context, a *agent.Agent) {
	t.mu.Lock()
	t.a = a
	t.mu.Unlock()
	if t.statusFile == "" {
		return
	}
	write := func(h statusReport) {
		if err := writeStatusFile(t.statusFile, h); err != nil {
			t.log.Warn("status file not written", "path", t.statusFile, "err", err)
		}
	}
	write(t.report())
	tick := time.NewTicker(t.interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			h := reportOf(agent.Status{}, time.Time{}, time.Now()) // stopped: not connected
			h.Problems = append(h.Problems, "agent stopped")
			write(h)
			return
		case <-tick.C:
		case <-t.kick:
		}
		write(t.report())
	}
}

// handler serves /metrics and /healthz for --metrics-listen.
func (t *agentTelemetry) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", t.m.Handler())
	mux.Handle("/healthz", telemetry.AgentHealthHandler(t.health))
	return mux
}

// runConnectionStatus is `forgeyard-agent connection status`: it reads the
// status file a running agent writes and prints it. Exit 0 when ok or
// degraded, 1 when down or unreadable, 2 on a usage error.
func runConnectionStatus(args []string, stdout, stderr io.Writer, now time.Time) int {
	fs, path, asJSON, staleFile := connectionStatusFlagSet(stderr)
	if code, ok := cli.ParseNoArgs(fs, args, stdout, stderr, "forgeyard-agent connection status"); !ok {
		return code
	}
	return printConnectionStatus(path, asJSON, staleFile, stdout, stderr, now)
}

// connectionStatusFlagSet is connection status' flags.
func connectionStatusFlagSet(out io.Writer) (fs *flag.FlagSet, path *string, asJSON *bool, staleFile *time.Duration) {
	fs = flag.NewFlagSet("forgeyard-agent connection status", flag.ContinueOnError)
	fs.SetOutput(out)
	path = fs.String("status-file", DefaultStatusFile, "status `file` the agent writes (its --status-file)")
	asJSON = fs.Bool("json", false, "print the report as JSON (telemetry.AgentHealth plus features, transport, epoch, fallback_reason) instead of a table")
	staleFile = fs.Duration("stale-after", 30*time.Second, "report down when the file was last written longer ago than this (the agent is not running)")
	cli.SetUsage(fs, `Usage: forgeyard-agent connection status [--json] [--status-file FILE]

Prints the connection health the running agent writes to its --status-file
(connected, endpoint, backend and why it was chosen when the agent says,
protocol and features, transport, last heartbeat ack, the last failed dial
and, while disconnected, the next retry). Exit status 0
when ok or degraded, 1 when down (not connected, agent not running, file
missing), 2 on a usage error.

Flags:
`, "")
	return fs, path, asJSON, staleFile
}

func printConnectionStatus(path *string, asJSON *bool, staleFile *time.Duration, stdout, stderr io.Writer, now time.Time) int {
	h, err := readStatusFile(*path, now, *staleFile)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard-agent connection status: %v\n", err)
		return cli.ExitFail
	}
	if *asJSON {
		b, _ := json.MarshalIndent(&h, "", "  ")
		fmt.Fprintf(stdout, "%s\n", b)
	} else {
		_ = h.writeTable(stdout)
		fmt.Fprintf(stdout, "STATUS FILE         %s (written %s ago)\n", *path, now.Sub(h.CheckedAt).Round(100*time.Millisecond))
	}
	if h.Status == telemetry.StatusDown {
		return cli.ExitFail
	}
	return cli.ExitOK
}

// readStatusFile reads a status file at now: the status is the agent's own
// evaluation (at most one --status-interval old), the heartbeat age is
// recomputed, and a file older than staleFile makes the report down.
// CheckedAt stays the time the agent wrote it.
func readStatusFile(path string, now time.Time, staleFile time.Duration) (statusReport, error) {
	var h statusReport
	data, err := readBounded(path, maxStatusFile, "status file")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return h, fmt.Errorf("%s does not exist: is the agent running with --status-file %s?", path, path)
		}
		return h, err
	}
	if err := json.Unmarshal(data, &h); err != nil {
		return h, fmt.Errorf("%s: not a status file: %v", path, err)
	}
	if h.CheckedAt.IsZero() {
		return h, fmt.Errorf("%s: not a status file: no checked_at", path)
	}
	switch h.Status {
	case telemetry.StatusOK, telemetry.StatusDegraded, telemetry.StatusDown:
	default:
		return h, fmt.Errorf("%s: not a status file: status %q", path, h.Status)
	}
	if !h.LastHeartbeatAck.IsZero() {
		h.HeartbeatAckAge = now.Sub(h.LastHeartbeatAck).Seconds()
	}
	if age := now.Sub(h.CheckedAt); age > staleFile && !containsProblem(h.Problems, "agent stopped") {
		h.Status = telemetry.StatusDown
		h.Problems = append(h.Problems, fmt.Sprintf("status file written %s ago: is the agent running?", age.Round(time.Second)))
	}
	return h, nil
}

func containsProblem(ps []string, p string) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}
