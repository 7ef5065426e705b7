package quic

import (
	"context"
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"forgeyard.dev/transport/semantics"
)

// A server's quic-go Transport is prepared by PrepareServerTransport: the
// stateless reset and token keys from Config.StatelessResetKey, and a
// ConnContext — quic-go calls it for every new connection attempt, after
// the client's first Initial packet and before any cryptographic work —
// that admits or refuses the attempt (Config.MaxHandshakes, Config.Admit)
// and watches the handshake's end (OnHandshakeFailure). An attempt counts
// as in progress until the listener takes its connection (Accept) or the
// connection ends.

// errTooManyHandshakes refuses an attempt beyond Config.MaxHandshakes.
var errTooManyHandshakes = errors.New("too many handshakes in progress")

// admission counts a server Transport's handshakes in progress and adapts
// the cap to how fast they complete.
//
// The cap in force (limit) starts at Config.MaxHandshakes and follows the
// handshakes' latency, additive increase and multiplicative decrease: a
// handshake accepted within handshakeLatencyTarget of its first packet
// raises it by one (up to MaxHandshakes), a slower one or a handshake that
// timed out lowers it by an eighth (down to minHandshakeLimit). The floor
// is high on purpose: on a machine whose CPU other processes take,
// handshakes are slow whatever the queue, and a low cap then only cuts
// throughput (a probe with a floor of 32 at load average 30 ran at ~2
// registrations/s). Little's
// law: a queue of handshakes the server cannot finish within the client's
// handshake idle timeout (5 s by default) only produces timeouts — work
// paid for and thrown away — while a refused attempt costs no cryptography
// and, with the client's Config.RefusalBackoff, is retried within the same
// dial once the server has room.
type admission struct {
	max      int // ≤ 0: unbounded
	inFlight atomic.Int64
	limit    atomic.Int64 // the cap in force, minHandshakeLimit..max
}

// handshakeLatencyTarget is the handshake latency (first packet to Accept)
// the adaptive cap aims below; minHandshakeLimit is its floor.
const (
	handshakeLatencyTarget = 2 * time.Second
	minHandshakeLimit      = 128
)

func newAdmission(max int) *admission {
	a := &admission{max: max}
	a.limit.Store(int64(max))
	return a
}

// observe adapts the cap to one handshake that took d (slow: it timed out).
func (a *admission) observe(d time.Duration, slow bool) {
	if a.max <= 0 {
		return
	}
	floor := int64(min(minHandshakeLimit, a.max))
	for {
		old := a.limit.Load()
		n := min(old+1, int64(a.max))
		if slow || d > handshakeLatencyTarget {
			n = max(old-old/8, floor)
		}
		if n == old || a.limit.CompareAndSwap(old, n) {
			return
		}
	}
}

// Limit returns the handshake cap in force.
func (a *admission) Limit() int64 { return a.limit.Load() }

// verifySourceAddress asks for a Retry above half the handshake cap.
func (a *admission) verifySourceAddress(net.Addr) bool {
	return a.max > 0 && a.inFlight.Load() >= a.limit.Load()/2
}

