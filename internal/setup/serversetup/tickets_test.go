package serversetup

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/webtransport"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

// Session resumption over the real backends (issue 25 item 4): a server
// tls.Config with SessionTickets installed and the daemon's listeners
// (QUIC with its admission gate, yamux, WebTransport), and agents with
// trust.NewSessionCache.

const ticketPeriod = time.Hour

// ticketCache is an agent session cache that reports each stored ticket,
// so a test redials only once the first connection's ticket arrived.
type ticketCache struct{ trusttest.NotifyingCache }

func newTicketCache(leaf *x509.Certificate) *ticketCache {
	return &ticketCache{trusttest.NewNotifyingCache(trust.NewSessionCache(func() *x509.Certificate { return leaf }), 16)}
}

func (c *ticketCache) waitStored(t *testing.T) {
	t.Helper()
	select {
	case <-c.Stored:
	case <-time.After(10 * time.Second):
		t.Fatal("no session ticket reached the agent's cache")
	}
}

// ticketServer is the daemon's TLS stack: every backend listening, each
// accepted connection's TLS state reported on accepted.
type ticketServer struct {
	tickets  *SessionTickets
	addrs    map[string]string
	accepted chan tls.ConnectionState
	failures chan semantics.HandshakeFailure
	close    func()
}

// serverClock lets a test move the server's TLS clock (certificate expiry).
type serverClock struct{ off atomic.Int64 }

func (c *serverClock) now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

func startTicketServer(t *testing.T, pki *trusttest.PKI, src TicketKeySource, clock *serverClock) *ticketServer {
	t.Helper()
	conf := pki.ServerConfig(t, "localhost")
	if clock != nil {
		conf.Time = clock.now
	}
	ctx := context.Background()
	tickets, err := NewSessionTickets(ctx, src, ticketPeriod, nil)
	if err != nil {
		t.Fatal(err)
	}
	tickets.Install(conf)
	s := &ticketServer{tickets: tickets, addrs: map[string]string{}, accepted: make(chan tls.ConnectionState, 16),
		failures: make(chan semantics.HandshakeFailure, 16)}
	report := func(f semantics.HandshakeFailure) {
		select {
		case s.failures <- f:
		default:
		}
	}
	ls, err := Listen(config.Listen{QUIC: "127.0.0.1:0", Yamux: "127.0.0.1:0", WebTransport: "127.0.0.1:0"}, conf,
		quic.Config{OnHandshakeFailure: report}, yamux.Config{OnHandshakeFailure: report})
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []semantics.BackendConn
	for _, l := range ls {
		s.addrs[l.Backend] = l.Addr().String()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := l.Accept(actx)
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				s.accepted <- c.ConnectionState()
			}
		}()
	}
	var once sync.Once
	s.close = func() {
		once.Do(func() {
			cancel()
			for _, l := range ls {
				_ = l.Close()
			}
			wg.Wait()
			mu.Lock()
			for _, c := range conns {
				_ = c.CloseWithCode(wire.CloseNormal, "test end")
			}
			mu.Unlock()
		})
	}
	t.Cleanup(s.close)
	return s
}

func (s *ticketServer) next(t *testing.T) tls.ConnectionState {
	t.Helper()
	select {
	case cs := <-s.accepted:
		return cs
	case <-time.After(10 * time.Second):
		t.Fatal("the server accepted no connection")
	}
	return tls.ConnectionState{}
}

var ticketBackends = []string{config.BackendQUIC, config.BackendYamux, config.BackendWebTransport}

func dialBackend(ctx context.Context, backend, addr string, tc *tls.Config) (semantics.BackendConn, error) {
	switch backend {
	case config.BackendQUIC:
		return quic.Dialer{TLS: tc}.Dial(ctx, addr)
	case config.BackendYamux:
		return yamux.Dialer{TLS: tc}.Dial(ctx, addr)
	}
	return webtransport.Dialer{TLS: tc}.Dial(ctx, webtransport.URL(addr))
}

// agentTLS is an agent's client configuration with its own session cache.
func agentTLS(t *testing.T, pki *trusttest.PKI, opts trusttest.LeafOptions) (*tls.Config, *ticketCache, wire.RunnerId) {
	runner := wire.NewRunnerId()
	cert := pki.IssueClient(t, runner, opts)
	tc := pki.ClientConfigWith(t, cert, "localhost")
	cache := newTicketCache(cert.Leaf)
	tc.ClientSessionCache = cache
	return tc, cache, runner
}

