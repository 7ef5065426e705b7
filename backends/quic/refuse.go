package quic

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	quicgo "github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/quicvarint"
	"golang.org/x/net/ipv4"
)

// Refusals that are heard (docs/protocols/internal/admission.md).
//
// quic-go answers an attempt its ConnContext refuses with a
// CONNECTION_REFUSED packet from a queue of 4; under a herd of Initials
// the rest are dropped, and a refused client hears nothing until its
// handshake idle timeout (5 s), then tries again with a new ClientHello.
// So a server Transport's socket is wrapped (initialFilter): the read
// path sees each batch of datagrams before quic-go does, decides about
// every client Initial that opens a new attempt (QUIC v1 or v2, no token,
// a destination connection ID of 8 bytes or more — the client's own
// choice, never one of this server's 4-byte IDs), and answers a refused
// one itself with a CONNECTION_REFUSED Initial (RFC 9000 §10.2.3, sealed
// with the Initial keys of RFC 9001 §5.2) whose reason phrase carries a
// retry hint ("retry_after_ms=N"). The refused datagram is then hidden
// from quic-go (its first byte cleared: a non-QUIC packet, which a
// server Transport drops). One packet answers one refused Initial; no
// state is kept for it but its connection ID for a while (retransmits of
// a refused Initial are refused again, of an admitted one passed on).

// refusalHintKey prefixes the retry hint in a refusal's reason phrase.
const refusalHintKey = "retry_after_ms="

// refusalHint returns the retry hint of a server's refusal before the
// handshake (a CONNECTION_REFUSED whose reason says "retry_after_ms=N"),
// and whether err is such a refusal at all.
func refusalHint(err error) (time.Duration, bool) {
	te, ok := errors.AsType[*quicgo.TransportError](err)
	if !ok || !te.Remote || te.ErrorCode != quicgo.ConnectionRefused {
		return 0, false
	}
	_, after, found := strings.Cut(te.ErrorMessage, refusalHintKey)
	if !found {
		return 0, true
	}
	if i := strings.IndexFunc(after, func(r rune) bool { return r < '0' || r > '9' }); i >= 0 {
		after = after[:i]
	}
	ms, err := strconv.ParseUint(after, 10, 32)
	if err != nil {
		return 0, true
	}
	return min(time.Duration(ms)*time.Millisecond, maxRetryHint), true
}

// maxRetryHint bounds the retry hint a refusal carries (and a dialer
// obeys).
const maxRetryHint = 60 * time.Second

// retryError is a dial that the server refused before its handshake with
// a retry hint longer than the dial had time left for: try again after
// RetryAfter (semantics/agent's reconnect loop obeys any error with that
// method).
type retryError struct {
	After time.Duration
	Err   error
}

func (e *retryError) Error() string {
	return fmt.Sprintf("%v (server asks to retry after %v)", e.Err, e.After.Round(time.Millisecond))
}
func (e *retryError) Unwrap() error { return e.Err }

// RetryAfter is the server's retry hint.
func (e *retryError) RetryAfter() time.Duration { return e.After }

// QUIC versions the filter can answer (RFC 9000, RFC 9369).
const (
	version1 = 0x00000001
	version2 = 0x6b3343cf
)

var (
	initialSaltV1 = []byte{0x38, 0x76, 0x2c, 0xf7, 0xf5, 0x59, 0x34, 0xb3, 0x4d, 0x17, 0x9a, 0xe6, 0xa4, 0xc8, 0x0c, 0xad, 0xcc, 0xbb, 0x7f, 0x0a}
	initialSaltV2 = []byte{0x0d, 0xed, 0xe3, 0xde, 0xf7, 0x00, 0xa6, 0xdb, 0x81, 0x93, 0x81, 0xbe, 0x6e, 0x26, 0x9d, 0xcb, 0xf9, 0xbd, 0x2e, 0xd9}
)

// minClientInitialDCID is RFC 9000 §7.2's minimum length of the
// destination connection ID of a client's first Initial; quic-go drops
// a shorter one (without a token) itself.
const minClientInitialDCID = 8

// initialHeader is what the filter reads of a client Initial.
type initialHeader struct {
	version    uint32
	dcid, scid []byte
}

