package agentsetup

// This file turns an agent's configured endpoint URIs into semantics/agent
// Endpoints with concrete backend dialers, their fallback class and, for
// TCP backends, the HTTP CONNECT proxy (backends/yamux/proxy). The
// race itself (staggered starts, "wins only after hello", memory per
// network, probing and the move back) lives in semantics/agent; this
// file is the part that needs the backends.
//
// Endpoint schemes (internal/config.ParseEndpoint; docs/operations.md
// "Fallback and proxies"):
//
//	quic://host[:7443]                  QUIC, class quic           (UDP)
//	webtransport://host[:443][/path]    WebTransport (HTTP/3)      (UDP 443)
//	yamux://host[:7444]                 TLS+yamux, class tcp       (TCP, proxy)
//	yamux+upgrade://host[:443]          TLS+yamux as HTTP/1.1 Upgrade (TCP, proxy)
//	relay+<one of the above>://host     the same to a forgeyard-relay, class relay
//	relay://host                        = relay+yamux://host
//
// The proxy applies only to TCP endpoints: QUIC and WebTransport are UDP,
// which CONNECT cannot carry.

import (
	"crypto/tls"
	"fmt"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/backends/yamux/proxy"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics/agent"
)

// EndpointOptions are what every endpoint's dialer shares.
type EndpointOptions struct {
	// TLS is the agent's client configuration (certificate, RootCAs); it is
	// cloned per endpoint and ServerName defaults to the endpoint's host.
	TLS *tls.Config
	// QUIC tunes the QUIC and WebTransport dialers, Yamux the TLS+yamux
	// ones.
	QUIC  quic.Config
	Yamux yamux.Config
	// Proxy dials the TCP endpoints' connections; nil means direct. See
	// ProxyFor.
	Proxy *proxy.Dialer
	// KeepAlive, when set, gives the TCP endpoints' connections its ping
	// interval (overriding Yamux.KeepAliveInterval) and adapts it to a
	// network that cuts idle connections (keepalive.go).
	KeepAlive *KeepAlive
}

// ProxyFor returns the proxy dialer for a control_plane.proxy setting:
// config.ProxyFromEnvironment ("") reads HTTPS_PROXY/NO_PROXY now,
// config.ProxyNone ("none") returns nil (direct), anything else is an
// explicit http://[user:pass@]host:port with noProxy exceptions.
func ProxyFor(setting, noProxy string) (*proxy.Dialer, error) {
	switch setting {
	case config.ProxyNone:
		return nil, nil
	case config.ProxyFromEnvironment:
		d := proxy.FromEnvironment()
		if d.Proxy == nil {
			return nil, nil
		}
		return d, nil
	}
	return proxy.Fixed(setting, noProxy)
}

// Class returns the fallback class of e: relay for relay endpoints, else by
// backend (quic, webtransport, tcp).
func Class(e config.Endpoint) agent.Class {
	switch {
	case e.Relay:
		return agent.ClassRelay
	case e.Backend == config.BackendWebTransport:
		return agent.ClassWebTransport
	case e.Backend == config.BackendYamux:
		return agent.ClassTCP
	}
	return agent.ClassQUIC
}

// BackendName is the Endpoint.Backend name shown in status and logs:
// "quic", "webtransport", "yamux" or "yamux+upgrade", prefixed "relay+"
// for relays.
func BackendName(e config.Endpoint) string { return e.Scheme() }

// Endpoint builds the agent endpoint for e.
func Endpoint(e config.Endpoint, o EndpointOptions) (agent.Endpoint, error) {
	if o.TLS == nil {
		return agent.Endpoint{}, fmt.Errorf("endpoint %s: no client TLS configuration", e)
	}
	d, addr, err := Dialer(e, o.TLS, o.QUIC, o.Yamux)
	if err != nil {
		return agent.Endpoint{}, err
	}
	if yd, ok := d.(yamux.Dialer); ok {
		if o.Proxy != nil {
			yd.DialContext = o.Proxy.DialContext
		}
		d = yd
		if o.KeepAlive != nil {
			d = keepAliveDialer{d: yd, ka: o.KeepAlive}
		}
	}
	return agent.Endpoint{Address: addr, Dialer: d, Backend: BackendName(e), Class: Class(e)}, nil
}

// Endpoints builds the agent endpoints for eps, in order.
func Endpoints(eps []config.Endpoint, o EndpointOptions) ([]agent.Endpoint, error) {
	out := make([]agent.Endpoint, 0, len(eps))
	for _, e := range eps {
		ae, err := Endpoint(e, o)
		if err != nil {
			return nil, err
		}
		out = append(out, ae)
	}
	return out, nil
}

// EndpointStagger converts [fallback] endpoint_stagger (agent.Config.FallbackStagger).
func EndpointStagger(f config.Fallback) []time.Duration {
	var out []time.Duration
	for _, d := range f.EndpointStagger {
		out = append(out, d.Duration)
	}
	return out
}

// Policy converts the [fallback] configuration section.
func Policy(f config.Fallback) agent.Fallback {
	out := agent.Fallback{MemoryTTL: f.MemoryTTL.Duration, ProbeInterval: f.ProbeInterval.Duration, ProbeSuccesses: f.ProbeSuccesses}
	for _, d := range f.ClassStagger {
		out.ClassStagger = append(out.ClassStagger, d.Duration)
	}
	if f.DisableMemory {
		out.MemoryTTL = -1
	}
	if f.DisableProbe {
		out.ProbeInterval = -1
	}
	return out
}
