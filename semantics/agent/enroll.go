package agent

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// ErrNotConnected is RenewCertificate's error when no registered transport
// is up.
var ErrNotConnected = errors.New("agent: not connected")

// ErrRenewalUnsupported: the daemon negotiated a protocol version before
// 1.2, which has no CertificateRequestV1 (enrollment and renewal are new in
// 1.2); such a daemon would not understand the request.
var ErrRenewalUnsupported = errors.New("the daemon's protocol version predates certificate enrollment and renewal (1.2)")

// credentials returns the key and chain of the next registration.
func (a *Agent) credentials() (crypto.Signer, [][]byte) {
	if c := a.cfg.Credentials; c != nil {
		return c.Signer(), c.Chain()
	}
	return a.cfg.Signer, a.cfg.CertChain
}

// certRenewLoop renews the certificate over link l when it is due (§21):
// at trust.RenewAt (2/3 of its lifetime or RenewWindow before expiry).
// After a renewal it closes l so that Run reconnects with the new
// certificate under the same AgentSessionId (the attempts continue after
// resync). Failed renewals are retried every 1/20 of the remaining
// lifetime (1 s to 10 min).
func (a *Agent) certRenewLoop(ctx context.Context, l *link) {
	for {
		leaf := a.cfg.Credentials.Leaf()
		wait := trust.RenewAt(leaf, a.cfg.RenewWindow).Sub(a.now())
		if wait > 0 && !sleepCtx(ctx, wait) {
			return
		}
		err := a.renewOn(ctx, l)
		if err == nil {
			_ = l.bc.CloseWithCode(wire.CloseNormal, "certificate renewed; reconnecting with it")
			return
		}
		if ctx.Err() != nil {
			return
		}
		retry := min(max(leaf.NotAfter.Sub(a.now())/20, time.Second), 10*time.Minute)
		a.log.Warn("certificate renewal failed; retrying", "err", err, "retry_in", retry,
			"expiry_warning", trust.ExpiryWarning(leaf, a.cfg.RenewWindow, a.now()))
		if !sleepCtx(ctx, retry) {
			return
		}
	}
}

// RenewCertificate renews the certificate now over the current transport
// (Config.Credentials must be set), stores it, and reconnects with it. It
// returns once the new certificate is stored; the reconnect follows
// asynchronously. ErrNotConnected when no transport is registered.
func (a *Agent) RenewCertificate(ctx context.Context) error {
	if a.cfg.Credentials == nil {
		return errors.New("agent: RenewCertificate needs Config.Credentials")
	}
	l, _ := a.currentLink()
	if l == nil {
		return ErrNotConnected
	}
	if err := a.renewOn(ctx, l); err != nil {
		return err
	}
	_ = l.bc.CloseWithCode(wire.CloseNormal, "certificate renewed; reconnecting with it")
	return nil
}