// parseNewInitial returns the header of p when p is a client Initial
// that opens a new attempt: long header, QUIC v1 or v2, Initial type, no
// token, a destination connection ID of at least 8 bytes.
func parseNewInitial(p []byte) (initialHeader, bool) {
	var h initialHeader
	if len(p) < 7 || p[0]&0xc0 != 0xc0 {
		return h, false
	}
	h.version = binary.BigEndian.Uint32(p[1:5])
	typ := (p[0] >> 4) & 3
	switch {
	case h.version == version1 && typ == 0, h.version == version2 && typ == 1:
	default:
		return h, false
	}
	p = p[5:]
	n := int(p[0])
	if n < minClientInitialDCID || n > 20 || len(p) < 1+n+1 {
		return h, false
	}
	h.dcid, p = p[1:1+n], p[1+n:]
	n = int(p[0])
	if n > 20 || len(p) < 1+n+1 {
		return h, false
	}
	h.scid, p = p[1:1+n], p[1+n:]
	tok, _, err := quicvarint.Parse(p)
	if err != nil || tok != 0 {
		return h, false
	}
	return h, true
}

// expandLabel is TLS 1.3's HKDF-Expand-Label with an empty context.
func expandLabel(secret []byte, label string, n int) []byte {
	full := "tls13 " + label
	info := make([]byte, 0, 4+len(full))
	info = binary.BigEndian.AppendUint16(info, uint16(n))
	info = append(info, byte(len(full)))
	info = append(info, full...)
	info = append(info, 0)
	b, err := hkdf.Expand(sha256.New, secret, string(info), n)
	if err != nil { // only for n > 255*32
		panic(err)
	}
	return b
}

// appendRefusal appends to b the server's CONNECTION_REFUSED Initial
// answering a client Initial with header h, reason as its reason phrase.
func appendRefusal(b []byte, h initialHeader, reason string) ([]byte, error) {
	salt, prefix, typ := initialSaltV1, "quic ", byte(0)
	if h.version == version2 {
		salt, prefix, typ = initialSaltV2, "quicv2 ", 1
	}
	initial, err := hkdf.Extract(sha256.New, h.dcid, salt)
	if err != nil {
		return nil, err
	}
	secret := expandLabel(initial, "server in", 32)
	key, iv, hp := expandLabel(secret, prefix+"key", 16), expandLabel(secret, prefix+"iv", 12), expandLabel(secret, prefix+"hp", 16)
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	// CONNECTION_CLOSE (transport): type 0x1c, error CONNECTION_REFUSED,
	// frame type 0, reason phrase.
	var frame []byte
	frame = quicvarint.Append(frame, 0x1c)
	frame = quicvarint.Append(frame, uint64(quicgo.ConnectionRefused))
	frame = quicvarint.Append(frame, 0)
	frame = quicvarint.Append(frame, uint64(len(reason)))
	frame = append(frame, reason...)
	const pnLen = 4 // packet number 0, four bytes (as quic-go): the sample starts at the payload
	start := len(b)
	b = append(b, 0xc0|typ<<4|(pnLen-1))
	b = binary.BigEndian.AppendUint32(b, h.version)
	b = append(b, byte(len(h.scid)))
	b = append(b, h.scid...)
	b = append(b, byte(len(h.dcid)))
	b = append(b, h.dcid...)
	b = quicvarint.Append(b, 0) // no token
	b = quicvarint.AppendWithLen(b, uint64(pnLen+len(frame)+aead.Overhead()), 2)
	pnOffset := len(b) - start
	b = append(b, 0, 0, 0, 0)
	hdr := b[start:]
	nonce := make([]byte, len(iv)) // packet number 0: the IV itself
	copy(nonce, iv)
	b = aead.Seal(b, nonce, frame, hdr)
	pkt := b[start:]
	// Header protection (RFC 9001 §5.4).
	hpBlock, err := aes.NewCipher(hp)
	if err != nil {
		return nil, err
	}
	var mask [16]byte
	hpBlock.Encrypt(mask[:], pkt[pnOffset+4:pnOffset+4+16])
	pkt[0] ^= mask[0] & 0x0f
	for i := range pnLen {
		pkt[pnOffset+i] ^= mask[1+i]
	}
	return b, nil
}

// initialFilter is a server Transport's socket with the admission's
// decision on each new client Initial in its read path (see above).
// quic-go reads through ReadBatch (the batch interface its OOB reader
// prefers); everything else is the embedded socket's.
type initialFilter struct {
	*net.UDPConn
	batch  *ipv4.PacketConn
	decide func(remote net.Addr) (refusal string, refused bool)

	// Read by one goroutine (quic-go's read loop): no lock.
	seen  map[string]seenInitial
	swept time.Time

	// The refusals are sealed and written by a goroutine of their own
	// (sendRefusals), never on the read path: a read loop that paid a
	// refusal's key derivation and write per refused Initial fell behind
	// a herd, and the socket's queue (megabytes of Initials) then delayed
	// the admitted handshakes' own packets by seconds, and overflowed.
	// Full queue: the refusal is dropped (counted); the client's
	// retransmitted Initial is refused again.
	out     chan refusalJob
	sending atomic.Bool
	dropped atomic.Int64
}

