package yamux

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"forgeyard.dev/transport/backends/internal/acceptq"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// maxHandshakes bounds concurrent server handshakes per listener, and
// readyQueue the handshaken connections waiting for Accept. Together they
// bound the goroutines and memory a flood of TCP connections can take.
const (
	maxHandshakes = 64
	readyQueue    = 16
)

// tlsConfig clones base for this backend: TLS 1.3 only, ALPN protos
// (default "forgeyard/1").
func tlsConfig(base *tls.Config, protos ...string) *tls.Config {
	var c *tls.Config
	if base == nil {
		c = &tls.Config{}
	} else {
		c = base.Clone()
	}
	c.MinVersion = tls.VersionTLS13
	if len(protos) == 0 {
		protos = []string{ALPN}
	}
	c.NextProtos = protos
	return c
}

// Listener accepts TLS+yamux connections on a TCP address. It implements
// semantics.BackendListener. Safe for concurrent use.
type Listener struct {
	ln        net.Listener
	tls       *tls.Config
	cfg       Config
	ready     chan *Conn
	closing   chan struct{}
	ctx       context.Context // cancelled by Close: aborts handshakes
	cancel    context.CancelFunc
	closeOnce sync.Once
	wg        sync.WaitGroup
	sem       chan struct{}
}

// Listen listens on TCP addr (host:port, e.g. ":7444"). tlsConf must carry
// the server certificate and, for agents, ClientCAs with
// RequireAndVerifyClientCert; it is cloned and forced to TLS 1.3 with ALPN
// "forgeyard/1" and "http/1.1". cfg is validated and copied.
//
// One port serves both forms of the backend, told apart by ALPN (not by
// sniffing bytes): a client that negotiated "forgeyard/1" speaks raw
// TLS+yamux; one that negotiated "http/1.1", or no ALPN at all (what an
// HTTP-aware middlebox re-originating TLS may send), must send the HTTP/1.1
// Upgrade request (see UpgradePath) before yamux starts.
func Listen(addr string, tlsConf *tls.Config, cfg Config) (*Listener, error) {
	cfg, err := cfg.prepare()
	if err != nil {
		return nil, err
	}
	if tlsConf == nil || (len(tlsConf.Certificates) == 0 && tlsConf.GetCertificate == nil && tlsConf.GetConfigForClient == nil) {
		return nil, errors.New("yamux: Listen needs a TLS config with a server certificate")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("yamux: %w", err)
	}
	l := &Listener{
		ln:      ln,
		tls:     tlsConfig(tlsConf, ALPN, ALPNHTTP1),
		cfg:     cfg,
		ready:   make(chan *Conn, readyQueue),
		closing: make(chan struct{}),
		sem:     make(chan struct{}, maxHandshakes),
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.wg.Add(1)
	go l.serve()
	return l, nil
}

func (l *Listener) serve() {
	defer l.wg.Done()
	for {
		nc, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.closing:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Transient (EMFILE, ECONNABORTED): back off briefly.
			l.cfg.Logger.Warn("yamux: accept failed", "err", err)
			t := time.NewTimer(50 * time.Millisecond)
			select {
			case <-t.C:
			case <-l.closing:
				t.Stop()
				return
			}
			continue
		}
		select {
		case l.sem <- struct{}{}:
		case <-l.closing:
			_ = nc.Close()
			return
		}
		l.wg.Add(1)
		go l.handshake(nc)
	}
}

func (l *Listener) handshake(nc net.Conn) {
	defer l.wg.Done()
	defer func() { <-l.sem }()
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.HandshakeTimeout)
	defer cancel()
	c, tlsErr, err := serverConn(ctx, nc, l.tls, &l.cfg)
	if err != nil {
		l.cfg.Logger.Debug("yamux: handshake failed", "remote", nc.RemoteAddr().String(), "err", err)
		l.reportHandshakeFailure(nc.RemoteAddr(), tlsErr, err)
		return
	}
	select {
	case l.ready <- c:
	case <-l.closing:
		_ = c.CloseWithCode(wire.CloseShutdown, "listener closed")
	}
}

// reportHandshakeFailure passes a failed server handshake to
// Config.OnHandshakeFailure: tlsErr is the TLS handshake's own error (nil
// when TLS completed and a later step, ALPN or the HTTP/1.1 Upgrade,
// failed: reason protocol). Handshakes aborted by Close are not reported.
func (l *Listener) reportHandshakeFailure(remote net.Addr, tlsErr, err error) {
	hook := l.cfg.OnHandshakeFailure
	if hook == nil || l.ctx.Err() != nil {
		return
	}
	if tlsErr == nil {
		f := semantics.NewHandshakeFailure("yamux", remote, err, false)
		if f.Reason != semantics.HandshakeTimeout {
			f.Reason = semantics.HandshakeProtocol
		}
		hook(f)
		return
	}
	// A peer's alert (it rejected our certificate) reaches the server as a
	// read error "remote error: tls: ...".
	oe, ok := errors.AsType[*net.OpError](tlsErr)
	byPeer := ok && oe.Op == "remote error"
	hook(semantics.NewHandshakeFailure("yamux", remote, tlsErr, byPeer))
}

