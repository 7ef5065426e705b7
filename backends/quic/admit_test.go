package quic

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// crash makes l's process "die": its socket closes under quic-go, so its
// connections end without a CONNECTION_CLOSE reaching the peer.
func crash(l *Listener) { _ = l.ep.udp.Close() }

// A restarted listener with the same StatelessResetKey resets the previous
// process's connections at their next packet: the client learns in one
// round trip what it would otherwise learn at its idle timeout (1 minute
// here, longer than the test waits).
func TestStatelessResetAfterRestart(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "server.key")
	if err := os.WriteFile(keyFile, []byte("-----BEGIN PRIVATE KEY-----\nnot really\n-----END PRIVATE KEY-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	key, err := ResetKey(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := ResetKey(keyFile)
	if *again != *key {
		t.Fatal("ResetKey is not deterministic")
	}
	cfg := Config{KeepAlivePeriod: -1, MaxIdleTimeout: time.Minute, StatelessResetKey: key}
	e := newTenv(t, cfg)
	addr := e.ln.Addr().String()
	c, _ := e.dial(t, Config{KeepAlivePeriod: -1, MaxIdleTimeout: time.Minute})
	crash(e.ln)
	ln2, err := Listen(addr, e.pki.ServerConfig(t, serverName), cfg)
	if err != nil {
		t.Fatalf("restart on %s: %v", addr, err)
	}
	defer ln2.Close()
	start := time.Now()
	// The client's next packet is answered with a stateless reset.
	if s, err := c.OpenStream(context.Background()); err == nil {
		_, _ = s.Write([]byte("hello after the restart"))
	}
	select {
	case <-c.Context().Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the restarted server did not reset the old connection")
	}
	cause := context.Cause(c.Context())
	if ce := ConnErrorOf(cause); ce == nil || ce.Code != wire.CloseShutdown || !ce.Remote || !strings.Contains(ce.Reason, "stateless reset") {
		t.Fatalf("old connection ended with %v, want the translated stateless reset (remote Shutdown)", cause)
	}
	t.Logf("reset %v after the client's first packet to the restarted server", time.Since(start).Round(time.Millisecond))
}

// Connections waiting for Accept count against MaxHandshakes: beyond it a
// new attempt is refused before its handshake (CloseOverloaded at the
// dialer, reason overloaded at the hook), and a slot frees once Accept
// takes a connection.
func TestMaxHandshakesRefusesBeforeHandshake(t *testing.T) {
	var mu sync.Mutex
	var reports []semantics.HandshakeFailure
	cfg := testConfig
	cfg.MaxHandshakes = 2
	cfg.HandshakeTimeout = time.Second // a half-open handshake holds its slot ≤ 0.5 s (below)
	cfg.OnHandshakeFailure = func(f semantics.HandshakeFailure) {
		mu.Lock()
		reports = append(reports, f)
		mu.Unlock()
	}
	e := newTenv(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dial := func() (semantics.BackendConn, error) {
		return Dialer{TLS: e.pki.ClientConfig(t, wire.NewRunnerId(), serverName), Config: testConfig}.Dial(ctx, e.ln.Addr().String())
	}
	for i := range 2 { // complete, waiting in the accept queue
		c, err := dial()
		if err != nil {
			t.Fatalf("dial %d within the cap: %v", i, err)
		}
		defer c.CloseWithCode(wire.CloseNormal, "")
	}
	_, err := dial()
	var ce *semantics.ConnError
	if !errors.As(err, &ce) || ce.Code != wire.CloseOverloaded {
		t.Fatalf("dial beyond MaxHandshakes: %v, want ConnError Overloaded", err)
	}
	mu.Lock()
	// One report per refused Initial: a client that retransmits its
	// first packet is refused (and counted) again.
	if len(reports) == 0 {
		t.Fatal("the refusal was not reported")
	}
	for _, f := range reports {
		if f.Reason != semantics.HandshakeOverloaded || f.Backend != "quic" || !errors.Is(f.Err, errTooManyHandshakes) {
			t.Fatalf("report %+v, want overloaded: too many handshakes", f)
		}
	}
	mu.Unlock()
	s, err := e.ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.CloseWithCode(wire.CloseNormal, "")
	// A retransmitted first packet of the refused attempt can still be in
	// flight: refused while the cap is full, but if it arrives after
	// Accept freed the slot it is admitted, and that half-open handshake
	// (its client gave up) holds the slot until the server's handshake
	// idle timeout (HandshakeTimeout/2) ends it. So the new dial must get
	// through within a few handshake timeouts, not at once (under -race on
	// a loaded machine a retransmission was seen to take the slot in 5%
	// of runs). Each try is a real dial.
	var c semantics.BackendConn
	deadline := time.Now().Add(3 * cfg.HandshakeTimeout)
	for {
		if c, err = dial(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dial after Accept freed a slot, still refused after %v: %v", 3*cfg.HandshakeTimeout, err)
		}
		time.Sleep(50 * time.Millisecond) // a refused dial returns at once; pace the retries
	}
	defer c.CloseWithCode(wire.CloseNormal, "")
}

// Config.Admit refuses an attempt before its handshake, with its error
// in the report.
func TestAdmitHookRefuses(t *testing.T) {
	refusal := errors.New("connection cap reached")
	got := make(chan semantics.HandshakeFailure, 1)
	cfg := testConfig
	cfg.Admit = func(net.Addr) error { return refusal }
	cfg.OnHandshakeFailure = func(f semantics.HandshakeFailure) { got <- f }
	e := newTenv(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := Dialer{TLS: e.pki.ClientConfig(t, wire.NewRunnerId(), serverName), Config: testConfig}.Dial(ctx, e.ln.Addr().String())
	var ce *semantics.ConnError
	if !errors.As(err, &ce) || ce.Code != wire.CloseOverloaded || !ce.Remote {
		t.Fatalf("dial refused by Admit: %v, want remote ConnError Overloaded", err)
	}
	f := <-got
	if f.Reason != semantics.HandshakeOverloaded || !errors.Is(f.Err, refusal) {
		t.Fatalf("report %+v, want overloaded with the Admit error", f)
	}
}

// With Config.RefusalBackoff a dial refused at MaxHandshakes is not failed:
// it waits and tries again within the same Dial, and completes once
// Accept freed a slot (the listener reported at least one refusal).
func TestRefusalBackoffPacesDial(t *testing.T) {
	var refused atomic.Int64
	cfg := testConfig
	cfg.MaxHandshakes = 1
	cfg.OnHandshakeFailure = func(f semantics.HandshakeFailure) {
		if f.Reason == semantics.HandshakeOverloaded {
			refused.Add(1)
		}
	}
	e := newTenv(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	client := e.pki.ClientConfig(t, wire.NewRunnerId(), serverName)
	first, err := Dialer{TLS: client, Config: testConfig}.Dial(ctx, e.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer first.CloseWithCode(wire.CloseNormal, "")
	paced := testConfig
	paced.RefusalBackoff = 20 * time.Millisecond
	paced.HandshakeTimeout = 15 * time.Second
	type result struct {
		c   semantics.BackendConn
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := Dialer{TLS: client, Config: paced}.Dial(ctx, e.ln.Addr().String())
		done <- result{c, err}
	}()
	// Free the slot only once the paced dial was refused at least once.
	for refused.Load() == 0 {
		select {
		case r := <-done:
			t.Fatalf("paced dial ended before any refusal: %v", r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	s, err := e.ln.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.CloseWithCode(wire.CloseNormal, "")
	r := <-done
	if r.err != nil {
		t.Fatalf("paced dial failed after the slot was freed: %v", r.err)
	}
	defer r.c.CloseWithCode(wire.CloseNormal, "")
}

// The refusal waits double from RefusalBackoff up to MaxRefusalBackoff,
// each uniform in its upper half.
func TestRefusalWait(t *testing.T) {
	lo := func(int64) int64 { return 0 }
	hi := func(n int64) int64 { return n - 1 }
	for n, want := range []time.Duration{250, 500, 1000, 2000, 4000, 4000, 4000} {
		want *= time.Millisecond
		if got := refusalWait(250*time.Millisecond, n, lo); got != want/2 {
			t.Errorf("wait %d low = %v, want %v", n, got, want/2)
		}
		if got := refusalWait(250*time.Millisecond, n, hi); got != want {
			t.Errorf("wait %d high = %v, want %v", n, got, want)
		}
	}
}

// The queue in front of the workers: FIFO slots, the wait bounded, the
// refusal decided by the measured rate, never by how slow handshakes are.
func TestAdmissionQueue(t *testing.T) {
	a := newAdmission(Config{MaxHandshakes: 100, HandshakeWorkers: 2, HandshakeQueueWait: 50 * time.Millisecond})
	ctx := context.Background()
	w1, w2, w3 := &handshakeWatch{admission: a}, &handshakeWatch{admission: a}, &handshakeWatch{admission: a}
	if err := a.acquire(ctx, w1); err != nil {
		t.Fatal(err)
	}
	if err := a.acquire(ctx, w2); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- a.acquire(ctx, w3) }()
	// The third waits until a slot is given back.
	for a.waiting.Load() != 1 {
		runtime.Gosched()
	}
	a.release(w1)
	a.release(w1) // once only
	if err := <-got; err != nil || !w3.slot.Load() {
		t.Fatalf("waiting attempt after a release: %v (slot %v)", err, w3.slot.Load())
	}
	// No slot comes back: the next one gives up after the queue wait (and
	// its slack), marked as a queue timeout.
	w4 := &handshakeWatch{admission: a}
	if err := a.acquire(ctx, w4); !errors.Is(err, errQueueWait) || !w4.queueTimeout.Load() || w4.slot.Load() {
		t.Fatalf("acquire with no worker free: %v", err)
	}
	// The refusal: by the wait the measured rate predicts.
	a.rate.Set(100)    // handshakes/s
	a.waiting.Store(4) // 40 ms at 100/s: admitted
	if err := a.full(); err != nil {
		t.Fatalf("4 waiting at 100/s: %v", err)
	}
	a.waiting.Store(10) // 100 ms > 50 ms: refused
	if err := a.full(); !errors.Is(err, errQueueFull) {
		t.Fatalf("10 waiting at 100/s: %v, want queue full", err)
	}
	a.waiting.Store(0)
	a.inFlight.Store(100)
	if err := a.full(); !errors.Is(err, errTooManyHandshakes) {
		t.Fatalf("at MaxHandshakes: %v", err)
	}
	if !a.verifySourceAddress(nil) {
		t.Fatal("no Retry at the cap")
	}
	a.inFlight.Store(10)
	if a.verifySourceAddress(nil) {
		t.Fatal("Retry asked below half the cap")
	}
}

// A herd far above the workers: every dial completes, none refused or
// timed out, and at most HandshakeWorkers server signatures ran at once.
func TestHandshakeWorkersHerd(t *testing.T) {
	cfg := testConfig
	cfg.HandshakeWorkers = 1
	// 60 handshakes through one worker take seconds under -race on a
	// loaded machine; the clients' handshake idle timeout (half of
	// HandshakeTimeout) must outlast the queue, or they give up waiting
	// (the subject here is the worker bound, not the queue's speed), and so
	// must the listener's queue-wait bound, or it refuses them at once.
	cfg.HandshakeTimeout, cfg.HandshakeQueueWait = time.Minute, 25*time.Second
	e := newTenv(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 60
	accepted := make(chan semantics.BackendConn, n)
	acceptErr := make(chan error, 1)
	go func() {
		for range n {
			c, err := e.ln.Accept(ctx)
			if err != nil {
				acceptErr <- err
				return
			}
			accepted <- c
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	conns := make(chan semantics.BackendConn, n)
	for range n {
		wg.Go(func() {
			c, err := Dialer{TLS: e.pki.ClientConfig(t, wire.NewRunnerId(), serverName), Config: cfg}.Dial(ctx, e.ln.Addr().String())
			if err != nil {
				errs <- err
				return
			}
			conns <- c
		})
	}
	wg.Wait()
	close(errs)
	close(conns)
	for err := range errs {
		t.Fatalf("dial: %v", err)
	}
	for i := range n { // every handshake reached Accept
		select {
		case c := <-accepted:
			defer c.CloseWithCode(wire.CloseNormal, "")
		case err := <-acceptErr:
			t.Fatalf("Accept after %d of %d: %v (stats %+v)", i, n, err, e.ln.HandshakeStats())
		}
	}
	for c := range conns { //lint:ignore SA9001 conns is closed above; the defers close the clients at the end of the test
		defer c.CloseWithCode(wire.CloseNormal, "")
	}
	st := e.ln.HandshakeStats()
	if st.Completed != n || st.Signed != n || st.Refused != 0 || st.TimedOut != 0 || st.Failed != 0 || st.Started != n {
		t.Fatalf("stats %+v, want %d completed, none refused or timed out", st, n)
	}
	if max := e.ln.adm.maxWorking.Load(); max != 1 {
		t.Fatalf("%d handshakes worked at once, want 1", max)
	}
}

// TestChooseCertificate: the gated config picks the certificate crypto/tls
// would have picked from the server's config (GateTLS moves Certificates
// behind its GetCertificate to wrap the chosen key).
func TestChooseCertificate(t *testing.T) {
	a, b := tls.Certificate{Certificate: [][]byte{{1}}}, tls.Certificate{Certificate: [][]byte{{2}}}
	got := &tls.Certificate{Certificate: [][]byte{{3}}}
	get := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return got, nil }
	none := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return nil, nil }
	for _, tc := range []struct {
		name string
		conf *tls.Config
		sni  string
		want *tls.Certificate
	}{
		{"one certificate", &tls.Config{Certificates: []tls.Certificate{a}}, "", &a},
		{"GetCertificate only", &tls.Config{GetCertificate: get}, "", got},
		{"Certificates win without a server name", &tls.Config{Certificates: []tls.Certificate{a}, GetCertificate: get}, "", &a},
		{"GetCertificate first with a server name", &tls.Config{Certificates: []tls.Certificate{a}, GetCertificate: get}, "x.test", got},
		{"GetCertificate nil falls back", &tls.Config{Certificates: []tls.Certificate{a, b}, GetCertificate: none}, "x.test", &a},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := chooseCertificate(tc.conf, &tls.ClientHelloInfo{ServerName: tc.sni})
			if err != nil {
				t.Fatal(err)
			}
			if c.Certificate[0][0] != tc.want.Certificate[0][0] {
				t.Fatalf("chose certificate %d, want %d", c.Certificate[0][0], tc.want.Certificate[0][0])
			}
		})
	}
	if _, err := chooseCertificate(&tls.Config{GetCertificate: none}, &tls.ClientHelloInfo{}); err == nil {
		t.Fatal("no certificate at all: no error")
	}
}
