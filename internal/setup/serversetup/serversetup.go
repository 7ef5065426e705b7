// Package serversetup is what the two server roles, forgeyard-daemon and
// forgeyard-relay, both assemble from their configuration: the mTLS server
// configuration, its certificate reloader (SIGHUP and a periodic check),
// the failed-handshake reporter, and the backend listeners. It is the only
// place that knows which backend package listens for which config.Listen
// key.
//
// It knows no engine: the daemon's own assembly (authority, identity) is
// package daemonsetup, the relay's (upstream TLS) package relaysetup, the
// agent's (credential, dialers, fallback) package agentsetup. It imports
// backends, so only cmd/ and internal test tooling use it; semantics/
// never does.
package serversetup

import (
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/webtransport"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/trust"
)

// ServerTLS builds the daemon's mTLS server configuration (client
// certificates required and verified against tls.client_ca).
func ServerTLS(c config.ServerTLS) (*tls.Config, error) {
	tc, err := trust.ServerConfig(trust.ServerFiles{
		CertFile: c.Certificate, KeyFile: c.PrivateKey, ClientCAFile: c.ClientCA, RequireClientCert: true,
	})
	if err != nil {
		return nil, config.WithTrustKeys(err, config.ServerTLSKeys)
	}
	if tc.CurvePreferences, err = config.ParseCurves("tls.curves", c.Curves); err != nil {
		return nil, err
	}
	// tls.disable_session_tickets; otherwise tickets use crypto/tls's
	// per-process keys unless the daemon installs the authority's
	// (SessionTickets.Install).
	tc.SessionTicketsDisabled = c.DisableSessionTickets
	return tc, nil
}

// ResetKey returns the QUIC stateless reset key of a server's listeners
// (quic.Config.StatelessResetKey): from keyFile when set (at least 32
// bytes of secret), else derived from the TLS private key file.
func ResetKey(keyFile string, t config.ServerTLS) (*[32]byte, error) {
	if keyFile == "" {
		k, err := quic.ResetKey(t.PrivateKey)
		if err != nil {
			return nil, fmt.Errorf("tls.private_key: deriving the QUIC stateless reset key: %w", err)
		}
		return k, nil
	}
	b, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("listen.stateless_reset_key_file: %w", err)
	}
	if len(b) < 32 {
		return nil, fmt.Errorf("listen.stateless_reset_key_file: %s holds %d bytes, want at least 32 (e.g. head -c 32 /dev/urandom > %s)", keyFile, len(b), keyFile)
	}
	k, err := quic.ResetKey(keyFile)
	if err != nil {
		return nil, fmt.Errorf("listen.stateless_reset_key_file: %w", err)
	}
	return k, nil
}

// Listener is one backend listener.
type Listener struct {
	Backend string // config.BackendQUIC, ...
	semantics.BackendListener
}

// Listen opens a listener for every configured backend. On error, the
// listeners already opened are closed. qcfg tunes QUIC and WebTransport;
// ycfg tunes yamux (zero values are the backend defaults).
func Listen(l config.Listen, tlsConf *tls.Config, qcfg quic.Config, ycfg yamux.Config) ([]Listener, error) {
	var out []Listener
	fail := func(key string, err error) ([]Listener, error) {
		for _, o := range out {
			o.Close()
		}
		return nil, fmt.Errorf("listen.%s: %w", key, err)
	}
	if l.QUIC != "" {
		ln, err := quic.Listen(l.QUIC, tlsConf, qcfg)
		if err != nil {
			return fail("quic", err)
		}
		out = append(out, Listener{config.BackendQUIC, ln})
	}
	if l.Yamux != "" {
		ln, err := yamux.Listen(l.Yamux, tlsConf, ycfg)
		if err != nil {
			return fail("yamux", err)
		}
		out = append(out, Listener{config.BackendYamux, ln})
	}
	if l.WebTransport != "" {
		ln, err := webtransport.Listen(l.WebTransport, tlsConf, qcfg)
		if err != nil {
			return fail("webtransport", err)
		}
		out = append(out, Listener{config.BackendWebTransport, ln})
	}
	return out, nil
}

// RestartHinter is a listener that can send restart hints from its socket
// (the QUIC and WebTransport listeners; see backends/quic.SendRestartHints).
type RestartHinter interface {
	HintRestartTo(ctx context.Context, hints []quic.RestartHint, perSecond int) (int, error)
}

// RestartTokenKey derives the daemon's restart token key
// (daemon.Config.RestartTokenKey) from its QUIC stateless reset key
// (ResetKey): secret, and the same after a restart for as long as the
// reset key is — which is what a restarted daemon needs to derive the
// tokens its previous process gave. Nil for a nil reset key.
func RestartTokenKey(resetKey *[32]byte) []byte {
	if resetKey == nil {
		return nil
	}
	k, err := hkdf.Key(sha256.New, resetKey[:], nil, "forgeyard restart token key", 32)
	if err != nil { // only for lengths above 255*32
		panic(err)
	}
	return k
}

// HintRestart sends the restart hints for peers (RestartPeers) from the
// listeners of their backends, at perSecond (≤ 0: the QUIC default), and
// logs what it sent. It returns the number sent.
func HintRestart(ctx context.Context, log *slog.Logger, peers map[string][]quic.RestartHint, ls []Listener, perSecond int) int {
	total := 0
	for _, l := range ls {
		h, ok := l.BackendListener.(RestartHinter)
		if !ok || len(peers[l.Backend]) == 0 {
			continue
		}
		start := time.Now()
		n, err := h.HintRestartTo(ctx, peers[l.Backend], perSecond)
		total += n
		if err != nil && ctx.Err() == nil {
			log.Warn("restart hints not all sent", "backend", l.Backend, "sent", n, "peers", len(peers[l.Backend]), "err", err)
			continue
		}
		log.Info("restart hints sent to the agents of the previous process", "backend", l.Backend, "sent", n,
			"took", time.Since(start).Round(time.Millisecond).String())
	}
	return total
}
