package config

import (
	"net"
	"net/netip"
	"path/filepath"
)

// DefaultAdminHost is the host an admin listen address without one (":9464")
// binds to: loopback, so metrics and session lists are not exposed by
// accident.
const DefaultAdminHost = "127.0.0.1"

// Admin is the daemon's operator HTTP endpoint (/healthz, /metrics,
// /status, /sessions, /protocols; see internal/adminapi), served on a
// loopback TCP address, a unix socket, or both.
//
//	[admin]
//	listen = "127.0.0.1:9464"
//	token_file = "/etc/forgeyard/admin.token"   # bearer token for TCP clients
//	public_metrics = false                      # true: /metrics needs no token
//	socket = "/run/forgeyard/admin.sock"        # mode 0600, no token needed
//	allow_remote = false
//	pprof = false                               # true: /debug/pprof/ (token or socket)
type Admin struct {
	// Listen is "host:port" ("" = no TCP endpoint). A missing host means
	// DefaultAdminHost. The host must be a loopback address or "localhost"
	// unless AllowRemote is set.
	Listen string `toml:"listen"`
	// TokenFile is the path of a file holding the bearer token TCP clients
	// must send ("Authorization: Bearer TOKEN") for every path but
	// /healthz. Without it the TCP endpoint serves only /healthz and
	// /metrics; /status, /sessions and /protocols are then reachable over
	// Socket only.
	TokenFile string `toml:"token_file"`
	// PublicMetrics lets TCP clients scrape /metrics without the token
	// (for a Prometheus without bearer-token configuration).
	PublicMetrics bool `toml:"public_metrics"`
	// Socket is the path of a unix socket serving every path without a
	// token; it is created mode 0600 (owner only), so the file permissions
	// are the authentication. A stale socket file is replaced.
	Socket string `toml:"socket"`
	// AllowRemote permits a non-loopback Listen host; it requires
	// TokenFile. Prefer a TLS-terminating proxy in front of it.
	AllowRemote bool `toml:"allow_remote"`
	// Pprof serves Go's runtime profiles (net/http/pprof) under
	// /debug/pprof/, with the access of /status: over the socket, or over
	// TCP with the bearer token. Off by default: a CPU profile costs the
	// daemon a few percent while it runs.
	Pprof bool `toml:"pprof"`
}

// Validate checks the admin keys (prefix "admin.").
func (a Admin) Validate() error {
	if _, err := AdminAddr("admin.listen", a.Listen, a.AllowRemote); err != nil {
		return err
	}
	if err := checkFileRef("admin.token_file", a.TokenFile); err != nil {
		return err
	}
	if err := checkFileRef("admin.socket", a.Socket); err != nil {
		return err
	}
	if a.Socket != "" && !filepath.IsAbs(a.Socket) {
		return invalid("admin.socket", "%q must be an absolute path (e.g. /run/forgeyard/admin.sock)", a.Socket)
	}
	if len(a.Socket) > 104 {
		return invalid("admin.socket", "path longer than 104 bytes (the unix socket limit)")
	}
	if a.AllowRemote && a.Listen != "" && a.TokenFile == "" {
		return invalid("admin.allow_remote", "a remote admin endpoint needs admin.token_file (a bearer token) so session lists are not open to the network")
	}
	if a.TokenFile != "" && a.Listen == "" {
		return invalid("admin.token_file", "set admin.listen too: the token authenticates TCP clients (the socket needs none)")
	}
	return nil
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
	return "", invalid(key, "%q is not a loopback address; serve it on 127.0.0.1 or a unix socket (admin.socket), or set admin.allow_remote = true with admin.token_file", host)
}
