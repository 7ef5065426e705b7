package loadgen

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	quicraw "forgeyard.dev/transport/backends/quic/rawbench"
	wtraw "forgeyard.dev/transport/backends/webtransport/rawbench"
	yamuxraw "forgeyard.dev/transport/backends/yamux/rawbench"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics/trust"
)

// The raw baseline server is this same executable started with these
// variables (MaybeRawServer): the backend ("quic", "yamux" or "webtransport") and the dev
// PKI directory.
const (
	rawServerEnv = "FORGEYARD_LOADGEN_RAW_SERVER"
	rawPKIEnv    = "FORGEYARD_LOADGEN_RAW_PKI"
	rawCurvesEnv = "FORGEYARD_LOADGEN_RAW_CURVES" // comma-separated config.ParseCurves names
)

// MaybeRawServer runs the raw baseline server and exits when this process
// was started as one (RawBaseline starts it); otherwise it returns at once.
// Call it first in main (and in TestMain of tests that measure the raw
// baseline).
func MaybeRawServer() {
	backend := os.Getenv(rawServerEnv)
	if backend == "" {
		return
	}
	if err := rawServer(backend, os.Getenv(rawPKIEnv), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "raw server:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func rawServer(backend, pkiDir string, out io.Writer) error {
	dev, err := trust.LoadDevPKI(pkiDir)
	if err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(dev.Server.CertFile, dev.Server.KeyFile)
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(dev.CA.CertFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	conf := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert}
	if c := os.Getenv(rawCurvesEnv); c != "" {
		if conf.CurvePreferences, err = config.ParseCurves(rawCurvesEnv, strings.Split(c, ",")); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	type server interface {
		Serve(context.Context) error
		Held() int64
		EchoAll()
	}
	var s server
	var addr string
	switch backend {
	case "quic":
		q, err := quicraw.Listen("127.0.0.1:0", conf)
		if err != nil {
			return err
		}
		s, addr = q, q.Addr().String()
	case "yamux":
		y, err := yamuxraw.Listen("127.0.0.1:0", conf)
		if err != nil {
			return err
		}
		s, addr = y, y.Addr().String()
	case "webtransport":
		w, err := wtraw.Listen("127.0.0.1:0", conf)
		if err != nil {
			return err
		}
		s, addr = w, w.Addr().String()
	default:
		return fmt.Errorf("no raw baseline for backend %q", backend)
	}
	fmt.Fprintf(out, "listening %s\n", addr)
	// The parent's commands on stdin: "echo" starts the steady echo (once),
	// "gc" asks for a report after two collections, so that the heap figure
	// is the live heap (the daemon's is read after /debug/pprof/heap?gc=1),
	// "heap PATH" writes the heap profile; closing stdin (or dying) stops.
	gc := make(chan struct{}, 1)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		started := false
		for sc.Scan() {
			switch sc.Text() {
			case "echo":
				if !started {
					started = true
					s.EchoAll()
				}
			case "gc":
				select {
				case gc <- struct{}{}:
				default:
				}
			default:
				if path, ok := strings.CutPrefix(sc.Text(), "heap "); ok {
					runtime.GC()
					if err := writeHeapProfile(path); err != nil {
						fmt.Fprintf(out, "heap-profile failed: %v\n", err)
					} else {
						fmt.Fprintln(out, "heap-profile ok")
					}
				}
			}
		}
		stop()
	}()
	go func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		var ms runtime.MemStats
		gcs := 0 // collections asked for ("gc")
		for {
			runtime.ReadMemStats(&ms)
			fmt.Fprintf(out, "held %d heap %d goroutines %d stack %d gcs %d\n", s.Held(), ms.HeapAlloc, runtime.NumGoroutine(), ms.StackInuse, gcs)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-gc:
				runtime.GC() // twice: sync.Pool's victim cache goes with the second
				runtime.GC()
				gcs++
			}
		}
	}()
	return s.Serve(ctx)
}

