package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/adminapi"
	"forgeyard.dev/transport/internal/buildinfo"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/internal/testkit/metricstest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
)

func httpGet(t *testing.T, url string) (int, string, string) {
	t.Helper()
	return httpGetToken(t, url, "")
}

// httpGetToken is httpGet with a bearer token ("" for none).
func httpGetToken(t *testing.T, url, token string) (int, string, string) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

// metricValue returns the value of the sample line `series value` in a
// text exposition, or fails.
func metricValue(t *testing.T, text, series string) float64 {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	m := re.FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no sample %s in:\n%s", series, text)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatalf("%s: %v", series, err)
	}
	return v
}

// TestAdminEndpoint runs the daemon main in-process with a dev PKI and
// --admin-listen, connects an agent that completes one demo lease, and
// checks /metrics (values move, promtool accepts it), /healthz and
// /sessions over HTTP; after the agent leaves, the active gauge returns to
// zero.
func TestAdminEndpoint(t *testing.T) {
	dir := t.TempDir()
	pkiDir := filepath.Join(dir, "pki")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	readyc := make(chan string, 1)
	adminc := make(chan string, 1)
	completions := make(chan daemon.CompletionEvent, 16)
	th := &testHooks{
		ready: func(d *daemon.Daemon, ls []serversetup.Listener) { readyc <- ls[0].Addr().String() },
		admin: func(addr string) { adminc <- addr },
		onCompletion: func(e daemon.CompletionEvent) {
			select {
			case completions <- e:
			default:
			}
		},
	}
	var logs syncBuffer
	done := make(chan int, 1)
	const token = "admin-endpoint-test-token"
	tokenFile := filepath.Join(dir, "admin.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	go func() {
		done <- run(ctx, []string{"--dev-pki", pkiDir, "--listen", "127.0.0.1:0", "--sqlite", filepath.Join(dir, "a.db"),
			"--admin-listen", "127.0.0.1:0", "--admin-token-file", tokenFile, "--admin-public-metrics", "--demo-leases", "1", "--log-format", "json", "--shutdown-timeout", "2s"}, io.Discard, &logs, th)
	}()
	var addr, admin string
	for addr == "" || admin == "" {
		select {
		case admin = <-adminc:
		case addr = <-readyc:
		case code := <-done:
			t.Fatalf("daemon exited %d before ready: %s", code, logs.String())
		case <-time.After(10 * time.Second):
			t.Fatal("daemon not ready")
		}
	}
	base := "http://" + admin

	// Before any agent: the full shape at zero, health ok.
	code, ctype, text := httpGet(t, base+"/metrics")
	if code != 200 || !strings.HasPrefix(ctype, "text/plain") {
		t.Fatalf("/metrics: %d %q", code, ctype)
	}
	if v := metricValue(t, text, `forgeyard_transport_connections_active{backend="quic"}`); v != 0 {
		t.Errorf("connections_active before agent = %v", v)
	}
	if bi := buildinfo.Get(); !strings.Contains(text, `forgeyard_build_info{commit="`+bi.ShortCommit()+`",goversion="`+bi.GoVersion+`",protocol_max="`+bi.Protocol.Max.String()+`",protocol_min="`+bi.Protocol.Min.String()+`",version="`+bi.Version+`"} 1`) {
		t.Errorf("/metrics lacks forgeyard_build_info of this build")
	}

	var cp config.ControlPlane
	if _, err := agentsetup.DevAgent(pkiDir, "a1", &cp); err != nil {
		t.Fatal(err)
	}
	cred, err := agentsetup.LoadCredential(cp)
	if err != nil {
		t.Fatal(err)
	}
	e, _ := config.ParseEndpoint("quic://" + addr)
	dialer, daddr, _ := agentsetup.Dialer(e, cred.Client, quic.Config{}, yamux.Config{})
	disconnected := make(chan struct{}, 1)
	a, err := agent.New(agent.Config{Runner: cred.Runner, Signer: cred.Signer, CertChain: cred.CertChain,
		Endpoints: []agent.Endpoint{{Address: daddr, Dialer: dialer, Backend: "quic"}},
		Executor:  agent.NewSyntheticExecutor(1, agent.SyntheticOptions{}), MaxParallel: 1, Version: "admin-test",
		Hooks: agent.Hooks{OnDisconnected: func(error) {
			select {
			case disconnected <- struct{}{}:
			default:
			}
		}}})
	if err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithCancel(context.Background())
	adone := make(chan error, 1)
	go func() { adone <- a.Run(actx) }()
	agentStopped := false
	stopAgent := func() {
		if !agentStopped {
			agentStopped = true
			acancel()
			<-adone
			a.Close()
		}
	}
	defer stopAgent()

	select {
	case ev := <-completions:
		if ev.Runner != cred.Runner {
			t.Errorf("completion from %v", ev.Runner)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("demo lease not completed; logs:\n%s", logs.String())
	}

	// /metrics while connected. The completion hook fires as the daemon
	// handles the completion; the latency samples (offer→ack recorded when
	// OfferLease returns, completion→ack around the ack write) land on
	// other goroutines, and no event announces them: scrape until both
	// appear, within a deadline.
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, _, text = httpGet(t, base+"/metrics")
		if metricValue(t, text, `forgeyard_lease_offer_to_ack_seconds_count`) >= 1 &&
			metricValue(t, text, `forgeyard_completion_ack_seconds_count`) >= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, c := range []struct {
		series string
		want   float64
	}{
		{`forgeyard_transport_connections_active{backend="quic"}`, 1},
		{`forgeyard_transport_connections_total{backend="quic"}`, 1},
		{`forgeyard_transport_connections_active{backend="yamux"}`, 0},
		{`forgeyard_transport_handshake_duration_seconds_count{backend="quic"}`, 1},
		{`forgeyard_daemon_completions_total{ack="accepted"}`, 1},
		{`forgeyard_daemon_completions_total{ack="stale_rejected"}`, 0},
		{`forgeyard_daemon_leases_total{event="offered"}`, 1},
		{`forgeyard_daemon_leases_total{event="accepted"}`, 1},
		{`forgeyard_daemon_registrations_total{result="accepted"}`, 1},
		{`forgeyard_lease_offer_to_ack_seconds_count`, 1},
		{`forgeyard_completion_ack_seconds_count`, 1},
		{`forgeyard_transport_messages_total{family="agent",outcome="error"}`, 0},
		{`forgeyard_daemon_rate_limited_total{class="certificate"}`, 0},
		{`forgeyard_daemon_admission_refused_total{stage="registration"}`, 0},
		{`forgeyard_daemon_admission_refused_total{stage="early"}`, 0},
		{`forgeyard_daemon_registrations_paced_total{action="held"}`, 0},
		{`forgeyard_daemon_registrations_paced_total{action="deferred"}`, 0},
		{`forgeyard_daemon_limit_closes_total`, 0},
		{`forgeyard_daemon_identity_events_total{event="renewed"}`, 0},
		{`forgeyard_daemon_secret_streams_total{result="delivered"}`, 0},
		{`forgeyard_transport_handshakes_total{backend="quic",event="started"}`, 1},
		{`forgeyard_transport_handshakes_total{backend="quic",event="signed"}`, 1},
		{`forgeyard_transport_handshakes_total{backend="quic",event="completed"}`, 1},
		{`forgeyard_transport_handshakes_total{backend="quic",event="refused"}`, 0},
		{`forgeyard_transport_handshakes_waiting{backend="quic"}`, 0},
	} {
		if v := metricValue(t, text, c.series); v != c.want {
			t.Errorf("%s = %v, want %v", c.series, v, c.want)
		}
	}
	// registration + lease answer + completion + phases: at least 3.
	if v := metricValue(t, text, `forgeyard_transport_messages_total{family="agent",outcome="ok"}`); v < 3 {
		t.Errorf("agent messages ok = %v, want ≥ 3", v)
	}
	for _, typ := range []string{
		"# TYPE forgeyard_transport_connections_active gauge",
		"# TYPE forgeyard_transport_messages_total counter",
		"# TYPE forgeyard_daemon_completions_total counter",
		"# TYPE forgeyard_daemon_rate_limited_total counter",
		"# TYPE forgeyard_daemon_identity_events_total counter",
		"# TYPE forgeyard_transport_handshakes_total counter",
		"# TYPE forgeyard_lease_offer_to_ack_seconds histogram",
	} {
		if !strings.Contains(text, typ) {
			t.Errorf("/metrics lacks %q", typ)
		}
	}
	metricstest.PromtoolCheck(t, text)
	metricstest.WriteSample(t, "metrics.txt", text)

	// A second scrape does not observe the same latency samples again.
	_, _, text2 := httpGet(t, base+"/metrics")
	if v := metricValue(t, text2, `forgeyard_lease_offer_to_ack_seconds_count`); v != 1 {
		t.Errorf("offer latency count after a second scrape = %v, want 1", v)
	}

	// /healthz
	code, ctype, body := httpGet(t, base+"/healthz")
	if code != 200 || ctype != "application/json" {
		t.Fatalf("/healthz: %d %q %s", code, ctype, body)
	}
	var h telemetry.DaemonHealth
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		t.Fatal(err)
	}
	if h.Status != telemetry.StatusOK || len(h.Problems) != 0 {
		t.Errorf("health status %s %v", h.Status, h.Problems)
	}
	if len(h.Listeners) != 1 || !h.Listeners[0].Active || h.Listeners[0].Backend != "quic" || h.Listeners[0].Address != addr {
		t.Errorf("listeners %+v", h.Listeners)
	}
	if c := h.Certificate; c == nil || !c.Valid || c.DaysToExpiry < 30 || !strings.Contains(c.Subject, "CN=localhost") || c.NotAfter.IsZero() {
		t.Errorf("certificate %+v", c)
	}
	if hs := h.Listeners[0].Handshakes; hs == nil || hs.Started != 1 || hs.Completed != 1 || hs.Signed != 1 || hs.InFlight != 0 {
		t.Errorf("listener handshakes %+v, want one started, signed and completed", hs)
	}
	if n := h.Listeners[0].HandshakesUnregistered; n != 0 {
		t.Errorf("handshakes_unregistered = %d, want 0: the one handshake registered", n)
	}
	if h.Connections != 1 || h.ConnectionsByBackend["quic"] != 1 || h.Sessions != 1 || h.HandshakeFailures != 0 {
		t.Errorf("counts: connections %d %v sessions %d failures %d", h.Connections, h.ConnectionsByBackend, h.Sessions, h.HandshakeFailures)
	}
	metricstest.WriteSample(t, "healthz.json", body)

	// /sessions
	if code, _, body := httpGet(t, base+"/sessions"); code != http.StatusUnauthorized || !strings.Contains(body, "bearer token") {
		t.Fatalf("/sessions without the token: %d %s", code, body)
	}
	code, _, body = httpGetToken(t, base+"/sessions", token)
	if code != 200 {
		t.Fatalf("/sessions: %d", code)
	}
	var ss []adminapi.Session
	if err := json.Unmarshal([]byte(body), &ss); err != nil {
		t.Fatal(err)
	}
	if len(ss) != 1 || ss[0].Runner != cred.Runner.String() || ss[0].Session != a.Session().String() || ss[0].Backend != "quic" ||
		ss[0].AgentVersion != "admin-test" || ss[0].Protocol != wire.Current.String() || ss[0].Epoch != 1 || ss[0].Fenced {
		t.Errorf("sessions = %s", body)
	}
	metricstest.WriteSample(t, "sessions.json", body)

	// Wrong method and unknown path.
	if resp, err := http.Post(base+"/metrics", "text/plain", nil); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /metrics: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if code, _, _ := httpGet(t, base+"/nope"); code != 404 {
		t.Errorf("/nope: %d", code)
	}

	// The agent leaves: the gauge returns to 0 (the daemon's disconnect
	// hook runs after the agent sees the close, hence a bounded poll).
	stopAgent()
	deadline = time.Now().Add(5 * time.Second)
	for {
		_, _, text = httpGet(t, base+"/metrics")
		if metricValue(t, text, `forgeyard_transport_connections_active{backend="quic"}`) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("connections_active stays non-zero after the agent left")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v := metricValue(t, text, `forgeyard_transport_connections_total{backend="quic"}`); v != 1 {
		t.Errorf("connections_total = %v", v)
	}

	cancel()
	select {
	case code := <-done:
		if code != cli.ExitOK {
			t.Fatalf("exit %d; logs:\n%s", code, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not shut down")
	}
	if !strings.Contains(logs.String(), `"msg":"admin endpoint listening"`) {
		t.Error("no admin listening log")
	}
	// The endpoint is gone after shutdown.
	if _, err := (&http.Client{Timeout: time.Second}).Get(base + "/healthz"); err == nil {
		t.Error("admin endpoint still serving after exit")
	}
}

func TestAdminListenRefusesRemote(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"--admin-listen", "0.0.0.0:9464"},
		{"--admin-listen", "192.0.2.1:9464", "--admin-allow-remote=false"},
	} {
		code, _, errOut := runDaemon(t, context.Background(), nil, append([]string{"--dev-pki", filepath.Join(dir, "pki"), "--sqlite", filepath.Join(dir, "a.db")}, args...)...)
		if code != cli.ExitUsage || !strings.Contains(errOut, "admin.listen") || !strings.Contains(errOut, "allow_remote") {
			t.Errorf("%v: exit %d %q", args, code, errOut)
		}
	}
}

type fakeListener struct{ addr string }

func (f fakeListener) Accept(ctx context.Context) (semantics.BackendConn, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (f fakeListener) Addr() net.Addr {
	a, _ := net.ResolveUDPAddr("udp", f.addr)
	return a
}
func (f fakeListener) Close() error { return nil }

// TestHealthListenerDown: a failed listener makes /healthz degraded with its
// error; all listeners down and no certificate make it down (503).
func TestHealthListenerDown(t *testing.T) {
	tel := newDaemonTelemetry()
	tel.attach(nil, []serversetup.Listener{{Backend: "quic", BackendListener: fakeListener{"127.0.0.1:7443"}},
		{Backend: "yamux", BackendListener: fakeListener{"127.0.0.1:7444"}}}, nil)
	h := tel.health()
	if h.Status != telemetry.StatusDown || len(h.Listeners) != 2 || !h.Listeners[0].Active || h.Certificate != nil {
		t.Errorf("no certificate: %+v", h)
	}
	tel.listenerDone(1, errors.New("accept: boom"))
	h = tel.health()
	if h.Listeners[1].Active || h.Listeners[1].Error != "accept: boom" || !h.Listeners[0].Active {
		t.Errorf("listeners %+v", h.Listeners)
	}
	tel.listenerDone(0, nil)
	srv := httptest.NewServer(tel.handler(adminAccess{trusted: true}))
	defer srv.Close()
	code, _, body := httpGet(t, srv.URL+"/healthz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "no active listener") || !strings.Contains(body, "listener yamux 127.0.0.1:7444 inactive") {
		t.Errorf("/healthz %d %s", code, body)
	}
	if code, _, body := httpGet(t, srv.URL+"/sessions"); code != 200 || strings.TrimSpace(body) != "[]" {
		t.Errorf("/sessions without a daemon: %d %q", code, body)
	}
}
