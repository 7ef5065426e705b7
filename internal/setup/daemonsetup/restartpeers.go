package daemonsetup

import (
	"context"
	"net/netip"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics/authority"
)

// RestartPeers reads, before the daemon serves, where the sessions its
// previous process held (daemon id) were connected: the agents that a
// crash left with a dead QUIC connection. TCP agents learnt of the crash
// from their kernel (the dead process's sockets were closed) and are left
// out. A nil p (an authority without the peer list) reads nothing.
func RestartPeers(ctx context.Context, p authority.Peers, id string) (map[string][]netip.AddrPort, error) {
	if p == nil {
		return nil, nil
	}
	held, err := p.HeldBy(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	out := map[string][]netip.AddrPort{}
	seen := map[netip.AddrPort]bool{} // agents behind one socket (NAT, a fleet) share an address
	for _, h := range held {
		ap, err := netip.ParseAddrPort(h.Remote)
		if err != nil || seen[ap] {
			continue
		}
		seen[ap] = true
		switch h.Backend {
		case config.BackendQUIC, config.BackendWebTransport:
			out[h.Backend] = append(out[h.Backend], ap)
		case "": // registered, presence not recorded yet: either UDP backend
			out[config.BackendQUIC] = append(out[config.BackendQUIC], ap)
			out[config.BackendWebTransport] = append(out[config.BackendWebTransport], ap)
		}
	}
	return out, nil
}
