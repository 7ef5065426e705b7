package wanbench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	quicraw "forgeyard.dev/transport/backends/quic/wanraw"
	"forgeyard.dev/transport/backends/webtransport"
	"forgeyard.dev/transport/backends/yamux"
	yamuxraw "forgeyard.dev/transport/backends/yamux/wanraw"
	"forgeyard.dev/transport/internal/stats"
	"forgeyard.dev/transport/internal/tools/netsim"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

const serverName = "localhost"

// path is one emulated WAN path.
type path struct {
	rtt  time.Duration
	loss float64 // probability per packet (UDP) / segment (TCP), each way
}

func (p path) String() string {
	return fmt.Sprintf("%d ms / %g %%", p.rtt.Milliseconds(), p.loss*100)
}

// queue is the bottleneck buffer: one BDP, at least 10 ms.
func (p path) queue() time.Duration { return max(p.rtt, 10*time.Millisecond) }

// impairment is one direction of p at bw bytes/s.
func (p path) impairment(bw int64) netsim.Impairment {
	return netsim.Impairment{Latency: p.rtt / 2, Bandwidth: bw, Loss: p.loss, Queue: p.queue()}
}

// proxyReadBuffer is the TCP proxy's SO_RCVBUF: small, so that bytes a
// sender pushes ahead into the proxy's kernel buffer (a queue the
// emulation does not control) stay below a millisecond or two of the path.
const proxyReadBuffer = 16 << 10

// env is what every cell shares.
type env struct {
	pki     *trusttest.PKI
	bw      int64
	measure time.Duration
	warm    time.Duration // before measuring under bulk, plus 10 RTTs (0: 1 s)
}

// proxy puts the emulated path p in front of target ("udp" or "tcp").
func (e *env) proxy(tb testing.TB, network, target string, p path) string {
	tb.Helper()
	imp := p.impairment(e.bw)
	opts := netsim.Options{Up: imp, Down: imp, Seed: uint64(p.rtt.Milliseconds()*1000) + uint64(p.loss*1e4) + 1,
		TCPReadBuffer: proxyReadBuffer, QueuePackets: 1 << 16}
	var addr string
	var closer io.Closer
	switch network {
	case "udp":
		px, err := netsim.NewUDPProxy(target, opts)
		if err != nil {
			tb.Fatal(err)
		}
		addr, closer = px.Addr(), px
	default:
		px, err := netsim.NewTCPProxy(target, opts)
		if err != nil {
			tb.Fatal(err)
		}
		addr, closer = px.Addr(), px
	}
	tb.Cleanup(func() { _ = closer.Close() })
	return addr
}

// opener opens streams of one connection (client side) or accepts them
// (server side). kind matters only to our semantics connections.
type opener interface {
	open(ctx context.Context, kind semantics.StreamKind) (io.ReadWriteCloser, error)
	accept(ctx context.Context) (io.ReadWriteCloser, error)
	close()
}

// pair is one client ↔ server connection over the path.
type pair struct {
	client, server opener
	connect        time.Duration // dial + first stream round trip
}

// impl is a raw library or one of our backends.
type impl struct {
	name string
	// dial makes a pair over path p.
	dial func(tb testing.TB, e *env, p path) *pair
	// ours: semantics connections (for CAS and register).
	ours *oursImpl
}

// --- raw libraries -------------------------------------------------------

type rawConn interface {
	OpenStream(ctx context.Context) (io.ReadWriteCloser, error)
	AcceptStream(ctx context.Context) (io.ReadWriteCloser, error)
	Close() error
}

type rawOpener struct{ c rawConn }

