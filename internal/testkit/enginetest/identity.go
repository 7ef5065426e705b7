package enginetest

import (
	"context"
	"crypto/tls"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// NewIDWorld is NewWorldWith for identity tests: the listener accepts
// connections without a client certificate (enrollment), the daemon signs
// with the PKI's CA and polls revocations every 50 ms.
func NewIDWorld(t *testing.T, b Backend, pki *trusttest.PKI, auth authority.Authority, opts ...WorldOpt) *World {
	t.Helper()
	srv := pki.ServerConfig(t, "localhost")
	srv.ClientAuth = tls.VerifyClientCertIfGiven
	cfg := daemon.Config{Identity: daemon.IdentityConfig{Issuer: pki.Issuer(time.Hour), RevocationPoll: 50 * time.Millisecond}}
	return newWorld(t, b, pki, auth, cfg, srv, opts)
}

// SqliteAuth opens an SQLite authority in a temporary directory, closed
// at the end of the test.
func SqliteAuth(t *testing.T) authority.Authority {
	t.Helper()
	a, err := authority.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

// CreateToken stores a fresh token valid for ttl and returns it.
func CreateToken(t *testing.T, auth authority.Authority, name string, ttl time.Duration) string {
	t.Helper()
	tok, err := trust.NewEnrollmentToken()
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := authority.IdentitiesOf(auth).CreateEnrollmentToken(context.Background(), authority.EnrollmentToken{
		Hash: trust.HashEnrollmentToken(tok), ID: trust.EnrollmentTokenID(tok), Name: name, CreatedAt: now.Add(-time.Second), ExpiresAt: now.Add(ttl)}); err != nil {
		t.Fatal(err)
	}
	return tok
}

// Enroll enrolls with token tok at w's daemon over dialer (nil: a
// dialer without a client certificate).
func Enroll(w *World, tok string, dialer semantics.BackendDialer) (*agent.Enrollment, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if dialer == nil {
		dialer = w.B.Dialer(w.T, w.Pki.NoClientCertConfig(w.T, "localhost"))
	}
	return agent.Enroll(ctx, agent.EnrollRequest{Endpoint: agent.Endpoint{Address: w.Addr, Dialer: dialer, Backend: w.B.Name},
		Token: tok, RequestTimeout: 8 * time.Second})
}

// StartEnrolled runs an agent on an enrolled identity with rotatable
// credentials stored in dir.
func StartEnrolled(w *World, en *agent.Enrollment, dir string, exec agent.Executor, opts ...AgentOpt) (*agent.Agent, *trust.Credentials, chan error) {
	w.T.Helper()
	cf, kf := filepath.Join(dir, "agent.pem"), filepath.Join(dir, "agent-key.pem")
	if err := trust.WriteCredentialFiles(cf, kf, en.Chain, en.Key); err != nil {
		w.T.Fatal(err)
	}
	creds, err := trust.LoadCredentials(cf, kf)
	if err != nil {
		w.T.Fatal(err)
	}
	credFiles.Store(creds, [2]string{cf, kf})
	return StartWithCreds(w, en.Runner, creds, exec, opts...)
}

func StartWithCreds(w *World, runner wire.RunnerId, creds *trust.Credentials, exec agent.Executor, opts ...AgentOpt) (*agent.Agent, *trust.Credentials, chan error) {
	w.T.Helper()
	cli := creds.ClientConfigFor(w.Pki.NoClientCertConfig(w.T, "localhost"))
	a, _, runErr := w.StartAgent(Identity{Runner: runner, Cert: *creds.Certificate()}, exec, append([]AgentOpt{func(c *agent.Config) {
		c.Signer, c.CertChain, c.Credentials = nil, nil, creds
		c.Endpoints[0].Dialer = &RecDialer{Inner: w.B.Dialer(w.T, cli)}
	}}, opts...)...)
	return a, creds, runErr
}

// credFiles maps credentials written by StartEnrolled to their files.
var credFiles sync.Map

// FilepathOf returns the files of credentials started by StartEnrolled.
func FilepathOf(t *testing.T, c *trust.Credentials) (string, string) {
	t.Helper()
	v, ok := credFiles.Load(c)
	if !ok {
		t.Fatal("credentials not file-backed by StartEnrolled")
	}
	p := v.([2]string)
	return p[0], p[1]
}
