//go:build linux

// Package netns is a test harness for end-to-end tests in Linux network
// namespaces: it creates namespaces joined by veth pairs with addresses and
// routes, applies nftables rulesets inside them, runs processes inside them
// (`ip netns exec`), starts Debian's tinyproxy or squid (a stock enterprise
// proxy: Basic auth, CONNECT to 443 only) in one, and opens sockets in one
// from the test process (DialContext, HTTPClient).
//
// Every namespace is named Prefix + "<pid>-<random>-<role>", so parallel
// tests and parallel test binaries never collide, and New registers a
// t.Cleanup that stops the namespace's processes and deletes it. Sweep
// deletes the namespaces left behind by test binaries that died (their
// pid is gone); New runs it once per process.
//
// Traffic stays inside the namespaces: a new namespace has only its
// loopback and the veth links the test adds, so addresses such as
// 10.X.Y.0/30 given to those links are reachable from those namespaces
// alone, never from the host's namespace or beyond it.
//
// The tests need root, ip (iproute2) and nft (nftables), and tinyproxy,
// squid and openssl for the proxy scenarios; `make test` installs them (.ci/ensure-debs.sh).
// Require fails a test with an actionable message when one is missing and
// skips it, with the reason logged, only under -short.
package netns

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Prefix starts the name of every namespace this package creates.
const Prefix = "fy-"

// runDir is where `ip netns` keeps its named namespaces.
const runDir = "/run/netns"

// cmdTimeout bounds each ip/nft invocation.
const cmdTimeout = 20 * time.Second

// Check reports what is missing to run namespace tests with the given
// extra programs (e.g. "tinyproxy"), besides root, ip and nft: nil when
// nothing is.
func Check(programs ...string) error {
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN: run the tests as root)")
	}
	for _, p := range append([]string{"ip", "nft"}, programs...) {
		if _, err := lookPath(p); err != nil {
			missing = append(missing, p+" (not in PATH)")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("netns: missing %s; run `make deps` (.ci/ensure-debs.sh installs iproute2, nftables, tinyproxy, squid and openssl) as root", strings.Join(missing, ", "))
	}
	return nil
}

// lookPath finds program in PATH or, for a PATH without the sbin
// directories (ip and nft live there), in /usr/sbin or /sbin, which it then
// adds to PATH for the commands this package runs.
func lookPath(program string) (string, error) {
	p, err := exec.LookPath(program)
	if err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin"} {
		cand := filepath.Join(dir, program)
		if fi, serr := os.Stat(cand); serr == nil && fi.Mode()&0o111 != 0 {
			_ = os.Setenv("PATH", os.Getenv("PATH")+string(os.PathListSeparator)+dir)
			return cand, nil
		}
	}
	return "", err
}

// Require fails t when Check(programs...) reports something missing. Under
// -short it skips instead, logging the reason.
func Require(t testing.TB, programs ...string) {
	t.Helper()
	if err := Check(programs...); err != nil {
		if testing.Short() {
			t.Skipf("-short: %v", err)
		}
		t.Fatal(err)
	}
}

// NS is a named network namespace created by New. Its methods may be
// called from several goroutines.
type NS struct {
	// Name is the namespace's name for `ip netns`.
	Name string
	// Role is the role given to New (part of Name).
	Role string

	t     testing.TB
	mu    sync.Mutex
	procs []*Proc
}

var sweepOnce sync.Once

// New creates a namespace for role (lower-case letters and digits, at
// most 12 characters) with its loopback up, and registers a cleanup that
// stops the processes started in it and deletes it. The first call in a
// process also sweeps stale namespaces of dead test processes.
func New(t testing.TB, role string) *NS {
	t.Helper()
	if role == "" || len(role) > 12 || strings.Trim(role, "abcdefghijklmnopqrstuvwxyz0123456789") != "" {
		t.Fatalf("netns.New: role %q must be 1–12 of [a-z0-9]", role)
	}
	sweepOnce.Do(func() {
		if removed, err := Sweep(); err != nil {
			t.Logf("netns: sweeping stale namespaces: %v", err)
		} else if len(removed) > 0 {
			t.Logf("netns: removed stale namespaces of dead test runs: %s", strings.Join(removed, " "))
		}
	})
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	n := &NS{Name: Prefix + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(rnd[:]) + "-" + role, Role: role, t: t}
	if _, err := run(context.Background(), nil, "ip", "netns", "add", n.Name); err != nil {
		t.Fatalf("netns: %v", err)
	}
	t.Cleanup(n.destroy)
	n.MustRun("ip", "link", "set", "lo", "up")
	return n
}

// destroy stops the namespace's processes, then deletes it.
func (n *NS) destroy() {
	n.mu.Lock()
	procs := n.procs
	n.procs = nil
	n.mu.Unlock()
	for _, p := range procs {
		p.Stop(5 * time.Second)
	}
	if _, err := run(context.Background(), nil, "ip", "netns", "del", n.Name); err != nil {
		n.t.Errorf("netns: %v", err)
	}
}

// Run runs args[0] with args[1:] inside the namespace and returns its
// combined output; the error includes that output.
func (n *NS) Run(ctx context.Context, args ...string) (string, error) {
	return run(ctx, nil, append([]string{"ip", "netns", "exec", n.Name}, args...)...)
}

// MustRun is Run that fails the test on error.
func (n *NS) MustRun(args ...string) string {
	n.t.Helper()
	out, err := n.Run(context.Background(), args...)
	if err != nil {
		n.t.Fatalf("netns %s: %v", n.Role, err)
	}
	return out
}