func (r rawOpener) open(ctx context.Context, _ semantics.StreamKind) (io.ReadWriteCloser, error) {
	s, err := r.c.OpenStream(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := s.Write([]byte{1}); err != nil { // make it visible to the peer
		return nil, err
	}
	return s, nil
}

func (r rawOpener) accept(ctx context.Context) (io.ReadWriteCloser, error) {
	s, err := r.c.AcceptStream(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(s, make([]byte, 1)); err != nil {
		return nil, err
	}
	return s, nil
}

func (r rawOpener) close() { _ = r.c.Close() }

// rawPair listens with listen, puts the path in front and dials.
func rawPair[C rawConn](tb testing.TB, e *env, p path, network string,
	listen func() (addr string, accept func(context.Context) (C, error), stop func()),
	dial func(ctx context.Context, addr string) (C, error)) *pair {
	tb.Helper()
	addr, accept, stop := listen()
	tb.Cleanup(stop)
	via := e.proxy(tb, network, addr, p)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	acc := make(chan C, 1)
	go func() {
		c, err := accept(ctx)
		if err != nil {
			tb.Error(err)
		}
		acc <- c
	}()
	t0 := time.Now()
	c, err := dial(ctx, via)
	if err != nil {
		tb.Fatal(err)
	}
	s := <-acc
	if tb.Failed() {
		tb.FailNow()
	}
	pr := &pair{client: rawOpener{c}, server: rawOpener{s}}
	tb.Cleanup(func() { pr.client.close(); pr.server.close() })
	pr.connect = firstRoundTrip(tb, pr, t0)
	return pr
}

// firstRoundTrip opens a stream, has it echoed once and returns the time
// since t0.
func firstRoundTrip(tb testing.TB, pr *pair, t0 time.Time) time.Duration {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		s, err := pr.server.accept(ctx)
		if err != nil {
			done <- err
			return
		}
		b := make([]byte, 64)
		if _, err := io.ReadFull(s, b); err != nil {
			done <- err
			return
		}
		_, err = s.Write(b)
		done <- err
	}()
	s, err := pr.client.open(ctx, wire.StreamDiagnostic)
	if err != nil {
		tb.Fatal(err)
	}
	b := make([]byte, 64)
	if _, err := s.Write(b); err != nil {
		tb.Fatal(err)
	}
	if _, err := io.ReadFull(s, b); err != nil {
		tb.Fatal(err)
	}
	d := time.Since(t0)
	if err := <-done; err != nil {
		tb.Fatal(err)
	}
	_ = s.Close()
	return d
}

var rawQUIC = impl{name: "raw quic-go", dial: func(tb testing.TB, e *env, p path) *pair {
	return rawPair(tb, e, p, "udp", func() (string, func(context.Context) (*quicraw.Conn, error), func()) {
		ln, err := quicraw.Listen("127.0.0.1:0", e.pki.ServerConfig(tb, serverName))
		if err != nil {
			tb.Fatal(err)
		}
		return ln.Addr().String(), ln.Accept, func() { _ = ln.Close() }
	}, func() func(ctx context.Context, addr string) (*quicraw.Conn, error) {
		conf := e.pki.ClientConfig(tb, wire.NewRunnerId(), serverName) // issued before the clock starts
		return func(ctx context.Context, addr string) (*quicraw.Conn, error) { return quicraw.Dial(ctx, addr, conf) }
	}())
}}

var rawYamux = impl{name: "raw TLS+yamux", dial: func(tb testing.TB, e *env, p path) *pair {
	return rawPair(tb, e, p, "tcp", func() (string, func(context.Context) (*yamuxraw.Conn, error), func()) {
		ln, err := yamuxraw.Listen("127.0.0.1:0", e.pki.ServerConfig(tb, serverName))
		if err != nil {
			tb.Fatal(err)
		}
		return ln.Addr().String(), ln.Accept, func() { _ = ln.Close() }
	}, func() func(ctx context.Context, addr string) (*yamuxraw.Conn, error) {
		conf := e.pki.ClientConfig(tb, wire.NewRunnerId(), serverName) // issued before the clock starts
		return func(ctx context.Context, addr string) (*yamuxraw.Conn, error) { return yamuxraw.Dial(ctx, addr, conf) }
	}())
}}

// TLS over plain TCP: every "stream" is its own TLS connection through
// the same emulated path (they share its bottleneck), so control traffic
// never waits behind bulk bytes of the same connection — the best a
// TCP-based transport can do on this path.
type tlsTCP struct {
	ln      net.Listener
	addr    string // via the proxy
	sconf   *tls.Config
	cconf   *tls.Config
	mu      sync.Mutex
	clients []net.Conn
}

type tlsTCPClient struct{ t *tlsTCP }
type tlsTCPServer struct{ t *tlsTCP }

func (c tlsTCPClient) OpenStream(ctx context.Context) (io.ReadWriteCloser, error) {
	d := tls.Dialer{Config: c.t.cconf}
	nc, err := d.DialContext(ctx, "tcp", c.t.addr)
	if err != nil {
		return nil, err
	}
	c.t.mu.Lock()
	c.t.clients = append(c.t.clients, nc)
	c.t.mu.Unlock()
	return halfCloser{nc.(*tls.Conn)}, nil
}

func (c tlsTCPClient) AcceptStream(context.Context) (io.ReadWriteCloser, error) {
	return nil, errors.New("tls/tcp: the client accepts nothing")
}

func (c tlsTCPClient) Close() error {
	c.t.mu.Lock()
	defer c.t.mu.Unlock()
	for _, nc := range c.t.clients {
		_ = nc.Close()
	}
	return nil
}

func (s tlsTCPServer) OpenStream(context.Context) (io.ReadWriteCloser, error) {
	return nil, errors.New("tls/tcp: the server opens nothing")
}

func (s tlsTCPServer) AcceptStream(ctx context.Context) (io.ReadWriteCloser, error) {
	nc, err := s.t.ln.Accept()
	if err != nil {
		return nil, err
	}
	tc := tls.Server(nc, s.t.sconf)
	if err := tc.HandshakeContext(ctx); err != nil {
		nc.Close()
		return nil, err
	}
	s.t.mu.Lock()
	s.t.clients = append(s.t.clients, tc)
	s.t.mu.Unlock()
	return halfCloser{tc}, nil
}

func (s tlsTCPServer) Close() error { return s.t.ln.Close() }

// halfCloser makes Close end the write side only, like a QUIC stream.
type halfCloser struct{ *tls.Conn }

func (h halfCloser) Close() error { return h.CloseWrite() }

var rawTLSTCP = impl{name: "raw TLS/TCP", dial: func(tb testing.TB, e *env, p path) *pair {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	t := &tlsTCP{ln: ln, sconf: e.pki.ServerConfig(tb, serverName), cconf: e.pki.ClientConfig(tb, wire.NewRunnerId(), serverName)}
	t.addr = e.proxy(tb, "tcp", ln.Addr().String(), p)
	pr := &pair{client: rawOpener{tlsTCPClient{t}}, server: rawOpener{tlsTCPServer{t}}}
	tb.Cleanup(func() { pr.client.close(); pr.server.close() })
	pr.connect = firstRoundTrip(tb, pr, time.Now())
	return pr
}}

// --- ours ------------------------------------------------------------------

// oursImpl is one of our backends, direct or through a relay.
type oursImpl struct {
	backend string // quic, webtransport, yamux
	relay   bool
	quic    quic.Config // for the quic backend (variants)
}

type oursOpener struct{ c *semantics.Conn }

func (o oursOpener) open(ctx context.Context, kind semantics.StreamKind) (io.ReadWriteCloser, error) {
	return o.c.OpenStream(ctx, kind)
}

func (o oursOpener) accept(ctx context.Context) (io.ReadWriteCloser, error) {
	return o.c.AcceptStream(ctx)
}

func (o oursOpener) close() { _ = o.c.CloseWithCode(wire.CloseNormal, "") }

// semConfig allows the benchmark's four CAS streams and a diagnostic one.
func semConfig() semantics.Config {
	var lim semantics.Limits
	lim.MaxStreamsPerKind[wire.StreamCasDownload] = 8
	lim.MaxStreamsPerKind[wire.StreamCasUpload] = 8
	return semantics.Config{Limits: lim}
}

// listenOurs starts a listener of backend on loopback; the address is what
// a dialer of that backend takes (a URL for WebTransport).
func listenOurs(tb testing.TB, backend string, conf *tls.Config, qcfg quic.Config) (semantics.BackendListener, string, string) {
	tb.Helper()
	var ln semantics.BackendListener
	var err error
	network := "udp"
	switch backend {
	case "quic":
		ln, err = quic.Listen("127.0.0.1:0", conf, qcfg)
	case "webtransport":
		ln, err = webtransport.Listen("127.0.0.1:0", conf, webtransport.Config{})
	case "yamux":
		ln, err = yamux.Listen("127.0.0.1:0", conf, yamux.Config{})
		network = "tcp"
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = ln.Close() })
	return ln, ln.Addr().String(), network
}

