package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/adminapi"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
)

func selfSigned(t *testing.T, notAfter time.Time) *x509.Certificate {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "daemon.test"},
		NotBefore: notAfter.Add(-90 * 24 * time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestWarnCertExpiry: the daemon warns within the window, errors once
// expired, and stays quiet otherwise.
func TestWarnCertExpiry(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		left  time.Duration
		warn  bool
		level string
		text  string
	}{
		{60 * 24 * time.Hour, false, "", ""},
		{3 * 24 * time.Hour, true, "level=WARN", "server certificate expires soon; rotate it before then"},
		{-time.Hour, true, "level=ERROR", "server certificate EXPIRED"},
	} {
		var b bytes.Buffer
		got := warnCertExpiry(slog.New(slog.NewTextHandler(&b, nil)), selfSigned(t, now.Add(c.left)), now)
		if got != c.warn || !strings.Contains(b.String(), c.level) || !strings.Contains(b.String(), c.text) || (!c.warn && b.Len() != 0) {
			t.Errorf("left %v: warned %v, log %q", c.left, got, b.String())
		}
		if c.warn && !strings.Contains(b.String(), `subject="CN=daemon.test"`) {
			t.Errorf("left %v: no subject in %q", c.left, b.String())
		}
	}
}

// failingAuthority answers RunnerStatus with an error.
type failingAuthority struct{ authority.Authority }

func (failingAuthority) RunnerStatus(context.Context, wire.RunnerId) (authority.RunnerStatus, error) {
	return authority.RunnerStatus{}, errors.New("database is locked")
}

// TestStatusAuthorityAndDraining: /status is down when the authority does
// not answer and says why; draining is reported.
func TestStatusAuthorityAndDraining(t *testing.T) {
	tel := newDaemonTelemetry()
	tel.attach(nil, []serversetup.Listener{{Backend: "quic", BackendListener: fakeListener{"127.0.0.1:7443"}}}, nil)
	tel.info = adminInfo{id: "d1", startedAt: time.Now(), au: failingAuthority{}, auBackend: "postgres", protocol: wire.Supported}
	srv := httptest.NewServer(tel.handler(adminAccess{trusted: true}))
	defer srv.Close()
	if code, _, body := httpGet(t, srv.URL+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz before draining: %d %s", code, body)
	}
	tel.draining.Store(true)
	if code, _, body := httpGet(t, srv.URL+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "draining") {
		t.Errorf("/readyz while draining: %d %s, want 503 naming the drain", code, body)
	}
	code, _, body := httpGet(t, srv.URL+"/status")
	var st adminapi.Status
	if code != http.StatusOK || json.Unmarshal([]byte(body), &st) != nil {
		t.Fatalf("/status %d %s", code, body)
	}
	if st.Status != telemetry.StatusDown || st.Authority.Reachable || st.Authority.Backend != "postgres" || st.Authority.Error != "database is locked" ||
		!st.Draining || !strings.Contains(body, "authority (postgres) unreachable: database is locked") || !strings.Contains(body, "draining") || st.Daemon != "d1" {
		t.Errorf("/status %s", body)
	}
	if code, _, body := httpGet(t, srv.URL+"/protocols"); code != 200 || !strings.Contains(body, `"min_protocol": "`+wire.Supported.Min.String()+`"`) {
		t.Errorf("/protocols %d %s", code, body)
	}
	if code, _, _ := httpGet(t, srv.URL+"/nope"); code != http.StatusNotFound {
		t.Errorf("/nope %d", code)
	}
	resp, err := http.Post(srv.URL+"/status", "text/plain", nil)
	if err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /status: %v %v", resp, err)
	}
	if resp != nil {
		resp.Body.Close()
	}
}

