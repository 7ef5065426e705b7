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

// RawBaseline starts the raw server of backend ("quic" or "yamux") as a
// child process, holds n raw mTLS connections to it (runner certificates
// of p), dialed parallel at a time (n: the raw herd), and measures its
// RSS and Go heap by the same method as the daemon's, and the CPU both
// processes spent admitting them.
func RawBaseline(ctx context.Context, backend string, p *PKI, n, parallel, sources int, timeout time.Duration, echo RawSteady) (*RawResult, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
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
	defer func() { _ = stdin.Close(); _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }()
	var mu sync.Mutex
	var held, heap, gs, stack, gcs int64
	addrc, profiled := make(chan string, 1), make(chan string, 1)
	update := make(chan struct{}, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			switch {
			case len(f) == 2 && f[0] == "listening":
				addrc <- f[1]
			case len(f) >= 2 && f[0] == "heap-profile":
				profiled <- strings.Join(f[1:], " ")
			case len(f) == 10 && f[0] == "held":
				h, _ := strconv.ParseInt(f[1], 10, 64)
				hp, _ := strconv.ParseInt(f[3], 10, 64)
				g, _ := strconv.ParseInt(f[5], 10, 64)
				st, _ := strconv.ParseInt(f[7], 10, 64)
				c, _ := strconv.ParseInt(f[9], 10, 64)
				mu.Lock()
				held, heap, gs, stack, gcs = h, hp, g, st, c
				mu.Unlock()
				select {
				case update <- struct{}{}:
				default:
				}
			}
		}
	}()
	var addr string
	select {
	case addr = <-addrc:
	case <-ctx.Done():
		return nil, fmt.Errorf("loadgen: raw %s server did not start: %w", backend, ctx.Err())
	}
	// afterReport waits for the server's next report and reads its /proc
	// figures.
	afterReport := func() (ProcStats, error) {
		select {
		case <-update:
		case <-ctx.Done():
			return ProcStats{}, ctx.Err()
		}
		return ReadProc(cmd.Process.Pid)
	}
	// The first report after listening is the idle server.
	before, err := afterReport()
	if err != nil {
		return nil, err
	}
	mu.Lock()
	res := &RawResult{Backend: backend, N: n, Parallel: parallel, RSSBefore: before.RSS, HeapBefore: heap, GoroutinesBefore: gs, StackBefore: stack}
	mu.Unlock()
	start, self0 := time.Now(), selfCPU()
	// The two raw clients have the same methods; StartEcho's result type
	// is internal to backends/, so each case wraps its own.
	var client interface {
		Close()
		Dials() int64
	}
	var startEcho func() echoRun
	switch backend {
	case "quic":
		c, dialErr := quicraw.DialN(ctx, addr, n, parallel, sources, p.ClientTLS)
		client, err = c, dialErr
		startEcho = func() echoRun { return c.StartEcho(ctx, echo.Interval, echo.Size, echo.Interval+echo.Window) }
	case "yamux":
		c, dialErr := yamuxraw.DialN(ctx, addr, n, parallel, sources, p.ClientTLS)
		client, err = c, dialErr
		startEcho = func() echoRun { return c.StartEcho(ctx, echo.Interval, echo.Size, echo.Interval+echo.Window) }
	case "webtransport":
		c, dialErr := wtraw.DialN(ctx, addr, n, parallel, sources, p.ClientTLS)
		client, err = c, dialErr
		startEcho = func() echoRun { return c.StartEcho(ctx, echo.Interval, echo.Size, echo.Interval+echo.Window) }
	}
	if err != nil {
		return nil, err
	}
	defer client.Close()
	for {
		mu.Lock()
		h := held
		mu.Unlock()
		if h >= int64(n) {
			break
		}
		select {
		case <-update:
		case <-ctx.Done():
			return nil, fmt.Errorf("loadgen: raw %s server holds %d of %d connections: %w", backend, h, n, ctx.Err())
		}
	}
	res.Took = time.Since(start)
	res.Dials, res.ClientCPU = client.Dials(), selfCPU()-self0
	if ps, err := ReadProc(cmd.Process.Pid); err == nil {
		res.ServerCPU = ps.CPUSeconds - before.CPUSeconds
	}
	// One more report: the heap figure after the last connection.
	if _, err := io.WriteString(stdin, "gc\n"); err != nil {
		return nil, err
	}
	var after ProcStats
	for {
		if after, err = afterReport(); err != nil {
			return nil, err
		}
		mu.Lock()
		collected := gcs > 0
		mu.Unlock()
		if collected {
			break
		}
	}
	mu.Lock()
	res.RSSAfter, res.HeapAfter, res.GoroutinesAfter, res.StackAfter = after.RSS, heap, gs, stack
	mu.Unlock()
	res.GoroutinesPerConn = float64(res.GoroutinesAfter-res.GoroutinesBefore) / float64(n)
	res.StackPerConn = float64(res.StackAfter-res.StackBefore) / float64(n)
	res.RSSPerConn = float64(res.RSSAfter-res.RSSBefore) / float64(n)
	res.HeapPerConn = float64(res.HeapAfter-res.HeapBefore) / float64(n)
	if echo.HeapProfile != "" {
		if _, err := fmt.Fprintf(stdin, "heap %s\n", echo.HeapProfile); err != nil {
			return nil, err
		}
		select {
		case e := <-profiled:
			if e != "ok" {
				return nil, fmt.Errorf("loadgen: raw server's heap profile: %s", e)
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if echo.Window > 0 && echo.Interval > 0 {
		if _, err := io.WriteString(stdin, "echo\n"); err != nil {
			return nil, err
		}
		if err := steadyEcho(ctx, res, cmd.Process.Pid, n, startEcho(), echo); err != nil {
			return nil, err
		}
	}
	return res, nil
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