func dialerOf(backend string, conf *tls.Config, qcfg quic.Config) semantics.BackendDialer {
	switch backend {
	case "quic":
		return quic.Dialer{TLS: conf, Config: qcfg}
	case "webtransport":
		return webtransport.Dialer{TLS: conf}
	default:
		return yamux.Dialer{TLS: conf}
	}
}

func dialAddr(backend, hostport string) string {
	if backend == "webtransport" {
		return webtransport.URL(hostport)
	}
	return hostport
}

// backendPair returns the agent-side and daemon-side BackendConns over the
// path (through a relay when o.relay) and the dial time.
func (o *oursImpl) backendPair(tb testing.TB, e *env, p path) (agent, daemon semantics.BackendConn, dialed time.Duration, t0 time.Time) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var dl semantics.BackendListener
	var target, network string
	if o.relay {
		dl, target, network = e.startRelay(tb, o.backend)
	} else {
		dl, target, network = listenOurs(tb, o.backend, e.pki.ServerConfig(tb, serverName), o.quic)
	}
	via := e.proxy(tb, network, target, p)
	acc := make(chan semantics.BackendConn, 1)
	go func() {
		c, err := dl.Accept(ctx)
		if err != nil {
			tb.Error(err)
		}
		acc <- c
	}()
	dialer := dialerOf(o.backend, e.pki.ClientConfig(tb, wire.NewRunnerId(), serverName), o.quic)
	t0 = time.Now()
	a, err := dialer.Dial(ctx, dialAddr(o.backend, via))
	if err != nil {
		tb.Fatal(err)
	}
	dialed = time.Since(t0)
	tb.Cleanup(func() { _ = a.CloseWithCode(wire.CloseNormal, "") })
	d := <-acc
	if d == nil {
		tb.FailNow()
	}
	tb.Cleanup(func() { _ = d.CloseWithCode(wire.CloseNormal, "") })
	return a, d, dialed, t0
}

