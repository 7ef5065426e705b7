package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"forgeyard.dev/transport/internal/matrixdriver"
)

// DaemonOptions start a forgeyard-daemon process for the fleet.
type DaemonOptions struct {
	// Bin is the forgeyard-daemon executable.
	Bin string
	// Dir is the work directory: Dir/pki (the dev PKI), Dir/authority.db,
	// Dir/daemon.toml (WriteDaemonConfig) and Dir/daemon.log (the
	// daemon's stderr, appended across restarts).
	Dir string
	// Backends lists the listeners to open ("quic", "yamux",
	// "webtransport"), on 127.0.0.1 port 0 at the first start and on the
	// same ports after a restart.
	Backends []string
	// Args are appended to the daemon's command line.
	Args []string
	// ShutdownTimeout is the daemon's --shutdown-timeout (0: 10 s).
	ShutdownTimeout time.Duration
	// StartTimeout bounds the wait for the listeners (0: 30 s).
	StartTimeout time.Duration
}

// Daemon is a running forgeyard-daemon process the loadgen started (or, with
// Attach, one started separately).
type Daemon struct {
	opts  DaemonOptions
	http  *http.Client
	mu    sync.Mutex
	cmd   *exec.Cmd
	pid   int
	done  chan struct{} // closed when the current process exited
	tail  *tailBuffer
	Addrs map[string]string // backend → host:port
	Admin string            // admin endpoint host:port ("" without one)
}

// DaemonConfigFile is the configuration WriteDaemonConfig writes in a work
// directory.
const DaemonConfigFile = "daemon.toml"

// WriteDaemonConfig writes dir/daemon.toml for a daemon serving the fleet:
// the dev PKI of dir/pki (server certificate, the runners' CA), an SQLite
// authority in dir, the heartbeat interval hb (0: the daemon's default) and
// the listeners (addrs: backend → host:port). Start the daemon with
// `forgeyard-daemon --config dir/daemon.toml --admin-listen 127.0.0.1:9464
// --matrix-driver` when it is not started by the loadgen.
func WriteDaemonConfig(dir string, p *PKI, hb time.Duration, addrs map[string]string) (string, error) {
	var b strings.Builder
	b.WriteString("# Written by forgeyard-loadgen prepare: a daemon for a load-generated fleet (development PKI).\n")
	b.WriteString("id = \"loadgen-daemon\"\n\n[listen]\n")
	for _, k := range []string{"quic", "yamux", "webtransport"} {
		if a, ok := addrs[k]; ok {
			fmt.Fprintf(&b, "%s = %q\n", k, a)
		}
	}
	fmt.Fprintf(&b, "\n[tls]\ncertificate = %q\nprivate_key = %q\nclient_ca = %q\n", p.Dev.Server.CertFile, p.Dev.Server.KeyFile, p.Dev.CA.CertFile)
	if len(p.Curves) > 0 {
		q := make([]string, len(p.Curves))
		for i, c := range p.Curves {
			q[i] = strconv.Quote(c)
		}
		fmt.Fprintf(&b, "curves = [%s]\n", strings.Join(q, ", "))
	}
	fmt.Fprintf(&b, "\n[authority]\nsqlite = %q\n", filepath.Join(dir, "authority.db"))
	if hb > 0 {
		fmt.Fprintf(&b, "\n[timing]\nheartbeat_interval = %q\n", hb.String())
	}
	fmt.Fprintf(&b, "\n[log]\nformat = \"json\"\nlevel = \"info\"\n")
	path := filepath.Join(dir, DaemonConfigFile)
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}

// StartDaemon starts the daemon with dir/daemon.toml, the admin endpoint
// on a free loopback port and the matrix driver (the loadgen's way to offer
// leases), and waits until every listener is up.
func StartDaemon(ctx context.Context, o DaemonOptions) (*Daemon, error) {
	if o.ShutdownTimeout == 0 {
		o.ShutdownTimeout = 10 * time.Second
	}
	if o.StartTimeout == 0 {
		o.StartTimeout = 30 * time.Second
	}
	d := &Daemon{opts: o, http: newHTTPClient(), Addrs: map[string]string{}}
	for _, b := range o.Backends {
		d.Addrs[b] = "127.0.0.1:0"
	}
	return d, d.start(ctx)
}