// connect dials, checks both sides agree on DidResume == resumed, and
// closes the connection once its ticket (if any is due) was stored.
func connect(t *testing.T, s *ticketServer, backend string, tc *tls.Config, cache *ticketCache, resumed bool) tls.ConnectionState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dialBackend(ctx, backend, s.addrs[backend], tc)
	if err != nil {
		t.Fatalf("%s: dial: %v", backend, err)
	}
	defer c.CloseWithCode(wire.CloseNormal, "done")
	srv := s.next(t)
	if got := c.ConnectionState().DidResume; got != resumed {
		t.Fatalf("%s: agent DidResume %v, want %v", backend, got, resumed)
	}
	if srv.DidResume != resumed {
		t.Fatalf("%s: server DidResume %v, want %v", backend, srv.DidResume, resumed)
	}
	if !resumed {
		cache.waitStored(t)
	}
	return srv
}

func sqliteTicketKeys(t *testing.T, path string) TicketKeySource {
	t.Helper()
	a, err := authority.OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return authority.TicketKeysOf(a).TicketKeys
}

// TestSessionResumption: an agent's second connection resumes on every
// backend, and the resumed session carries the verified client chain the
// daemon's identity check reads (the same RunnerId as the full
// handshake's); after a daemon restart on the same authority the agent
// resumes; a daemon on another authority's keys does not accept the
// ticket but a full handshake still works.
func TestSessionResumption(t *testing.T) {
	pki := trusttest.NewPKI(t)
	dbA := filepath.Join(t.TempDir(), "a.db")
	srvA := startTicketServer(t, pki, sqliteTicketKeys(t, dbA), nil)
	if n := srvA.tickets.Keys(); n != 2 {
		t.Fatalf("%d ticket keys loaded, want 2 (current, next)", n)
	}
	type agentState struct {
		tc     *tls.Config
		cache  *ticketCache
		runner wire.RunnerId
	}
	agents := map[string]agentState{}
	for _, b := range ticketBackends {
		tc, cache, runner := agentTLS(t, pki, trusttest.LeafOptions{})
		agents[b] = agentState{tc, cache, runner}
		full := connect(t, srvA, b, tc, cache, false)
		resumed := connect(t, srvA, b, tc, cache, true)
		for what, cs := range map[string]tls.ConnectionState{"full": full, "resumed": resumed} {
			id, err := trust.VerifyPeer(cs, time.Now())
			if err != nil || id.Runner != runner {
				t.Fatalf("%s %s handshake: identity %v, %v; want runner %v", b, what, id.Runner, err, runner)
			}
		}
		if !bytes.Equal(full.PeerCertificates[0].Raw, resumed.PeerCertificates[0].Raw) {
			t.Fatalf("%s: the resumed session carries another client certificate", b)
		}
	}

	// Another deployment: its own authority, its own keys. The agents'
	// tickets (same server name) are not accepted; a full handshake is.
	srvB := startTicketServer(t, pki, sqliteTicketKeys(t, filepath.Join(t.TempDir(), "b.db")), nil)
	for _, b := range ticketBackends {
		a := agents[b]
		connect(t, srvB, b, a.tc, a.cache, false)
	}
	srvB.close()

	// A restart of daemon A on the same authority: tickets issued before
	// still resume. The agents' caches now hold srvB's tickets, so take
	// one from A first with a fresh agent per backend.
	fresh := map[string]agentState{}
	for _, b := range ticketBackends {
		tc, cache, runner := agentTLS(t, pki, trusttest.LeafOptions{})
		fresh[b] = agentState{tc, cache, runner}
		connect(t, srvA, b, tc, cache, false)
	}
	srvA.close()
	srvA2 := startTicketServer(t, pki, sqliteTicketKeys(t, dbA), nil)
	for _, b := range ticketBackends {
		a := fresh[b]
		connect(t, srvA2, b, a.tc, a.cache, true)
	}
}

// TestSessionTicketRotation: after the rotation a ticket issued under the
// previous period's key still resumes; once that key is older than
// authority.TicketKeysKept periods it no longer does (full handshake).
func TestSessionTicketRotation(t *testing.T) {
	pki := trusttest.NewPKI(t)
	src := sqliteTicketKeys(t, filepath.Join(t.TempDir(), "a.db"))
	srv := startTicketServer(t, pki, src, nil)
	b := config.BackendYamux
	tc, cache, _ := agentTLS(t, pki, trusttest.LeafOptions{})
	connect(t, srv, b, tc, cache, false)
	now := time.Now()
	if err := srv.tickets.Refresh(context.Background(), now.Add(ticketPeriod)); err != nil {
		t.Fatal(err)
	}
	connect(t, srv, b, tc, cache, true) // previous period's key decrypts
	// The resumed connection got a new ticket under the new current key:
	// start over with a fresh agent to age one ticket past the kept keys.
	tc2, cache2, _ := agentTLS(t, pki, trusttest.LeafOptions{})
	connect(t, srv, b, tc2, cache2, false)
	if err := srv.tickets.Refresh(context.Background(), now.Add(time.Duration(2+authority.TicketKeysKept)*ticketPeriod)); err != nil {
		t.Fatal(err)
	}
	connect(t, srv, b, tc2, cache2, false)
}

