//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"

	"forgeyard.dev/transport/internal/testkit/netns"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
)

// Addresses: every link is a /30 of 10.77.0.0/16, which exists only
// inside the namespaces of one test.
var (
	agentHubNet   = netip.MustParsePrefix("10.77.1.0/30") // agent .1 ⟷ hub .2
	proxyHubNet   = netip.MustParsePrefix("10.77.2.0/30") // proxy .1 ⟷ hub .2
	agentProxyNet = netip.MustParsePrefix("10.77.3.0/30") // agent .1 ⟷ proxy .2
)

// Ports inside the hub namespace (its own port space).
const (
	portQUIC  = 7443
	portYamux = 7444
	portWT    = 443
	adminAddr = "127.0.0.1:9464"
)

// fallbackTarget is the time from agent start to registered that the
// design promises when UDP is silently dropped (issue 6).
const fallbackTarget = 1500 * time.Millisecond

// scenarioTimeout bounds each scenario as a whole.
const scenarioTimeout = 60 * time.Second

// Firewall rules. They sit in the hub namespace's input chain and match
// what arrives from the agent's link (interface "v-agent" on the hub's
// side), like a firewall on the path: the agent's datagrams leave it and
// vanish, and nothing tells it so (a drop in the agent's own output chain
// would fail its sendmsg at once with EPERM, which no real network does).
// The table is named fye2e; unblock deletes it.
const (
	// rulesDropUDP silently drops every UDP datagram from the agent.
	rulesDropUDP = `table inet fye2e {
	chain input {
		type filter hook input priority 0; policy accept;
		iifname "v-agent" meta l4proto udp drop
	}
}`
	// rulesOnlyUDP443 passes only UDP to port 443 (HTTP/3) from the
	// agent; everything else, TCP included, is silently dropped.
	rulesOnlyUDP443 = `table inet fye2e {
	chain input {
		type filter hook input priority 0; policy accept;
		iifname "v-agent" udp dport 443 accept
		iifname "v-agent" drop
	}
}`
)

// unblock deletes the firewall rules from the hub.
func (w *world) unblock() {
	w.t.Helper()
	w.hub.MustRun("nft", "delete", "table", "inet", "fye2e")
}

// world is one scenario's namespaces and daemon.
type world struct {
	t      *testing.T
	ctx    context.Context
	dir    string
	pki    string
	runner string // RunnerId of dev agent "a1"
	hub    *netns.NS
	daemon *netns.Proc
	db     string
	logDir string
	token  string // the admin endpoint's bearer token (--admin-token-file)
}

func newWorld(t *testing.T) *world { return newWorldWithin(t, scenarioTimeout) }