// Attach describes a daemon started separately: its admin endpoint (with
// the matrix driver) and its pid (0: no process figures).
func Attach(addrs map[string]string, admin string, pid int) *Daemon {
	return &Daemon{http: newHTTPClient(), Addrs: addrs, Admin: admin, pid: pid}
}

func newHTTPClient() *http.Client {
	return &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
}

var listenFlags = map[string]string{"quic": "--listen", "yamux": "--listen-yamux", "webtransport": "--listen-webtransport"}

func (d *Daemon) start(ctx context.Context) error {
	o := d.opts
	args := []string{"--config", filepath.Join(o.Dir, DaemonConfigFile), "--admin-listen", "127.0.0.1:0", "--matrix-driver",
		"--log-format", "json", "--shutdown-timeout", o.ShutdownTimeout.String()}
	for b, a := range d.Addrs {
		args = append(args, listenFlags[b], a)
	}
	args = append(args, o.Args...)
	logf, err := os.OpenFile(filepath.Join(o.Dir, "daemon.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(o.Bin, args...)
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	cmd.Stdout = logf
	tail := &tailBuffer{max: 32 << 10}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("loadgen: start daemon: %w", err)
	}
	done := make(chan struct{})
	d.mu.Lock()
	d.cmd, d.pid, d.done, d.tail, d.Admin = cmd, cmd.Process.Pid, done, tail, ""
	d.mu.Unlock()
	ready := make(chan struct{})
	seen := map[string]string{}
	var once sync.Once
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			_, _ = logf.Write(append(line, '\n'))
			tail.Write(append(line, '\n'))
			if !bytes.Contains(line, []byte("listening")) {
				continue
			}
			var rec struct{ Msg, Addr, Backend string }
			if json.Unmarshal(line, &rec) != nil {
				continue
			}
			switch rec.Msg {
			case "admin endpoint listening":
				seen["admin"] = rec.Addr
			case "listening":
				seen[rec.Backend] = rec.Addr
			}
			if len(seen) == len(d.Addrs)+1 {
				once.Do(func() {
					d.mu.Lock()
					for k, v := range seen {
						if k == "admin" {
							d.Admin = v
						} else {
							d.Addrs[k] = v
						}
					}
					d.mu.Unlock()
					close(ready)
				})
			}
		}
		_, _ = io.Copy(io.Discard, pr)
		_ = logf.Close()
	}()
	go func() {
		_ = cmd.Wait()
		_ = pw.Close()
		close(done)
	}()
	t := time.NewTimer(o.StartTimeout)
	defer t.Stop()
	select {
	case <-ready:
		return nil
	case <-done:
		return fmt.Errorf("loadgen: daemon exited before listening:\n%s", tail.String())
	case <-t.C:
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("loadgen: daemon not listening after %v:\n%s", o.StartTimeout, tail.String())
	case <-ctx.Done():
		_ = cmd.Process.Kill()
		<-done
		return ctx.Err()
	}
}

// Pid is the current process id (0 when unknown).
func (d *Daemon) Pid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pid
}

// Addr returns the listener of backend.
func (d *Daemon) Addr(backend string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.Addrs[backend]
}

// AdminAddr returns the admin endpoint.
func (d *Daemon) AdminAddr() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.Admin
}

// LogTail returns the end of the daemon's stderr.
func (d *Daemon) LogTail() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.tail == nil {
		return ""
	}
	return d.tail.String()
}

// Kill sends SIGKILL and waits for the process to exit.
func (d *Daemon) Kill() error {
	return d.signal(syscall.SIGKILL, 0)
}

// Terminate sends SIGTERM (a graceful drain: GoAway to every agent) and
// waits up to grace before killing.
func (d *Daemon) Terminate(grace time.Duration) error {
	return d.signal(syscall.SIGTERM, grace)
}

