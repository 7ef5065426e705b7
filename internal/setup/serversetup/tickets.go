package serversetup

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// TicketKeySource returns the TLS session ticket keys for now and a
// rotation period, the one to encrypt with first (the method value
// authority.TicketKeyStore.TicketKeys; a func so that this package, which
// the relay links too, needs no authority).
type TicketKeySource func(ctx context.Context, now time.Time, period time.Duration) ([][32]byte, error)

// SessionTickets makes the session tickets a server's tls.Config issues
// use keys from a TicketKeySource (the authority: shared by the daemons
// of an HA set, rotated, surviving restarts) instead of crypto/tls's
// per-process keys, so an agent resumes its TLS session on any daemon and
// after a restart (issue 25 item 4).
//
// It installs WrapSession and UnwrapSession on the config rather than
// calling SetSessionTicketKeys: the listeners clone the config (QUIC,
// yamux, WebTransport, the QUIC admission gate's per-handshake configs),
// and function fields are carried by every clone, so a key rotation
// reaches connections on all of them without touching those copies.
//
// A resumed session carries the client certificate chain verified at the
// full handshake; crypto/tls refuses to resume when that certificate has
// expired or its chain no longer ends at one of the config's ClientCAs,
// and the daemon's registration checks identity and revocation on the
// connection state exactly as on a full handshake.
type SessionTickets struct {
	src    TicketKeySource
	period time.Duration
	log    *slog.Logger
	keys   atomic.Pointer[tls.Config] // holds only the ticket keys
	n      atomic.Int32               // how many keys are loaded (tests, /healthz)

	mu      sync.Mutex
	failing bool // the last refresh failed (logged once per streak)
}

// ticketRefreshDivisor: keys are reloaded every period / 4.
const ticketRefreshDivisor = 4

// NewSessionTickets loads the keys from src (period: the rotation
// period, > 0). When src fails it logs a warning and uses a random key
// of this process until a later Refresh succeeds: tickets then resume on
// this daemon only, and a full handshake still works everywhere.
func NewSessionTickets(ctx context.Context, src TicketKeySource, period time.Duration, log *slog.Logger) (*SessionTickets, error) {
	if src == nil {
		return nil, errors.New("serversetup: session tickets need a key source")
	}
	if period <= 0 {
		return nil, fmt.Errorf("tls.session_ticket_rotation: %v is not positive", period)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	t := &SessionTickets{src: src, period: period, log: log}
	if err := t.Refresh(ctx, time.Now()); err != nil {
		var k [32]byte
		if _, rerr := rand.Read(k[:]); rerr != nil {
			return nil, fmt.Errorf("serversetup: session ticket key: %w", rerr)
		}
		t.set([][32]byte{k})
	}
	return t, nil
}

func (t *SessionTickets) set(keys [][32]byte) {
	c := &tls.Config{}
	c.SetSessionTicketKeys(keys)
	t.keys.Store(c)
	t.n.Store(int32(len(keys)))
}

// Keys reports how many keys are loaded (current, next, previous).
func (t *SessionTickets) Keys() int { return int(t.n.Load()) }

// Refresh reloads the keys for now. On failure the keys in use stay (the
// first failure of a streak is logged, and the recovery).
func (t *SessionTickets) Refresh(ctx context.Context, now time.Time) error {
	keys, err := t.src(ctx, now, t.period)
	if err == nil && len(keys) == 0 {
		err = errors.New("the key source returned no keys")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		if !t.failing {
			t.failing = true
			if t.keys.Load() == nil {
				t.log.Warn("TLS session ticket keys unavailable from the authority; using a key of this process (agents resume on this daemon only) until it answers", "err", err)
			} else {
				t.log.Warn("TLS session ticket keys not refreshed from the authority; keeping the current ones", "err", err)
			}
		}
		return err
	}
	if t.failing {
		t.failing = false
		t.log.Info("TLS session ticket keys refreshed from the authority again", "keys", len(keys))
	}
	t.set(keys)
	return nil
}

// Install makes conf's session tickets use t's keys. Call it before the
// listeners clone conf.
func (t *SessionTickets) Install(conf *tls.Config) {
	conf.SessionTicketsDisabled = false
	conf.WrapSession = func(cs tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
		return t.keys.Load().EncryptTicket(cs, ss)
	}
	conf.UnwrapSession = func(identity []byte, cs tls.ConnectionState) (*tls.SessionState, error) {
		// (nil, nil): not ours, or under a key no longer kept — a full
		// handshake follows.
		return t.keys.Load().DecryptTicket(identity, cs)
	}
}

// Run refreshes the keys every period/4 until ctx ends.
func (t *SessionTickets) Run(ctx context.Context) {
	tk := time.NewTicker(max(t.period/ticketRefreshDivisor, time.Second))
	defer tk.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tk.C:
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_ = t.Refresh(rctx, now)
			cancel()
		}
	}
}
