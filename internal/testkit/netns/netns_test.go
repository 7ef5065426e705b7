//go:build linux

package netns

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// pair builds a ⟷ b on 10.201.0.0/30.
func pair(t *testing.T) (a, b *NS, aAddr, bAddr netip.Addr) {
	Require(t)
	a, b = New(t, "a"), New(t, "b")
	aAddr, bAddr = Link(t, a, b, netip.MustParsePrefix("10.201.0.0/30"))
	return a, b, aAddr, bAddr
}

func echoServer(t *testing.T, l net.Listener) {
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
}

func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo: got %q, %v; want %q", buf, err, msg)
	}
}

func TestLinkTCPAndUDPBlocking(t *testing.T) {
	a, b, aAddr, bAddr := pair(t)
	if aAddr != netip.MustParseAddr("10.201.0.1") || bAddr != netip.MustParseAddr("10.201.0.2") {
		t.Fatalf("addresses %v %v", aAddr, bAddr)
	}
	l, err := b.Listen("tcp", netip.AddrPortFrom(bAddr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	echoServer(t, l)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := a.DialContext(ctx, "tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c, "hello over veth")

	// UDP passes, then a silent drop in a's output chain stops it (TCP
	// still passes).
	pc, err := b.ListenPacket("udp", netip.AddrPortFrom(bAddr, 0).String())
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	send := func() error {
		u, err := a.DialContext(ctx, "udp", pc.LocalAddr().String())
		if err != nil {
			return err
		}
		defer u.Close()
		_, err = u.Write([]byte("ping"))
		return err
	}
	recv := func(wait time.Duration) error {
		_ = pc.SetReadDeadline(time.Now().Add(wait))
		buf := make([]byte, 16)
		n, _, err := pc.ReadFrom(buf)
		if err == nil && string(buf[:n]) != "ping" {
			return fmt.Errorf("got %q", buf[:n])
		}
		return err
	}
	if err := send(); err != nil {
		t.Fatal(err)
	}
	if err := recv(5 * time.Second); err != nil {
		t.Fatalf("UDP before the rule: %v", err)
	}
	a.Nft(`table inet fytest {
	chain output {
		type filter hook output priority 0; policy accept;
		meta l4proto udp drop
	}
}`)
	if err := send(); err == nil {
		var ne net.Error
		if err := recv(300 * time.Millisecond); !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("UDP after the drop rule: want a read timeout, got %v", err)
		}
	} // (a send error is also a drop)
	c, err = a.DialContext(ctx, "tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c, "tcp still passes")
	if out := a.MustRun("nft", "list", "ruleset"); !strings.Contains(out, "udp drop") {
		t.Fatalf("ruleset in a: %s", out)
	}
}

func TestNoRouteBeyondLinks(t *testing.T) {
	a, _, _, _ := pair(t)
	// A destination that no link of a covers has no route (no packet is
	// sent: `ip route get` only asks the routing table).
	out, err := a.Run(context.Background(), "ip", "route", "get", "10.202.0.2")
	if err == nil || !strings.Contains(out, "unreachable") {
		t.Fatalf("route from a to an unlinked subnet: %q, %v", out, err)
	}
}

func TestDialNeedsIPLiteral(t *testing.T) {
	a, _, _, _ := pair(t)
	if _, err := a.DialContext(context.Background(), "tcp", "localhost:1"); err == nil || !strings.Contains(err.Error(), "IP literal") {
		t.Fatalf("err = %v", err)
	}
}

func TestProcWaitLineAndStop(t *testing.T) {
	a, _, _, _ := pair(t)
	p := a.Start("sh", "/bin/sh", []string{"-c", "echo starting; ip -o addr show dev v-b; echo ready; exec sleep 60"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	line, err := p.WaitLine(ctx, func(l string) bool { return strings.Contains(l, "inet ") })
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(line, "10.201.0.1/30") {
		t.Fatalf("the process does not run in namespace a: %q", line)
	}
	if _, err := p.WaitLine(ctx, func(l string) bool { return l == "ready" }); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(5 * time.Second); err == nil {
		t.Fatal("sleep stopped by SIGTERM reported success")
	}
	if _, err := p.WaitLine(ctx, func(l string) bool { return l == "never" }); err == nil || !strings.Contains(err.Error(), "exited") {
		t.Fatalf("WaitLine after exit: %v", err)
	}
}

func TestSweepRemovesDeadRunsOnly(t *testing.T) {
	Require(t)
	// The live namespace first: the first New in a process sweeps too, and
	// must do so before the stale namespace exists.
	live := New(t, "live")
	// A pid that surely ended: a finished child.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := Prefix + strconv.Itoa(cmd.Process.Pid) + "-deadbeef-stale"
	if _, err := run(context.Background(), nil, "ip", "netns", "add", dead); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = run(context.Background(), nil, "ip", "netns", "del", dead) })
	// A process the dead run left inside: Sweep kills it.
	orphan := exec.Command("ip", "netns", "exec", dead, "sleep", "60")
	if err := orphan.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- orphan.Wait() }()
	t.Cleanup(func() { _ = orphan.Process.Kill() })
	deadline := time.After(10 * time.Second)
	for { // until `ip netns exec` has exec'd sleep inside (no event for it)
		out, _ := run(context.Background(), nil, "ip", "netns", "pids", dead)
		if strings.TrimSpace(out) != "" {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("orphan exited at start: %v", err)
		case <-deadline:
			t.Fatal("the orphan never showed up in the namespace")
		case <-time.After(10 * time.Millisecond):
		}
	}
	removed, err := Sweep()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range removed {
		found = found || r == dead
		if r == live.Name {
			t.Fatalf("Sweep removed the live namespace %s", r)
		}
	}
	if !found {
		// Another test process (internal/testkit/e2e runs in parallel) may sweep
		// the same dead run first; the checks below still require that it
		// is gone and its process killed.
		t.Logf("Sweep removed %v; %s was removed by a concurrent sweep", removed, dead)
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("Sweep left the dead run's process running")
	}
	if _, err := os.Stat(runDir + "/" + dead); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale namespace still there: %v", err)
	}
	if _, err := os.Stat(runDir + "/" + live.Name); err != nil {
		t.Fatalf("live namespace: %v", err)
	}
}

// TestTinyproxyConnect: client ⟷ proxy ⟷ server, the client has no route
// to the server and reaches it through tinyproxy's CONNECT.
func TestTinyproxyConnect(t *testing.T) {
	Require(t, "tinyproxy")
	client, proxy, server := New(t, "client"), New(t, "proxy"), New(t, "server")
	cAddr, pAddr := Link(t, client, proxy, netip.MustParsePrefix("10.202.1.0/30"))
	_, sAddr := Link(t, proxy, server, netip.MustParsePrefix("10.202.2.0/30"))
	l, err := server.Listen("tcp", netip.AddrPortFrom(sAddr, 7444).String())
	if err != nil {
		t.Fatal(err)
	}
	echoServer(t, l)
	tp := proxy.StartTinyproxy(netip.AddrPortFrom(pAddr, 8888), netip.PrefixFrom(cAddr, 30), 7444)
	if tp.URL() != "http://10.202.1.2:8888" {
		t.Fatalf("URL %s", tp.URL())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := client.DialContext(ctx, "tcp", l.Addr().String()); err == nil {
		t.Fatal("client reached the server without the proxy")
	}
	connect := func(target string) (net.Conn, *http.Response) {
		c, err := client.DialContext(ctx, "tcp", tp.Addr.String())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", target, target)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusOK && br.Buffered() > 0 {
			t.Fatalf("proxy sent %d bytes after its answer", br.Buffered())
		}
		return c, resp
	}
	c, resp := connect(l.Addr().String())
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %s", resp.Status)
	}
	roundTrip(t, c, "through tinyproxy")
	// A port outside ConnectPort is refused by the proxy.
	c, resp = connect(netip.AddrPortFrom(sAddr, 22).String())
	c.Close()
	if resp.StatusCode/100 == 2 {
		t.Fatalf("CONNECT to a port outside ConnectPort: %s", resp.Status)
	}
}

func TestCheckNamesWhatIsMissing(t *testing.T) {
	err := Check("fy-no-such-program")
	if err == nil || !strings.Contains(err.Error(), "fy-no-such-program (not in PATH)") || !strings.Contains(err.Error(), "make deps") {
		t.Fatalf("Check = %v", err)
	}
}