// writeHeapProfile writes the process's heap profile to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// RawResult is the raw baseline: the server process's memory before and
// with N idle connections, and what admitting them cost (Parallel = N is
// the raw herd: every client at once).
type RawResult struct {
	Backend     string  `json:"backend"`
	N           int     `json:"n"`
	Parallel    int     `json:"parallel"`
	Dials       int64   `json:"dials"`              // handshakes begun, retries included
	ServerCPU   float64 `json:"server_cpu_seconds"` // the raw server's CPU while admitting
	ClientCPU   float64 `json:"client_cpu_seconds"` // this process's CPU while admitting
	RSSBefore   int64   `json:"rss_before_bytes"`
	RSSAfter    int64   `json:"rss_after_bytes"`
	HeapBefore  int64   `json:"heap_before_bytes"`
	HeapAfter   int64   `json:"heap_after_bytes"`
	RSSPerConn  float64 `json:"rss_per_conn_bytes"`
	HeapPerConn float64 `json:"heap_per_conn_bytes"`
	// The server's goroutines before and with the N idle connections.
	GoroutinesBefore  int64   `json:"goroutines_before"`
	GoroutinesAfter   int64   `json:"goroutines_after"`
	GoroutinesPerConn float64 `json:"goroutines_per_conn"`
	// Its goroutine stacks (runtime.MemStats.StackInuse).
	StackBefore  int64         `json:"stack_before_bytes"`
	StackAfter   int64         `json:"stack_after_bytes"`
	StackPerConn float64       `json:"stack_per_conn_bytes"`
	Took         time.Duration `json:"took_ns"`
	// The steady echo (RawSteady), when asked for: the server's CPU over the
	// window, the echoes completed in it, and the CPU per 1,000
	// connections (% of one core) and per echo.
	EchoInterval       time.Duration `json:"echo_interval_ns,omitempty"`
	EchoWindow         time.Duration `json:"echo_window_ns,omitempty"`
	EchoCPUSeconds     float64       `json:"echo_server_cpu_seconds,omitempty"`
	Echoes             int64         `json:"echoes,omitempty"`
	EchoCPUPercent1000 float64       `json:"echo_cpu_percent_per_1000,omitempty"`
	EchoCPUPerEcho     time.Duration `json:"echo_cpu_per_echo_ns,omitempty"`
}

// RawSteady asks RawBaseline for more after the memory figures: the
// server's heap profile (after a collection) written to HeapProfile, and a
// steady echo — every connection echoes Size bytes once per Interval
// (spread evenly, as the fleet's heartbeats are), and the server's CPU is
// read over Window after one Interval of ramp. The zero value asks for
// neither.
type RawSteady struct {
	HeapProfile      string
	Interval, Window time.Duration
	Size             int
}

// echoRun is a client's running steady echo.
type echoRun interface {
	Count() int64
	Wait() error
}

