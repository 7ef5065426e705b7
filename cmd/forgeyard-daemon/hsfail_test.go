package main

import (
	"bufio"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// TestHandshakeFailureAudited runs the daemon main with a TLS+yamux
// listener and shows that a client certificate from a foreign CA, rejected
// inside the TLS handshake, becomes one auth.failure audit record (reason
// unknown_authority, with backend, remote IP and the certificate), a
// forgeyard_transport_handshake_failures_total increment and /healthz
// handshake_failures; then that a burst of 200 such handshakes writes at
// most the audit limit (burst 20 plus 10/s) while every suppressed record
// is accounted for (a "suppressed" attribute or an "audit suppressed"
// summary), so written + suppressed = offered.
func TestHandshakeFailureAudited(t *testing.T) {
	fd := startFileDaemon(t, "")
	pki, addr, admin, logs := fd.pki, fd.addr, fd.admin, fd.logs
	base := "http://" + admin
	const series = `forgeyard_transport_handshake_failures_total{backend="yamux",reason="unknown_authority"}`
	// awaitMetric polls /metrics (the failure happens inside the daemon's
	// handshake goroutine; there is no event to wait on from here).
	awaitMetric := func(want float64) {
		t.Helper()
		var v float64
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			_, _, text := httpGet(t, base+"/metrics")
			if v = metricValue(t, text, series); v >= want {
				break
			}
		}
		if v != want {
			t.Fatalf("%s = %v, want %v; log:\n%s", series, v, want, logs.String())
		}
	}

	other := trusttest.NewPKI(t)
	foreign := other.ClientConfig(t, wire.NewRunnerId(), "localhost")
	foreign.RootCAs = pki.CAPool() // trusts the daemon: the daemon is the one that rejects
	foreign.NextProtos = []string{yamux.ALPN}
	foreignLeaf := foreign.Certificates[0].Leaf
	badHandshake := func() error {
		c, err := tls.Dial("tcp", addr, foreign)
		if err != nil {
			return err
		}
		defer c.Close()
		// TLS 1.3: the client's handshake is done before the daemon checks
		// its certificate; wait for the daemon's alert.
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var b [1]byte
		if _, err := c.Read(b[:]); err == nil {
			return fmt.Errorf("the daemon accepted a foreign certificate")
		}
		return nil
	}

	// One rejected handshake: one audit record with the typed attributes.
	if err := badHandshake(); err != nil {
		t.Fatal(err)
	}
	awaitMetric(1)
	recs := auditRecords(t, logs.String())
	if len(recs) != 1 {
		t.Fatalf("%d handshake audit records, want 1:\n%s", len(recs), logs.String())
	}
	checkHandshakeAudit(t, recs[0], map[string]string{
		"backend": "yamux", "remote": "127.0.0.1", "reason": "unknown_authority", "by_peer": "false",
		"cert_subject": foreignLeaf.Subject.String(), "cert_issuer": foreignLeaf.Issuer.String(),
		"cert_serial": foreignLeaf.SerialNumber.Text(16), "error": "*",
	})
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"msg":"audit"`) {
			t.Logf("audit record: %s", line)
		}
	}
	if recs[0]["event"] != "auth.failure" {
		t.Errorf("event %v", recs[0]["event"])
	}
	_, _, body := httpGet(t, base+"/healthz")
	var h telemetry.DaemonHealth
	if err := json.Unmarshal([]byte(body), &h); err != nil || h.HandshakeFailures != 1 || h.RegistrationFailures != 0 {
		t.Errorf("/healthz handshake_failures %d registration_failures %d (%v): %s", h.HandshakeFailures, h.RegistrationFailures, err, body)
	}

	// A burst of 200: bounded records, nothing lost from the count.
	const burst = 200
	start := time.Now()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	errs := make(chan error, burst)
	for range burst {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := badHandshake(); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	awaitMetric(1 + burst)
	elapsed := time.Since(start)
	fd.stop(t) // Close writes the pending suppressed count
	recs = auditRecords(t, logs.String())
	written, suppressed := len(recs), 0
	for _, r := range recs {
		if s, ok := r["suppressed"].(string); ok {
			n, err := strconv.Atoi(s)
			if err != nil || n <= 0 {
				t.Errorf("suppressed=%q", s)
			}
			suppressed += n
		}
	}
	summaries := 0
	for _, r := range logRecords(t, logs.String()) {
		if r["msg"] == "audit suppressed" {
			summaries++
			suppressed += int(r["suppressed"].(float64))
		}
	}
	limit := telemetry.DefaultAuditBurst + int(math.Ceil(elapsed.Seconds()*telemetry.DefaultAuditRate)) + 1 // +1: the first record
	t.Logf("%d handshakes in %v: %d audit records (limit %d), %d suppressed (%d summary records)", 1+burst, elapsed.Round(time.Millisecond), written, limit, suppressed, summaries)
	if written > limit {
		t.Errorf("%d audit records for %d failed handshakes in %v, want at most %d", written, 1+burst, elapsed, limit)
	}
	if written+suppressed != 1+burst {
		t.Errorf("%d written + %d suppressed = %d, want %d", written, suppressed, written+suppressed, 1+burst)
	}
	if suppressed == 0 {
		t.Error("nothing was suppressed: the limit did not apply")
	}
}

// logRecords parses every JSON log line.
func logRecords(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			continue // not a JSON record (none expected, but not this test's concern)
		}
		out = append(out, m)
	}
	return out
}

// auditRecords returns the audit records of failed TLS handshakes (those
// with a backend attribute).
func auditRecords(t *testing.T, logs string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, r := range logRecords(t, logs) {
		if r["msg"] == "audit" && r["backend"] != nil {
			out = append(out, r)
		}
	}
	return out
}

// checkHandshakeAudit asserts rec carries exactly the given attributes
// besides the slog envelope and event ("*": any non-empty value).
func checkHandshakeAudit(t *testing.T, rec map[string]any, want map[string]string) {
	t.Helper()
	for k, v := range rec {
		switch k {
		case "time", "level", "msg", "daemon", "event":
			continue
		}
		w, ok := want[k]
		if !ok {
			t.Errorf("unexpected audit attribute %s=%v", k, v)
			continue
		}
		if s, _ := v.(string); s == "" || (w != "*" && s != w) {
			t.Errorf("audit %s=%v, want %s", k, v, w)
		}
	}
	for k := range want {
		if _, ok := rec[k]; !ok {
			t.Errorf("audit record lacks %s: %v", k, rec)
		}
	}
}
