package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/internal/buildinfo"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/daemonsetup"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/internal/testkit/metricstest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
)

// fastHeartbeatDaemon is a QUIC loopback daemon with a 250 ms heartbeat, so
// the agent's last heartbeat ack is set within the test (50 ms let the
// daemon drop the agent for "no heartbeat for 3 intervals" under -race on
// a loaded machine, about 1 run in 8).
func fastHeartbeatDaemon(t *testing.T, pkiDir string, hooks daemon.Hooks) string {
	t.Helper()
	var stls config.ServerTLS
	if _, err := daemonsetup.DevDaemon(pkiDir, &stls); err != nil {
		t.Fatal(err)
	}
	tc, err := serversetup.ServerTLS(stls)
	if err != nil {
		t.Fatal(err)
	}
	au, err := authority.OpenSQLite(context.Background(), ":memory:")
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(daemon.Config{Authority: au, Hooks: hooks, Timing: daemon.Timing{HeartbeatInterval: 250 * time.Millisecond},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := quic.Listen("127.0.0.1:0", tc, quic.Config{})
	if err != nil {
		t.Fatal(err)
	}
	go d.Serve(context.Background(), ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d.Shutdown(ctx)
		ln.Close()
		au.Close()
	})
	return ln.Addr().String()
}

func connectionStatus(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var o, e bytes.Buffer
	code := run(context.Background(), append([]string{"connection", "status"}, args...), &o, &e, nil)
	return code, o.String(), e.String()
}

// TestStatusFileAndMetrics runs the agent main in-process with
// --status-file and --metrics-listen against a daemon: the status file
// reports the connection (read back by `connection status`, table and
// JSON), /metrics counts the QUIC connection and passes promtool, /healthz
// answers; after SIGINT the file says the agent stopped.
func TestStatusFileAndMetrics(t *testing.T) {
	dir := t.TempDir()
	pkiDir := filepath.Join(dir, "pki")
	statusFile := filepath.Join(dir, "status.json")
	addr := fastHeartbeatDaemon(t, pkiDir, daemon.Hooks{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	metricsc := make(chan string, 1)
	var logs syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"--dev-pki", pkiDir, "--endpoint", "quic://" + addr, "--server-name", "localhost",
			"--status-file", statusFile, "--status-interval", "100ms", "--metrics-listen", "127.0.0.1:0", "--log-format", "json"},
			io.Discard, &logs, &testHooks{metrics: func(a string) { metricsc <- a }})
	}()
	defer func() {
		if t.Failed() {
			t.Logf("agent logs:\n%s", logs.String())
		}
	}()
	var maddr string
	select {
	case maddr = <-metricsc:
	case code := <-done:
		t.Fatalf("agent exited %d: %s", code, logs.String())
	case <-time.After(10 * time.Second):
		t.Fatal("metrics endpoint not up")
	}

	// The file is rewritten every 100 ms; no event tells the test when the
	// first heartbeat ack landed in it, hence a bounded poll.
	var h telemetry.AgentHealth
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, err := os.ReadFile(statusFile); err == nil {
			h = telemetry.AgentHealth{}
			if err := json.Unmarshal(b, &h); err != nil {
				t.Fatalf("status file is not JSON (a torn write?): %v\n%s", err, b)
			}
			if h.Connected && !h.LastHeartbeatAck.IsZero() {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("status file never showed a heartbeat ack: %+v; logs:\n%s", h, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if h.Status != telemetry.StatusOK || h.Backend != "quic" || h.Protocol != wire.Current.String() || !strings.Contains(h.Endpoint, addr) {
		t.Errorf("status file %+v", h)
	}
	// The negotiated version as numbers beside its string form.
	if b, err := os.ReadFile(statusFile); err == nil {
		var r statusReport
		if err := json.Unmarshal(b, &r); err != nil || r.ProtocolVersion == nil ||
			r.ProtocolVersion.Major != wire.Current.Major || r.ProtocolVersion.Minor != wire.Current.Minor {
			t.Errorf("status file protocol_version %+v (%v), want %v as numbers:\n%s", r.ProtocolVersion, err, wire.Current, b)
		}
	}
	if fi, err := os.Stat(statusFile); err != nil || fi.Mode().Perm() != 0o644 {
		t.Errorf("status file mode: %v %v", fi.Mode(), err)
	}

	code, out, errOut := connectionStatus(t, "--status-file", statusFile)
	if code != cli.ExitOK {
		t.Fatalf("connection status: exit %d %s", code, errOut)
	}
	for _, re := range []string{`(?m)^STATUS\s+ok$`, `(?m)^CONNECTED\s+yes$`, `(?m)^BACKEND\s+quic$`, `(?m)^PROTOCOL\s+` + regexp.QuoteMeta(wire.Current.String()) + `$`,
		`(?m)^ENDPOINT\s+\S*` + regexp.QuoteMeta(addr), `(?m)^LAST HEARTBEAT ACK\s+\d{4}-\d\d-\d\dT\S+ \(\d+\.\ds ago\)$`, `(?m)^STATUS FILE\s+` + regexp.QuoteMeta(statusFile),
		`(?m)^FEATURES\s+none$`, `(?m)^TRANSPORT\s+[0-9A-Z]{26} \(epoch 1\)$`, `(?m)^FALLBACK\s+quic \S+ answered hello after \S+$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("table lacks %s:\n%s", re, out)
		}
	}
	metricstest.WriteSample(t, "agent-status.txt", out)
	code, out, _ = connectionStatus(t, "--json", "--status-file", statusFile)
	var hj statusReport
	if code != cli.ExitOK || json.Unmarshal([]byte(out), &hj) != nil || !hj.Connected || hj.Backend != "quic" || hj.LastHeartbeatAck.IsZero() ||
		len(hj.Transport) != 26 || hj.Epoch != 1 || !strings.Contains(hj.FallbackReason, "answered hello") {
		t.Errorf("--json: exit %d %s", code, out)
	}
	metricstest.WriteSample(t, "agent-status.json", out)

	// /metrics and /healthz.
	resp, err := http.Get("http://" + maddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(body)
	for _, line := range []string{`forgeyard_transport_connections_active{backend="quic"} 1`, `forgeyard_transport_connections_total{backend="quic"} 1`,
		`forgeyard_transport_reconnects_total{backend="quic"} 0`} {
		if !strings.Contains(text, line+"\n") {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	if bi := buildinfo.Get(); !strings.Contains(text, `forgeyard_build_info{commit="`+bi.ShortCommit()+`",goversion="`+bi.GoVersion+`",protocol_max="`+bi.Protocol.Max.String()+`",protocol_min="`+bi.Protocol.Min.String()+`",version="`+bi.Version+`"} 1`) {
		t.Errorf("/metrics lacks forgeyard_build_info of this build")
	}
	// Counted by the engine's control channel: at least the hello ack, the
	// registration accepted and the resync response.
	if m := regexp.MustCompile(`(?m)^forgeyard_transport_messages_total\{family="agent",outcome="ok"\} (\d+)$`).FindStringSubmatch(text); m == nil || atoi(m[1]) < 3 {
		t.Errorf("/metrics: agent messages ok %v, want ≥ 3", m)
	}
	metricstest.PromtoolCheck(t, text)
	resp, err = http.Get("http://" + maddr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	var hh telemetry.AgentHealth
	if resp.StatusCode != 200 || json.Unmarshal(body, &hh) != nil || !hh.Connected || hh.Backend != "quic" {
		t.Errorf("/healthz %d %s", resp.StatusCode, body)
	}

	cancel() // SIGINT
	select {
	case code := <-done:
		if code != cli.ExitOK {
			t.Fatalf("exit %d; logs:\n%s", code, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent did not stop")
	}
	code, out, _ = connectionStatus(t, "--status-file", statusFile)
	if code != cli.ExitFail || !regexp.MustCompile(`(?m)^STATUS\s+down$`).MatchString(out) || !strings.Contains(out, "agent stopped") ||
		!regexp.MustCompile(`(?m)^CONNECTED\s+no$`).MatchString(out) {
		t.Errorf("after stop: exit %d\n%s", code, out)
	}
	metricstest.WriteSample(t, "agent-status-stopped.txt", out)
	if _, err := http.Get("http://" + maddr + "/metrics"); err == nil {
		t.Error("metrics endpoint still serving after exit")
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".status.json.tmp*")); len(m) != 0 {
		t.Errorf("temporary files left: %v", m)
	}
}

func TestConnectionStatusErrors(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	write := func(name string, v any) string {
		p := filepath.Join(dir, name)
		var b []byte
		switch v := v.(type) {
		case string:
			b = []byte(v)
		default:
			b, _ = json.Marshal(v)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	fresh := telemetry.AgentHealth{Status: telemetry.StatusOK, CheckedAt: now.Add(-time.Second), Connected: true, Backend: "yamux",
		Endpoint: "127.0.0.1:7444", Protocol: "1.0", LastHeartbeatAck: now.Add(-3 * time.Second)}
	stale := fresh
	stale.CheckedAt = now.Add(-2 * time.Minute)

	code, out, errOut := connectionStatus(t, "--status-file", write("fresh.json", fresh))
	if code != cli.ExitOK || !regexp.MustCompile(`(?m)^BACKEND\s+yamux$`).MatchString(out) || !regexp.MustCompile(`\((3|4)\.\ds ago\)`).MatchString(out) {
		t.Errorf("fresh: %d %s %s", code, out, errOut)
	}
	code, out, _ = connectionStatus(t, "--status-file", write("stale.json", stale))
	if code != cli.ExitFail || !strings.Contains(out, "is the agent running?") || !regexp.MustCompile(`(?m)^STATUS\s+down$`).MatchString(out) {
		t.Errorf("stale: %d %s", code, out)
	}
	if code, out, _ = connectionStatus(t, "--stale-after", "5m", "--status-file", filepath.Join(dir, "stale.json")); code != cli.ExitOK {
		t.Errorf("stale within --stale-after: %d %s", code, out)
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--status-file", filepath.Join(dir, "missing.json")}, cli.ExitFail, "is the agent running with --status-file"},
		{[]string{"--status-file", write("garbage.json", "{not json")}, cli.ExitFail, "not a status file"},
		{[]string{"--status-file", write("empty.json", "{}")}, cli.ExitFail, "no checked_at"},
		{[]string{"--status-file", write("big.json", strings.Repeat(" ", maxStatusFile+1))}, cli.ExitFail, "larger than"},
		{[]string{"--bogus"}, cli.ExitUsage, "flag provided but not defined"},
		{[]string{"extra"}, cli.ExitUsage, "unexpected argument"},
	} {
		code, _, errOut := connectionStatus(t, c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d %q; want %d with %q", c.args, code, errOut, c.code, c.want)
		}
	}
	var o, e bytes.Buffer
	if code := run(context.Background(), []string{"connection"}, &o, &e, nil); code != cli.ExitUsage || !strings.Contains(e.String(), "connection status") {
		t.Errorf("bare connection: %d %q", code, e.String())
	}
	for _, args := range [][]string{{"--metrics-listen", "0.0.0.0:9465"}, {"--status-interval", "1ms"}} {
		o.Reset()
		e.Reset()
		if code := run(context.Background(), args, &o, &e, nil); code != cli.ExitUsage {
			t.Errorf("%v: exit %d %q", args, code, e.String())
		}
	}
	o.Reset()
	if code := run(context.Background(), []string{"connection", "status", "-h"}, &o, &e, nil); code != cli.ExitOK || !strings.Contains(o.String(), "--json") {
		t.Errorf("help: %d %s", code, o.String())
	}
}

// TestAgentHealthGrace: a fresh connection without a heartbeat ack is ok;
// after HeartbeatStaleAfter without one it is degraded.
func TestAgentHealthGrace(t *testing.T) {
	now := time.Now()
	st := agentStatusConnected()
	if h := agentHealth(st, now.Add(-time.Second), now); h.Status != telemetry.StatusOK {
		t.Errorf("fresh connection: %s %v", h.Status, h.Problems)
	}
	if h := agentHealth(st, now.Add(-HeartbeatStaleAfter-time.Second), now); h.Status != telemetry.StatusDegraded {
		t.Errorf("no ack after the grace: %s", h.Status)
	}
}

func agentStatusConnected() agent.Status {
	return agent.Status{Connected: true, Endpoint: "127.0.0.1:7443", Backend: "quic", Protocol: wire.V(1, 0)}
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// TestStatusShowsLastDialError: `connection status` of a disconnected
// agent shows its last failed dial (the error naming the hop) and the next
// retry, in the table and as JSON; a connected agent keeps showing the
// last failure but no retry.
func TestStatusShowsLastDialError(t *testing.T) {
	now := time.Now()
	failedAt := now.Add(-4 * time.Second)
	st := agent.Status{LastDialError: "relay+yamux relay.example:443: proxy authentication required by proxy.corp:3128: the credentials in the proxy URL were refused",
		LastDialErrorAt: failedAt, NextRetry: now.Add(40 * time.Second)}
	quicAt := now.Add(-2 * time.Second)
	withList := st
	withList.LastDialError, withList.LastDialErrorAt = "quic d.example:7443: timeout", quicAt
	withList.DialErrors = []agent.DialError{{Backend: "quic", Endpoint: "d.example:7443", Err: "timeout", At: quicAt},
		{Backend: "relay+yamux", Endpoint: "relay.example:443", Err: "proxy authentication required by proxy.corp:3128: the credentials in the proxy URL were refused", At: failedAt}}
	var tbl bytes.Buffer
	wl := reportOf(withList, time.Time{}, now)
	_ = wl.writeTable(&tbl)
	if n := strings.Count(tbl.String(), "LAST DIAL ERROR"); n != 2 || !strings.Contains(tbl.String(), "relay+yamux relay.example:443: proxy authentication required by proxy.corp:3128") {
		t.Fatalf("per-endpoint errors: %d lines\n%s", n, tbl.String())
	}
	r := reportOf(st, time.Time{}, now)
	path := filepath.Join(t.TempDir(), "status.json")
	if err := writeStatusFile(path, r); err != nil {
		t.Fatal(err)
	}
	code, out, _ := connectionStatus(t, "--status-file", path)
	if code != cli.ExitFail || !regexp.MustCompile(`(?m)^LAST DIAL ERROR\s+relay\+yamux relay.example:443: proxy authentication required by proxy.corp:3128: .* \(`+regexp.QuoteMeta(failedAt.UTC().Format(time.RFC3339))+`\)$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^NEXT RETRY\s+\S+$`).MatchString(out) {
		t.Fatalf("disconnected: exit %d\n%s", code, out)
	}
	code, out, _ = connectionStatus(t, "--json", "--status-file", path)
	var got statusReport
	if err := json.Unmarshal([]byte(out), &got); err != nil || code != cli.ExitFail {
		t.Fatalf("--json: %d %v\n%s", code, err, out)
	}
	if got.LastDialError != st.LastDialError || !got.LastDialErrorAt.Equal(failedAt) || got.NextRetry.IsZero() {
		t.Fatalf("--json: %+v", got)
	}
	st.Connected, st.Backend, st.Endpoint = true, "relay+yamux", "relay.example:443"
	r = reportOf(st, now, now)
	if r.LastDialError == "" || !r.NextRetry.IsZero() {
		t.Fatalf("connected: %+v", r)
	}
}