// RawBaseline starts the raw server of backend (one of Backends) as a
// child process, holds n raw mTLS connections to it (runner certificates
// of p), dialed parallel at a time (n: the raw herd), and measures its
// RSS and Go heap by the same method as the daemon's, and the CPU both
// processes spent admitting them.
func RawBaseline(ctx context.Context, backend string, p *PKI, n, parallel, sources int, timeout time.Duration, echo RawSteady) (*RawResult, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	rp, err := startRawServer(ctx, backend, p)
	if err != nil {
		return nil, err
	}
	defer rp.stop()
	// The first report after listening is the idle server.
	before, err := rp.afterReport(ctx)
	if err != nil {
		return nil, err
	}
	r := rp.report()
	res := &RawResult{Backend: backend, N: n, Parallel: parallel, RSSBefore: before.RSS, HeapBefore: r.heap, GoroutinesBefore: r.goroutines, StackBefore: r.stack}
	start, self0 := time.Now(), selfCPU()
	client, startEcho, err := dialRaw(ctx, backend, rp.addr, p, n, parallel, sources, echo)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	if err := rp.awaitHeld(ctx, n); err != nil {
		return nil, err
	}
	res.Took = time.Since(start)
	res.Dials, res.ClientCPU = client.Dials(), selfCPU()-self0
	if ps, err := ReadProc(rp.cmd.Process.Pid); err == nil {
		res.ServerCPU = ps.CPUSeconds - before.CPUSeconds
	}
	if err := rp.collectMemory(ctx, res); err != nil {
		return nil, err
	}
	if echo.HeapProfile != "" {
		if err := rp.heapProfile(ctx, echo.HeapProfile); err != nil {
			return nil, err
		}
	}
	if echo.Window > 0 && echo.Interval > 0 {
		if err := rp.command("echo"); err != nil {
			return nil, err
		}
		if err := steadyEcho(ctx, res, rp.cmd.Process.Pid, n, startEcho(), echo); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// rawProc is the raw server child process (MaybeRawServer) and what its
// reports said last.
type rawProc struct {
	backend  string
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	addr     string
	mu       sync.Mutex
	last     rawReport     // guarded by mu
	update   chan struct{} // a report arrived
	profiled chan string   // the answer to "heap PATH"
}

// rawReport is one of the server's "held … heap … goroutines … stack …
// gcs …" lines.
type rawReport struct{ held, heap, goroutines, stack, gcs int64 }

// startRawServer starts the raw server of backend and waits until it
// listens.
func startRawServer(ctx context.Context, backend string, p *PKI) (*rawProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), rawServerEnv+"="+backend, rawPKIEnv+"="+p.Dev.Dir, rawCurvesEnv+"="+strings.Join(p.Curves, ","))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	rp := &rawProc{backend: backend, cmd: cmd, stdin: stdin, update: make(chan struct{}, 1), profiled: make(chan string, 1)}
	addrc := make(chan string, 1)
	go rp.read(stdout, addrc)
	select {
	case rp.addr = <-addrc:
		return rp, nil
	case <-ctx.Done():
		rp.stop()
		return nil, fmt.Errorf("loadgen: raw %s server did not start: %w", backend, ctx.Err())
	}
}

// read parses the server's stdout: its address, its reports and its
// heap-profile answers.
func (rp *rawProc) read(stdout io.Reader, addrc chan<- string) {
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && f[0] == "listening":
			addrc <- f[1]
		case len(f) >= 2 && f[0] == "heap-profile":
			rp.profiled <- strings.Join(f[1:], " ")
		case len(f) == 10 && f[0] == "held":
			var r rawReport
			for i, v := range []*int64{&r.held, &r.heap, &r.goroutines, &r.stack, &r.gcs} {
				*v, _ = strconv.ParseInt(f[1+2*i], 10, 64)
			}
			rp.mu.Lock()
			rp.last = r
			rp.mu.Unlock()
			select {
			case rp.update <- struct{}{}:
			default:
			}
		}
	}
}

// stop ends the server: its stdin closed, SIGTERM, waited for.
func (rp *rawProc) stop() {
	_ = rp.stdin.Close()
	_ = rp.cmd.Process.Signal(syscall.SIGTERM)
	_ = rp.cmd.Wait()
}

func (rp *rawProc) report() rawReport {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	return rp.last
}

// command writes one of the server's stdin commands.
func (rp *rawProc) command(c string) error {
	_, err := io.WriteString(rp.stdin, c+"\n")
	return err
}

// afterReport waits for the server's next report and reads its /proc
// figures.
func (rp *rawProc) afterReport(ctx context.Context) (ProcStats, error) {
	select {
	case <-rp.update:
	case <-ctx.Done():
		return ProcStats{}, ctx.Err()
	}
	return ReadProc(rp.cmd.Process.Pid)
}

// awaitHeld waits until the server holds n connections.
func (rp *rawProc) awaitHeld(ctx context.Context, n int) error {
	for rp.report().held < int64(n) {
		select {
		case <-rp.update:
		case <-ctx.Done():
			return fmt.Errorf("loadgen: raw %s server holds %d of %d connections: %w", rp.backend, rp.report().held, n, ctx.Err())
		}
	}
	return nil
}

