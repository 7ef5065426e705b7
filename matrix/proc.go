package matrix

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"forgeyard.dev/transport/internal/matrixdriver"
)

// backendSchemes maps a backend to the agent's endpoint URI scheme and the
// daemon's listener name in its "listening" log line.
var backendSchemes = map[string]string{"quic": "quic", "yamux": "yamux", "webtransport": "webtransport"}

// tail is a bounded buffer keeping the last bytes written (process
// stderr).
type tail struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// proc is a started daemon or agent process.
type proc struct {
	cmd    *exec.Cmd
	stderr *tail
	done   chan struct{} // closed when the process exited
	err    error         // its Wait error, after done
}

func startProc(ctx context.Context, bin string, args []string, lines func(string)) (*proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Stdout = io.Discard
	p := &proc{cmd: cmd, stderr: &tail{max: 64 << 10}, done: make(chan struct{})}
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.stderr.Write([]byte(line + "\n"))
			if lines != nil {
				lines(line)
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		p.err = cmd.Wait()
		_ = pw.Close()
		close(p.done)
	}()
	go func() {
		select {
		case <-ctx.Done():
			_ = cmd.Process.Kill()
		case <-p.done:
		}
	}()
	return p, nil
}

// stop sends SIGTERM and waits up to grace before killing.
func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// waitListening waits up to 30 s for ready, which the process's log lines
// close once it listens; what names the process in the errors. A process
// still not listening is stopped.
func (p *proc) waitListening(ready <-chan struct{}, what string) error {
	t := time.NewTimer(30 * time.Second)
	defer t.Stop()
	select {
	case <-ready:
		return nil
	case <-p.done:
		return fmt.Errorf("%s exited (%v) before listening:\n%s", what, p.err, lastLines(p.stderr.String(), 10))
	case <-t.C:
		p.stop(5 * time.Second)
		return fmt.Errorf("%s not listening after 30s:\n%s", what, lastLines(p.stderr.String(), 10))
	}
}