// PrepareServerTransport sets tr up to serve incoming connections as cfg
// says: the stateless reset and token keys (Config.StatelessResetKey), the
// handshake admission (Config.MaxHandshakes, Config.Admit) and the
// failed-handshake reports to cfg.OnHandshakeFailure as backend. Call it
// before tr.Listen; pass every connection tr's listener returns to
// HandshakeAccepted. Listen does this itself; it is exported for
// backends/webtransport, which runs its own Transport.
func PrepareServerTransport(tr *quicgo.Transport, backend string, cfg Config) {
	cfg = cfg.withDefaults()
	if k := cfg.StatelessResetKey; k != nil {
		reset := quicgo.StatelessResetKey(*k)
		tr.StatelessResetKey = &reset
		tok := quicgo.TokenGeneratorKey(deriveKey(k[:], "forgeyard quic token key"))
		tr.TokenGeneratorKey = &tok
	}
	a := newAdmission(cfg.MaxHandshakes)
	if a.max > 0 {
		tr.VerifySourceAddress = a.verifySourceAddress
	}
	hook, admit := cfg.OnHandshakeFailure, cfg.Admit
	tr.ConnContext = func(ctx context.Context, info *quicgo.ClientInfo) (context.Context, error) {
		remote := info.RemoteAddr
		refuse := func(err error) (context.Context, error) {
			if hook != nil {
				f := semantics.NewHandshakeFailure(backend, remote, err, false)
				f.Reason = semantics.HandshakeOverloaded
				hook(f)
			}
			return nil, err
		}
		if n := a.inFlight.Add(1); a.max > 0 && n > a.limit.Load() {
			a.inFlight.Add(-1)
			return refuse(fmt.Errorf("%w (%d of at most %d)", errTooManyHandshakes, a.limit.Load(), a.max))
		}
		if admit != nil {
			if err := admit(remote); err != nil {
				a.inFlight.Add(-1)
				return refuse(err)
			}
		}
		w := &handshakeWatch{admission: a, start: time.Now()}
		ctx = context.WithValue(ctx, handshakeWatchKey{}, w)
		context.AfterFunc(ctx, func() {
			w.done()
			if !w.accepted.Load() && handshakeTimedOut(context.Cause(ctx)) {
				a.observe(0, true)
			}
			if w.accepted.Load() || hook == nil {
				return
			}
			cause := context.Cause(ctx)
			if acceptQueueFull(cause) {
				f := semantics.NewHandshakeFailure(backend, remote, fmt.Errorf("accept queue full: %w", cause), false)
				f.Reason = semantics.HandshakeOverloaded
				hook(f)
				return
			}
			if byPeer, err := handshakeFailure(cause); err != nil {
				hook(semantics.NewHandshakeFailure(backend, remote, err, byPeer))
			}
		})
		return ctx, nil
	}
}

// acceptQueueFull reports whether cause is quic-go refusing a connection
// whose handshake completed while its accept queue was full (a local
// CONNECTION_REFUSED).
func acceptQueueFull(cause error) bool {
	te, ok := errors.AsType[*quicgo.TransportError](cause)
	return ok && !te.Remote && te.ErrorCode == quicgo.ConnectionRefused
}

// handshakeTimedOut reports whether cause ended a handshake by timeout.
func handshakeTimedOut(cause error) bool {
	if _, ok := errors.AsType[*quicgo.HandshakeTimeoutError](cause); ok {
		return true
	}
	_, ok := errors.AsType[*quicgo.IdleTimeoutError](cause)
	return ok
}

// ResetKey derives a Config.StatelessResetKey from the server's private
// key file: secret, different for every server key, and the same across
// restarts for as long as the key file is (a certificate renewed with a
// new key changes it; connections of the previous process then end at
// their idle timeout instead, as without a key).
func ResetKey(privateKeyFile string) (*[32]byte, error) {
	pem, err := os.ReadFile(privateKeyFile)
	if err != nil {
		return nil, err
	}
	if len(pem) == 0 {
		return nil, fmt.Errorf("%s is empty", privateKeyFile)
	}
	k := deriveKey(pem, "forgeyard quic stateless reset key")
	return &k, nil
}

// deriveKey is HKDF-SHA256(secret, info) truncated to 32 bytes.
func deriveKey(secret []byte, info string) [32]byte {
	b, err := hkdf.Key(sha256.New, secret, nil, info, 32)
	if err != nil { // only for lengths above 255*32
		panic(err)
	}
	return [32]byte(b)
}

// handshakeWatchKey and handshakeWatch: see WatchHandshakes.
type handshakeWatchKey struct{}

type handshakeWatch struct {
	admission *admission
	start     time.Time // the attempt's first packet
	accepted  atomic.Bool
	once      sync.Once
}

// done releases the attempt's in-progress slot (once).
func (w *handshakeWatch) done() {
	w.once.Do(func() { w.admission.inFlight.Add(-1) })
}
