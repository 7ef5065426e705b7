package serversetup

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics/trust"
)

// ReloadingServerTLS is ServerTLS whose certificate is served through a
// CertReloader that runs until stop is called: it checks the files every
// c.ReloadInterval and reloads at once on SIGHUP. The daemon and the relay
// use it so that a rotated server certificate needs no restart.
func ReloadingServerTLS(c config.ServerTLS, log *slog.Logger) (_ *tls.Config, _ *CertReloader, stop func(), _ error) {
	base, err := ServerTLS(c)
	if err != nil {
		return nil, nil, nil, err
	}
	r, err := NewCertReloader(c.Certificate, c.PrivateKey, log)
	if err != nil {
		return nil, nil, nil, err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx, c.ReloadInterval.Duration, hup) }()
	stop = func() {
		signal.Stop(hup)
		cancel()
		<-done
	}
	return r.TLSConfig(base), r, stop, nil
}

// DefaultCertReloadInterval is how often a CertReloader looks at its files.
const DefaultCertReloadInterval = time.Minute

// CertReloader serves a server certificate (the daemon's or the relay's)
// from its PEM files and picks up replaced files without a restart: on
// SIGHUP (the caller passes the signal channel to Run) and whenever a
// periodic check sees a file's size or modification time change. Files
// that fail to load (half-written, key and certificate not matching yet,
// expired) are reported and the current certificate is kept, so a bad
// rotation never takes listeners down. Safe for concurrent use.
type CertReloader struct {
	certFile, keyFile string
	creds             *trust.Credentials
	log               *slog.Logger

	mu      sync.Mutex
	stamp   [2]fileStamp // of the files last loaded (or last tried)
	reloads int
}

type fileStamp struct {
	size int64
	mod  time.Time
}

func stampOf(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{size: -1}
	}
	return fileStamp{size: fi.Size(), mod: fi.ModTime()}
}

// NewCertReloader loads the server certificate and key (checked as
// trust.ServerConfig checks them).
func NewCertReloader(certFile, keyFile string, log *slog.Logger) (*CertReloader, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &CertReloader{certFile: certFile, keyFile: keyFile, log: log}
	r.stamp = [2]fileStamp{stampOf(certFile), stampOf(keyFile)}
	creds, err := trust.LoadServerCredentials(certFile, keyFile)
	if err != nil {
		return nil, config.WithTrustKeys(err, config.ServerTLSKeys)
	}
	r.creds = creds
	return r, nil
}

// TLSConfig returns a clone of base whose handshakes present the current
// certificate.
func (r *CertReloader) TLSConfig(base *tls.Config) *tls.Config { return r.creds.ServerConfigFor(base) }

// Leaf returns the certificate currently served.
func (r *CertReloader) Leaf() *x509.Certificate { return r.creds.Leaf() }

// Reloads counts the successful reloads.
func (r *CertReloader) Reloads() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reloads
}

// Reload re-reads the files now. On error the current certificate stays.
func (r *CertReloader) Reload() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reloadLocked("requested")
}

func (r *CertReloader) reloadLocked(why string) error {
	r.stamp = [2]fileStamp{stampOf(r.certFile), stampOf(r.keyFile)}
	old := r.creds.Leaf()
	if err := r.creds.Reload(); err != nil {
		r.log.Error("server certificate files could not be loaded; still serving the previous certificate",
			"why", why, "err", err, "serial", trust.SerialString(old), "not_after", old.NotAfter.UTC().Format(time.RFC3339))
		return fmt.Errorf("reload server certificate: %w", err)
	}
	leaf := r.creds.Leaf()
	if trust.SerialString(leaf) == trust.SerialString(old) {
		return nil
	}
	r.reloads++
	r.log.Info("server certificate reloaded", "why", why, "old_serial", trust.SerialString(old),
		"serial", trust.SerialString(leaf), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// Check reloads when a file's size or modification time changed since the
// last load; it reports whether it tried.
func (r *CertReloader) Check() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := [2]fileStamp{stampOf(r.certFile), stampOf(r.keyFile)}; now == r.stamp {
		return false, nil
	}
	return true, r.reloadLocked("files changed")
}

// Run checks the files every interval (≤ 0: DefaultCertReloadInterval) and
// reloads at once on each value from hup (nil: none), until ctx ends.
func (r *CertReloader) Run(ctx context.Context, interval time.Duration, hup <-chan os.Signal) {
	if interval <= 0 {
		interval = DefaultCertReloadInterval
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			_, _ = r.Check()
		case <-hup:
			r.mu.Lock()
			_ = r.reloadLocked("SIGHUP")
			r.mu.Unlock()
		}
	}
}