// serverConn runs the server side of the handshake on nc. On failure it
// closes nc and returns the error, and tlsErr, the TLS handshake's own
// error when that step failed.
func serverConn(ctx context.Context, nc net.Conn, conf *tls.Config, cfg *Config) (c *Conn, tlsErr, err error) {
	raw := tuneSocket(nc, *cfg)
	bc := &batchConn{Conn: nc}
	tc := tls.Server(bc, conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = nc.Close()
		return nil, err, handshakeError("tls", err)
	}
	dl, _ := ctx.Deadline()
	var conn net.Conn = tc
	ready := []byte{readyByte}
	switch p := tc.ConnectionState().NegotiatedProtocol; p {
	case ALPN:
	case ALPNHTTP1, "":
		// The HTTP/1.1 Upgrade form: read and check the request, answer 101
		// followed by the ready byte.
		uc, resp, err := serverUpgrade(tc, dl)
		if err != nil {
			_ = nc.Close()
			return nil, nil, handshakeError("http upgrade", err)
		}
		conn, ready = uc, append(resp, readyByte)
	default:
		_ = nc.Close()
		return nil, nil, handshakeError("alpn", fmt.Errorf("peer negotiated %q", p))
	}
	_ = tc.SetWriteDeadline(dl)
	if _, err := tc.Write(ready); err != nil {
		_ = nc.Close()
		return nil, nil, handshakeError("ready", err)
	}
	_ = tc.SetWriteDeadline(time.Time{})
	c, err = newConn(ctx, conn, tc, bc, raw, cfg, false)
	return c, nil, err
}

// tuneSocket applies TCP_NOTSENT_LOWAT and returns the raw socket for
// QueuedBytes (nil when nc is not TCP).
func tuneSocket(nc net.Conn, cfg Config) syscall.RawConn {
	tcp, ok := nc.(*net.TCPConn)
	if !ok {
		return nil
	}
	raw, err := tcp.SyscallConn()
	if err != nil {
		return nil
	}
	if cfg.NotSentLowat > 0 {
		if err := setNotSentLowat(raw, cfg.NotSentLowat); err != nil {
			cfg.Logger.Debug("yamux: TCP_NOTSENT_LOWAT not set", "err", err)
		}
	}
	if cfg.RecvBuffer > 0 {
		if err := tcp.SetReadBuffer(cfg.RecvBuffer); err != nil {
			cfg.Logger.Debug("yamux: SO_RCVBUF not set", "err", err)
		}
	}
	return raw
}

// Accept returns the next connection whose TLS handshake (client
// certificate verified) and control-stream setup completed. It returns
// ctx.Err() when ctx ends and net.ErrClosed after Close.
func (l *Listener) Accept(ctx context.Context) (semantics.BackendConn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.closing:
		return nil, net.ErrClosed
	}
}

// Addr returns the TCP address the listener is bound to.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Close stops accepting, aborts handshakes in progress (their clients see a
// network failure), closes connections not yet returned by Accept with
// CloseShutdown, and waits for the listener's goroutines. Connections
// already accepted are not affected.
func (l *Listener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.closing)
		l.cancel()
		err = l.ln.Close()
		l.wg.Wait()
		acceptq.CloseQueued(l.ready)
	})
	return err
}

// Dialer dials TLS+yamux connections. It implements
// semantics.BackendDialer. The zero Config means defaults; TLS must carry
// RootCAs (or use the system pool) and, for agents, the client
// certificate. Dial clones TLS, forces TLS 1.3 and ALPN "forgeyard/1", and
// sets ServerName from addr when empty. Safe for concurrent use.
//
// DialContext, when set, makes the TCP connection (e.g. through an HTTP
// CONNECT proxy, backends/yamux/proxy). Upgrade selects the HTTP/1.1 Upgrade form:
// ALPN "http/1.1", then "GET UpgradePath" with "Connection: Upgrade" and
// "Upgrade: forgeyard-yamux/1", and yamux only after the server's 101, so
// HTTP-aware middleboxes on port 443 pass the connection.
type Dialer struct {
	TLS         *tls.Config
	Config      Config
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	Upgrade     bool
}

// Dial connects to addr (host:port). The whole handshake (TCP, TLS, the
// listener's acceptance of the client certificate, control stream) is
// bounded by ctx and Config.HandshakeTimeout; failures wrap ErrHandshake.
func (d Dialer) Dial(ctx context.Context, addr string) (semantics.BackendConn, error) {
	cfg, err := d.Config.prepare()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.HandshakeTimeout)
	defer cancel()
	proto := ALPN
	if d.Upgrade {
		proto = ALPNHTTP1
	}
	conf := tlsConfig(d.TLS, proto)
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("yamux: dial %q: %w", addr, err)
	}
	if conf.ServerName == "" {
		conf.ServerName = host
	}
	dial := d.DialContext
	if dial == nil {
		var nd net.Dialer
		dial = nd.DialContext
	}
	nc, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, handshakeError("tcp", err)
	}
	raw := tuneSocket(nc, cfg)
	bc := &batchConn{Conn: nc}
	tc := tls.Client(bc, conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = nc.Close()
		return nil, handshakeError("tls", err)
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != proto {
		_ = nc.Close()
		return nil, handshakeError("alpn", fmt.Errorf("server negotiated %q", p))
	}
	dl, _ := ctx.Deadline()
	var conn net.Conn = tc
	if d.Upgrade {
		if conn, err = clientUpgrade(tc, conf.ServerName, dl); err != nil {
			_ = nc.Close()
			return nil, handshakeError("http upgrade", err)
		}
	}
	// Wait for the listener's verdict on our certificate (TLS 1.3 sends it
	// after our handshake completed).
	_ = tc.SetReadDeadline(dl)
	var b [1]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil || b[0] != readyByte {
		_ = nc.Close()
		if err == nil {
			err = errors.New("unexpected first byte")
		}
		return nil, handshakeError("server acceptance", err)
	}
	_ = tc.SetReadDeadline(time.Time{})
	c, err := newConn(ctx, conn, tc, bc, raw, &cfg, true)
	if err != nil {
		return nil, err
	}
	return c, nil
}
