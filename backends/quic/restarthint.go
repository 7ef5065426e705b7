package quic

// Restart hints (docs/protocols/internal/restart-hint.md). A QUIC peer
// that crashed loses its connections without a word: UDP has no FIN, and
// the peer on the other side finds out only when it next sends (the
// restarted process answers that packet with a stateless reset, its reset
// key surviving the restart). An idle agent sends every heartbeat interval
// (10 s by default), so it would notice a restart that late. Instead the
// restarted daemon sends one restart hint to every address its previous
// process held a connection with, from its listening socket (so that NATs
// and firewalls that let the daemon's packets through let the hint
// through). A hint is a datagram that is not QUIC — its first byte has both
// high bits clear (RFC 9443 §5 leaves such packets to the application;
// quic-go hands them to Transport.ReadNonQUICPacket) — and carries no
// secret: it asks the agent to send on its connection now (a heartbeat),
// and only the stateless reset that packet draws, which QUIC
// authenticates, ends the connection. A forged hint costs one heartbeat.

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	quicgo "github.com/quic-go/quic-go"
)

// restartHint is the hint datagram: a zero byte (not QUIC), "FYRH" and
// the format version 1. Receivers accept longer packets that start with
// it (room for later fields).
var restartHint = []byte{0x00, 'F', 'Y', 'R', 'H', 0x01}

// maxRestartHint bounds what a receiver reads of a non-QUIC packet.
const maxRestartHint = 64

// DefaultRestartHintRate is how many hints per second SendRestartHints
// sends when given no rate: 10,000 agents hear of a restart within a
// second, and the stateless resets their heartbeats draw arrive spread
// over that second rather than in one burst (quic-go queues only four
// resets at a time and drops the rest).
const DefaultRestartHintRate = 10000

// IsRestartHint reports whether p is a restart hint.
func IsRestartHint(p []byte) bool { return bytes.HasPrefix(p, restartHint) }

// SendRestartHints sends one restart hint to each of peers from tr (the
// listening transport), at most perSecond per second (≤ 0: the default),
// in batches every millisecond. It returns how many were sent; it stops
// early when ctx ends or tr's socket closes (an address the socket cannot
// send to is skipped).
func SendRestartHints(ctx context.Context, tr *quicgo.Transport, peers []netip.AddrPort, perSecond int) (int, error) {
	if perSecond <= 0 {
		perSecond = DefaultRestartHintRate
	}
	const tick = time.Millisecond
	batch := max(1, perSecond/int(time.Second/tick))
	t := time.NewTicker(tick)
	defer t.Stop()
	sent := 0
	for i, p := range peers {
		if i > 0 && i%batch == 0 {
			select {
			case <-ctx.Done():
				return sent, ctx.Err()
			case <-t.C:
			}
		}
		if !p.IsValid() || p.Port() == 0 {
			continue
		}
		if _, err := tr.WriteTo(restartHint, net.UDPAddrFromAddrPort(p)); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return sent, err
			}
			continue // one peer's address (unreachable, wrong family)
		}
		sent++
	}
	return sent, nil
}

// WatchRestartHints reads the non-QUIC packets arriving at tr (a client
// transport) until ctx ends or tr closes, and calls onHint with the sender
// of every restart hint. Other non-QUIC packets are ignored.
func WatchRestartHints(ctx context.Context, tr *quicgo.Transport, onHint func(from netip.AddrPort)) {
	buf := make([]byte, maxRestartHint)
	for {
		n, from, err := tr.ReadNonQUICPacket(ctx, buf)
		if err != nil {
			return
		}
		if !IsRestartHint(buf[:n]) {
			continue
		}
		if ap, ok := addrPort(from); ok {
			onHint(ap)
		}
	}
}

// addrPort is a's address and port, IPv4-mapped IPv6 unmapped.
func addrPort(a net.Addr) (netip.AddrPort, bool) {
	ua, ok := a.(*net.UDPAddr)
	if !ok {
		return netip.AddrPort{}, false
	}
	ap := ua.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), ap.IsValid()
}
