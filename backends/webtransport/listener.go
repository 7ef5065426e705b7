package webtransport

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"sync"

	quicgo "github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	wt "github.com/quic-go/webtransport-go"

	"forgeyard.dev/transport/backends/internal/acceptq"
	"forgeyard.dev/transport/backends/internal/refcount"
	fyquic "forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

var _ semantics.BackendListener = (*Listener)(nil)

// Listener serves HTTP/3 with WebTransport at Path and hands each
// established session out through Accept. Accept may be called
// concurrently. Requests for any other path get 404.
type Listener struct {
	udp *net.UDPConn
	tr  *quicgo.Transport
	ln  *quicgo.Listener
	srv *wt.Server
	cfg Config

	sessions chan *conn
	closing  chan struct{} // closed by Close

	users *refcount.Users // live QUIC connections plus the listener itself

	closeOnce sync.Once
	serveDone chan struct{}
	adm       *fyquic.Admission
}

// HandshakeStats returns the listener's handshake admission counters
// (semantics.HandshakeCounter).
func (l *Listener) HandshakeStats() semantics.HandshakeStats { return l.adm.Stats() }

// Listen serves WebTransport on the UDP address addr ("host:port", port 0
// picks one; UDP 443 in production) with a clone of tlsConf (TLS 1.3 only,
// ALPN "h3"; set ClientAuth/ClientCAs there for mTLS) and cfg (validated
// and copied). Failed QUIC/TLS handshakes are reported to
// cfg.OnHandshakeFailure (see backends/quic.Config).
func Listen(addr string, tlsConf *tls.Config, cfg Config) (*Listener, error) {
	qconf, err := quicConfig(cfg)
	if err != nil {
		return nil, err
	}
	if tlsConf == nil {
		return nil, errors.New("webtransport: a *tls.Config is required (TLS 1.3 with certificates; no insecure mode)")
	}
	tc := tlsConf.Clone()
	tc.MinVersion, tc.MaxVersion = tls.VersionTLS13, 0
	tc.NextProtos = []string{http3.NextProtoH3}
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	udp, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, err
	}
	tr := &quicgo.Transport{Conn: udp}
	adm := fyquic.PrepareServerTransport(tr, "webtransport", cfg)
	ln, err := tr.Listen(adm.GateTLS(tc), qconf)
	if err != nil {
		_ = tr.Close()
		_ = udp.Close()
		return nil, err
	}
	l := &Listener{
		udp: udp, tr: tr, ln: ln, cfg: cfg, adm: adm,
		sessions:  make(chan *conn, acceptQueue),
		closing:   make(chan struct{}),
		users:     refcount.New(),
		serveDone: make(chan struct{}),
	}
	mux := http.NewServeMux()
	mux.HandleFunc(Path, l.upgrade)
	l.srv = &wt.Server{
		H3: &http3.Server{Handler: mux, EnableDatagrams: true,
			ConnContext: func(ctx context.Context, qc *quicgo.Conn) context.Context {
				return context.WithValue(ctx, quicConnKey{}, qc)
			}},
		ApplicationProtocols: []string{ApplicationProtocol},
	}
	go l.serve()
	return l, nil
}

// serve accepts QUIC connections (handshake complete, client certificate
// verified) and serves HTTP/3 on each.
func (l *Listener) serve() {
	defer close(l.serveDone)
	for {
		qc, err := l.ln.Accept(context.Background())
		if err != nil {
			return
		}
		fyquic.HandshakeAccepted(qc)
		if !l.acquire() {
			_ = qc.CloseWithError(quicgo.ApplicationErrorCode(wire.CloseShutdown), "listener closed")
			continue
		}
		context.AfterFunc(qc.Context(), l.release)
		go func() {
			if err := l.srv.ServeQUICConn(qc); err != nil {
				_ = qc.CloseWithError(quicgo.ApplicationErrorCode(wire.CloseInternalError), "webtransport: "+err.Error())
			}
		}()
	}
}

