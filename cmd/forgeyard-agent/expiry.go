package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"forgeyard.dev/transport/semantics/trust"
)

// Certificate expiry checks (§22): the agent warns at start and then
// every certCheckEvery (every certCheckNear once within the warning
// window) while its certificate expires within
// trust.DefaultExpiryWarningWindow.
const (
	certCheckEvery = 24 * time.Hour
	certCheckNear  = time.Hour
)

// checkCertExpiry reads the certificate file (so a rotated file is seen)
// and logs trust.ExpiryWarning: Warn ahead of expiry, Error once expired.
// It reports whether the certificate is within the window.
func checkCertExpiry(log *slog.Logger, certFile string, now time.Time) bool {
	b, err := readPEMFile(certFile)
	if err != nil {
		log.Warn("cannot read the agent certificate to check its expiry", "path", certFile, "err", err)
		return false
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		return false
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return false
	}
	msg := trust.ExpiryWarning(c, trust.DefaultExpiryWarningWindow, now)
	if msg == "" {
		return false
	}
	level := slog.LevelWarn
	if now.After(c.NotAfter) {
		level = slog.LevelError
	}
	log.Log(context.Background(), level, msg, "event", "certificate.expiry", "path", certFile,
		"not_after", c.NotAfter.UTC().Format(time.RFC3339))
	return true
}

// watchCertExpiry checks at once and then periodically until ctx ends.
func watchCertExpiry(ctx context.Context, log *slog.Logger, certFile string) {
	for {
		every := certCheckEvery
		if checkCertExpiry(log, certFile, time.Now()) {
			every = certCheckNear
		}
		t := time.NewTimer(every)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// maxPEMFile bounds the certificate and CA files doctor and the expiry
// check read.
const maxPEMFile = 1 << 20

// readPEMFile reads a PEM file of at most maxPEMFile bytes.
func readPEMFile(path string) ([]byte, error) {
	return readBounded(path, maxPEMFile, "PEM certificate file")
}

// readBounded reads the file at path; one over limit bytes is refused as
// "<path>: larger than <limit> bytes; not a <what>". A failure to open is
// os.Open's error.
func readBounded(path string, limit int, what string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > limit {
		return nil, fmt.Errorf("%s: larger than %d bytes; not a %s", path, limit, what)
	}
	return b, nil
}