// exitCode returns the exit code once exited (-1 when killed by a signal).
func (p *proc) exitCode() int {
	if p.cmd.ProcessState == nil {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}

// daemonProc is a daemon started with the matrix driver.
type daemonProc struct {
	*proc
	dir   string
	pki   string
	admin string
	addrs map[string]string // backend → host:port
	http  *http.Client
}

// startDaemon starts bin with the driver and every backend on loopback
// port 0 and waits for its listeners (from its JSON log lines).
func startDaemon(ctx context.Context, bin, dir string, extra []string) (*daemonProc, error) {
	d := &daemonProc{dir: dir, pki: filepath.Join(dir, "pki"), addrs: map[string]string{}, http: &http.Client{Timeout: 60 * time.Second}}
	ready := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	lines := func(line string) {
		var rec struct {
			Msg, Addr, Backend string
		}
		if json.Unmarshal([]byte(line), &rec) != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		switch rec.Msg {
		case "admin endpoint listening":
			d.admin = rec.Addr
		case "listening":
			d.addrs[rec.Backend] = rec.Addr
		}
		if d.admin != "" && len(d.addrs) == len(backendSchemes) {
			once.Do(func() { close(ready) })
		}
	}
	args := []string{"--dev-pki", d.pki, "--sqlite", filepath.Join(dir, "authority.db"),
		"--listen", "127.0.0.1:0", "--listen-yamux", "127.0.0.1:0", "--listen-webtransport", "127.0.0.1:0",
		"--admin-listen", "127.0.0.1:0", "--matrix-driver", "--log-format", "json", "--shutdown-timeout", "2s"}
	p, err := startProc(ctx, bin, append(args, extra...), lines)
	if err != nil {
		return nil, err
	}
	d.proc = p
	if err := p.waitListening(ready, "daemon"); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	return d, nil
}

// startRelay starts forgeyard-relay with the daemon's dev PKI, agent-facing
// yamux and WebTransport listeners on loopback port 0 and the daemon's
// QUIC endpoint upstream, and returns its listeners (backend → address).
func startRelay(ctx context.Context, bin, pki, upstream string) (*proc, map[string]string, error) {
	if bin == "" {
		return nil, nil, errors.New("no forgeyard-relay binary")
	}
	addrs := map[string]string{}
	ready := make(chan struct{})
	var once sync.Once
	var mu sync.Mutex
	lines := func(line string) {
		var rec struct{ Msg, Addr, Backend string }
		if json.Unmarshal([]byte(line), &rec) != nil || rec.Msg != "listening" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		addrs[rec.Backend] = rec.Addr
		if len(addrs) == 2 {
			once.Do(func() { close(ready) })
		}
	}
	p, err := startProc(ctx, bin, []string{"--dev-pki", pki, "--listen-yamux", "127.0.0.1:0", "--listen-webtransport", "127.0.0.1:0",
		"--upstream", "quic://" + upstream, "--log-format", "json", "--shutdown-timeout", "2s"}, lines)
	if err != nil {
		return nil, nil, err
	}
	if err := p.waitListening(ready, "relay"); err != nil {
		return nil, nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	return p, maps.Clone(addrs), nil
}

// call does one driver request; out receives the JSON answer. A non-2xx
// status is an error carrying the driver's message.
func (d *daemonProc) call(ctx context.Context, method, path string, body, out any) error {
	return matrixdriver.Call(ctx, d.http, d.admin, method, path, body, out)
}

// driverSession is one entry of GET /v1/matrix/sessions.
type driverSession struct {
	Runner       string   `json:"runner"`
	Session      string   `json:"session"`
	Epoch        uint64   `json:"epoch"`
	Backend      string   `json:"backend"`
	Protocol     string   `json:"protocol"`
	Features     []string `json:"features"`
	AgentVersion string   `json:"agent_version"`
	State        string   `json:"state"`
}

// driverAttempt is GET /v1/matrix/attempt.
type driverAttempt struct {
	Phases      []string `json:"phases"`
	Completions []struct {
		Ack      string `json:"ack"`
		Result   string `json:"result"`
		ExitCode int32  `json:"exit_code"`
	} `json:"completions"`
	Log       string `json:"log"`
	LogFrames int    `json:"log_frames"`
	Outputs   []struct {
		Digest   string `json:"digest"`
		Size     uint64 `json:"size"`
		Stored   bool   `json:"stored"`
		Received uint64 `json:"received"`
	} `json:"outputs"`
	OutputsFinalized bool `json:"outputs_finalized"`
	// LogEncoding is reported by drivers from protocol 1.1 on ("Raw",
	// "Flate"); empty from older daemons.
	LogEncoding string `json:"log_encoding"`
}

func (d *daemonProc) sessions(ctx context.Context) ([]driverSession, error) {
	var s []driverSession
	err := d.call(ctx, "GET", "/v1/matrix/sessions", nil, &s)
	return s, err
}

// agentProc is an agent process connected to one daemon endpoint.
type agentProc struct {
	*proc
	name string
}

func startAgent(ctx context.Context, bin, pki, name, endpoint string, args []string) (*agentProc, error) {
	all := append([]string{"--dev-pki", pki, "--dev-agent", name, "--endpoint", endpoint, "--log-format", "json"}, args...)
	p, err := startProc(ctx, bin, all, nil)
	if err != nil {
		return nil, err
	}
	return &agentProc{proc: p, name: name}, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// poll calls f every 25 ms until it reports done, fails, or the deadline
// passes (the processes under test offer no event to wait on).
func poll(ctx context.Context, timeout time.Duration, what string, f func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		ok, err := f()
		if ok && err == nil {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("%s: not reached within %v (last error: %v)", what, timeout, last)
			}
			return fmt.Errorf("%s: not reached within %v", what, timeout)
		case <-time.After(25 * time.Millisecond):
		}
	}
}

var errAgentExited = errors.New("agent exited")

func removeAll(dir string) { _ = os.RemoveAll(dir) }
