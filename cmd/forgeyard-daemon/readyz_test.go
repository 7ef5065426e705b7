package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// awaitCode polls path until it answers want, and returns the body.
func awaitCode(t *testing.T, url string, want int, within time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		code, _, body := httpGet(t, url)
		if code == want {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %d after %v, want %d: %s", url, code, within, want, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestReadyzPostgresDownAtStart (issue 27 item 4): a daemon started while
// its PostgreSQL authority is down serves: /readyz answers 503 with the
// authority's error and /healthz carries the same probe (reachable false,
// last_error, its time) while keeping its own status. Once PostgreSQL is
// started /readyz turns 200 by itself, an agent registers, and the LISTEN
// watch — whose first connection failed at the daemon's start — is up:
// a runner disabled through another authority handle (another daemon)
// reaches this daemon as an event and its transport is closed at once,
// although the periodic revocation check runs only every hour here.
func TestReadyzPostgresDownAtStart(t *testing.T) {
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	dsn := srv.NewDatabase(t)
	open := func() authority.Authority {
		a, err := authority.OpenPostgres(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = a.Close() })
		return a
	}
	other, mine := open(), open()
	if err := srv.StopServer("fast"); err != nil {
		if strings.Contains(err.Error(), "external") {
			t.Skip("FORGEYARD_PG_DSN: an external server cannot be stopped")
		}
		t.Fatal(err)
	}
	tel := newDaemonTelemetry()
	w := enginetest.NewWorldWith(t, enginetest.MemoryBackend(), trusttest.NewPKI(t), mine, func(c *daemon.Config) {
		c.Metrics = tel.m
		c.HealthProbe = daemon.HealthProbe{Interval: 100 * time.Millisecond, Timeout: time.Second}
		c.Timing.RequestTimeout = 3 * time.Second
		c.Timing.HeartbeatInterval = time.Minute // the raw client sends none
		c.Identity.RevocationPoll = time.Hour    // only an event can close the transport within the test
	})
	tel.attach(w.D, []serversetup.Listener{{Backend: "memory", BackendListener: fakeListener{"127.0.0.1:7443"}}}, nil)
	hs := httptest.NewServer(tel.handler(adminAccess{})) // TCP without a token: /readyz is public like /healthz
	defer hs.Close()

	body := awaitCode(t, hs.URL+"/readyz", http.StatusServiceUnavailable, 10*time.Second)
	var r telemetry.Readiness
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("/readyz body: %v: %s", err, body)
	}
	if r.Ready || r.Authority == nil || !r.Authority.Configured || !r.Authority.Probed || r.Authority.Reachable ||
		r.Authority.LastError == "" || r.Authority.LastErrorAt.IsZero() || len(r.Problems) == 0 {
		t.Fatalf("/readyz with PostgreSQL down: %s", body)
	}
	_, _, body = httpGet(t, hs.URL+"/healthz")
	var h telemetry.DaemonHealth
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		t.Fatalf("/healthz body: %v: %s", err, body)
	}
	if h.Authority == nil || h.Authority.Reachable || h.Authority.LastError == "" || h.ObjectStore == nil || h.ObjectStore.Configured {
		t.Fatalf("/healthz with PostgreSQL down: %s", body)
	}
	for _, p := range h.Problems {
		if strings.Contains(p, "authority") {
			t.Fatalf("/healthz status changed by the authority probe: %s", body)
		}
	}

	if err := srv.StartServer(); err != nil {
		t.Fatal(err)
	}
	body = awaitCode(t, hs.URL+"/readyz", http.StatusOK, 30*time.Second)
	if err := json.Unmarshal([]byte(body), &r); err != nil || !r.Ready || !r.Authority.Reachable || r.Authority.LastError == "" {
		t.Fatalf("/readyz after the restart (the last error stays): %v %s", err, body)
	}
	if _, _, body := httpGet(t, hs.URL+"/metrics"); !strings.Contains(body, "forgeyard_authority_up 1") {
		t.Errorf("/metrics lacks forgeyard_authority_up 1")
	}

	id := w.NewIdentity()
	rc := w.DialRaw(id)
	rc.Join(wire.NewAgentSessionId())
	w.AwaitActive(id.Runner)
	// The watch may still be in its backoff (at most 5 s): a disable
	// committed before it listens is not delivered (best effort), so
	// disable, enable and disable again until the transport is closed.
	deadline := time.Now().Add(30 * time.Second)
	for enabled := false; ; enabled = !enabled {
		// The other handle's pooled connections died with the server: the
		// first statement on each fails (57P01 admin shutdown); retry.
		if err := other.SetRunnerEnabled(context.Background(), id.Runner, enabled, "test", time.Now()); err != nil {
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
			continue
		}
		if !enabled {
			select {
			case <-rc.Sc.Done():
				var ce *semantics.ConnError
				if !errors.As(rc.Sc.Err(), &ce) || ce.Code != wire.CloseRunnerDisabled {
					t.Fatalf("transport closed with %v, want %s; daemon log:\n%s", rc.Sc.Err(), wire.CloseRunnerDisabled, w.LogBuf.String())
				}
				return
			case <-time.After(time.Second):
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the runner disabled through another handle was not closed here within 30 s: the watch is not up; daemon log:\n%s", w.LogBuf.String())
		}
	}
}