// refusalJob is one refusal to send: the client Initial's header, copied
// out of the read buffer that quic-go reuses.
type refusalJob struct {
	version    uint32
	dcid, scid [20]byte
	dl, sl     uint8
	reason     string
	to         net.Addr
}

// refusalQueue bounds the refusals waiting to be sent (≈ 100 B each).
const refusalQueue = 8192

// seenInitial remembers the decision on an attempt's connection ID, so
// that its retransmitted Initials get the same one.
type seenInitial struct {
	refused bool
	until   time.Time
}

const (
	// seenFor is how long a decision is remembered: longer than a
	// handshake may last (DefaultHandshakeTimeout's quic-go bound).
	seenFor = 2*DefaultHandshakeTimeout + 5*time.Second
	// maxSeen bounds the remembered decisions (≈ 60 B each); beyond it
	// new attempts are refused without being remembered.
	maxSeen = 1 << 18
)

func newInitialFilter(udp *net.UDPConn, decide func(net.Addr) (string, bool)) *initialFilter {
	return &initialFilter{UDPConn: udp, batch: ipv4.NewPacketConn(udp), decide: decide, seen: map[string]seenInitial{}, out: make(chan refusalJob, refusalQueue)}
}

// ReadBatch reads like ipv4.PacketConn.ReadBatch, then answers and hides
// the refused Initials of the batch.
func (f *initialFilter) ReadBatch(ms []ipv4.Message, flags int) (int, error) {
	n, err := f.batch.ReadBatch(ms, flags)
	for i := range n {
		m := &ms[i]
		if len(m.Buffers) == 0 || m.N > len(m.Buffers[0]) {
			continue
		}
		if f.refuse(m.Buffers[0][:m.N], m.Addr) {
			m.Buffers[0][0] = 0 // no QUIC fixed bit: quic-go drops it
		}
	}
	return n, err
}

// refuse decides about p from remote and answers a refusal; it reports
// whether p is to be hidden from quic-go.
func (f *initialFilter) refuse(p []byte, remote net.Addr) bool {
	h, ok := parseNewInitial(p)
	if !ok {
		return false
	}
	now := time.Now()
	s, known := f.seen[string(h.dcid)]
	if known && now.After(s.until) {
		known = false
	}
	reason := "overloaded"
	switch {
	case known && !s.refused:
		return false
	case !known:
		var refused bool
		if f.full(now) {
			refused = true // too many attempts remembered to tell their retransmits apart
		} else {
			reason, refused = f.decide(remote)
			f.seen[string(h.dcid)] = seenInitial{refused: refused, until: now.Add(seenFor)}
		}
		if !refused {
			return false
		}
	}
	j := refusalJob{version: h.version, dl: uint8(len(h.dcid)), sl: uint8(len(h.scid)), reason: reason, to: remote}
	copy(j.dcid[:], h.dcid)
	copy(j.scid[:], h.scid)
	select {
	case f.out <- j:
		if f.sending.CompareAndSwap(false, true) {
			go f.sendRefusals()
		}
	default:
		f.dropped.Add(1)
	}
	return true
}

// sendRefusals seals and writes the queued refusals; it returns once the
// queue stayed empty for a second (started again by the next refusal),
// so an idle listener holds no goroutine for it.
func (f *initialFilter) sendRefusals() {
	var buf []byte
	idle := time.NewTimer(time.Second)
	defer idle.Stop()
	for {
		select {
		case j := <-f.out:
			h := initialHeader{version: j.version, dcid: j.dcid[:j.dl], scid: j.scid[:j.sl]}
			var err error
			if buf, err = appendRefusal(buf[:0], h, j.reason); err == nil {
				_, _ = f.UDPConn.WriteTo(buf, j.to)
			}
			idle.Reset(time.Second) // Go ≥ 1.23: no stale tick after Reset
		case <-idle.C:
			f.sending.Store(false)
			// A refusal queued after the timer fired and before the flag
			// was cleared saw the flag set and started no sender.
			if len(f.out) == 0 || !f.sending.CompareAndSwap(false, true) {
				return
			}
			idle.Reset(time.Second)
		}
	}
}

// full reports whether the table of decisions is full, after dropping
// the expired ones (at most once a second).
func (f *initialFilter) full(now time.Time) bool {
	if len(f.seen) >= maxSeen/2 && now.Sub(f.swept) > time.Second {
		for k, v := range f.seen {
			if now.After(v.until) {
				delete(f.seen, k)
			}
		}
		f.swept = now
	}
	return len(f.seen) >= maxSeen
}
