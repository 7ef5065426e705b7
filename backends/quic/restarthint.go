package quic

// Restart hints (docs/protocols/internal/restart-hint.md). A QUIC peer
// that crashed loses its connections without a word: UDP has no FIN, and
// the peer on the other side finds out only when it next sends (the
// restarted process answers that packet with a stateless reset, its reset
// key surviving the restart). An idle agent sends every heartbeat interval
// (10 s by default), so it would notice a restart that late. Instead the
// restarted daemon sends a restart hint to every session its previous
// process held, from its listening socket (so that NATs and firewalls
// that let the daemon's packets through let the hint through). A hint is
// a datagram that is not QUIC — its first byte has both high bits clear
// (RFC 9443 §5 leaves such packets to the application; a dialling socket
// takes them out of quic-go's read path, NewHintSocket). It carries the session's restart token
// (semantics.RestartToken) when the daemon has one: a connection the
// engine armed with that token ends at once (semantics.RestartTokenHinter).
// A hint without a token, or one the connection cannot check, only asks
// the agent to send on its connection now (a heartbeat), and only the
// stateless reset that packet draws, which QUIC authenticates, or the
// silence after it ends the connection. A forged hint costs one heartbeat.

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"time"

	quicgo "github.com/quic-go/quic-go"
	"golang.org/x/net/ipv4"

	"forgeyard.dev/transport/semantics"
)

// restartHint is the hint datagram's header: a zero byte (not QUIC),
// "FYRH" and the format version 1. Receivers accept longer packets that
// start with it (room for later fields). The first such field is the
// restart token: key id (4 bytes) ‖ token (16 bytes), 26 bytes in all;
// receivers that predate it read a 26-byte hint as a tokenless one, so it
// keeps the version byte (a new version would be ignored by them).
var restartHint = []byte{0x00, 'F', 'Y', 'R', 'H', 0x01}

// restartHintTokenLen is the length of a hint carrying a token.
const restartHintTokenLen = 6 + 4 + 16

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

// AppendRestartHint appends the hint datagram carrying tok (zero: the
// tokenless 6-byte hint) to b.
func AppendRestartHint(b []byte, tok semantics.RestartToken) []byte {
	b = append(b, restartHint...)
	if tok.IsZero() {
		return b
	}
	b = append(b, tok.KeyID[:]...)
	return append(b, tok.Token[:]...)
}

// ParseRestartHint reports whether p is a restart hint and returns the
// token it carries (zero: none; a hint shorter than a token's is a
// tokenless one).
func ParseRestartHint(p []byte) (semantics.RestartToken, bool) {
	var tok semantics.RestartToken
	if !IsRestartHint(p) {
		return tok, false
	}
	if len(p) >= restartHintTokenLen {
		copy(tok.KeyID[:], p[6:10])
		copy(tok.Token[:], p[10:26])
	}
	return tok, true
}

// RestartHint is one hint SendRestartHints sends: to an agent's address,
// with its session's token (zero: a tokenless hint).
type RestartHint struct {
	To    netip.AddrPort
	Token semantics.RestartToken
}

// SendRestartHints sends one tokenless restart hint to each of peers from
// tr, as SendRestartHintsTo does (the hints of a daemon without restart
// tokens: agents then answer with a heartbeat probe).
func SendRestartHints(ctx context.Context, tr *quicgo.Transport, peers []netip.AddrPort, perSecond int) (int, error) {
	hints := make([]RestartHint, len(peers))
	for i, p := range peers {
		hints[i].To = p
	}
	return SendRestartHintsTo(ctx, tr, hints, perSecond)
}

// TokenHintBoost is how much faster than the tokenless rate the hints
// carrying a token are sent, and they go first: an agent holding its
// session's token ends its link on the hint alone (no heartbeat probe, no
// stateless reset to spread out for quic-go's queue of four), so at the
// default rate 10,000 token holders hear of a restart within a quarter of
// a second instead of a second (docs/perf.md, "The notice apart from the
// reconnection storm").
const TokenHintBoost = 4

// SendRestartHintsTo sends each of hints from tr (the listening
// transport): those carrying a token first, at TokenHintBoost × perSecond,
// then the tokenless ones at perSecond (≤ 0: the default), each pace with
// a first batch of a millisecond's worth and checked every millisecond.
// It returns how many were sent; it stops early when ctx ends or tr's
// socket closes (an address the socket cannot send to is skipped).
func SendRestartHintsTo(ctx context.Context, tr *quicgo.Transport, hints []RestartHint, perSecond int) (int, error) {
	if perSecond <= 0 {
		perSecond = DefaultRestartHintRate
	}
	var withToken, without []RestartHint
	for _, h := range hints {
		if h.Token.IsZero() {
			without = append(without, h)
		} else {
			withToken = append(withToken, h)
		}
	}
	sent, err := sendPaced(ctx, tr, withToken, perSecond*TokenHintBoost)
	if err != nil {
		return sent, err
	}
	n, err := sendPaced(ctx, tr, without, perSecond)
	return sent + n, err
}

// sendPaced sends hints at most perSecond per second.
func sendPaced(ctx context.Context, tr *quicgo.Transport, hints []RestartHint, perSecond int) (int, error) {
	const tick = time.Millisecond
	batch := max(1, perSecond/int(time.Second/tick))
	t := time.NewTicker(tick)
	defer t.Stop()
	sent := 0
	buf := make([]byte, 0, restartHintTokenLen)
	// The hints due are counted from the elapsed time, not from the
	// ticks: a restarted daemon busy with its reconnect storm wakes late
	// (measured: 3,000 hints took 597 ms at 10,000/s in batches per tick),
	// and then catches up.
	start, due := time.Now(), batch
	for i, h := range hints {
		for i >= due {
			select {
			case <-ctx.Done():
				return sent, ctx.Err()
			case <-t.C:
			}
			due = max(due, batch+int(int64(time.Since(start))*int64(perSecond)/int64(time.Second)))
		}
		p := h.To
		if !p.IsValid() || p.Port() == 0 {
			continue
		}
		if _, err := tr.WriteTo(AppendRestartHint(buf[:0], h.Token), net.UDPAddrFromAddrPort(p)); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return sent, err
			}
			continue // one peer's address (unreachable, wrong family)
		}
		sent++
	}
	return sent, nil
}

