package webtransport

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	quicgo "github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	wt "github.com/quic-go/webtransport-go"

	fyquic "forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// BenchmarkIdleConnMemory measures the server-side cost of idle
// connections: Go heap (live, after GC) and process RSS per connection.
// The clients run in a child process (this test binary re-executed as
// TestIdleClientsHelper) so that only server memory is measured. Run with
// -benchtime=1x; FY_IDLE_N sets the connection count (default 1000).
//
//	quic-raw  quic-go listener, connections kept, nothing else
//	quic-backend  backends/quic Listener, BackendConns kept (no semantics.Conn)
//	quic-ours backends/quic Listener + semantics.NewConn per connection
//	wt-raw    webtransport-go server, sessions kept
//	wt-backend    backends/webtransport Listener, BackendConns kept
//	wt-ours   backends/webtransport Listener + semantics.NewConn
func BenchmarkIdleConnMemory(b *testing.B) {
	n := 1000
	if v, err := strconv.Atoi(os.Getenv("FY_IDLE_N")); err == nil && v > 0 {
		n = v
	}
	for _, mode := range []string{"quic-raw", "quic-backend", "quic-ours", "wt-raw", "wt-backend", "wt-ours"} {
		b.Run(mode, func(b *testing.B) {
			for range b.N {
				heap, stack, rss := idleMemory(b, mode, n)
				b.ReportMetric(heap/1024, "heap-KiB/conn")
				b.ReportMetric((heap+stack)/1024, "heap+stack-KiB/conn")
				b.ReportMetric(rss/1024, "rss-KiB/conn")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

type keeper struct {
	mu   sync.Mutex
	keep []any
}

func (k *keeper) add(v any) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.keep = append(k.keep, v)
	return len(k.keep)
}

func idleMemory(b *testing.B, mode string, n int) (heapPerConn, stackPerConn, rssPerConn float64) {
	pki := trusttest.NewPKI(b)
	stc := pki.ServerConfig(b, serverName)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	heap0, stack0, rss0 := memNow()
	var (
		k      keeper
		all    = make(chan struct{})
		addr   string
		closer func()
	)
	got := func(v any) {
		if k.add(v) == n {
			close(all)
		}
	}
	switch mode {
	case "quic-raw":
		tc := stc.Clone()
		tc.NextProtos = []string{fyquic.ALPN}
		ln, err := quicgo.ListenAddr("127.0.0.1:0", tc, &quicgo.Config{MaxIdleTimeout: time.Minute, KeepAlivePeriod: 15 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		addr, closer = ln.Addr().String(), func() { _ = ln.Close() }
		go func() {
			for {
				c, err := ln.Accept(ctx)
				if err != nil {
					return
				}
				got(c)
			}
		}()
	case "quic-ours", "quic-backend":
		ln, err := fyquic.Listen("127.0.0.1:0", stc, fyquic.Config{})
		if err != nil {
			b.Fatal(err)
		}
		addr, closer = ln.Addr().String(), func() { _ = ln.Close() }
		go acceptOurs(ctx, ln, got, mode == "quic-ours")
	case "wt-raw":
		udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			b.Fatal(err)
		}
		mux := http.NewServeMux()
		srv := &wt.Server{H3: &http3.Server{Handler: mux, TLSConfig: http3.ConfigureTLSConfig(stc)}}
		mux.HandleFunc(Path, func(w http.ResponseWriter, r *http.Request) {
			s, err := srv.Upgrade(w, r)
			if err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			got(s)
		})
		go func() { _ = srv.Serve(udp) }()
		addr, closer = udp.LocalAddr().String(), func() { _ = srv.Close(); _ = udp.Close() }
	case "wt-ours", "wt-backend":
		ln, err := Listen("127.0.0.1:0", stc, Config{})
		if err != nil {
			b.Fatal(err)
		}
		addr, closer = ln.Addr().String(), func() { _ = ln.Close() }
		go acceptOurs(ctx, ln, got, mode == "wt-ours")
	}
	defer closer()

	child := startClients(b, pki, mode, addr, n)
	select {
	case <-all:
	case <-time.After(2 * time.Minute):
		b.Fatalf("%s: only %d of %d connections accepted", mode, len(k.keep), n)
	}
	child.waitReady(b)
	heap1, stack1, rss1 := memNow()
	heapPerConn = float64(heap1-heap0) / float64(n)
	stackPerConn = float64(stack1-stack0) / float64(n)
	rssPerConn = float64(rss1-rss0) / float64(n)
	b.Logf("%s: %d connections: heap %+d KiB (%.1f KiB/conn), stacks %.1f KiB/conn, goroutines %d, RSS %+d KiB (%.1f KiB/conn)",
		mode, n, (heap1-heap0)/1024, heapPerConn/1024, stackPerConn/1024, runtime.NumGoroutine(), (rss1-rss0)/1024, rssPerConn/1024)
	child.stop()
	for _, v := range k.keep {
		switch c := v.(type) {
		case *quicgo.Conn:
			_ = c.CloseWithError(0, "")
		case *wt.Session:
			_ = c.CloseWithError(0, "")
		case *semantics.Conn:
			_ = c.CloseWithCode(wire.CloseNormal, "")
		case semantics.BackendConn:
			_ = c.CloseWithCode(wire.CloseNormal, "")
		}
	}
	return heapPerConn, stackPerConn, rssPerConn
}

func acceptOurs(ctx context.Context, ln semantics.BackendListener, got func(any), wrap bool) {
	for {
		bc, err := ln.Accept(ctx)
		if err != nil {
			return
		}
		if !wrap {
			got(bc)
			continue
		}
		c, err := semantics.NewConn(bc, semantics.Config{})
		if err != nil {
			_ = bc.CloseWithCode(wire.CloseInternalError, "")
			continue
		}
		got(c)
	}
}

// memNow returns the live Go heap and goroutine stacks after two GCs and
// the process RSS.
func memNow() (heap, stack, rss int64) {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc), int64(ms.StackInuse), vmRSS()
}

func vmRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb * 1024
		}
	}
	return 0
}

type clients struct {
	cmd   *exec.Cmd
	out   *bufio.Reader
	stdin interface{ Close() error }
}

func startClients(b *testing.B, pki *trusttest.PKI, mode, addr string, n int) *clients {
	cert := pki.IssueClient(b, wire.NewRunnerId(), trusttest.LeafOptions{})
	key, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		b.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})
	cmd := exec.Command(os.Args[0], "-test.run=^TestIdleClientsHelper$", "-test.bench=^$")
	cmd.Env = append(os.Environ(),
		"FY_IDLE_ADDR="+addr, "FY_IDLE_MODE="+mode, "FY_IDLE_N="+strconv.Itoa(n),
		"FY_IDLE_CA="+string(pki.CACertPEM()), "FY_IDLE_CERT="+string(certPEM), "FY_IDLE_KEY="+string(keyPEM))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	c := &clients{cmd: cmd, out: bufio.NewReader(stdout), stdin: stdin}
	b.Cleanup(c.stop)
	return c
}

