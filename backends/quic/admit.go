package quic

import (
	"context"
	"crypto"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"forgeyard.dev/transport/semantics/ratemeter"
	"io"
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

// Alike in shape to other packages' sentinel-error blocks, but these are
// this admission's own refusal reasons.
// errTooManyHandshakes refuses an attempt beyond Config.MaxHandshakes;
// errQueueFull one whose wait for a handshake worker would exceed
// Config.HandshakeQueueWait at the measured rate; errQueueWait fails an
// admitted attempt that still found no worker after it.
var (
	errTooManyHandshakes = errors.New("too many handshakes in progress")
	errQueueFull         = errors.New("handshake queue full")
	errWindowFull        = errors.New("admission window full")
	errQueueWait         = errors.New("waited too long for a handshake worker")
)

// Admission is a server Transport's handshake admission: a bounded queue
// in front of a fixed number of handshake workers.
//
// Every attempt quic-go sees (ConnContext, after the client's first
// Initial, before any cryptography) is either admitted or refused at once.
// An admitted attempt's TLS handshake waits in GetConfigForClient (FIFO:
// Go's channel waiters) until one of Config.HandshakeWorkers slots is
// free, and gives it back when the server's own cryptography is done —
// after its CertificateVerify signature (a resumed handshake, which signs
// nothing, when it ends). So at most HandshakeWorkers handshakes compete
// for the CPU at once and each one that starts finishes in milliseconds,
// where a server that starts them all (raw quic-go) spreads its CPU over
// thousands of handshakes until the clients' handshake timeout throws
// them away. A slot is not held while the server waits for the client's
// flight: a slow (CPU-starved, far) peer does not slow the others, and
// the rate does not fall because the peers are slow.
//
// The queue is bounded by time, measured: the rate at which slots are
// given back while attempts wait is the server's own handshake rate, and
// an attempt that would wait longer than Config.HandshakeQueueWait at
// that rate (below the clients' 5 s handshake idle timeout) is refused
// before its handshake (CONNECTION_REFUSED), as is one beyond
// Config.MaxHandshakes (the memory bound).
//
// When the Transport's socket is a *net.UDPConn, the decision is taken in
// its read path instead (refuse.go), so that every refusal is heard: the
// daemon answers each refused Initial with its own CONNECTION_REFUSED
// packet carrying an appointment (retry_after_ms, spread at the rate
// attempts are taken in: appointment), where quic-go's refusal queue drops all but 4
// (docs/protocols/internal/admission.md).
type Admission struct {
	max      int           // attempts in progress, queued or working; ≤ 0: unbounded
	maxWait  time.Duration // the longest an attempt may wait for a worker
	slots    chan struct{} // one token per working handshake
	inFlight atomic.Int64  // attempts in progress (admitted, not yet accepted or ended)
	waiting  atomic.Int64  // attempts waiting for a slot
	rate     ratemeter.Meter
	// maxWorking is the most slots ever held at once (≤ HandshakeWorkers).
	maxWorking atomic.Int64

	started, completed, refused, timedOut, failed, signed atomic.Int64

	// filtered: the Transport's socket is an initialFilter, which
	// decides about every new unverified attempt (refuse.go); quic-go's
	// ConnContext then only counts them.
	filtered bool
	// unsent is the filter's count of refusals its queue had no room for
	// (nil without the filter).
	unsent *atomic.Int64
	// The hooks (Config.Admit, Config.Backlog, the refusal report),
	// behind a pointer so that Admission stays comparable.
	hooks *admissionHooks

	// The appointments of refused attempts (appointment): the intake
	// (admissions per second while others are refused), the last refusal
	// (unix ns), the book.
	intake      ratemeter.Meter
	lastRefusal atomic.Int64
	apMu        sync.Mutex
	next        time.Time
}

// listenerReceiveBuffer is the SO_RCVBUF a listener asks for (32 MiB,
// beyond quic-go's 7 MiB): every agent's packets arrive on this one
// socket, and under a herd the Go scheduler can leave quic-go's read loop
// runnable but not running for hundreds of milliseconds (docs/perf.md
// §10, sixth ladder); a deeper queue delays those packets instead of
// dropping them (a dropped handshake packet costs its sender a PTO, about
// a second). It is memory only while packets wait.
const listenerReceiveBuffer = 32 << 20

// admissionHooks are an Admission's callbacks.
type admissionHooks struct {
	admit    func(net.Addr) error
	backlog  func() (int, float64)
	onRefuse func(remote net.Addr, err error)
}

func newAdmission(cfg Config) *Admission {
	return &Admission{max: cfg.MaxHandshakes, maxWait: cfg.HandshakeQueueWait, slots: make(chan struct{}, cfg.HandshakeWorkers),
		hooks: &admissionHooks{admit: cfg.Admit, backlog: cfg.Backlog}}
}

// check reports why a new attempt from remote is refused (nil: admit
// it): the handshake bound and queue (full), then Config.Admit.
func (a *Admission) check(remote net.Addr) error {
	if err := a.full(); err != nil {
		return err
	}
	if a.hooks.admit != nil {
		return a.hooks.admit(remote)
	}
	return nil
}

// decideNew is the initialFilter's decision on a new attempt from
// remote: whether it is refused, and the reason phrase of the refusal
// with its retry hint (appointment).
func (a *Admission) decideNew(remote net.Addr) (string, bool) {
	now := time.Now()
	err := a.check(remote)
	if err == nil {
		// Admitted while others are refused: room freed up (the intake).
		a.intake.Tick(now, now.UnixNano()-a.lastRefusal.Load() < int64(time.Second))
		return "", false
	}
	a.noteRefused(remote, err)
	a.lastRefusal.Store(now.UnixNano())
	if after := a.appointment(now); after > 0 {
		return fmt.Sprintf("overloaded; %s%d", refusalHintKey, after.Milliseconds()), true
	}
	return "overloaded", true
}

// noteRefused counts a refused attempt and reports it (the filter's and
// ConnContext's refusals alike).
func (a *Admission) noteRefused(remote net.Addr, err error) {
	a.refused.Add(1)
	if a.hooks.onRefuse != nil {
		a.hooks.onRefuse(remote, err)
	}
}

// appointment is the retry hint of an attempt refused at now: the time
// at which the attempts in progress will have shrunk to half their bound,
// and no earlier than one admission after the previous appointment — so
// the refused attempts come back spread at the rate they are taken in,
// into room. The rate is the intake: attempts admitted per second while
// others are being refused (the bound is then what limits them, so that
// is the rate at which room frees up, whatever limits it: the workers,
// the agents' own side of the handshake, registration). Before it is
// measured, the workers' rate or the host's, the slower; 0 while none is
// measured (the dialer's own backoff applies).
//
// The book is kept from running away: the drain is at most a window, and
// when the book reaches appointmentHorizon it starts again from the
// drain. An agent that comes back to a full window is refused again at
// the cost of one packet; a book that only grew would hand every later
// agent the same far appointment, and they would return as one herd.
func (a *Admission) appointment(now time.Time) time.Duration {
	hsRate := a.rate.Rate()
	r := hsRate
	var pending int
	var hostRate float64
	if a.hooks.backlog != nil {
		pending, hostRate = a.hooks.backlog()
		if hostRate > 0 && (r <= 0 || hostRate < r) {
			r = hostRate
		}
	}
	if in := a.intake.Rate(); in > 0 {
		r = in
	}
	if r <= 0 {
		return 0
	}
	var drain time.Duration
	if a.hooks.backlog != nil {
		over := float64(a.inFlight.Load()+int64(pending)) - float64(windowLimit(hostRate))/2
		drain = min(time.Duration(over/r*float64(time.Second)), AdmissionWindow)
	} else {
		drain = min(time.Duration(float64(a.waiting.Load())/r*float64(time.Second))-a.maxWait/2, a.maxWait/2)
	}
	a.apMu.Lock()
	defer a.apMu.Unlock()
	at := now.Add(max(drain, 0))
	if a.next.After(at) && a.next.Sub(now) < appointmentHorizon {
		at = a.next
	}
	a.next = at.Add(time.Duration(float64(time.Second) / r))
	return min(at.Sub(now), maxRetryHint)
}

// appointmentHorizon bounds the book of appointments (see appointment):
// at 540 registrations/s it holds 16,200 agents.
const appointmentHorizon = 30 * time.Second

// AdmissionStats are a listener's handshake counters since it started.
type AdmissionStats = semantics.HandshakeStats

// Stats returns the admission's counters.
func (a *Admission) Stats() AdmissionStats {
	st := AdmissionStats{Started: a.started.Load(), Completed: a.completed.Load(), Refused: a.refused.Load(),
		TimedOut: a.timedOut.Load(), Failed: a.failed.Load(), Signed: a.signed.Load(), Waiting: a.waiting.Load(), InFlight: a.inFlight.Load(), Rate: a.rate.Rate()}
	if a.unsent != nil {
		st.RefusalsUnsent = a.unsent.Load()
	}
	return st
}

// windowLimit is the end-to-end bound on attempts in progress at the
// host's intake rate (Config.Backlog).
func windowLimit(perSecond float64) int64 {
	return max(MinAdmissionWindow, int64(perSecond*AdmissionWindow.Seconds()))
}

// full reports why a new attempt is refused ("": admit it).
func (a *Admission) full() error {
	n := a.inFlight.Load()
	if a.max > 0 && n >= int64(a.max) {
		return fmt.Errorf("%w (%d of at most %d)", errTooManyHandshakes, n, a.max)
	}
	if a.hooks.backlog != nil {
		pending, hr := a.hooks.backlog()
		if total, limit := n+int64(pending), windowLimit(hr); total >= limit {
			return fmt.Errorf("%w (%d handshaking, %d awaiting registration at %.0f/s: at most %d)", errWindowFull, n, pending, hr, limit)
		}
	}
	if w := a.waiting.Load(); w > 0 {
		if r := a.rate.Rate(); r > 0 {
			if wait := time.Duration(float64(w) / r * float64(time.Second)); wait > a.maxWait {
				return fmt.Errorf("%w (%d waiting, %.0f handshakes/s: %v > %v)", errQueueFull, w, r, wait.Round(time.Millisecond), a.maxWait)
			}
		}
	}
	return nil
}

// acquire waits for a worker slot for w (in FIFO order), at most the
// queue wait and a second more (the rate estimate's slack), or until ctx
// (the connection's) ends.
func (a *Admission) acquire(ctx context.Context, w *handshakeWatch) error {
	select {
	case a.slots <- struct{}{}:
		a.took(w)
		return nil
	default:
	}
	a.waiting.Add(1)
	defer a.waiting.Add(-1)
	t := time.NewTimer(a.maxWait + time.Second)
	defer t.Stop()
	select {
	case a.slots <- struct{}{}:
		a.took(w)
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		w.queueTimeout.Store(true)
		return errQueueWait
	}
}

func (a *Admission) took(w *handshakeWatch) {
	w.slot.Store(true)
	n := int64(len(a.slots))
	for {
		m := a.maxWorking.Load()
		if n <= m || a.maxWorking.CompareAndSwap(m, n) {
			return
		}
	}
}

// release gives w's slot back (once; no-op without one).
func (a *Admission) release(w *handshakeWatch) {
	if w.slot.CompareAndSwap(true, false) {
		<-a.slots
		a.rate.Tick(time.Now(), a.waiting.Load() > 0)
	}
}

// verifySourceAddress asks for a Retry above half the handshake cap.
func (a *Admission) verifySourceAddress(net.Addr) bool {
	return a.max > 0 && a.inFlight.Load() >= int64(a.max)/2
}

// GateTLS returns a clone of conf whose handshakes take a worker slot of
// a (acquire) before the server's cryptography and give it back after its
// signature (release). The clone serves every handshake itself (its
// GetConfigForClient returns nil after acquiring, and its GetCertificate
// wraps the chosen certificate's key): a config cloned per handshake would
// stay with the connection for its life (crypto/tls keeps the config a
// handshake used; quic-go clones a returned config once more), ≈ 0.6 KiB
// per idle agent (issue 26 item 1). Only a per-client config of conf's own
// GetConfigForClient is cloned, to wrap its keys.
func (a *Admission) GateTLS(conf *tls.Config) *tls.Config {
	c := conf.Clone()
	next := conf.GetConfigForClient
	c.GetConfigForClient = func(chi *tls.ClientHelloInfo) (*tls.Config, error) {
		w := watchOf(chi)
		if w == nil { // not one of this Transport's attempts
			if next != nil {
				return next(chi)
			}
			return nil, nil
		}
		if err := a.acquire(chi.Context(), w); err != nil {
			return nil, err
		}
		if next != nil {
			nc, err := next(chi)
			if err != nil {
				a.release(w)
				return nil, err
			}
			if nc != nil {
				return a.releasingConfig(nc, w), nil
			}
		}
		return nil, nil // c: its GetCertificate releases the slot
	}
	if conf.GetCertificate != nil || len(conf.Certificates) > 0 {
		c.Certificates = nil // chosen by GetCertificate, as crypto/tls would
		c.GetCertificate = func(chi *tls.ClientHelloInfo) (*tls.Certificate, error) {
			cert, err := chooseCertificate(conf, chi)
			if err != nil || cert == nil {
				return cert, err
			}
			if w := watchOf(chi); w != nil {
				return a.releasing(cert, w), nil
			}
			return cert, nil
		}
	}
	return c
}

// watchOf is the handshakeWatch of chi's attempt, nil when it is not one
// of an Admission's Transport.
func watchOf(chi *tls.ClientHelloInfo) *handshakeWatch {
	w, _ := chi.Context().Value(handshakeWatchKey{}).(*handshakeWatch)
	return w
}

// chooseCertificate picks conf's certificate for chi as crypto/tls does
// (Config.getCertificate, without the deprecated NameToCertificate):
// GetCertificate first when there are no Certificates or the client named
// a server, then the only certificate, then the first chi supports, then
// the first.
func chooseCertificate(conf *tls.Config, chi *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if conf.GetCertificate != nil && (len(conf.Certificates) == 0 || chi.ServerName != "") {
		cert, err := conf.GetCertificate(chi)
		if cert != nil || err != nil {
			return cert, err
		}
	}
	switch len(conf.Certificates) {
	case 0:
		return nil, errors.New("tls: no certificates configured")
	case 1:
		return &conf.Certificates[0], nil
	}
	for i := range conf.Certificates {
		if chi.SupportsCertificate(&conf.Certificates[i]) == nil {
			return &conf.Certificates[i], nil
		}
	}
	return &conf.Certificates[0], nil
}

// releasing is cert with its key wrapped so that the server's signature
// gives w's slot back (cert itself when its key cannot sign).
func (a *Admission) releasing(cert *tls.Certificate, w *handshakeWatch) *tls.Certificate {
	s, ok := cert.PrivateKey.(crypto.Signer)
	if !ok {
		return cert
	}
	cc := *cert
	cc.PrivateKey = releasingSigner{Signer: s, done: func() { a.signed.Add(1); a.release(w) }}
	return &cc
}

// releasingConfig is base (a per-client config of the server's own
// GetConfigForClient) for one handshake, its certificates' keys wrapped so
// that the server's signature gives w's slot back.
func (a *Admission) releasingConfig(base *tls.Config, w *handshakeWatch) *tls.Config {
	c := base.Clone()
	c.GetConfigForClient = nil
	if get := base.GetCertificate; get != nil {
		c.GetCertificate = func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			cert, err := get(h)
			if err != nil || cert == nil {
				return cert, err
			}
			return a.releasing(cert, w), nil
		}
	}
	if len(base.Certificates) > 0 {
		c.Certificates = make([]tls.Certificate, len(base.Certificates))
		for i := range base.Certificates {
			c.Certificates[i] = *a.releasing(&base.Certificates[i], w)
		}
	}
	return c
}