// renewOn asks the daemon on l for a certificate for a fresh key and
// stores it (Credentials.Update writes the files atomically).
func (a *Agent) renewOn(ctx context.Context, l *link) error {
	creds := a.cfg.Credentials
	key, err := trust.GenerateKey()
	if err != nil {
		return err
	}
	csr, err := trust.CreateCSR(key, creds.Leaf().Subject.CommonName)
	if err != nil {
		return err
	}
	if l.protocol.Less(wire.V(1, 2)) { // CertificateRequestV1 is new in protocol 1.2
		return fmt.Errorf("agent: certificate renewal: %w (negotiated %s)", ErrRenewalUnsupported, l.protocol)
	}
	env, err := l.ch.Call(ctx, control.Out{Msg: &agentwire.CertificateRequestV1{CSR: csr}}, a.cfg.RequestTimeout)
	if err != nil {
		return fmt.Errorf("agent: certificate renewal: %w", err)
	}
	m, ok := env.Payload.(*agentwire.CertificateIssuedV1)
	if !ok {
		return fmt.Errorf("agent: certificate renewal: unexpected answer %s", env.Payload.MessageType())
	}
	if m.Runner != a.cfg.Runner {
		return fmt.Errorf("agent: certificate renewal: daemon issued a certificate for runner %s, not %s", m.Runner, a.cfg.Runner)
	}
	if err := creds.Update(m.CertChain, key); err != nil {
		return err
	}
	leaf := creds.Leaf()
	a.log.Info("certificate renewed", "serial", trust.SerialString(leaf), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
	if h := a.cfg.Hooks.OnCertificateRenewed; h != nil {
		h(leaf)
	}
	return nil
}

// EnrollRequest describes one enrollment (§20).
type EnrollRequest struct {
	// Endpoint is the daemon (or relay) to enroll with. Its dialer must
	// verify the daemon's certificate and present NO client certificate.
	Endpoint Endpoint
	// Token is the one-time bootstrap token (fyet_…).
	Token string
	// Key is the agent's new private key; nil means a fresh ECDSA P-256
	// key (trust.GenerateKey). It never leaves this process: only a CSR
	// is sent.
	Key crypto.Signer
	// Protocol, Version and RequestTimeout as in Config (zero → defaults).
	Protocol       wire.ProtocolRange
	Version        string
	RequestTimeout time.Duration
	Limits         semantics.Limits
}

// Enrollment is the result of Enroll: the new identity.
type Enrollment struct {
	Runner wire.RunnerId
	Chain  [][]byte // DER, leaf first
	Leaf   *x509.Certificate
	Key    crypto.Signer
}

// Enroll obtains the agent's long-term certificate: it dials the endpoint
// over server-authenticated TLS, says hello, sends CertificateRequestV1
// with the token and a CSR for the key, and checks that the certificate
// it gets back certifies that key and names the RunnerId the daemon
// assigned. A refusal (unknown, used, expired or revoked token, bad CSR)
// is an error carrying the daemon's message; a TLS failure is explained
// with trust.ExplainHandshakeError.
func Enroll(ctx context.Context, req EnrollRequest) (*Enrollment, error) {
	if req.Endpoint.Dialer == nil || req.Endpoint.Address == "" {
		return nil, errors.New("agent: Enroll needs an endpoint address and dialer")
	}
	if err := trust.CheckEnrollmentToken(req.Token); err != nil {
		return nil, err
	}
	if req.Protocol == (wire.ProtocolRange{}) {
		req.Protocol = wire.Supported
	}
	if req.Version == "" {
		req.Version = "forgeyard-agent"
	}
	rto := req.RequestTimeout
	if rto <= 0 {
		rto = DefaultRequestTimeout
	}
	key := req.Key
	if key == nil {
		var err error
		if key, err = trust.GenerateKey(); err != nil {
			return nil, err
		}
	}
	csr, err := trust.CreateCSR(key, "forgeyard agent")
	if err != nil {
		return nil, err
	}
	addr := req.Endpoint.Address
	dctx, dcancel := context.WithTimeout(ctx, rto)
	bc, err := req.Endpoint.Dialer.Dial(dctx, addr)
	dcancel()
	if err != nil {
		return nil, fmt.Errorf("agent: enroll: dial %s: %s", addr, trust.ExplainHandshakeError(err, nil, time.Now()))
	}
	defer func() { _ = bc.CloseWithCode(wire.CloseNormal, "enrollment done") }()
	sc, err := semantics.NewConn(bc, semantics.Config{Limits: req.Limits})
	if err != nil {
		return nil, err
	}
	octx, ocancel := context.WithTimeout(ctx, rto)
	st, err := sc.OpenStream(octx, wire.StreamControl)
	ocancel()
	if err != nil {
		return nil, fmt.Errorf("agent: enroll: %s: %w", addr, err)
	}
	ch := control.New(st, control.Config{WriteTimeout: rto})
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		_ = ch.Run(func(*wire.Envelope) {}, func(*control.DecodeError) {})
	}()
	defer func() {
		_ = bc.CloseWithCode(wire.CloseNormal, "enrollment done")
		<-runDone
	}()
	env, err := ch.Call(ctx, control.Out{Msg: &agentwire.TransportHelloV1{Role: agentwire.RoleAgent, Versions: req.Protocol,
		AgentVersion: req.Version}}, rto)
	if err != nil {
		return nil, fmt.Errorf("agent: enroll: hello to %s: %w", addr, err)
	}
	switch m := env.Payload.(type) {
	case *agentwire.HelloAckV1:
		if m.Negotiated.Less(wire.V(1, 2)) { // CertificateRequestV1 is new in protocol 1.2
			return nil, fmt.Errorf("agent: enroll: %s: %w (negotiated %s)", addr, ErrRenewalUnsupported, m.Negotiated)
		}
		ch.SetProtocol(m.Negotiated)
	case *agentwire.RegistrationRejectedV1:
		return nil, fmt.Errorf("agent: enroll: %s refused the hello: %s", addr, m.Message)
	default:
		return nil, fmt.Errorf("agent: enroll: unexpected answer to hello from %s", addr)
	}
	env, err = ch.Call(ctx, control.Out{Msg: &agentwire.CertificateRequestV1{Token: req.Token, CSR: csr}}, rto)
	if err != nil {
		var we *wire.WireErrorV1
		if errors.As(err, &we) {
			return nil, fmt.Errorf("agent: enrollment refused by %s: %s", addr, we.Message)
		}
		return nil, fmt.Errorf("agent: enroll: %s: %w", addr, err)
	}
	m, ok := env.Payload.(*agentwire.CertificateIssuedV1)
	if !ok {
		return nil, fmt.Errorf("agent: enroll: unexpected answer %s from %s", env.Payload.MessageType(), addr)
	}
	leaf, err := x509.ParseCertificate(m.CertChain[0])
	if err != nil {
		return nil, fmt.Errorf("agent: enroll: issued certificate: %w", err)
	}
	if pk, ok := leaf.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !pk.Equal(key.Public()) {
		return nil, errors.New("agent: enroll: the issued certificate does not certify our key")
	}
	if id, err := trust.RunnerIDFromCert(leaf); err != nil || id != m.Runner {
		return nil, fmt.Errorf("agent: enroll: the issued certificate does not name runner %s: %v", m.Runner, err)
	}
	return &Enrollment{Runner: m.Runner, Chain: m.CertChain, Leaf: leaf, Key: key}, nil
}
