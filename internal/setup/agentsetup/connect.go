package agentsetup

import (
	"fmt"
	"log/slog"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/trust"
)

// ControlPlaneFlags are the values of the control-plane flags every
// command that connects like an agent has (forgeyard-agent,
// forgeyard-signer): --endpoint, --server-name, --cert, --key, --ca,
// --dev-pki and --dev-agent. Each command registers them with its own
// help texts; Apply writes them into the configuration.
type ControlPlaneFlags struct {
	Endpoints        []string // --endpoint, repeatable
	ServerName       string
	Cert, Key, CA    string
	DevPKI, DevAgent string
}

// Apply writes the flags that were set into cp: --endpoint replaces the
// file's list; --dev-pki's credential comes before --cert, --key and --ca,
// which override it.
func (f *ControlPlaneFlags) Apply(cp *config.ControlPlane, set config.SetFlags) error {
	if set["endpoint"] {
		cp.Endpoints = f.Endpoints
	}
	set.String("server-name", &cp.ServerName, f.ServerName)
	if f.DevPKI != "" {
		if _, err := DevAgent(f.DevPKI, f.DevAgent, cp); err != nil {
			return fmt.Errorf("--dev-pki: %w", err)
		}
	}
	set.String("cert", &cp.Credential.Certificate, f.Cert)
	set.String("key", &cp.Credential.PrivateKey, f.Key)
	set.String("ca", &cp.Credential.CA, f.CA)
	return nil
}

// Dialing is what an agent-like process reaches its daemons with.
type Dialing struct {
	Credential *Credential
	// Credentials is the rotatable certificate the dialers ask for at
	// every handshake; the agent renews it in place (§21).
	Credentials *trust.Credentials
	Endpoints   []agent.Endpoint
}

// NewDialing loads cp's credential and builds one endpoint per eps (QUIC
// logging to log), the TCP ones through cp's proxy and, when ka is not
// nil, kept alive by it.
func NewDialing(cp config.ControlPlane, eps []config.Endpoint, log *slog.Logger, ka *KeepAlive) (*Dialing, error) {
	cred, err := LoadCredential(cp)
	if err != nil {
		return nil, err
	}
	creds, err := trust.LoadCredentials(cp.Credential.Certificate, cp.Credential.PrivateKey)
	if err != nil {
		return nil, config.WithTrustKeys(err, config.AgentCredentialKeys)
	}
	px, err := ProxyFor(cp.Proxy, cp.NoProxy)
	if err != nil {
		return nil, fmt.Errorf("control_plane.proxy: %w", err)
	}
	aeps, err := Endpoints(eps, EndpointOptions{TLS: creds.ClientConfigFor(cred.Client), QUIC: quic.Config{Logger: log}, Proxy: px, KeepAlive: ka})
	if err != nil {
		return nil, err
	}
	return &Dialing{Credential: cred, Credentials: creds, Endpoints: aeps}, nil
}
