package config

import (
	"errors"
	"io/fs"
	"strings"
	"testing"

	"forgeyard.dev/transport/semantics/trust"
)

// TestWithTrustKeys: credential errors name the configuration key, not the
// Go field, and still unwrap to the trust kinds and the cause.
func TestWithTrustKeys(t *testing.T) {
	_, err := trust.ServerConfig(trust.ServerFiles{CertFile: "/nope/server.pem", KeyFile: "/nope/server-key.pem", ClientCAFile: "/nope/ca.pem", RequireClientCert: true})
	if err == nil {
		t.Fatal("missing files accepted")
	}
	got := WithTrustKeys(err, ServerTLSKeys)
	if msg := got.Error(); !strings.HasPrefix(msg, `tls.certificate "/nope/server.pem": `) || strings.Contains(msg, "CertFile") {
		t.Errorf("message %q; want it to start with the key tls.certificate and not name CertFile", msg)
	}
	var fe *trust.FileError
	if !errors.As(got, &fe) || !errors.Is(got, fs.ErrNotExist) {
		t.Errorf("%v does not unwrap to the trust.FileError and fs.ErrNotExist", got)
	}
	_, err = trust.ClientConfig(trust.ClientFiles{KeyFile: "/nope/agent-key.pem"})
	if msg := WithTrustKeys(err, AgentCredentialKeys).Error(); err == nil || strings.Contains(msg, "CertFile") || strings.Contains(msg, "KeyFile") ||
		!strings.Contains(msg, "control_plane.credential.certificate") {
		t.Errorf("half a key pair: %q (from %v)", msg, err)
	}
	if other := errors.New("x"); WithTrustKeys(other, ServerTLSKeys) != other {
		t.Error("another error was rewritten")
	}
}
