package config

import (
	"net"
	"net/netip"
)

// DefaultAdminHost is the host an admin listen address without one (":9464")
// binds to: loopback, so metrics and session lists are not exposed by
// accident.
const DefaultAdminHost = "127.0.0.1"

// Admin is the daemon's operator HTTP endpoint: /metrics, /healthz and
// /sessions.
//
//	[admin]
//	listen = "127.0.0.1:9464"
//	allow_remote = false
type Admin struct {
	// Listen is "host:port" ("" = no admin endpoint). A missing host means
	// DefaultAdminHost. The host must be a loopback address or "localhost"
	// unless AllowRemote is set.
	Listen string `toml:"listen"`
	// AllowRemote permits a non-loopback Listen host. The endpoint has no
	// authentication: put it behind a firewall or a TLS proxy.
	AllowRemote bool `toml:"allow_remote"`
}

// AdminAddr returns the address to bind for the admin key (e.g.
// "admin.listen") with value addr: "" stays "", a missing host becomes
// DefaultAdminHost, and a host that is not loopback is an *Error unless
// allowRemote. Host names other than "localhost" are refused without
// allowRemote (they could resolve anywhere).
func AdminAddr(key, addr string, allowRemote bool) (string, error) {
	if addr == "" {
		return "", nil
	}
	if err := checkListen(key, addr); err != nil {
		return "", err
	}
	host, port, _ := net.SplitHostPort(addr)
	if host == "" {
		return net.JoinHostPort(DefaultAdminHost, port), nil
	}
	if allowRemote || host == "localhost" {
		return addr, nil
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsLoopback() {
		return addr, nil
	}
	return "", invalid(key, "%q is not a loopback address; the admin endpoint has no authentication (set admin.allow_remote = true to serve it remotely)", host)
}