// releasingSigner calls done after each signature.
type releasingSigner struct {
	crypto.Signer
	done func()
}

func (s releasingSigner) Sign(rand io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	defer s.done()
	return s.Signer.Sign(rand, digest, opts)
}

// PrepareServerTransport sets tr up to serve incoming connections as cfg
// says: the stateless reset and token keys (Config.StatelessResetKey), the
// handshake admission (Config.MaxHandshakes, HandshakeWorkers,
// HandshakeQueueWait, Admit) and the failed-handshake reports to
// cfg.OnHandshakeFailure as backend. When tr.Conn is a *net.UDPConn it is
// wrapped so that refused Initials are answered before quic-go reads them
// (see Admission). Call it before tr.Listen, and listen
// with the returned Admission's GateTLS of the server's tls.Config; pass
// every connection tr's listener returns to HandshakeAccepted. Listen does
// this itself; it is exported for backends/webtransport, which runs its
// own Transport.
func PrepareServerTransport(tr *quicgo.Transport, backend string, cfg Config) *Admission {
	cfg = cfg.withDefaults()
	if k := cfg.StatelessResetKey; k != nil {
		reset := quicgo.StatelessResetKey(*k)
		tr.StatelessResetKey = &reset
		tok := quicgo.TokenGeneratorKey(deriveKey(k[:], "forgeyard quic token key"))
		tr.TokenGeneratorKey = &tok
	}
	a := newAdmission(cfg)
	if a.max > 0 {
		tr.VerifySourceAddress = a.verifySourceAddress
	}
	hook := cfg.OnHandshakeFailure
	if hook != nil {
		a.hooks.onRefuse = func(remote net.Addr, err error) {
			f := semantics.NewHandshakeFailure(backend, remote, err, false)
			f.Reason = semantics.HandshakeOverloaded
			hook(f)
		}
	}
	if udp, ok := tr.Conn.(*net.UDPConn); ok {
		growReceiveBuffer(udp, listenerReceiveBuffer)
		f := newInitialFilter(udp, a.decideNew)
		tr.Conn = f
		a.filtered, a.unsent = true, &f.dropped
	}
	tr.ConnContext = func(ctx context.Context, info *quicgo.ClientInfo) (context.Context, error) {
		remote := info.RemoteAddr
		// An unverified attempt on a filtered socket was admitted by the
		// filter already; one after a Retry (or without the filter) is
		// decided here, and refused by quic-go's own CONNECTION_REFUSED.
		if !a.filtered || info.AddrVerified {
			if err := a.check(remote); err != nil {
				a.noteRefused(remote, err)
				return nil, err
			}
		}
		a.inFlight.Add(1)
		a.started.Add(1)
		w := &handshakeWatch{admission: a, start: time.Now()}
		ctx = context.WithValue(ctx, handshakeWatchKey{}, w)
		w.unwatch = context.AfterFunc(ctx, func() {
			w.done()
			if !w.state.CompareAndSwap(attemptPending, attemptEnded) {
				return // accepted: not a handshake failure
			}
			cause := context.Cause(ctx)
			if w.queueTimeout.Load() || handshakeTimedOut(cause) {
				a.timedOut.Add(1)
			} else {
				a.failed.Add(1)
			}
			if hook == nil {
				return
			}
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
	return a
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
	admission    *Admission
	start        time.Time    // the attempt's first packet
	state        atomic.Int32 // attemptPending, then attemptAccepted or attemptEnded
	slot         atomic.Bool  // holds a worker slot
	queueTimeout atomic.Bool  // found no worker in time
	once         sync.Once
	// unwatch stops the AfterFunc that sees the attempt's end; called once
	// the connection is accepted, so that an established connection does
	// not keep it (set by ConnContext before the handshake starts).
	unwatch func() bool
}

// A handshakeWatch's state: the first of Accept (HandshakeAccepted) and
// the connection's end decides whether the attempt completed or failed.
const (
	attemptPending int32 = iota
	attemptAccepted
	attemptEnded
)

// done releases the attempt's in-progress slot (once).
func (w *handshakeWatch) done() {
	w.once.Do(func() {
		w.admission.release(w)
		w.admission.inFlight.Add(-1)
	})
}
