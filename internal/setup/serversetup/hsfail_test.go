package serversetup

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/telemetry"
)

// TestHandshakeFailuresReport: only certificate reasons count in Count
// and are audit records, the rest are debug lines.
func TestHandshakeFailuresReport(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := NewHandshakeFailures(log, telemetry.NewMetrics(), 0, 0)
	remote := &net.UDPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 5555}
	h.Report(semantics.HandshakeFailure{Backend: "quic", Remote: remote, Reason: semantics.HandshakeTimeout, Err: errors.New("timeout")})
	h.Report(semantics.HandshakeFailure{Backend: "quic", Remote: remote, Reason: semantics.HandshakeProtocol, Err: errors.New("not tls")})
	h.Report(semantics.HandshakeFailure{Backend: "quic", Remote: remote, Reason: semantics.HandshakeCertificateExpired, Err: errors.New("expired")})
	h.Close()
	if h.Count() != 1 || h.Suppressed() != 0 {
		t.Fatalf("Count %d Suppressed %d, want 1, 0", h.Count(), h.Suppressed())
	}
	out := buf.String()
	if n := strings.Count(out, `"msg":"audit"`); n != 1 {
		t.Errorf("%d audit records, want 1:\n%s", n, out)
	}
	if !strings.Contains(out, `"reason":"certificate_expired"`) || !strings.Contains(out, `"remote":"192.0.2.7"`) {
		t.Errorf("audit record lacks reason or remote IP:\n%s", out)
	}
	if n := strings.Count(out, `"msg":"tls handshake failed"`); n != 2 {
		t.Errorf("%d debug lines, want 2:\n%s", n, out)
	}
}