func (o *oursImpl) dial(tb testing.TB, e *env, p path) *pair {
	a, d, _, t0 := o.backendPair(tb, e, p)
	ac, err := semantics.NewConn(a, semConfig())
	if err != nil {
		tb.Fatal(err)
	}
	dc, err := semantics.NewConn(d, semConfig())
	if err != nil {
		tb.Fatal(err)
	}
	pr := &pair{client: oursOpener{ac}, server: oursOpener{dc}}
	tb.Cleanup(func() { pr.client.close(); pr.server.close() })
	pr.connect = firstRoundTrip(tb, pr, t0)
	return pr
}

func oursNamed(backend string, relay bool, variant string) impl {
	o := &oursImpl{backend: backend, relay: relay}
	name := backend
	if relay {
		name = "relay+" + backend
	}
	switch variant {
	case "":
	case "hint": // the DelayHint on every path (default: only ≤ 5 ms)
		o.quic.DelayHintMaxRTT = time.Hour
		name += " delay-hint"
	case "wan": // long-path windows: 4 MiB per stream, 8 MiB per connection
		o.quic.StreamReceiveWindow, o.quic.ConnectionReceiveWindow = 4<<20, 8<<20
		name += " 4M/8M-windows"
	default:
		panic("FY_WAN_VARIANTS: unknown variant " + variant)
	}
	return impl{name: name, dial: o.dial, ours: o}
}

// --- measurements ----------------------------------------------------------

// pings does 64-byte round trips on ctl (echoed by the peer) until n are
// done and at least d passed (at most 20n), and returns them sorted.
func pings(tb testing.TB, ctl io.ReadWriter, n int, d time.Duration) []time.Duration {
	tb.Helper()
	msg := make([]byte, 64)
	out := make([]time.Duration, 0, n)
	begin := time.Now()
	for i := 0; i < n || (i < 20*n && time.Since(begin) < d); i++ {
		t0 := time.Now()
		if _, err := ctl.Write(msg); err != nil {
			tb.Fatalf("ping %d: %v", i, err)
		}
		if _, err := io.ReadFull(ctl, msg); err != nil {
			tb.Fatalf("pong %d: %v", i, err)
		}
		out = append(out, time.Since(t0))
	}
	slices.Sort(out)
	return out
}

// controlStream opens a control stream from the client and echoes on the
// server.
func controlStream(tb testing.TB, pr *pair, bg *sync.WaitGroup) io.ReadWriteCloser {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	acc := make(chan io.ReadWriteCloser, 1)
	go func() {
		s, err := pr.server.accept(ctx)
		if err != nil {
			tb.Error(err)
		}
		acc <- s
	}()
	ctl, err := pr.client.open(ctx, wire.StreamControl)
	if err != nil {
		tb.Fatal(err)
	}
	// Semantics streams become visible with their header; raw ones with
	// the opener's byte. One round trip makes sure the echo runs.
	peer := <-acc
	if peer == nil {
		tb.FailNow()
	}
	bg.Add(1)
	go func() {
		defer bg.Done()
		_, _ = io.Copy(peer, peer)
	}()
	pings(tb, ctl, 1, 0)
	return ctl
}