// newWorldWithin is newWorld for a scenario that observes for longer.
func newWorldWithin(t *testing.T, timeout time.Duration) *world {
	if testing.Short() {
		t.Skip("-short: the end-to-end namespace scenarios run real processes for about a minute")
	}
	netns.Require(t, "tinyproxy")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	w := &world{t: t, ctx: ctx, dir: t.TempDir()}
	w.pki = filepath.Join(w.dir, "pki")
	w.db = filepath.Join(w.dir, "authority.db")
	w.logDir = filepath.Join(w.dir, "logs")
	w.token = "e2e-admin-" + filepath.Base(w.dir)
	if err := os.WriteFile(filepath.Join(w.dir, "admin.token"), []byte(w.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	pki, err := trust.GenerateDevPKI(w.pki, trust.DevPKIOptions{Agents: []string{"a1"}})
	if err != nil {
		t.Fatal(err)
	}
	a, ok := pki.Agent("a1")
	if !ok {
		t.Fatal("dev PKI without agent a1")
	}
	w.runner = a.Runner.String()
	w.hub = netns.New(t, "hub")
	return w
}

// startDaemon runs forgeyard-daemon in the hub namespace on every backend
// (all addresses) and waits until its listeners and admin endpoint serve.
func (w *world) startDaemon(extra ...string) {
	w.t.Helper()
	args := []string{"--dev-pki", w.pki, "--sqlite", w.db, "--log-dir", w.logDir,
		"--listen", fmt.Sprintf("0.0.0.0:%d", portQUIC),
		"--listen-yamux", fmt.Sprintf("0.0.0.0:%d", portYamux),
		"--listen-webtransport", fmt.Sprintf("0.0.0.0:%d", portWT),
		"--admin-listen", adminAddr, "--admin-token-file", filepath.Join(w.dir, "admin.token"),
		"--log-format", "json", "--shutdown-timeout", "2s"}
	w.daemon = w.hub.Start("daemon", binDaemon, append(args, extra...))
	listening, admin := 0, false
	if _, err := w.daemon.WaitLine(w.ctx, func(l string) bool {
		switch logLine(l).msg() {
		case "listening":
			listening++
		case "admin endpoint listening":
			admin = true
		}
		return listening == 3 && admin
	}); err != nil {
		w.t.Fatalf("daemon not serving: %v", err)
	}
}

// stopDaemon stops the daemon gracefully (so the authority is closed).
func (w *world) stopDaemon() {
	w.t.Helper()
	if err := w.daemon.Stop(10 * time.Second); err != nil {
		w.t.Errorf("daemon exit: %v", err)
	}
}

// agentRun is one forgeyard-agent process.
type agentRun struct {
	*netns.Proc
	w      *world
	status string // --status-file
}

// startAgent runs forgeyard-agent "a1" in ns with the endpoints in order.
func (w *world) startAgent(ns *netns.NS, endpoints []string, env []string, extra ...string) *agentRun {
	w.t.Helper()
	status := filepath.Join(w.dir, "agent-status-"+ns.Role+".json")
	args := []string{"--dev-pki", w.pki, "--dev-agent", "a1", "--server-name", "localhost",
		"--status-file", status, "--status-interval", "200ms", "--log-format", "json", "--log-level", "debug"}
	for _, e := range endpoints {
		args = append(args, "--endpoint", e)
	}
	ar := &agentRun{w: w, status: status}
	// The test's own proxy settings never leak in: only env's count.
	clean := []string{"HTTPS_PROXY=", "https_proxy=", "HTTP_PROXY=", "http_proxy=", "ALL_PROXY=", "all_proxy=", "NO_PROXY=", "no_proxy="}
	ar.Proc = ns.Start("agent", binAgent, append(args, extra...), append(clean, env...)...)
	return ar
}

// connection is one "connected" line of the agent.
type connection struct {
	Backend, Endpoint string
	At                time.Time // the agent's own timestamp
}

// waitConnected waits for the agent's n-th "connected" log line (from 1).
func (ar *agentRun) waitConnected(n int) connection {
	ar.w.t.Helper()
	seen := 0
	line, err := ar.WaitLine(ar.w.ctx, func(l string) bool {
		if logLine(l).msg() == "connected" {
			seen++
		}
		return seen == n
	})
	if err != nil {
		ar.w.t.Fatalf("agent connection %d: %v", n, err)
	}
	ll := logLine(line)
	at, err := time.Parse(time.RFC3339Nano, ll.str("time"))
	if err != nil {
		ar.w.t.Fatalf("agent log time %q: %v", ll.str("time"), err)
	}
	return connection{Backend: ll.str("backend"), Endpoint: ll.str("endpoint"), At: at}
}

// startedAt is the time of the agent's "agent starting" log line (its
// own clock: after process start-up and configuration, before dialing).
func (ar *agentRun) startedAt() time.Time {
	ar.w.t.Helper()
	line, err := ar.WaitLine(ar.w.ctx, func(l string) bool { return logLine(l).msg() == "agent starting" })
	if err != nil {
		ar.w.t.Fatalf("agent start: %v", err)
	}
	at, err := time.Parse(time.RFC3339Nano, logLine(line).str("time"))
	if err != nil {
		ar.w.t.Fatalf("agent log time: %v", err)
	}
	return at
}

// readStatus reads the agent's --status-file.
func (ar *agentRun) readStatus() (telemetry.AgentHealth, error) {
	var h telemetry.AgentHealth
	b, err := os.ReadFile(ar.status)
	if err != nil {
		return h, err
	}
	return h, json.Unmarshal(b, &h)
}

// waitStatus polls the status file (no event tells the test it was
// rewritten) until it reports connected over backend.
func (ar *agentRun) waitStatus(backend string) telemetry.AgentHealth {
	ar.w.t.Helper()
	var h telemetry.AgentHealth
	var err error
	for {
		h, err = ar.readStatus()
		if err == nil && h.Connected && h.Backend == backend {
			return h
		}
		select {
		case <-ar.w.ctx.Done():
			ar.w.t.Fatalf("status file never said connected over %s: last %+v, %v", backend, h, err)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// session is one /sessions entry of the daemon's admin endpoint.
type session struct {
	Runner  string `json:"runner"`
	Session string `json:"session"`
	Epoch   uint64 `json:"epoch"`
	Backend string `json:"backend"`
	Remote  string `json:"remote"`
	State   string `json:"state"`
	Fenced  bool   `json:"fenced"`
}

// sessions fetches /sessions from inside the hub namespace.
func (w *world) sessions() []session {
	w.t.Helper()
	req, err := http.NewRequestWithContext(w.ctx, http.MethodGet, "http://"+adminAddr+"/sessions", nil)
	if err != nil {
		w.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+w.token)
	resp, err := w.hub.HTTPClient().Do(req)
	if err != nil {
		w.t.Fatalf("GET /sessions: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		w.t.Fatalf("GET /sessions: %s: %s", resp.Status, body)
	}
	var out []session
	if err := json.Unmarshal(body, &out); err != nil {
		w.t.Fatalf("/sessions: %v: %s", err, body)
	}
	return out
}

// liveSession returns the runner's one unfenced session at the daemon,
// polling /sessions until it is there over backend with remote's address.
func (w *world) liveSession(backend string, remote netip.Addr) session {
	w.t.Helper()
	var last []session
	for {
		last = w.sessions()
		var live []session
		for _, s := range last {
			if s.Runner == w.runner && !s.Fenced {
				live = append(live, s)
			}
		}
		if len(live) == 1 && live[0].Backend == backend && strings.HasPrefix(live[0].Remote, remote.String()+":") {
			return live[0]
		}
		select {
		case <-w.ctx.Done():
			w.t.Fatalf("daemon never showed one live session of %s over %s from %s: %+v", w.runner, backend, remote, last)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

// logLine is one JSON log line (slog JSONHandler) of a process.
type logLine string

func (l logLine) fields() map[string]any {
	var m map[string]any
	if json.Unmarshal([]byte(l), &m) != nil {
		return nil
	}
	return m
}

func (l logLine) msg() string { return l.str("msg") }

func (l logLine) str(key string) string {
	v, ok := l.fields()[key]
	if !ok {
		return ""
	}
	if s, ok := v.(string); ok {
		return s
	}
	return fmt.Sprint(v)
}

// endpoint URIs.
func quicURI(a netip.Addr) string            { return fmt.Sprintf("quic://%s:%d", a, portQUIC) }
func yamuxURI(a netip.Addr, port int) string { return fmt.Sprintf("yamux://%s:%d", a, port) }
func wtURI(a netip.Addr) string              { return fmt.Sprintf("webtransport://%s:%d", a, portWT) }

// waitAttemptLog waits until the daemon's --log-dir holds one attempt's
// log with at least n durable records and returns the attempt. It polls:
// nothing signals a sync of the log files.
func (w *world) waitAttemptLog(n int) wire.JobAttemptId {
	w.t.Helper()
	for {
		idx, _ := filepath.Glob(filepath.Join(w.logDir, "*.idx"))
		if len(idx) > 1 {
			w.t.Fatalf("logs of %d attempts, want 1: %v", len(idx), idx)
		}
		if len(idx) == 1 {
			id, err := ulid.ParseStrict(strings.TrimSuffix(filepath.Base(idx[0]), ".idx"))
			if err != nil {
				w.t.Fatalf("log index %s: %v", idx[0], err)
			}
			a := wire.JobAttemptId{ULID: id}
			if len(w.durableLog(a)) >= n {
				return a
			}
		}
		select {
		case <-w.ctx.Done():
			w.t.Fatalf("no attempt log with %d durable lines in %s", n, w.logDir)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// durableLog reads the attempt's durable log records from the daemon's
// --log-dir (read-only: ReadDurable never truncates or writes).
func (w *world) durableLog(a wire.JobAttemptId) []logs.Record {
	w.t.Helper()
	sink, err := logs.NewFileSink(w.logDir, logs.FileSinkOptions{})
	if err != nil {
		w.t.Fatal(err)
	}
	var out []logs.Record
	if err := sink.ReadDurable(a, func(r logs.Record) error {
		r.Data = append([]byte(nil), r.Data...)
		out = append(out, r)
		return nil
	}); err != nil {
		w.t.Fatalf("reading the log of %s: %v", a, err)
	}
	return out
}

var syntheticLine = regexp.MustCompile(`^synthetic ([0-9a-f]{12}) line ([0-9]+)$`)

// checkLog asserts that recs have consecutive sequence numbers and hold
// the synthetic executor's n lines, each once and in order (a record may
// carry several lines: the writer coalesces what queued up while the
// link was down).
func checkLog(t *testing.T, recs []logs.Record, n int) {
	t.Helper()
	var all []byte
	for i, r := range recs {
		if r.Seq != recs[0].Seq+uint64(i) {
			t.Fatalf("record %d has seq %d after %d: a gap or a duplicate", i, r.Seq, recs[0].Seq)
		}
		all = append(all, r.Data...)
	}
	got := strings.SplitAfter(string(all), "\n")
	if got[len(got)-1] == "" {
		got = got[:len(got)-1]
	}
	if len(got) != n {
		t.Fatalf("%d log lines in %d records, want %d", len(got), len(recs), n)
	}
	var spec string
	for i, l := range got {
		m := syntheticLine.FindStringSubmatch(strings.TrimSuffix(l, "\n"))
		if m == nil || !strings.HasSuffix(l, "\n") || m[2] != strconv.Itoa(i) || (spec != "" && m[1] != spec) {
			t.Fatalf("log line %d is %q, want synthetic line %d", i, l, i)
		}
		spec = m[1]
	}
}

// completions counts the attempt's completions in the daemon's SQLite
// authority (after the daemon stopped).
func (w *world) completions(a wire.JobAttemptId) int {
	w.t.Helper()
	au, err := authority.OpenSQLite(context.Background(), w.db)
	if err != nil {
		w.t.Fatal(err)
	}
	defer au.Close()
	n, err := au.Completions(context.Background(), a)
	if err != nil {
		w.t.Fatal(err)
	}
	return n
}

// lineCount counts the log lines in recs.
func lineCount(recs []logs.Record) int {
	n := 0
	for _, r := range recs {
		n += strings.Count(string(r.Data), "\n")
	}
	return n
}

// Relay ports in the hub namespace (TLS+yamux, agent-facing).
const (
	portRelay1 = 8444
	portRelay2 = 8445
)

// startRelay runs forgeyard-relay in the hub namespace: agents over
// TLS+yamux on port, one QUIC connection each to the daemon on the hub's
// loopback. It returns once the relay serves.
func (w *world) startRelay(name string, port int) *netns.Proc {
	w.t.Helper()
	p := w.hub.Start(name, binRelay, []string{"--dev-pki", w.pki,
		"--listen-yamux", fmt.Sprintf("0.0.0.0:%d", port),
		"--upstream", fmt.Sprintf("quic://127.0.0.1:%d", portQUIC),
		"--log-format", "json", "--shutdown-timeout", "2s"})
	if _, err := p.WaitLine(w.ctx, func(l string) bool { return logLine(l).msg() == "relaying to daemons" }); err != nil {
		w.t.Fatalf("%s not serving: %v", name, err)
	}
	return p
}

// relayURI is the endpoint of a relay over TLS+yamux (raced last).
func relayURI(a netip.Addr, port int) string { return fmt.Sprintf("relay+yamux://%s:%d", a, port) }

// relayedVia is the address the daemon sees for agents relayed from the
// hub (the relays dial it on loopback).
var relayedVia = netip.MustParseAddr("127.0.0.1")

// agentConfig writes an agent TOML file with a fast move-back probe (the
// defaults probe every 30 s) and returns its path.
func (w *world) agentConfig() string {
	w.t.Helper()
	path := filepath.Join(w.dir, "agent.toml")
	const body = `[fallback]
probe_interval = "200ms"
probe_successes = 3
`
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		w.t.Fatal(err)
	}
	return path
}