func (d *Daemon) signal(sig syscall.Signal, grace time.Duration) error {
	d.mu.Lock()
	cmd, done := d.cmd, d.done
	d.mu.Unlock()
	if cmd == nil {
		return errors.New("loadgen: daemon not started by the loadgen")
	}
	select {
	case <-done:
		return nil
	default:
	}
	if err := cmd.Process.Signal(sig); err != nil {
		return err
	}
	if grace <= 0 {
		<-done
		return nil
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("loadgen: daemon still running %v after %v; killed", grace, sig)
	}
}

// Restart starts the daemon again on the same listener ports (after Kill
// or Terminate).
func (d *Daemon) Restart(ctx context.Context) error {
	return d.start(ctx)
}

// Close stops a started daemon gracefully.
func (d *Daemon) Close() error {
	if d.cmd == nil {
		return nil
	}
	return d.Terminate(d.opts.ShutdownTimeout + 5*time.Second)
}

// ProcStats are a process's figures from /proc.
type ProcStats struct {
	RSS, HWM   int64   // bytes: VmRSS, VmHWM
	CPUSeconds float64 // utime + stime
	FDs        int
	Threads    int
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// ReadProc reads /proc/<pid>/status, stat and fd.
func ReadProc(pid int) (ProcStats, error) {
	var s ProcStats
	if pid <= 0 {
		return s, errors.New("loadgen: no pid")
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmRSS":
			s.RSS = n << 10
		case "VmHWM":
			s.HWM = n << 10
		case "Threads":
			s.Threads = int(n)
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	// Fields after the command name (which may hold spaces) start at 3.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 {
		f := strings.Fields(string(stat[i+1:]))
		if len(f) > 13 {
			ut, _ := strconv.ParseInt(f[11], 10, 64)
			st, _ := strconv.ParseInt(f[12], 10, 64)
			s.CPUSeconds = float64(ut+st) / clockTicks
		}
	}
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		s.FDs = len(ents)
	}
	return s, nil
}

// Proc reads the current daemon process's figures.
func (d *Daemon) Proc() (ProcStats, error) { return ReadProc(d.Pid()) }

// Metrics scrapes the admin endpoint's /metrics and returns the samples
// whose names start with one of prefixes, keyed by the sample's text
// before the value (name and labels).
func (d *Daemon) Metrics(ctx context.Context, prefixes ...string) (map[string]float64, error) {
	body, _, err := d.get(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		match := len(prefixes) == 0
		for _, p := range prefixes {
			if strings.HasPrefix(line, p) {
				match = true
				break
			}
		}
		if !match {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, nil
}

// Healthz fetches /healthz and returns how long it took.
func (d *Daemon) Healthz(ctx context.Context) (time.Duration, int, error) {
	start := time.Now()
	_, code, err := d.get(ctx, "/healthz")
	return time.Since(start), code, err
}

func (d *Daemon) get(ctx context.Context, path string) ([]byte, int, error) {
	admin := d.AdminAddr()
	if admin == "" {
		return nil, 0, errors.New("loadgen: no admin endpoint")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+path, nil)
	if err != nil {
		return nil, 0, err
	}
	resp, err := d.http.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return b, resp.StatusCode, err
}

// driverCall does one matrix-driver request (POST with a JSON body, or GET
// when body is nil); out receives the answer.
func (d *Daemon) driverCall(ctx context.Context, path string, body, out any) error {
	admin := d.AdminAddr()
	if admin == "" {
		return errors.New("loadgen: no admin endpoint")
	}
	method := http.MethodGet
	if body != nil {
		method = http.MethodPost
	}
	err := matrixdriver.Call(ctx, d.http, admin, method, path, body, out)
	var me *matrixdriver.Error
	if errors.As(err, &me) {
		return &driverError{Status: me.Code, Msg: me.Msg}
	}
	return err
}

type driverError struct {
	Status int
	Msg    string
}

func (e *driverError) Error() string { return fmt.Sprintf("matrix driver: %d: %s", e.Status, e.Msg) }

// tailBuffer keeps the last max bytes written.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (t *tailBuffer) Write(p []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-t.max:]...)
	}
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