// bulkRun is n daemon → agent streams written as fast as the sender
// allows until stop.
type bulkRun struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	received atomic.Int64
}

func startBulk(tb testing.TB, pr *pair, n int) *bulkRun {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	br := &bulkRun{stop: make(chan struct{})}
	for range n {
		acc := make(chan io.ReadWriteCloser, 1)
		go func() {
			s, err := pr.server.accept(ctx)
			if err != nil {
				tb.Error(err)
			}
			acc <- s
		}()
		r, err := pr.client.open(ctx, wire.StreamCasDownload)
		if err != nil {
			tb.Fatal(err)
		}
		w := <-acc
		if w == nil {
			tb.FailNow()
		}
		br.wg.Add(2)
		go func() { // the agent reads
			defer br.wg.Done()
			buf := make([]byte, 64<<10)
			for {
				m, err := r.Read(buf)
				br.received.Add(int64(m))
				if err != nil {
					return
				}
			}
		}()
		go func() { // the daemon writes
			defer br.wg.Done()
			chunk := make([]byte, 64<<10)
			for {
				select {
				case <-br.stop:
					_ = w.Close()
					return
				default:
				}
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		}()
	}
	return br
}

// phase is one measured interval.
type phase struct {
	p50, p99 time.Duration
	mbps     float64 // bulk goodput during the pings (MB/s)
	samples  int
}

// underBulk measures control round trips while n bulk streams run, after a
// warm-up long enough for slow start and window growth.
func (e *env) underBulk(tb testing.TB, im impl, p path, n int) phase {
	pr := im.dial(tb, e, p)
	var bg sync.WaitGroup
	ctl := controlStream(tb, pr, &bg)
	br := startBulk(tb, pr, n)
	wt := e.warm
	if wt == 0 {
		wt = time.Second
	}
	warm := time.NewTimer(wt + 10*p.rtt)
	<-warm.C // a fixed warm-up: no event marks "the path is full"
	r0, t0 := br.received.Load(), time.Now()
	rtts := pings(tb, ctl, 10, e.measure)
	el := time.Since(t0)
	r1 := br.received.Load()
	close(br.stop)
	pr.client.close()
	pr.server.close()
	br.wg.Wait()
	bg.Wait()
	return phase{p50: stats.Percentile(rtts, 50), p99: stats.Percentile(rtts, 99), mbps: float64(r1-r0) / el.Seconds() / 1e6, samples: len(rtts)}
}

// result is one implementation on one path.
type result struct {
	name         string
	connect      time.Duration
	idle         phase
	bulk1, bulk4 phase
	cas, logs    float64 // MB/s; 0 for raw
	register     time.Duration
}

func (e *env) run(tb testing.TB, im impl, p path, casSize int) result {
	res := result{name: im.name}
	pr := im.dial(tb, e, p)
	res.connect = pr.connect
	var bg sync.WaitGroup
	ctl := controlStream(tb, pr, &bg)
	idle := pings(tb, ctl, 10, min(e.measure, time.Second))
	res.idle = phase{p50: stats.Percentile(idle, 50), p99: stats.Percentile(idle, 99), samples: len(idle)}
	pr.client.close()
	pr.server.close()
	bg.Wait()
	res.bulk1 = e.underBulk(tb, im, p, 1)
	res.bulk4 = e.underBulk(tb, im, p, 4)
	if im.ours != nil {
		res.cas = e.casUpload(tb, im.ours, p, casSize)
		res.logs = e.logUpload(tb, im.ours, p, casSize)
		res.register = e.register(tb, im.ours, p)
	}
	return res
}

// --- the benchmark ---------------------------------------------------------

func envDuration(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func paths(tb testing.TB) []path {
	spec := os.Getenv("FY_WAN_PATHS")
	if spec == "" {
		spec = "0/0,0/0.5,10/0,10/0.5,50/0,50/0.5,100/0,100/0.5"
	}
	var out []path
	for _, f := range strings.Split(spec, ",") {
		r, l, ok := strings.Cut(strings.TrimSpace(f), "/")
		ms, err1 := strconv.Atoi(r)
		loss, err2 := strconv.ParseFloat(l, 64)
		if !ok || err1 != nil || err2 != nil || ms < 0 || loss < 0 || loss >= 100 {
			tb.Fatalf("FY_WAN_PATHS: %q is not RTT-ms/loss-%% (e.g. 50/0.5)", f)
		}
		out = append(out, path{rtt: time.Duration(ms) * time.Millisecond, loss: loss / 100})
	}
	return out
}

// rows are the table's rows: each backend beside its raw library.
type row struct {
	backend string
	relay   bool
	raw     *impl
	variant string
}

var rows = []row{
	{"quic", false, &rawQUIC, ""},
	{"webtransport", false, &rawQUIC, ""},
	{"yamux", false, &rawYamux, ""},
	{"yamux", true, &rawYamux, ""},
	{"webtransport", true, &rawQUIC, ""},
}

// BenchmarkWAN runs the whole matrix once (use -benchtime 1x).
func BenchmarkWAN(b *testing.B) {
	e := &env{pki: trusttest.NewPKI(b), bw: 50_000_000 / 8, measure: envDuration("FY_WAN_MEASURE", 2*time.Second)}
	if v, err := strconv.Atoi(os.Getenv("FY_WAN_MBIT")); err == nil && v > 0 {
		e.bw = int64(v) * 1_000_000 / 8
	}
	want := map[string]bool{}
	for _, n := range strings.Split(os.Getenv("FY_WAN_BACKENDS"), ",") {
		if n = strings.TrimSpace(n); n != "" {
			want[n] = true
		}
	}
	rows := rows
	for _, v := range strings.Split(os.Getenv("FY_WAN_VARIANTS"), ",") { // e.g. "wan,hint": extra quic rows
		if v = strings.TrimSpace(v); v != "" {
			rows = append(rows, row{"quic", false, &rawQUIC, v})
		}
	}
	// One unmeasured connection per library first, so that one-time costs
	// (package initialisation, first TLS handshake) are in no cell.
	b.Run("warm-up", func(b *testing.B) {
		for _, im := range []impl{rawQUIC, rawYamux, oursNamed("quic", false, ""), oursNamed("webtransport", false, ""), oursNamed("yamux", false, "")} {
			im.dial(b, e, path{})
		}
	})
	start := time.Now()
	var tables []cellTable
	for range b.N {
		tables = tables[:0]
		for _, p := range paths(b) {
			t := cellTable{path: p, raws: map[string]result{}}
			need := map[string]*impl{"raw TLS/TCP": &rawTLSTCP}
			for _, r := range rows {
				n := oursNamed(r.backend, r.relay, r.variant).name
				if len(want) == 0 || want[n] || (r.variant != "" && want[r.backend]) {
					need[r.raw.name] = r.raw
				}
			}
			for _, name := range []string{"raw quic-go", "raw TLS+yamux", "raw TLS/TCP"} {
				if im := need[name]; im != nil {
					b.Run(fmt.Sprintf("rtt=%dms/loss=%g/%s", p.rtt.Milliseconds(), p.loss*100, strings.ReplaceAll(name, " ", "-")), func(b *testing.B) {
						t.raws[name] = e.run(b, *im, p, 0)
					})
				}
			}
			for _, r := range rows {
				im := oursNamed(r.backend, r.relay, r.variant)
				if len(want) > 0 && !want[im.name] && (r.variant == "" || !want[r.backend]) {
					continue
				}
				raw := t.raws[r.raw.name]
				casSize := int(min(max(raw.bulk1.mbps*1e6*2, 1<<20), 8<<20))
				b.Run(fmt.Sprintf("rtt=%dms/loss=%g/%s", p.rtt.Milliseconds(), p.loss*100, im.name), func(b *testing.B) {
					res := e.run(b, im, p, casSize)
					t.ours = append(t.ours, oursRow{res: res, raw: r.raw.name})
				})
			}
			tables = append(tables, t)
		}
	}
	elapsed := time.Since(start)
	out := render(tables, e, elapsed)
	fmt.Print(out)
	if f := os.Getenv("FY_WAN_OUT"); f != "" {
		if err := os.WriteFile(f, []byte(out), 0o644); err != nil {
			b.Error(err)
		}
	}
	b.ReportMetric(elapsed.Seconds(), "matrix-s")
	b.ReportMetric(0, "ns/op")
}
