package adminapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestReadTokenFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if tok, err := ReadTokenFile(write("ok", "  abc123\n")); err != nil || tok != "abc123" {
		t.Errorf("ok: %q %v", tok, err)
	}
	for _, c := range []struct{ path, want string }{
		{write("empty", "\n"), "is empty"},
		{write("spaces", "a b\n"), "one line without spaces"},
		{write("big", strings.Repeat("x", MaxTokenFile+1)), "larger than"},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		if _, err := ReadTokenFile(c.path); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.path, err, c.want)
		}
	}
}

func TestNewClientTargets(t *testing.T) {
	for _, c := range []struct{ admin, target, err string }{
		{"http://127.0.0.1:9464", "127.0.0.1:9464", ""},
		{"127.0.0.1:9464", "127.0.0.1:9464", ""},
		{"https://admin.example:443", "admin.example:443", ""},
		{"unix:///run/forgeyard/admin.sock", "/run/forgeyard/admin.sock", ""},
		{"/run/forgeyard/admin.sock", "/run/forgeyard/admin.sock", ""},
		{"", "", "no admin endpoint"},
		{"unix://", "", "missing socket path"},
		{"ftp://x", "", "want http://HOST:PORT"},
		{"http://h:1/path", "", "want http://HOST:PORT"},
	} {
		cl, err := NewClient(c.admin, "", "", time.Second)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%q: %v, want %q", c.admin, err, c.err)
			}
			continue
		}
		if err != nil || cl.Target() != c.target {
			t.Errorf("%q: %v target %q", c.admin, err, cl.Target())
		}
	}
}

// TestClientAnswers: status codes map to actionable errors; bodies
// decode; the token is sent as a bearer token.
func TestClientAnswers(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case PathProtocols:
			if r.Header.Get("Authorization") != "Bearer tok" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			w.Write([]byte(`{"min_protocol":"1.0"}`))
		case PathStatus:
			w.WriteHeader(http.StatusForbidden)
			w.Write([]byte(`{"error":"use the socket"}`))
		case PathHealth:
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"status":"down"}`))
		case PathSessions:
			w.Write([]byte(`not json`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	ctx := context.Background()
	good, _ := NewClient(srv.URL, "tok", "the token in f", time.Second)
	var p Protocols
	if err := good.Get(ctx, PathProtocols, &p); err != nil || p.MinProtocol != "1.0" {
		t.Errorf("protocols: %v %+v", err, p)
	}
	bad, _ := NewClient(srv.URL, "nope", "the token in /etc/t", time.Second)
	none, _ := NewClient(srv.URL, "", "", time.Second)
	host := strings.TrimPrefix(srv.URL, "http://")
	var h struct{ Status string }
	for _, c := range []struct {
		c    *Client
		path string
		want string
	}{
		{bad, PathProtocols, "401: the token in /etc/t does not match the daemon's admin.token_file"},
		{none, PathProtocols, "401: admin endpoint " + host + " requires a token"},
		{good, PathStatus, "403: use the socket"},
		{good, PathSessions, "is not the expected JSON"},
		{good, "/nope", "404: admin endpoint " + host + " has no /nope"},
	} {
		var v any
		if err := c.c.Get(ctx, c.path, &v); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.path, err, c.want)
		}
	}
	if err := good.Get(ctx, PathHealth, &h); err != nil || h.Status != "down" {
		t.Errorf("/healthz 503 must decode: %v %+v", err, h)
	}
}