// upgrade turns the CONNECT request into a session and queues it.
func (l *Listener) upgrade(w http.ResponseWriter, r *http.Request) {
	sess, err := l.srv.Upgrade(w, r)
	if err != nil {
		l.cfg.Logger.Debug("webtransport: upgrade failed", "remote", r.RemoteAddr, "err", err)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	qc := quicConnOf(r)
	if qc == nil { // cannot happen: ConnContext sets it for every connection
		_ = sess.CloseWithError(wt.SessionErrorCode(wire.CloseInternalError), "no QUIC connection")
		return
	}
	c := newConn(sess, qc, nil, hintMaxRTT(l.cfg))
	c.credit = l.cfg.StreamCredit()
	if p := sess.SessionState().ApplicationProtocol; p != ApplicationProtocol {
		_ = c.CloseWithCode(wire.CloseProtocolError, "application protocol "+ApplicationProtocol+" required")
		return
	}
	select {
	case <-l.closing:
		_ = c.CloseWithCode(wire.CloseShutdown, "listener closed")
	case l.sessions <- c:
	default:
		_ = c.CloseWithCode(wire.CloseOverloaded, "accept queue full")
	}
}

// Accept returns the next established session. It returns ctx's error when
// ctx is done and a *semantics.ConnError (CloseShutdown) after Close.
func (l *Listener) Accept(ctx context.Context) (semantics.BackendConn, error) {
	select {
	case c := <-l.sessions:
		return c, nil
	case <-l.closing:
		return nil, &semantics.ConnError{Code: wire.CloseShutdown, Reason: "listener closed"}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Addr returns the bound UDP address.
func (l *Listener) Addr() net.Addr { return l.udp.LocalAddr() }

// Close stops accepting; sessions queued but not accepted are closed with
// CloseShutdown. Established sessions stay up; the UDP socket closes with
// the last of them. Idempotent.
func (l *Listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.closing)
		_ = l.ln.Close()
		<-l.serveDone
		acceptq.CloseQueued(l.sessions)
		l.release()
	})
	return nil
}

func (l *Listener) acquire() bool { return l.users.Acquire() }

// release drops one user and closes the socket with the last.
func (l *Listener) release() {
	if l.users.Release() {
		_ = l.srv.Close()
		_ = l.tr.Close()
		_ = l.udp.Close()
	}
}

// quicConfig derives the QUIC configuration WebTransport needs from cfg.
func quicConfig(cfg Config) (*quicgo.Config, error) {
	qc, err := cfg.QUICConfig()
	if err != nil {
		return nil, err
	}
	qc.MaxIncomingStreams += h3Streams
	qc.MaxIncomingUniStreams += h3Streams
	qc.EnableDatagrams = true
	qc.EnableStreamResetPartialDelivery = true
	return qc, nil
}

type quicConnKey struct{}

// quicConnOf returns the QUIC connection r arrived on.
func quicConnOf(r *http.Request) *quicgo.Conn {
	qc, _ := r.Context().Value(quicConnKey{}).(*quicgo.Conn)
	return qc
}

// HintRestart sends a tokenless restart hint to each of peers from the
// listening socket (backends/quic.SendRestartHints): a daemon that
// restarted after a crash tells the agents of its previous process at
// once. HintRestartTo sends hints carrying the sessions' restart tokens.
func (l *Listener) HintRestart(ctx context.Context, peers []netip.AddrPort, perSecond int) (int, error) {
	return fyquic.SendRestartHints(ctx, l.tr, peers, perSecond)
}

// HintRestartTo sends hints (one per session, with its restart token)
// from the listening socket (backends/quic.SendRestartHintsTo).
func (l *Listener) HintRestartTo(ctx context.Context, hints []fyquic.RestartHint, perSecond int) (int, error) {
	return fyquic.SendRestartHintsTo(ctx, l.tr, hints, perSecond)
}
