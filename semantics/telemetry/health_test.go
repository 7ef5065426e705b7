package telemetry_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/telemetry"
)

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func testCert(t *testing.T, notBefore, notAfter time.Time) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7),
		Subject:      pkix.Name{CommonName: "daemon.local"},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		DNSNames:     []string{"daemon.local"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCertHealthOf(t *testing.T) {
	day := 24 * time.Hour
	for _, c := range []struct {
		name          string
		before, after time.Time
		valid         bool
		days          int
	}{
		{"valid 30 days", now.Add(-day), now.Add(30*day + time.Hour), true, 30},
		{"valid under a day", now.Add(-day), now.Add(time.Hour), true, 0},
		{"expired an hour ago", now.Add(-90 * day), now.Add(-time.Hour), false, -1},
		{"expired 3 days ago", now.Add(-90 * day), now.Add(-3 * day), false, -3},
		{"not yet valid", now.Add(time.Hour), now.Add(90 * day), false, 90},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := telemetry.CertHealthOf(testCert(t, c.before, c.after), now)
			if h.Valid != c.valid || h.DaysToExpiry != c.days {
				t.Fatalf("valid=%v days=%d, want valid=%v days=%d", h.Valid, h.DaysToExpiry, c.valid, c.days)
			}
			if h.Subject != "CN=daemon.local" || !h.NotAfter.Equal(c.after.Truncate(time.Second)) {
				t.Fatalf("subject %q not_after %v", h.Subject, h.NotAfter)
			}
		})
	}
	if h := telemetry.CertHealthOf(nil, now); h.Valid || h.Subject != "" {
		t.Fatalf("nil certificate: %+v", h)
	}
}

func daemonHealth(t *testing.T, certDays int) telemetry.DaemonHealth {
	ch := telemetry.CertHealthOf(testCert(t, now.Add(-24*time.Hour), now.Add(time.Duration(certDays)*24*time.Hour+time.Minute)), now)
	return telemetry.DaemonHealth{
		Listeners: []telemetry.ListenerHealth{
			{Backend: "quic", Address: "0.0.0.0:7443", Active: true},
			{Backend: "yamux", Address: "0.0.0.0:7444", Active: true},
		},
		Certificate:          &ch,
		Connections:          3,
		ConnectionsByBackend: map[string]int{"quic": 2, "yamux": 1},
		Sessions:             3,
		HandshakeFailures:    5,
	}
}

func TestDaemonHealthEvaluate(t *testing.T) {
	for _, c := range []struct {
		name     string
		mutate   func(*telemetry.DaemonHealth)
		want     telemetry.HealthStatus
		problems []string
	}{
		{"ok", func(*telemetry.DaemonHealth) {}, telemetry.StatusOK, nil},
		{"expiring", func(h *telemetry.DaemonHealth) {
			*h.Certificate = telemetry.CertHealthOf(testCert(t, now.Add(-time.Hour), now.Add(5*24*time.Hour+time.Minute)), now)
		}, telemetry.StatusDegraded, []string{"certificate expires in 5 days"}},
		{"one listener down", func(h *telemetry.DaemonHealth) {
			h.Listeners[1].Active, h.Listeners[1].Error = false, "address in use"
		}, telemetry.StatusDegraded, []string{"listener yamux 0.0.0.0:7444 inactive"}},
		{"no listener", func(h *telemetry.DaemonHealth) { h.Listeners = nil }, telemetry.StatusDown, []string{"no active listener"}},
		{"expired", func(h *telemetry.DaemonHealth) {
			*h.Certificate = telemetry.CertHealthOf(testCert(t, now.Add(-48*time.Hour), now.Add(-time.Hour)), now)
		}, telemetry.StatusDown, []string{"certificate not valid now"}},
		{"no certificate", func(h *telemetry.DaemonHealth) { h.Certificate = nil }, telemetry.StatusDown, []string{"no certificate"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := daemonHealth(t, 60)
			c.mutate(&h)
			h.Evaluate(now)
			if h.Status != c.want || !reflect.DeepEqual(h.Problems, c.problems) {
				t.Fatalf("status %s problems %q, want %s %q", h.Status, h.Problems, c.want, c.problems)
			}
			// Evaluate is idempotent.
			h.Evaluate(now)
			if !reflect.DeepEqual(h.Problems, c.problems) {
				t.Fatalf("second Evaluate problems %q", h.Problems)
			}
		})
	}
}

func TestAgentHealthEvaluate(t *testing.T) {
	base := telemetry.AgentHealth{Connected: true, Endpoint: "daemon.local:7443", Backend: "quic", Protocol: "1.0",
		LastHeartbeatAck: now.Add(-2 * time.Second), Running: 1}
	h := base
	h.Evaluate(now, 30*time.Second)
	if h.Status != telemetry.StatusOK || h.HeartbeatAckAge != 2 || h.Problems != nil {
		t.Fatalf("fresh: %+v", h)
	}
	h = base
	h.LastHeartbeatAck = now.Add(-time.Minute)
	h.Evaluate(now, 30*time.Second)
	if h.Status != telemetry.StatusDegraded || len(h.Problems) != 1 {
		t.Fatalf("stale: %+v", h)
	}
	h = base
	h.LastHeartbeatAck = time.Time{}
	h.Evaluate(now, 0)
	if h.Status != telemetry.StatusOK || h.HeartbeatAckAge != 0 {
		t.Fatalf("stale check off: %+v", h)
	}
	h = base
	h.Connected = false
	h.Evaluate(now, 30*time.Second)
	if h.Status != telemetry.StatusDown || !reflect.DeepEqual(h.Problems, []string{"not connected"}) {
		t.Fatalf("disconnected: %+v", h)
	}
}