// Nft loads an nftables ruleset (nft -f syntax) into the namespace.
func (n *NS) Nft(ruleset string) {
	n.t.Helper()
	if _, err := run(context.Background(), []byte(ruleset), "ip", "netns", "exec", n.Name, "nft", "-f", "-"); err != nil {
		n.t.Fatalf("netns %s: nft: %v\nruleset:\n%s", n.Role, err, ruleset)
	}
}

// AddRoute adds a route to dst through gw (an address on a linked peer).
func (n *NS) AddRoute(dst netip.Prefix, gw netip.Addr) {
	n.t.Helper()
	n.MustRun("ip", "route", "add", dst.String(), "via", gw.String())
}

// Link joins a and b with a veth pair named after the other side's role
// and gives them the first two host addresses of subnet (a /30 or
// larger), which must not overlap another link of a or b. It returns the
// two addresses.
func Link(t testing.TB, a, b *NS, subnet netip.Prefix) (aAddr, bAddr netip.Addr) {
	t.Helper()
	subnet = subnet.Masked()
	if !subnet.Addr().Is4() || subnet.Bits() > 30 {
		t.Fatalf("netns.Link: %v must be an IPv4 /30 or larger", subnet)
	}
	aAddr = subnet.Addr().Next()
	bAddr = aAddr.Next()
	aIf, bIf := ifName(b.Role), ifName(a.Role)
	if _, err := run(context.Background(), nil, "ip", "link", "add", aIf, "netns", a.Name, "type", "veth", "peer", "name", bIf, "netns", b.Name); err != nil {
		t.Fatalf("netns: %v", err)
	}
	for _, s := range []struct {
		ns   *NS
		ifc  string
		addr netip.Addr
	}{{a, aIf, aAddr}, {b, bIf, bAddr}} {
		s.ns.MustRun("ip", "addr", "add", netip.PrefixFrom(s.addr, subnet.Bits()).String(), "dev", s.ifc)
		s.ns.MustRun("ip", "link", "set", s.ifc, "up")
	}
	return aAddr, bAddr
}

// ifName is a veth name inside a namespace (IFNAMSIZ: 15 characters).
func ifName(peerRole string) string {
	name := "v-" + peerRole
	if len(name) > 15 {
		name = name[:15]
	}
	return name
}

// DialContext opens a connection from inside the namespace: the socket
// is created with the calling thread switched into the namespace, so all
// its traffic stays there. addr must be an IP literal and port (no name
// resolution, which would run on other threads).
func (n *NS) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if _, err := netip.ParseAddr(host); err != nil {
		return nil, fmt.Errorf("netns: DialContext needs an IP literal, got %q", addr)
	}
	return inside(n, func() (net.Conn, error) { return (&net.Dialer{}).DialContext(ctx, network, addr) })
}

// Listen opens a listener inside the namespace (see DialContext).
func (n *NS) Listen(network, addr string) (net.Listener, error) {
	return inside(n, func() (net.Listener, error) { return net.Listen(network, addr) })
}

// ListenPacket opens a packet listener inside the namespace.
func (n *NS) ListenPacket(network, addr string) (net.PacketConn, error) {
	return inside(n, func() (net.PacketConn, error) { return net.ListenPacket(network, addr) })
}

// HTTPClient returns an HTTP client whose connections are opened inside
// the namespace (for an admin endpoint listening there, e.g. on
// 127.0.0.1), without proxies.
func (n *NS) HTTPClient() *http.Client {
	return &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{Proxy: nil, DialContext: n.DialContext, DisableKeepAlives: true},
	}
}

// do runs fn on a locked OS thread switched into the namespace and
// switches back. If switching back fails the thread stays locked, so the
// runtime discards it when the goroutine ends.
func (n *NS) do(fn func() error) error {
	target, err := os.Open(filepath.Join(runDir, n.Name))
	if err != nil {
		return fmt.Errorf("netns: %w", err)
	}
	defer target.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: %w", err)
			return
		}
		defer orig.Close()
		if err := setns(target); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("netns: entering %s: %w", n.Name, err)
			return
		}
		ferr := fn()
		if err := setns(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("netns: leaving %s: %w", n.Name, err))
			return // thread stays locked: discarded at goroutine exit
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// inside is n.do for an fn that opens something: its value, opened inside n.
func inside[T any](n *NS, fn func() (T, error)) (T, error) {
	var v T
	err := n.do(func() error {
		var err error
		v, err = fn()
		return err
	})
	return v, err
}

func setns(f *os.File) error {
	return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
}

// Sweep deletes namespaces named Prefix+"<pid>-…" whose pid no longer
// runs (left by a test binary that crashed or was killed) and returns
// their names.
func Sweep() ([]string, error) {
	entries, err := os.ReadDir(runDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, Prefix) {
			continue
		}
		pidStr, _, ok := strings.Cut(strings.TrimPrefix(name, Prefix), "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 {
			continue // not ours
		}
		if pidAlive(pid) {
			continue
		}
		killAll(name)
		if _, err := run(context.Background(), nil, "ip", "netns", "del", name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}

func pidAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// killAll SIGKILLs the processes still inside namespace name (left by a
// dead test binary) so that deleting it frees it.
func killAll(name string) {
	out, err := run(context.Background(), nil, "ip", "netns", "pids", name)
	if err != nil {
		return
	}
	for _, f := range strings.Fields(out) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// run runs a command with cmdTimeout and returns its combined output.
func run(ctx context.Context, stdin []byte, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
