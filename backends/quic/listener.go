package quic

import (
	"context"
	"crypto/tls"
	"net"
	"net/netip"
	"sync"

	quicgo "github.com/quic-go/quic-go"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

var _ semantics.BackendListener = (*Listener)(nil)

// Listener accepts QUIC connections. Accept may be called concurrently.
type Listener struct {
	ep  *endpoint
	ln  *quicgo.Listener
	cfg Config
	adm *Admission

	closeOnce sync.Once
}

// Listen listens on the UDP address addr ("host:port", port 0 picks a free
// port; see Addr) with a clone of tlsConf (TLS 1.3 only, ALPN
// "forgeyard/1" added; set ClientAuth/ClientCAs there for mTLS) and cfg
// (validated, copied, defaults filled). Failed handshakes are reported to
// cfg.OnHandshakeFailure.
func Listen(addr string, tlsConf *tls.Config, cfg Config) (*Listener, error) {
	cfg, err := cfg.checked()
	if err != nil {
		return nil, err
	}
	tc, err := prepareTLS(tlsConf)
	if err != nil {
		return nil, err
	}
	ep, err := newEndpoint("udp", addr)
	if err != nil {
		return nil, err
	}
	adm := PrepareServerTransport(ep.tr, "quic", cfg)
	ln, err := ep.tr.Listen(adm.GateTLS(tc), cfg.quicConfig())
	if err != nil {
		ep.release()
		return nil, err
	}
	checkUDPBuffers(ep.udp, cfg.Logger)
	return &Listener{ep: ep, ln: ln, cfg: cfg, adm: adm}, nil
}

// Accept returns the next connection whose handshake completed (client
// certificate verified if the tls.Config requires one). It returns ctx's
// error when ctx is done, and a *semantics.ConnError (CloseShutdown)
// after Close.
func (l *Listener) Accept(ctx context.Context) (semantics.BackendConn, error) {
	for {
		qc, err := l.ln.Accept(ctx)
		if err != nil {
			return nil, TranslateError(err)
		}
		HandshakeAccepted(qc)
		if err := checkALPN(qc); err != nil {
			l.cfg.Logger.Warn("quic: rejected connection", "remote", qc.RemoteAddr().String(), "err", err)
			RejectedAfterHandshake(l.cfg.OnHandshakeFailure, "quic", qc.RemoteAddr(), err)
			continue
		}
		if !l.ep.acquire() {
			_ = qc.CloseWithError(quicgo.ApplicationErrorCode(wire.CloseShutdown), "listener closed")
			continue
		}
		c := newConn(qc, l.ep.release, l.cfg.DelayHintMaxRTT)
		c.credit = l.cfg.streamCredit()
		return c, nil
	}
}

// HandshakeStats returns the listener's handshake admission counters
// (semantics.HandshakeCounter).
func (l *Listener) HandshakeStats() semantics.HandshakeStats { return l.adm.Stats() }

// Addr returns the bound UDP address.
func (l *Listener) Addr() net.Addr { return l.ep.udp.LocalAddr() }

// Close stops accepting. Established connections stay up; the UDP socket
// closes with the last of them. Idempotent.
func (l *Listener) Close() error {
	err := l.ln.Close()
	l.closeOnce.Do(l.ep.release) // drop the listener's own reference
	return err
}

// Abort is what the death of the process does to the listener: it closes
// the socket at once and drops every connection on it without a word to
// its peer (no CONNECTION_CLOSE: quic-go destroys them), which then learns
// of it only from a restart hint, a stateless reset or its idle timeout.
// For crash tests (restart hints); a server closes with Close. Idempotent.
func (l *Listener) Abort() {
	_ = l.ln.Close()
	_ = l.ep.tr.Close() // destroys the connections silently
	_ = l.ep.udp.Close()
	l.closeOnce.Do(l.ep.release)
}

// HintRestart sends a tokenless restart hint to each of peers from the
// listening socket, perSecond at most (≤ 0: DefaultRestartHintRate): a
// daemon that restarted after a crash tells the agents of its previous
// process at once (restarthint.go). It returns how many were sent.
// HintRestartTo sends hints carrying the sessions' restart tokens.
func (l *Listener) HintRestart(ctx context.Context, peers []netip.AddrPort, perSecond int) (int, error) {
	return SendRestartHints(ctx, l.ep.tr, peers, perSecond)
}

// HintRestartTo sends hints (one per session, with its restart token)
// from the listening socket, perSecond at most (≤ 0:
// DefaultRestartHintRate). It returns how many were sent.
func (l *Listener) HintRestartTo(ctx context.Context, hints []RestartHint, perSecond int) (int, error) {
	return SendRestartHintsTo(ctx, l.ep.tr, hints, perSecond)
}