func TestHealthJSON(t *testing.T) {
	d := daemonHealth(t, 60)
	d.Evaluate(now)
	b, err := json.Marshal(&d)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"status", "checked_at", "listeners", "certificate", "connections",
		"connections_by_backend", "sessions", "handshake_failures"} {
		if _, ok := m[k]; !ok {
			t.Errorf("daemon JSON lacks %q: %s", k, b)
		}
	}
	if cert := m["certificate"].(map[string]any); cert["days_to_expiry"] != float64(60) || cert["valid"] != true {
		t.Errorf("certificate JSON %v", cert)
	}
	var back telemetry.DaemonHealth
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, d) {
		t.Errorf("JSON round trip differs:\n%+v\n%+v", back, d)
	}

	a := telemetry.AgentHealth{Connected: false}
	a.Evaluate(now, time.Second)
	b, _ = json.Marshal(&a)
	if strings.Contains(string(b), "last_heartbeat_ack") {
		t.Errorf("zero last_heartbeat_ack not omitted: %s", b)
	}
	a = telemetry.AgentHealth{Connected: true, Protocol: "1.0", LastHeartbeatAck: now}
	a.Evaluate(now.Add(time.Second), time.Minute)
	b, _ = json.Marshal(&a)
	for _, k := range []string{`"connected":true`, `"protocol":"1.0"`, `"last_heartbeat_ack":"2026-11-29T12:00:00Z"`, `"heartbeat_ack_age_seconds":1`, `"status":"ok"`} {
		if !strings.Contains(string(b), k) {
			t.Errorf("agent JSON lacks %s: %s", k, b)
		}
	}
}

func TestHealthHandlers(t *testing.T) {
	d := daemonHealth(t, 60)
	d.Evaluate(now)
	down := telemetry.AgentHealth{}
	down.Evaluate(now, 0)
	for _, c := range []struct {
		name   string
		h      http.Handler
		method string
		code   int
		status string
	}{
		{"daemon ok", telemetry.DaemonHealthHandler(func() telemetry.DaemonHealth { return d }), http.MethodGet, 200, "ok"},
		{"agent down", telemetry.AgentHealthHandler(func() telemetry.AgentHealth { return down }), http.MethodGet, 503, "down"},
		{"head", telemetry.DaemonHealthHandler(func() telemetry.DaemonHealth { return d }), http.MethodHead, 200, ""},
		{"post", telemetry.DaemonHealthHandler(func() telemetry.DaemonHealth { return d }), http.MethodPost, 405, ""},
		{"unevaluated", telemetry.DaemonHealthHandler(func() telemetry.DaemonHealth { return telemetry.DaemonHealth{} }), http.MethodGet, 503, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(c.h)
			defer srv.Close()
			req, _ := http.NewRequest(c.method, srv.URL+"/healthz", nil)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != c.code {
				t.Fatalf("status %d, want %d (%s)", resp.StatusCode, c.code, body)
			}
			if c.code == 405 {
				if resp.Header.Get("Allow") != "GET, HEAD" {
					t.Fatalf("Allow %q", resp.Header.Get("Allow"))
				}
				return
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type %q", ct)
			}
			if c.method == http.MethodHead {
				if len(body) != 0 {
					t.Fatalf("HEAD returned a body")
				}
				return
			}
			var m map[string]any
			if err := json.Unmarshal(body, &m); err != nil {
				t.Fatalf("body is not JSON: %v\n%s", err, body)
			}
			if m["status"] != c.status {
				t.Fatalf("status field %v, want %q", m["status"], c.status)
			}
		})
	}
}

func TestHealthTables(t *testing.T) {
	d := daemonHealth(t, 60)
	d.Listeners[1].Active, d.Listeners[1].Error = false, "address in use"
	d.Evaluate(now)
	var buf bytes.Buffer
	if err := d.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"STATUS              degraded",
		"PROBLEM             listener yamux 0.0.0.0:7444 inactive",
		"CONNECTIONS         3 (quic=2, yamux=1)",
		"HANDSHAKE FAILURES  5",
		"CERTIFICATE         CN=daemon.local",
		"days to expiry    60",
		"0.0.0.0:7444",
		"address in use",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("daemon table lacks %q:\n%s", want, out)
		}
	}

	a := telemetry.AgentHealth{Connected: true, Endpoint: "daemon.local:7443", Backend: "quic", Protocol: "1.0",
		LastHeartbeatAck: now.Add(-1500 * time.Millisecond), Running: 2}
	a.Evaluate(now, time.Minute)
	buf.Reset()
	if err := a.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out = buf.String()
	for _, want := range []string{
		"STATUS              ok",
		"CONNECTED           yes",
		"ENDPOINT            daemon.local:7443",
		"PROTOCOL            1.0",
		"LAST HEARTBEAT ACK  2026-11-29T11:59:58Z (1.5s ago)",
		"RUNNING ATTEMPTS    2",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("agent table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "DRAINING") {
		t.Errorf("agent table shows DRAINING while not draining:\n%s", out)
	}
}
