package daemonsetup

import (
	"context"
	"net/netip"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/authority"
)

// RestartPeers reads, before the daemon serves, where the sessions its
// previous process held (daemon id) were connected: the agents that a
// crash left with a dead QUIC connection, one restart hint each
// (docs/protocols/internal/restart-hint.md), keyed by backend. With a
// restart token key (daemon.Config.RestartTokenKey) every session gets its
// own hint carrying its token (agents behind one address — a NAT, a load
// generator's shared socket — each need theirs); without one, agents
// behind one address share one tokenless hint. TCP agents learnt of the
// crash from their kernel (the dead process's sockets were closed) and are
// left out. A nil p (an authority without the peer list) reads nothing.
func RestartPeers(ctx context.Context, p authority.Peers, id string, tokenKey []byte) (map[string][]quic.RestartHint, error) {
	if p == nil {
		return nil, nil
	}
	held, err := p.HeldBy(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	out := map[string][]quic.RestartHint{}
	seen := map[netip.AddrPort]bool{} // tokenless: agents behind one socket share an address
	for _, h := range held {
		ap, err := netip.ParseAddrPort(h.Remote)
		if err != nil {
			continue
		}
		hint := quic.RestartHint{To: ap, Token: semantics.DeriveRestartToken(tokenKey, h.Session, h.Transport)}
		if hint.Token.IsZero() {
			if seen[ap] {
				continue
			}
			seen[ap] = true
		}
		switch h.Backend {
		case config.BackendQUIC, config.BackendWebTransport:
			out[h.Backend] = append(out[h.Backend], hint)
		case "": // registered, presence not recorded yet: either UDP backend
			out[config.BackendQUIC] = append(out[config.BackendQUIC], hint)
			out[config.BackendWebTransport] = append(out[config.BackendWebTransport], hint)
		}
	}
	return out, nil
}
