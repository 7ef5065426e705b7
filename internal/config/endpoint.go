package config

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Backend names as used in endpoint URIs, listen keys and logs.
const (
	BackendQUIC         = "quic"
	BackendYamux        = "yamux"
	BackendWebTransport = "webtransport"
)

// Default ports of each backend (ARCHITECTURE.md decision 8).
const (
	DefaultQUICPort         = 7443
	DefaultYamuxPort        = 7444
	DefaultWebTransportPort = 443
	// DefaultRelayPort is forgeyard-relay's TLS+yamux port: 443, the one
	// port a stock corporate proxy lets CONNECT through.
	DefaultRelayPort = 443
)

// WebTransportPath is the only path a webtransport endpoint may name.
const WebTransportPath = "/.well-known/forgeyard/agent"

// Endpoint is a normalized control-plane endpoint (§282).
type Endpoint struct {
	// Backend is BackendQUIC, BackendYamux or BackendWebTransport.
	Backend string
	// HostPort is "host:port" with a lower-case host and an explicit port
	// (IPv6 literals in brackets).
	HostPort string
	// Upgrade (yamux only) selects the HTTP/1.1 Upgrade form of TLS+yamux,
	// for TLS port 443 behind HTTP-aware middleboxes.
	Upgrade bool
	// Relay says the address is a forgeyard-relay, not a daemon: the agent
	// races it last (ARCHITECTURE.md decision 11).
	Relay bool
}

// Scheme returns the canonical scheme: "quic", "webtransport", "yamux",
// "yamux+upgrade", or "relay+" followed by one of the last three.
func (e Endpoint) Scheme() string {
	s := e.Backend
	if e.Backend == BackendYamux && e.Upgrade {
		s = "yamux+upgrade"
	}
	if e.Relay {
		s = "relay+" + s
	}
	return s
}

// String returns the canonical URI, e.g. "quic://daemon.example:7443".
func (e Endpoint) String() string { return e.Scheme() + "://" + e.HostPort }

// Host returns the host part of HostPort without brackets.
func (e Endpoint) Host() string {
	h, _, err := net.SplitHostPort(e.HostPort)
	if err != nil {
		return e.HostPort
	}
	return h
}

// scheme is what a URI scheme selects.
type scheme struct {
	backend        string
	upgrade, relay bool
}

var schemeAliases = map[string]scheme{
	"quic":                {backend: BackendQUIC},
	"forgeyard":           {backend: BackendQUIC},
	"yamux":               {backend: BackendYamux},
	"tls":                 {backend: BackendYamux},
	"tls+yamux":           {backend: BackendYamux},
	"yamux+tls":           {backend: BackendYamux},
	"yamux+upgrade":       {backend: BackendYamux, upgrade: true},
	"webtransport":        {backend: BackendWebTransport},
	"wt":                  {backend: BackendWebTransport},
	"https":               {backend: BackendWebTransport},
	"relay":               {backend: BackendYamux, relay: true},
	"relay+yamux":         {backend: BackendYamux, relay: true},
	"relay+yamux+upgrade": {backend: BackendYamux, upgrade: true, relay: true},
	"relay+webtransport":  {backend: BackendWebTransport, relay: true},
	"relay+quic":          {backend: BackendQUIC, relay: true},
}

func defaultPort(s scheme) int {
	switch {
	case s.backend == BackendYamux && s.upgrade:
		return 443
	case s.backend == BackendYamux && s.relay:
		return DefaultRelayPort
	case s.backend == BackendYamux:
		return DefaultYamuxPort
	case s.backend == BackendWebTransport:
		return DefaultWebTransportPort
	default:
		return DefaultQUICPort
	}
}

// ParseEndpoint normalizes an endpoint URI (§282).
//
// Accepted forms: "quic://host[:port]" (alias "forgeyard://"),
// "yamux://host[:port]" (aliases "tls://", "tls+yamux://", "yamux+tls://"),
// "yamux+upgrade://host[:port]" (TLS+yamux as an HTTP/1.1 Upgrade, default
// port 443), "webtransport://host[:port]" (aliases "wt://", and
// "https://host[:port]/.well-known/forgeyard/agent"), any of these prefixed
// with "relay+" for a forgeyard-relay ("relay://" alone means
// "relay+yamux://"), and a bare "host:port", which means QUIC. Schemes and
// hosts are case-insensitive; a missing port takes the backend's default
// (7443, 7444, 443; 443 for the Upgrade form and for a relay). A path other than the
// WebTransport agent path, a query, a fragment or user information is an
// error.
func ParseEndpoint(s string) (Endpoint, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Endpoint{}, fmt.Errorf("empty endpoint")
	}
	if !strings.Contains(s, "://") {
		s = "quic://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return Endpoint{}, fmt.Errorf("endpoint %q: %v", s, unwrapURLError(err))
	}
	sch, ok := schemeAliases[strings.ToLower(u.Scheme)]
	if !ok {
		return Endpoint{}, fmt.Errorf("endpoint %q: unknown scheme %q (want quic://, yamux://, yamux+upgrade://, webtransport:// or relay+…://)", s, u.Scheme)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return Endpoint{}, fmt.Errorf("endpoint %q: only scheme://host[:port] is allowed", s)
	}
	if u.Path != "" && u.Path != "/" && !(sch.backend == BackendWebTransport && u.Path == WebTransportPath) {
		return Endpoint{}, fmt.Errorf("endpoint %q: unexpected path %q", s, u.Path)
	}
	host := strings.ToLower(u.Hostname())
	if host == "" {
		return Endpoint{}, fmt.Errorf("endpoint %q: missing host", s)
	}
	port := defaultPort(sch)
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return Endpoint{}, fmt.Errorf("endpoint %q: port must be 1–65535", s)
		}
		port = n
	}
	return Endpoint{Backend: sch.backend, HostPort: net.JoinHostPort(host, strconv.Itoa(port)), Upgrade: sch.upgrade, Relay: sch.relay}, nil
}

func unwrapURLError(err error) error {
	if ue, ok := err.(*url.Error); ok {
		return ue.Err
	}
	return err
}

// checkListen validates a "host:port" listen address (port 0 allowed: any
// free port).
func checkListen(key, addr string) error {
	if addr == "" {
		return nil
	}
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return invalid(key, "want \"host:port\" (e.g. \"0.0.0.0:7443\"): %v", err)
	}
	n, err := strconv.Atoi(p)
	if err != nil || n < 0 || n > 65535 {
		return invalid(key, "port %q must be 0–65535", p)
	}
	return nil
}
