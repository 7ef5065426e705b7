//go:build linux

package netns

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Tinyproxy is Debian's tinyproxy running in a namespace as an HTTP
// CONNECT proxy.
type Tinyproxy struct {
	*Proc
	// Addr is where it listens.
	Addr netip.AddrPort
}

// URL is the proxy URL for HTTPS_PROXY, e.g. "http://10.77.1.2:8888".
func (tp *Tinyproxy) URL() string { return "http://" + tp.Addr.String() }

// StartTinyproxy runs tinyproxy in the foreground in n, listening on
// listen, accepting clients from allow and CONNECT to connectPorts only
// (none: any port). It returns once the proxy accepts connections (at most
// 10 s).
func (n *NS) StartTinyproxy(listen netip.AddrPort, allow netip.Prefix, connectPorts ...uint16) *Tinyproxy {
	n.t.Helper()
	return n.StartTinyproxyTimeout(listen, allow, 60*time.Second, connectPorts...)
}

// StartTinyproxyTimeout is StartTinyproxy with tinyproxy's Timeout (whole
// seconds): a tunnel without traffic either way for that long is closed,
// as proxies and NATs that cut idle connections do.
func (n *NS) StartTinyproxyTimeout(listen netip.AddrPort, allow netip.Prefix, idle time.Duration, connectPorts ...uint16) *Tinyproxy {
	n.t.Helper()
	bin, err := lookPath("tinyproxy")
	if err != nil {
		n.t.Fatalf("netns: tinyproxy not installed: run `make deps` (.ci/ensure-debs.sh) as root")
	}
	var conf strings.Builder
	fmt.Fprintf(&conf, "User nobody\nGroup nogroup\nPort %d\nListen %s\nTimeout %d\nMaxClients 64\nLogLevel Connect\nAllow %s\nDisableViaHeader Yes\n",
		listen.Port(), listen.Addr(), max(1, int(idle/time.Second)), allow.Masked())
	for _, p := range connectPorts {
		fmt.Fprintf(&conf, "ConnectPort %d\n", p)
	}
	path := filepath.Join(n.t.TempDir(), "tinyproxy.conf")
	if err := os.WriteFile(path, []byte(conf.String()), 0o644); err != nil {
		n.t.Fatal(err)
	}
	tp := &Tinyproxy{Proc: n.Start("tinyproxy", bin, []string{"-d", "-c", path}), Addr: listen}
	n.waitAccepting(tp.Proc, "tinyproxy", listen, 10*time.Second, 20*time.Millisecond, nil)
	return tp
}

// waitAccepting returns once something accepts TCP on listen inside n (a
// proxy p that name started), polling every poll; it fails the test if p
// exits first or after timeout, with p's output and detail's text (nil:
// none) in the message.
func (n *NS) waitAccepting(p *Proc, name string, listen netip.AddrPort, timeout, poll time.Duration, detail func() string) {
	n.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	more := func() string {
		if detail == nil {
			return ""
		}
		return detail()
	}
	for {
		c, err := n.DialContext(ctx, "tcp", listen.String())
		if err == nil {
			_ = c.Close()
			return
		}
		select {
		case <-p.Done():
			n.t.Fatalf("netns: %s exited at start: %s%s", name, strings.Join(p.Lines(), "\n"), more())
		case <-ctx.Done():
			n.t.Fatalf("netns: %s not accepting on %s after %d s: %v%s", name, listen, int(timeout/time.Second), err, more())
		case <-time.After(poll): // no readiness event: poll
		}
	}
}
