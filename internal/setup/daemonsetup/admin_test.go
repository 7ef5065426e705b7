package daemonsetup

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/adminapi"
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
