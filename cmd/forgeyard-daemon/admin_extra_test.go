package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/adminapi"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
)

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

func sha256Sum(s string) [32]byte { return sha256.Sum256([]byte(s)) }