func (c *clients) waitReady(b *testing.B) {
	for {
		line, err := c.out.ReadString('\n')
		if err != nil {
			b.Fatalf("client process: %v", err)
		}
		if strings.HasPrefix(line, "READY") {
			return
		}
		if strings.HasPrefix(line, "FAIL") {
			b.Fatalf("client process: %s", line)
		}
	}
}

func (c *clients) stop() {
	if c.stdin != nil {
		_ = c.stdin.Close() // the child exits on stdin EOF
		_ = c.cmd.Wait()
		c.stdin = nil
	}
}

// TestIdleClientsHelper is the client process of BenchmarkIdleConnMemory
// (not a test; it skips unless started by the benchmark). It dials
// FY_IDLE_N connections sharing one UDP socket, prints READY, and holds
// them until stdin closes.
func TestIdleClientsHelper(t *testing.T) {
	addr := os.Getenv("FY_IDLE_ADDR")
	if addr == "" {
		t.Skip("client process for BenchmarkIdleConnMemory; runs only when started by it")
	}
	mode := os.Getenv("FY_IDLE_MODE")
	n, _ := strconv.Atoi(os.Getenv("FY_IDLE_N"))
	fail := func(err error) {
		fmt.Println("FAIL", err)
		os.Exit(1)
	}
	cert, err := tls.X509KeyPair([]byte(os.Getenv("FY_IDLE_CERT")), []byte(os.Getenv("FY_IDLE_KEY")))
	if err != nil {
		fail(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(os.Getenv("FY_IDLE_CA")))
	tc := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: serverName, Certificates: []tls.Certificate{cert}}
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		fail(err)
	}
	tr := &quicgo.Transport{Conn: udp}
	ua, _ := net.ResolveUDPAddr("udp", addr)
	qconf := &quicgo.Config{MaxIdleTimeout: time.Minute, KeepAlivePeriod: 15 * time.Second,
		EnableDatagrams: true, EnableStreamResetPartialDelivery: true}
	ctx := context.Background()
	keep := make([]any, 0, n)
	sem := make(chan struct{}, 16)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var firstErr error
	for range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var v any
			var err error
			if strings.HasPrefix(mode, "quic") {
				c := tc.Clone()
				c.NextProtos = []string{fyquic.ALPN}
				v, err = tr.Dial(ctx, ua, c, qconf)
			} else {
				wtr := &wt.Transport{TLSClientConfig: tc, QUICConfig: qconf, ApplicationProtocols: []string{ApplicationProtocol},
					DialAddr: func(ctx context.Context, _ string, tlsCfg *tls.Config, cfg *quicgo.Config) (*quicgo.Conn, error) {
						return tr.Dial(ctx, ua, tlsCfg, cfg)
					}}
				var rsp *http.Response
				rsp, v, err = wtr.Dial(ctx, URL(addr), nil)
				if err == nil && rsp.StatusCode != http.StatusOK {
					err = fmt.Errorf("HTTP %d", rsp.StatusCode)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			keep = append(keep, v)
		}()
	}
	wg.Wait()
	if firstErr != nil {
		fail(firstErr)
	}
	fmt.Println("READY", len(keep))
	buf := make([]byte, 1)
	_, _ = os.Stdin.Read(buf) // until the parent closes stdin
	os.Exit(0)
}