// TestProcessWaitsForPostgres (issue 27 item 4): forgeyard-daemon started
// while its PostgreSQL is stopped does not exit: it logs that it waits
// for the authority (WARN, naming authority.postgres_dsn_file), and once
// PostgreSQL is started it opens the authority and listens. A SIGTERM
// while waiting ends it cleanly.
func TestProcessWaitsForPostgres(t *testing.T) {
	srv, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	dir := t.TempDir()
	dsnFile := filepath.Join(dir, "pg.dsn")
	if err := os.WriteFile(dsnFile, []byte(srv.NewDatabase(t)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	daemonBin, _ := buildCommands(t, dir)
	if err := srv.StopServer("fast"); err != nil {
		t.Fatal(err)
	}
	start := func(name string) *process {
		return startProcess(t, daemonBin, filepath.Join(dir, name), "--dev-pki", filepath.Join(dir, "pki"), "--postgres-dsn-file", dsnFile,
			"--listen", fmt.Sprintf("127.0.0.1:%d", freeUDPPort(t)), "--listen-webtransport", "", "--log-format", "json")
	}
	waiting := func(p *process) func() bool {
		return func() bool { return p.count("waiting for the PostgreSQL authority") >= 2 }
	}

	// SIGTERM while waiting: a clean exit, not a hang.
	early := start("early.log")
	early.await(t, "the daemon waiting for PostgreSQL", waiting(early))
	if k := early.logValue("waiting for the PostgreSQL authority", "key"); k != "authority.postgres_dsn_file" {
		t.Errorf("the waiting line names key %q, want authority.postgres_dsn_file", k)
	}
	if e := early.logValue("waiting for the PostgreSQL authority", "err"); !strings.Contains(e, dsnFile) || strings.Contains(e, "password=") {
		t.Errorf("the waiting line's error %q should name the DSN file and never the DSN", e)
	}
	_ = early.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-early.done:
		early.done <- err // for the cleanup
	case <-time.After(20 * time.Second):
		t.Fatal("the waiting daemon did not stop on SIGTERM")
	}

	d := start("daemon.log")
	d.await(t, "the daemon waiting for PostgreSQL", waiting(d))
	if n := d.count("listening"); n != 0 {
		t.Fatalf("listening before the authority opened:\n%s", d.log())
	}
	if err := srv.StartServer(); err != nil {
		t.Fatal(err)
	}
	d.await(t, "the daemon listening once PostgreSQL is up", func() bool { return d.count("listening") > 0 })
	if d.count("the PostgreSQL authority is reachable") != 1 {
		t.Errorf("no line saying the authority became reachable:\n%s", d.log())
	}
	d.stop(t)
}
