package semantics

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"
)

func TestClassifyHandshakeError(t *testing.T) {
	now := time.Now()
	future := &x509.Certificate{NotBefore: now.Add(time.Hour), NotAfter: now.Add(2 * time.Hour)}
	past := &x509.Certificate{NotBefore: now.Add(-2 * time.Hour), NotAfter: now.Add(-time.Hour)}
	cve := func(err error, c *x509.Certificate) error {
		return &tls.CertificateVerificationError{UnverifiedCertificates: []*x509.Certificate{c}, Err: err}
	}
	withAlert := func(err error, a uint8) error { return fmt.Errorf("%w%.0w", err, tls.AlertError(a)) }
	for _, tc := range []struct {
		err  error
		want HandshakeFailureReason
	}{
		{nil, ""},
		{cve(x509.UnknownAuthorityError{}, past), HandshakeUnknownAuthority},
		{cve(x509.CertificateInvalidError{Cert: past, Reason: x509.Expired}, past), HandshakeCertificateExpired},
		{cve(x509.CertificateInvalidError{Cert: future, Reason: x509.Expired}, future), HandshakeCertificateNotYetValid},
		{cve(x509.CertificateInvalidError{Reason: x509.IncompatibleUsage}, past), HandshakeBadCertificate},
		{withAlert(errors.New("tls: client didn't provide a certificate"), 116), HandshakeNoClientCertificate},
		{errors.New("tls: client didn't provide a certificate"), HandshakeNoClientCertificate},
		{withAlert(errors.New("x"), 48), HandshakeUnknownAuthority},
		{withAlert(errors.New("x"), 45), HandshakeCertificateExpired},
		{withAlert(errors.New("x"), 42), HandshakeBadCertificate},
		{withAlert(errors.New("x"), 120), HandshakeProtocol},
		{&net.OpError{Op: "remote error", Err: errors.New("tls: unknown certificate authority")}, HandshakeUnknownAuthority},
		{tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, HandshakeProtocol},
		{fmt.Errorf("wrapped: %w", context.DeadlineExceeded), HandshakeTimeout},
		{&net.OpError{Op: "read", Err: timeoutErr{}}, HandshakeTimeout},
		{io.EOF, HandshakeProtocol},
		{errors.New("something else"), HandshakeOther},
	} {
		if got := ClassifyHandshakeError(tc.err); got != tc.want {
			t.Errorf("ClassifyHandshakeError(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestNewHandshakeFailureCertificate(t *testing.T) {
	c := &x509.Certificate{NotAfter: time.Now().Add(-time.Hour)}
	err := fmt.Errorf("quic: %w", &tls.CertificateVerificationError{UnverifiedCertificates: []*x509.Certificate{c}, Err: x509.UnknownAuthorityError{}})
	f := NewHandshakeFailure("quic", nil, err, false)
	if f.Certificate != c || f.Reason != HandshakeUnknownAuthority || f.Backend != "quic" || f.Err != err {
		t.Fatalf("NewHandshakeFailure = %+v", f)
	}
	if !f.Reason.CertificateRelated() || HandshakeTimeout.CertificateRelated() || HandshakeProtocol.CertificateRelated() {
		t.Fatal("CertificateRelated")
	}
}