// collectMemory asks for two collections ("gc") and records the report
// after them, per connection, in res.
func (rp *rawProc) collectMemory(ctx context.Context, res *RawResult) error {
	if err := rp.command("gc"); err != nil {
		return err
	}
	var after ProcStats
	var r rawReport
	for r.gcs == 0 {
		var err error
		if after, err = rp.afterReport(ctx); err != nil {
			return err
		}
		r = rp.report()
	}
	res.RSSAfter, res.HeapAfter, res.GoroutinesAfter, res.StackAfter = after.RSS, r.heap, r.goroutines, r.stack
	n := float64(res.N)
	res.GoroutinesPerConn = float64(res.GoroutinesAfter-res.GoroutinesBefore) / n
	res.StackPerConn = float64(res.StackAfter-res.StackBefore) / n
	res.RSSPerConn = float64(res.RSSAfter-res.RSSBefore) / n
	res.HeapPerConn = float64(res.HeapAfter-res.HeapBefore) / n
	return nil
}

// heapProfile has the server write its heap profile to path.
func (rp *rawProc) heapProfile(ctx context.Context, path string) error {
	if err := rp.command("heap " + path); err != nil {
		return err
	}
	select {
	case e := <-rp.profiled:
		if e != "ok" {
			return fmt.Errorf("loadgen: raw server's heap profile: %s", e)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// rawClient is what RawBaseline needs of a library's raw client.
type rawClient interface {
	Close()
	Dials() int64
}

// dialRaw dials the raw clients of backend and returns them with the
// function that starts their side of the steady echo. The clients of the
// three libraries have the same methods; StartEcho's result type is
// internal to backends/, so each case wraps its own.
func dialRaw(ctx context.Context, backend, addr string, p *PKI, n, parallel, sources int, echo RawSteady) (rawClient, func() echoRun, error) {
	window := echo.Interval + echo.Window
	switch backend {
	case "quic":
		c, err := quicraw.DialN(ctx, addr, n, parallel, sources, p.ClientTLS)
		if err != nil {
			return nil, nil, err
		}
		return c, func() echoRun { return c.StartEcho(ctx, echo.Interval, echo.Size, window) }, nil
	case "yamux":
		c, err := yamuxraw.DialN(ctx, addr, n, parallel, sources, p.ClientTLS)
		if err != nil {
			return nil, nil, err
		}
		return c, func() echoRun { return c.StartEcho(ctx, echo.Interval, echo.Size, window) }, nil
	case "webtransport":
		c, err := wtraw.DialN(ctx, addr, n, parallel, sources, p.ClientTLS)
		if err != nil {
			return nil, nil, err
		}
		return c, func() echoRun { return c.StartEcho(ctx, echo.Interval, echo.Size, window) }, nil
	}
	return nil, nil, fmt.Errorf("loadgen: no raw client for backend %q", backend)
}

// steadyEcho measures the steady phase of RawSteady (run, on n connections)
// on the server process pid and records it in res.
func steadyEcho(ctx context.Context, res *RawResult, pid, n int, run echoRun, e RawSteady) error {
	ramp := time.NewTimer(e.Interval)
	defer ramp.Stop()
	select {
	case <-ramp.C:
	case <-ctx.Done():
		_ = run.Wait()
		return ctx.Err()
	}
	p0, err := ReadProc(pid)
	if err != nil {
		return err
	}
	echoes0 := run.Count()
	if err := run.Wait(); err != nil {
		return fmt.Errorf("loadgen: raw steady echo: %w", err)
	}
	p1, err := ReadProc(pid)
	if err != nil {
		return err
	}
	res.EchoInterval, res.EchoWindow = e.Interval, e.Window
	res.EchoCPUSeconds, res.Echoes = p1.CPUSeconds-p0.CPUSeconds, run.Count()-echoes0
	res.EchoCPUPercent1000 = res.EchoCPUSeconds / e.Window.Seconds() * 100 / (float64(n) / 1000)
	if res.Echoes > 0 {
		res.EchoCPUPerEcho = time.Duration(res.EchoCPUSeconds / float64(res.Echoes) * 1e9)
	}
	return nil
}
