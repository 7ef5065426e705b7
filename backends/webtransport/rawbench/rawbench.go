// Package rawbench is the raw webtransport-go baseline of the scale
// harness (internal/tools/loadgen, `make scale`): WebTransport sessions
// made with webtransport-go's and quic-go's defaults (plus the settings
// WebTransport requires: datagrams, partial-delivery resets; HTTP/3 ALPN;
// the client keeps the connection alive), each with one stream that
// carried one byte, held idle. It is backends/quic/rawbench's shape over
// webtransport-go, so that the daemon's WebTransport agents are measured
// beside the library they run on rather than beside raw QUIC.
//
// Like backends/quic/rawbench it is a measuring tool, not a transport:
// nothing in the product uses it.
package rawbench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	wt "github.com/quic-go/webtransport-go"

	"forgeyard.dev/transport/backends/internal/rawkit"
	quicraw "forgeyard.dev/transport/backends/quic/rawbench"
)

// Path is the URL path sessions are opened on.
const Path = "/raw"

// KeepAlive is the client's keep-alive period (the product's default
// heartbeat interval).
const KeepAlive = 10 * time.Second

// Server accepts raw sessions and holds them; it echoes the one byte each
// session's stream carries.
type Server struct {
	udp  *net.UDPConn
	tr   *quic.Transport
	ln   *quic.Listener
	srv  *wt.Server
	held rawkit.Server[*wt.Session]
	ctx  context.Context // Serve's; the sessions' streams are accepted under it
}

// Listen, Addr, Held, EchoAll and Serve are shaped like
// backends/quic/rawbench's (internal/tools/loadgen drives them through one
// interface).
//
// Listen listens on addr ("127.0.0.1:0").
func Listen(addr string, conf *tls.Config) (*Server, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	udp, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, err
	}
	tc := rawkit.TLS(conf)
	tc.NextProtos = []string{http3.NextProtoH3}
	tr := &quic.Transport{Conn: udp}
	ln, err := tr.Listen(tc, quicConfig())
	if err != nil {
		_ = tr.Close()
		_ = udp.Close()
		return nil, err
	}
	s := &Server{udp: udp, tr: tr, ln: ln, ctx: context.Background()}
	mux := http.NewServeMux()
	mux.HandleFunc(Path, s.upgrade)
	s.srv = &wt.Server{H3: &http3.Server{Handler: mux, EnableDatagrams: true}}
	return s, nil
}

func quicConfig() *quic.Config {
	return &quic.Config{EnableDatagrams: true, EnableStreamResetPartialDelivery: true}
}

func (s *Server) upgrade(w http.ResponseWriter, r *http.Request) {
	sess, err := s.srv.Upgrade(w, r)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	s.held.Conns.Add(sess)
	go func() {
		if st, err := sess.AcceptStream(s.ctx); err == nil {
			s.held.Echo(st)
		}
	}()
}

// Addr is the listening address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Held is the number of sessions whose stream delivered its byte.
func (s *Server) Held() int64 { return s.held.Held() }

// EchoAll starts the server's side of the steady echo (rawkit.Server.EchoAll).
func (s *Server) EchoAll() { s.held.EchoAll() }

// Serve accepts until ctx ends or the listener fails, then closes every
// session and the socket.
func (s *Server) Serve(ctx context.Context) error {
	s.ctx = ctx
	defer func() {
		_ = s.held.Conns.CloseAll(closeSession)
		_ = s.srv.Close()
		_ = s.tr.Close()
		_ = s.udp.Close()
	}()
	return rawkit.Serve(ctx, s.ln, s.ln.Accept, func(c *quic.Conn) {
		go func() { _ = s.srv.ServeQUICConn(c) }()
	})
}

func closeSession(s *wt.Session) error { return s.CloseWithError(0, "") }

// Client holds raw client sessions, dialed over one shared UDP socket
// (quic.Transport) per source address.
type Client struct {
	trs           []*quic.Transport
	sessions      rawkit.Held[*wt.Session]
	rawkit.Client // the pinged streams, StartEcho, Dials
}

// DialN dials n sessions to addr, parallel at a time, from the loopback
// addresses 127.0.0.1 … 127.0.0.<sources>; conf(i) is session i's TLS
// configuration. It returns when every session's byte was echoed, or on
// the first error.
func DialN(ctx context.Context, addr string, n, parallel, sources int, conf func(i int) *tls.Config) (*Client, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	trs, err := quicraw.Transports(sources)
	if err != nil {
		return nil, err
	}
	c := &Client{trs: trs}
	qc := quicConfig()
	qc.KeepAlivePeriod = KeepAlive
	url := fmt.Sprintf("https://%s%s", addr, Path)
	err = rawkit.DialN(ctx, n, parallel, "session", func(i int) error {
		return c.dialOne(ctx, c.trs[i%len(c.trs)], ua, url, conf(i), qc)
	})
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Client) dialOne(ctx context.Context, tr *quic.Transport, ua *net.UDPAddr, url string, conf *tls.Config, qconf *quic.Config) error {
	c.Dialed()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tc := rawkit.TLS(conf)
	tc.NextProtos = []string{http3.NextProtoH3}
	qc, err := tr.Dial(ctx, ua, tc, qconf)
	if err != nil {
		return err
	}
	wtr := &wt.Transport{}
	defer wtr.Close()
	cc, err := wtr.NewClientConn(qc)
	if err != nil {
		_ = qc.CloseWithError(0, "")
		return err
	}
	rsp, sess, err := cc.Dial(ctx, url, nil)
	if err == nil && (rsp.StatusCode < 200 || rsp.StatusCode > 299) {
		err = fmt.Errorf("rawbench: server answered HTTP %d", rsp.StatusCode)
	}
	if err != nil {
		_ = qc.CloseWithError(0, "")
		return err
	}
	st, err := sess.OpenStreamSync(ctx)
	if err == nil {
		err = rawkit.Ping(ctx, st) // the server's echo: it holds the session
	}
	if err != nil {
		_ = sess.CloseWithError(0, "")
		return err
	}
	c.sessions.Add(sess)
	c.Streams.Add(st)
	return nil
}

// Len is the number of sessions held.
func (c *Client) Len() int { return c.sessions.Len() }

// Close closes every session and socket.
func (c *Client) Close() {
	_ = errors.Join(c.sessions.CloseAll(closeSession), quicraw.CloseTransports(c.trs))
	c.trs = nil
}
