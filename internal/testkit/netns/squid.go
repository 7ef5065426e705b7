//go:build linux

package netns

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Squid is Debian's squid running in a namespace, configured like a stock
// enterprise proxy: Basic authentication against an htpasswd file
// (basic_ncsa_auth), CONNECT only to the allowed ports (443 unless told
// otherwise; squid's "http_access deny CONNECT !SSL_ports"), no cache.
type Squid struct {
	*Proc
	// Addr is where it listens.
	Addr netip.AddrPort
	dir  string
}

// SquidOptions configure StartSquid.
type SquidOptions struct {
	// Users are the accepted user names and passwords (none: no
	// authentication).
	Users map[string]string
	// ConnectPorts are the ports CONNECT may reach (nil: 443 only).
	ConnectPorts []uint16
	// Allow is the client network squid serves.
	Allow netip.Prefix
	// ReadTimeout, when set, is squid's read_timeout (how long a tunnel
	// may be idle).
	ReadTimeout time.Duration
}

// URL is the proxy URL with user and password (both empty: none).
func (s *Squid) URL(user, pass string) string {
	u := url.URL{Scheme: "http", Host: s.Addr.String()}
	if user != "" {
		u.User = url.UserPassword(user, pass)
	}
	return u.String()
}

// AccessLog returns squid's access.log lines so far (native format:
// "time elapsed client ACTION/status bytes METHOD target user …").
func (s *Squid) AccessLog() []string {
	b, err := os.ReadFile(filepath.Join(s.dir, "access.log"))
	if err != nil {
		return nil
	}
	return strings.FieldsFunc(string(b), func(r rune) bool { return r == '\n' })
}

// WaitAccess waits for an access.log line that satisfies match. squid
// gives no event when it logs: the file is polled.
func (s *Squid) WaitAccess(ctx context.Context, match func(line string) bool) (string, error) {
	for {
		for _, l := range s.AccessLog() {
			if match(l) {
				return l, nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("squid access.log has no such line (%d lines: %s): %w", len(s.AccessLog()), strings.Join(s.AccessLog(), " | "), ctx.Err())
		case <-s.Done():
			return "", fmt.Errorf("squid exited: %s", strings.Join(s.Lines(), "\n"))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// StartSquid runs squid in the foreground in n, listening on listen,
// with its configuration, password file and logs in a fresh directory.
// It returns once the proxy accepts connections (at most 20 s).
func (n *NS) StartSquid(listen netip.AddrPort, o SquidOptions) *Squid {
	n.t.Helper()
	bin, err := lookPath("squid")
	if err != nil {
		n.t.Fatalf("netns: squid not installed: run `make deps` (.ci/ensure-debs.sh) as root")
	}
	helper := "/usr/lib/squid/basic_ncsa_auth"
	if len(o.Users) > 0 {
		if _, err := os.Stat(helper); err != nil {
			n.t.Fatalf("netns: %s missing (Debian's squid package ships it): %v", helper, err)
		}
	}
	// squid drops to user proxy: its directory must be readable (the
	// password file, read by the helper) and writable (logs).
	dir, err := os.MkdirTemp("", "fy-squid-")
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777); err != nil {
		n.t.Fatal(err)
	}
	ports := o.ConnectPorts
	if len(ports) == 0 {
		ports = []uint16{443}
	}
	var conf strings.Builder
	fmt.Fprintf(&conf, `http_port %s
pid_filename %[2]s/squid.pid
cache_log %[2]s/cache.log
access_log stdio:%[2]s/access.log squid
coredump_dir %[2]s
visible_hostname forgeyard-test-proxy
pinger_enable off
netdb_filename none
shutdown_lifetime 0 seconds
cache_mem 8 MB
cache deny all
acl clients src %s
acl CONNECT method CONNECT
`, listen, dir, o.Allow.Masked())
	for _, p := range ports {
		fmt.Fprintf(&conf, "acl SSL_ports port %d\n", p)
	}
	conf.WriteString("http_access deny CONNECT !SSL_ports\nhttp_access deny !clients\n")
	if len(o.Users) > 0 {
		var lines []string
		for user, pass := range o.Users {
			out, err := exec.Command("openssl", "passwd", "-1", pass).Output()
			if err != nil {
				n.t.Fatalf("netns: hashing the squid password (openssl passwd -1; `make deps` installs openssl): %v", err)
			}
			lines = append(lines, user+":"+strings.TrimSpace(string(out)))
		}
		sort.Strings(lines)
		if err := os.WriteFile(filepath.Join(dir, "passwd"), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			n.t.Fatal(err)
		}
		fmt.Fprintf(&conf, "auth_param basic program %s %s/passwd\nauth_param basic realm forgeyard-test\nacl authed proxy_auth REQUIRED\nhttp_access allow authed\n", helper, dir)
	} else {
		conf.WriteString("http_access allow clients\n")
	}
	conf.WriteString("http_access deny all\n")
	if o.ReadTimeout > 0 {
		fmt.Fprintf(&conf, "read_timeout %d seconds\n", int(o.ReadTimeout/time.Second))
	}
	path := filepath.Join(dir, "squid.conf")
	if err := os.WriteFile(path, []byte(conf.String()), 0o644); err != nil {
		n.t.Fatal(err)
	}
	s := &Squid{Proc: n.Start("squid", bin, []string{"-N", "-f", path}), Addr: listen, dir: dir}
	n.waitAccepting(s.Proc, "squid", listen, 20*time.Second, 50*time.Millisecond, func() string {
		log, _ := os.ReadFile(filepath.Join(dir, "cache.log"))
		return "\n" + string(log)
	})
	return s
}