// TestAdminAccess: the TCP access rules of each configuration.
func TestAdminAccess(t *testing.T) {
	tel := newDaemonTelemetry()
	tel.attach(nil, []serversetup.Listener{{Backend: "quic", BackendListener: fakeListener{"127.0.0.1:7443"}}}, nil)
	withToken := adminAccess{hasToken: true}
	withToken.tokenHash = sha256Sum("tok")
	public := withToken
	public.publicMetrics = true
	for _, c := range []struct {
		name   string
		access adminAccess
		token  string
		want   map[string]int
	}{
		{"no token configured", adminAccess{}, "", map[string]int{"/healthz": 503, "/metrics": 200, "/status": 403, "/sessions": 403, "/protocols": 403}},
		{"token, none sent", withToken, "", map[string]int{"/healthz": 503, "/metrics": 401, "/status": 401, "/sessions": 401, "/protocols": 401}},
		{"token, wrong one", withToken, "tok2", map[string]int{"/metrics": 401, "/sessions": 401}},
		{"token, right one", withToken, "tok", map[string]int{"/metrics": 200, "/status": 200, "/sessions": 200, "/protocols": 200}},
		{"public metrics", public, "", map[string]int{"/metrics": 200, "/sessions": 401}},
		{"socket", adminAccess{trusted: true}, "", map[string]int{"/metrics": 200, "/status": 200, "/sessions": 200}},
	} {
		srv := httptest.NewServer(tel.handler(c.access))
		for path, want := range c.want {
			if code, _, body := httpGetToken(t, srv.URL+path, c.token); code != want {
				t.Errorf("%s: %s = %d, want %d (%s)", c.name, path, code, want, body)
			}
		}
		srv.Close()
	}
}

// TestAdminPprof: /debug/pprof/ is served only with admin.pprof, with the
// access of /status.
func TestAdminPprof(t *testing.T) {
	tel := newDaemonTelemetry()
	tel.attach(nil, []serversetup.Listener{{Backend: "quic", BackendListener: fakeListener{"127.0.0.1:7443"}}}, nil)
	withToken := adminAccess{hasToken: true}
	withToken.tokenHash = sha256Sum("tok")
	for _, c := range []struct {
		name   string
		pprof  bool
		access adminAccess
		token  string
		want   int
	}{
		{"off", false, adminAccess{trusted: true}, "", http.StatusNotFound},
		{"no token configured", true, adminAccess{}, "", http.StatusForbidden},
		{"token, none sent", true, withToken, "", http.StatusUnauthorized},
		{"token, right one", true, withToken, "tok", http.StatusOK},
		{"socket", true, adminAccess{trusted: true}, "", http.StatusOK},
	} {
		tel.pprof = c.pprof
		srv := httptest.NewServer(tel.handler(c.access))
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap?debug=1"} {
			code, _, body := httpGetToken(t, srv.URL+path, c.token)
			if code != c.want {
				t.Errorf("%s: %s = %d, want %d (%.200s)", c.name, path, code, c.want, body)
			}
			if code == http.StatusOK && !strings.Contains(body, "heap") {
				t.Errorf("%s: %s is not a pprof page: %.200s", c.name, path, body)
			}
		}
		srv.Close()
	}
}

// TestMetricsGoRuntime: /metrics carries the Go runtime's and the
// process's figures beside the forgeyard_ series (the scale harness reads
// the daemon's heap from go_memstats_heap_alloc_bytes).
func TestMetricsGoRuntime(t *testing.T) {
	tel := newDaemonTelemetry()
	tel.attach(nil, []serversetup.Listener{{Backend: "quic", BackendListener: fakeListener{"127.0.0.1:7443"}}}, nil)
	srv := httptest.NewServer(tel.handler(adminAccess{}))
	defer srv.Close()
	code, _, body := httpGet(t, srv.URL+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics %d", code)
	}
	for _, name := range []string{"go_memstats_heap_alloc_bytes ", "go_goroutines ", "process_resident_memory_bytes ", "forgeyard_transport_connections_active"} {
		if !strings.Contains(body, "\n"+name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

// TestAdminSocket: mode 0600, a stale socket is replaced, a live one or a
// regular file at the path is refused, the file is removed at stop.
func TestAdminSocket(t *testing.T) {
	dir := t.TempDir()
	log := slog.New(slog.DiscardHandler)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("hi")) })
	path := filepath.Join(dir, "admin.sock")

	// A stale socket left by a crashed daemon.
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	a, err := startAdminSocket(path, h, log)
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v %v", fi.Mode(), err)
	}
	c, err := adminapi.NewClient("unix://"+path, "", "", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := c.Get(context.Background(), "/", &v); err == nil || !strings.Contains(err.Error(), "is not the expected JSON") {
		t.Errorf("request over the socket: %v", err) // "hi" is served, not JSON
	}
	c.Close()
	if _, err := startAdminSocket(path, h, log); err == nil || !strings.Contains(err.Error(), "in use by another process") {
		t.Errorf("live socket: %v", err)
	}
	a.Stop(time.Second)
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left after stop: %v", err)
	}
	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := startAdminSocket(path, h, log); err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Errorf("regular file: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".admin-sock-*")); len(m) != 0 {
		t.Errorf("temporary directories left: %v", m)
	}
}

func sha256Sum(s string) [32]byte { return sha256.Sum256([]byte(s)) }
