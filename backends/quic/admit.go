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

// admission counts a server Transport's handshakes in progress.
type admission struct {
	max      int // ≤ 0: unbounded
	inFlight atomic.Int64
}

// verifySourceAddress asks for a Retry above half the handshake cap.
func (a *admission) verifySourceAddress(net.Addr) bool {
	return a.max > 0 && a.inFlight.Load() >= int64(a.max/2)
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
	a := &admission{max: cfg.MaxHandshakes}
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
		if n := a.inFlight.Add(1); a.max > 0 && n > int64(a.max) {
			a.inFlight.Add(-1)
			return refuse(fmt.Errorf("%w (%d)", errTooManyHandshakes, a.max))
		}
		if admit != nil {
			if err := admit(remote); err != nil {
				a.inFlight.Add(-1)
				return refuse(err)
			}
		}
		w := &handshakeWatch{admission: a}
		ctx = context.WithValue(ctx, handshakeWatchKey{}, w)
		context.AfterFunc(ctx, func() {
			w.done()
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
	accepted  atomic.Bool
	once      sync.Once
}

// done releases the attempt's in-progress slot (once).
func (w *handshakeWatch) done() {
	w.once.Do(func() { w.admission.inFlight.Add(-1) })
}