// NewHintSocket wraps udp, a dialling socket, for a quic-go Transport:
// restart hints are taken out of its read path and passed to onHint with
// their sender and token (zero: none), on quic-go's read loop — onHint
// must not block. quic-go would hand them to Transport.ReadNonQUICPacket
// through a queue of 32 and drop the rest: a restarted daemon sends one
// hint per session, and a socket shared by many connections (a load
// generator, a proxy) lost most of its hints whenever its reader was
// scheduled late (measured: 1,281 of 3,000 heard, docs/perf.md). quic-go
// drops the hints itself (non-QUIC packets, with nobody reading them).
// It reads through ReadBatch (the batch interface quic-go's OOB reader
// prefers) or ReadFrom; everything else is the embedded socket's.
func NewHintSocket(udp *net.UDPConn, onHint func(from netip.AddrPort, tok semantics.RestartToken)) net.PacketConn {
	return &hintSocket{UDPConn: udp, batch: ipv4.NewPacketConn(udp), onHint: onHint}
}

type hintSocket struct {
	*net.UDPConn
	batch  *ipv4.PacketConn
	onHint func(netip.AddrPort, semantics.RestartToken)
}

// ReadBatch reads like ipv4.PacketConn.ReadBatch and passes on the
// batch's restart hints.
func (s *hintSocket) ReadBatch(ms []ipv4.Message, flags int) (int, error) {
	n, err := s.batch.ReadBatch(ms, flags)
	for i := range n {
		m := &ms[i]
		if len(m.Buffers) > 0 && m.N <= len(m.Buffers[0]) {
			s.check(m.Buffers[0][:m.N], m.Addr)
		}
	}
	return n, err
}

// ReadFrom is the socket's ReadFrom, passing on restart hints.
func (s *hintSocket) ReadFrom(b []byte) (int, net.Addr, error) {
	n, from, err := s.UDPConn.ReadFrom(b)
	if err == nil {
		s.check(b[:n], from)
	}
	return n, from, err
}

func (s *hintSocket) check(p []byte, from net.Addr) {
	if len(p) == 0 || p[0]&0xc0 != 0 {
		return // QUIC (RFC 9443 §5: a hint has both high bits clear)
	}
	tok, ok := ParseRestartHint(p)
	if !ok {
		return
	}
	if ap, ok := addrPort(from); ok {
		s.onHint(ap, tok)
	}
}

// WatchRestartHints reads the non-QUIC packets arriving at tr (a client
// transport) until ctx ends or tr closes, and calls onHint with the sender
// of every restart hint (its token, if any, is not passed on). Other
// non-QUIC packets are ignored.
//
// Deprecated: quic-go queues 32 non-QUIC packets for it and drops the
// rest, which loses most of a restart's one-hint-per-session burst on a
// shared socket; wrap the socket with NewHintSocket instead (the dialers
// of this package and backends/webtransport do).
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

// HintTarget is the restart-hint state of one dialled connection, for
// the QUIC and WebTransport backends' semantics.RestartTokenHinter: the
// armed token and the two channels a hint lands on
// (semantics.ClassifyRestartHint). The zero value is not usable; see
// NewHintTarget.
type HintTarget struct {
	armed     atomic.Pointer[semantics.RestartToken]
	probes    atomic.Int64 // unauthenticated hints delivered (not coalesced), counted before the signal
	hints     chan struct{}
	restarted chan struct{}
}

// NewHintTarget returns a HintTarget with no token armed.
func NewHintTarget() *HintTarget {
	return &HintTarget{hints: make(chan struct{}, 1), restarted: make(chan struct{}, 1)}
}

// Arm sets the connection's token. On a nil HintTarget (an accepted
// connection, which hears no hints) it does nothing, and Hints and
// Restarted return nil, so a backend's connection passes its methods on
// without checking.
func (h *HintTarget) Arm(t semantics.RestartToken) {
	if h != nil {
		h.armed.Store(&t)
	}
}

// Hints is the channel of unauthenticated hints (semantics.PeerHinter).
func (h *HintTarget) Hints() <-chan struct{} {
	if h == nil {
		return nil
	}
	return h.hints
}

// Restarted is the channel of hints carrying the armed token
// (semantics.RestartTokenHinter.PeerRestarted).
func (h *HintTarget) Restarted() <-chan struct{} {
	if h == nil {
		return nil
	}
	return h.restarted
}

// Deliver passes a hint carrying tok (zero: none) from the connection's
// peer to the channel its verdict names, and returns the verdict.
func (h *HintTarget) Deliver(tok semantics.RestartToken) semantics.HintVerdict {
	var armed semantics.RestartToken
	if p := h.armed.Load(); p != nil {
		armed = *p
	}
	v := semantics.ClassifyRestartHint(armed, tok)
	var ch chan struct{}
	switch v {
	case semantics.HintProbe:
		h.probes.Add(1)
		ch = h.hints
	case semantics.HintRestarted:
		ch = h.restarted
	default:
		return v
	}
	select {
	case ch <- struct{}{}:
	default: // one pending is enough
	}
	return v
}
