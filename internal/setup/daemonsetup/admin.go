package daemonsetup

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"forgeyard.dev/transport/internal/adminapi"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/trust"
)

// AdminHandlers are the admin endpoint's handlers, which the host builds
// (its telemetry's views: /healthz, /metrics, /status, ...): TCP for the
// clients of admin.listen, who must send token as a bearer token ("" when
// admin.token_file is not set: no token to send, and only what needs none
// is served); Socket for the unix socket admin.socket, whose file mode
// authenticates its clients.
type AdminHandlers struct {
	TCP    func(token string) http.Handler
	Socket func() http.Handler
}

// Admin is the operator's side of a running daemon: the admin endpoints
// and the server certificate's expiry warnings.
type Admin struct {
	servers   []*cli.AdminServer
	tcpAddr   string
	stopWatch func()
}

// Addr is the address the TCP admin endpoint serves on, "" without one.
func (a *Admin) Addr() string { return a.tcpAddr }

// Stop stops the expiry warnings, then the endpoints (2 s for the requests
// in flight).
func (a *Admin) Stop() {
	if a.stopWatch != nil {
		a.stopWatch()
	}
	for _, s := range a.servers {
		s.Stop(2 * time.Second)
	}
}

// StartAdmin is the operator step: the admin endpoints of cfg (TCP on
// cfg.AdminListen(), the unix socket admin.socket; either, both or
// neither), then the expiry of the certificate served now (cert) checked
// in the log at start and daily. On an error, what it started is stopped.
func StartAdmin(cfg *config.Daemon, cert func() *x509.Certificate, h AdminHandlers, log *slog.Logger) (_ *Admin, err error) {
	a := &Admin{}
	defer func() {
		if err != nil {
			a.Stop()
		}
	}()
	paths := "/healthz /readyz /metrics /status /sessions /protocols /runners"
	if cfg.Admin.Pprof {
		paths += " /debug/pprof/"
	}
	if addr := cfg.AdminListen(); addr != "" {
		adm, err := startAdminTCP(cfg.Admin, addr, h.TCP, paths, log)
		if err != nil {
			return nil, err
		}
		a.servers, a.tcpAddr = append(a.servers, adm), adm.Addr()
	}
	if p := cfg.Admin.Socket; p != "" {
		adm, err := startAdminSocket(p, h.Socket(), log)
		if err != nil {
			return nil, fmt.Errorf("admin.socket: %w", err)
		}
		a.servers = append(a.servers, adm)
		log.Info("admin socket listening", "path", p, "paths", paths, "auth", "file mode 0600")
	}
	a.stopWatch = watchCertExpiry(cert, log)
	return a, nil
}

// startAdminTCP serves the handler tcp builds for the bearer token of
// cfg.TokenFile on addr.
func startAdminTCP(cfg config.Admin, addr string, tcp func(token string) http.Handler, paths string, log *slog.Logger) (*cli.AdminServer, error) {
	var token string
	if cfg.TokenFile != "" {
		tok, err := adminapi.ReadTokenFile(cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("admin.token_file: %w", err)
		}
		token = tok
		if fi, err := os.Stat(cfg.TokenFile); err == nil && fi.Mode().Perm()&0o077 != 0 {
			log.Warn("admin.token_file is readable by other users; chmod 0600 it", "path", cfg.TokenFile, "mode", fi.Mode().Perm().String())
		}
	}
	adm, err := cli.ListenAdmin(addr, tcp(token), log)
	if err != nil {
		return nil, fmt.Errorf("admin.listen: %w", err)
	}
	auth := "bearer token (not /healthz, /readyz)"
	switch {
	case token == "":
		auth = "none (only /healthz, /readyz and /metrics served)"
	case cfg.PublicMetrics:
		auth = "bearer token (not /healthz, /readyz, /metrics)"
	}
	log.Info("admin endpoint listening", "addr", adm.Addr(), "paths", paths, "auth", auth)
	if token == "" {
		log.Warn("admin endpoint without admin.token_file: TCP serves only /healthz, /readyz and /metrics; use admin.socket or set a token for /status, /sessions, /protocols", "addr", adm.Addr())
	}
	return adm, nil
}

// startAdminSocket serves h on a unix socket at path, mode 0600. A stale
// socket file (nobody accepting) is replaced; any other existing file is
// an error.
func startAdminSocket(path string, h http.Handler, log *slog.Logger) (*cli.AdminServer, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket; remove it or choose another admin.socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s is in use by another process (another daemon?)", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("removing stale socket %s: %w", path, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	ln, err := listenUnixPrivate(path)
	if err != nil {
		return nil, err
	}
	return cli.ServeAdmin(ln, path, h, log), nil
}

// listenUnixPrivate listens on a unix socket at path that is owner-only
// (0600) from the moment it appears there: the socket is bound inside a
// fresh 0700 directory beside path, chmod-ed, then renamed into place.
func listenUnixPrivate(path string) (net.Listener, error) {
	dir, err := os.MkdirTemp(filepath.Dir(path), ".admin-sock-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: tmp, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false) // the server removes path itself at stop
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// certCheckEvery is how often the daemon re-checks its certificate's
// expiry (it also checks at start).
const certCheckEvery = 24 * time.Hour

// watchCertExpiry checks cert's expiry at start and every certCheckEvery
// until stop.
func watchCertExpiry(cert func() *x509.Certificate, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		warnCertExpiry(log, cert(), time.Now())
		tick := time.NewTicker(certCheckEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				warnCertExpiry(log, cert(), now)
			}
		}
	}()
	return func() { cancel(); <-done }
}

// warnCertExpiry logs a warning when cert expires within the window (§22).
func warnCertExpiry(log *slog.Logger, cert *x509.Certificate, now time.Time) bool {
	if cert == nil || !trust.ExpiresWithin(cert, trust.DefaultExpiryWarningWindow, now) {
		return false
	}
	h := telemetry.CertHealthOf(cert, now)
	if now.After(cert.NotAfter) {
		log.Error("server certificate EXPIRED: agents refuse to connect; rotate it now", "subject", h.Subject,
			"not_after", h.NotAfter.Format(time.RFC3339))
		return true
	}
	log.Warn("server certificate expires soon; rotate it before then", "subject", h.Subject,
		"not_after", h.NotAfter.Format(time.RFC3339), "days_to_expiry", h.DaysToExpiry)
	return true
}