// TestSessionResumptionExpiredCert: a client certificate that expired
// after its ticket was issued neither resumes nor completes a full
// handshake; a valid agent connects right after.
func TestSessionResumptionExpiredCert(t *testing.T) {
	pki := trusttest.NewPKI(t)
	clock := &serverClock{}
	srv := startTicketServer(t, pki, sqliteTicketKeys(t, filepath.Join(t.TempDir(), "a.db")), clock)
	now := time.Now()
	for _, b := range []string{config.BackendQUIC, config.BackendYamux} {
		clock.off.Store(0)
		tc, cache, _ := agentTLS(t, pki, trusttest.LeafOptions{NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour)})
		connect(t, srv, b, tc, cache, false)
		clock.off.Store(int64(2 * time.Hour)) // the certificate has expired for the server
		// Deadlines, not waits: generous for a starved machine (two test
		// runs on 2 cores under -race).
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, err := dialBackend(ctx, b, srv.addrs[b], tc)
		cancel()
		if err == nil {
			// QUIC: the agent's side of the handshake completes before
			// the server has judged its certificate; the server then
			// closes the connection and never accepts it (checked below).
			// The agent keeps its side open until then: closing it at
			// once could reach a starved server before its verdict, and
			// end the handshake as closed by the peer instead.
			if c.ConnectionState().DidResume {
				t.Fatalf("%s: an agent whose certificate expired after its ticket resumed", b)
			}
		}
		select {
		case f := <-srv.failures:
			if f.Reason != semantics.HandshakeCertificateExpired {
				t.Fatalf("%s: handshake failure %v (%v), want certificate_expired", b, f.Reason, f.Err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: the refused handshake was not reported (dial: %v)", b, err)
		}
		if err == nil {
			_ = c.CloseWithCode(wire.CloseNormal, "done")
		}
		// The server clock is 2h ahead; a fresh certificate valid for a
		// day is still good, and it is the next connection the server
		// accepts (the expired one never was).
		tc2, cache2, _ := agentTLS(t, pki, trusttest.LeafOptions{})
		got := connect(t, srv, b, tc2, cache2, false)
		if !bytes.Equal(got.PeerCertificates[0].Raw, tc2.Certificates[0].Certificate[0]) {
			t.Fatalf("%s: the server accepted the expired agent's connection", b)
		}
	}
}

// TestSessionTicketsAuthorityDown: a failing key source keeps the keys in
// use (tickets still resume) and is logged once per streak; before any
// key was loaded a key of the process is used.
func TestSessionTicketsAuthorityDown(t *testing.T) {
	var fail atomic.Bool
	var calls atomic.Int32
	key := [32]byte{1}
	src := func(ctx context.Context, now time.Time, period time.Duration) ([][32]byte, error) {
		calls.Add(1)
		if fail.Load() {
			return nil, errors.New("authority down")
		}
		return [][32]byte{key}, nil
	}
	var logs bytes.Buffer
	var logMu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))
	st, err := NewSessionTickets(context.Background(), src, time.Hour, log)
	if err != nil {
		t.Fatal(err)
	}
	fail.Store(true)
	for range 3 {
		if err := st.Refresh(context.Background(), time.Now()); err == nil {
			t.Fatal("a failing source reported success")
		}
	}
	if st.Keys() != 1 {
		t.Fatalf("%d keys after failures, want the 1 loaded before", st.Keys())
	}
	logMu.Lock()
	n := bytes.Count(logs.Bytes(), []byte("not refreshed"))
	logMu.Unlock()
	if n != 1 {
		t.Fatalf("the failure streak was logged %d times, want once:\n%s", n, logs.String())
	}
	// The keys in use still encrypt and decrypt.
	conf := &tls.Config{}
	st.Install(conf)
	pki := trusttest.NewPKI(t)
	srvConf := pki.ServerConfig(t, "localhost")
	st.Install(srvConf)
	cli := pki.ClientConfig(t, wire.NewRunnerId(), "localhost")
	cli.ClientSessionCache = tls.NewLRUClientSessionCache(4)
	r := trusttest.Handshake(t, srvConf, cli)
	if !r.OK() {
		t.Fatalf("handshake with kept keys: %v %v", r.ServerErr, r.ClientErr)
	}

	fail.Store(false)
	if err := st.Refresh(context.Background(), time.Now()); err != nil {
		t.Fatal(err)
	}
	logMu.Lock()
	recovered := bytes.Contains(logs.Bytes(), []byte("refreshed from the authority again"))
	logMu.Unlock()
	if !recovered {
		t.Fatal("the recovery was not logged")
	}

	// Down from the start: a process key, logged.
	fail.Store(true)
	st2, err := NewSessionTickets(context.Background(), src, time.Hour, log)
	if err != nil || st2.Keys() != 1 {
		t.Fatalf("start with the authority down: %v, %d keys", err, st2.Keys())
	}
	if _, err := NewSessionTickets(context.Background(), src, 0, log); err == nil {
		t.Fatal("a zero period was accepted")
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
