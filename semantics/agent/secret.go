package agent

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/registry"
)

// Secret delivery (§149–152): the daemon opens a stream of kind
// wire.StreamSecret carrying SecretMaterialV1 envelopes for a lease this
// agent holds. The agent keeps each secret in memory only, for the
// executor of that attempt, until the executor used it (UseSecret), the
// attempt's Execute returned, or the secret expired — whichever comes
// first — and zeroes it then. It never logs or writes it anywhere.

// Errors of UseSecret.
var (
	// ErrNoSecrets: ctx is not an attempt's Execute context.
	ErrNoSecrets = errors.New("agent: no secret delivery for this context")
	// ErrSecretGone: the secret was already used, expired, or the attempt
	// ended.
	ErrSecretGone = errors.New("agent: secret used, expired or attempt ended")
)

// maxSecretsPerLease bounds the secrets held for one lease.
const maxSecretsPerLease = 64

type secretKey struct{}

// secretHandle is what an Execute context carries.
type secretHandle struct {
	a  *Agent
	at *attempt
}

// heldSecret is one stored secret.
type heldSecret struct {
	b     agentwire.SecretBytes
	timer *time.Timer
}

// leaseSecrets are the secrets of one lease.
type leaseSecrets struct {
	items   map[string]*heldSecret
	used    map[string]bool
	changed chan struct{} // closed and replaced when a secret arrives
	dropped bool
}

// secretStore holds every lease's secrets; its mutex is taken after
// Agent.mu when both are held.
type secretStore struct {
	mu      sync.Mutex
	byLease map[wire.LeaseId]*leaseSecrets
}

func (s *secretStore) entry(lease wire.LeaseId, create bool) *leaseSecrets {
	ls := s.byLease[lease]
	if ls == nil && create {
		if s.byLease == nil {
			s.byLease = map[wire.LeaseId]*leaseSecrets{}
		}
		ls = &leaseSecrets{items: map[string]*heldSecret{}, used: map[string]bool{}, changed: make(chan struct{})}
		s.byLease[lease] = ls
	}
	return ls
}

// withSecrets gives at's Execute context access to its lease's secrets.
func (a *Agent) withSecrets(ctx context.Context, at *attempt) context.Context {
	return context.WithValue(ctx, secretKey{}, &secretHandle{a: a, at: at})
}

// UseSecret waits until the secret id of the attempt whose Execute ctx
// this is has arrived, calls fn with its bytes, and zeroes them when fn
// returns: a secret is used at most once. fn must not keep, log or write
// the bytes. It returns fn's error, ErrSecretGone (used, expired, attempt
// ended), ErrNoSecrets (ctx is not an Execute context) or ctx's error.
func UseSecret(ctx context.Context, id string, fn func(agentwire.SecretBytes) error) error {
	h, _ := ctx.Value(secretKey{}).(*secretHandle)
	if h == nil {
		return ErrNoSecrets
	}
	s := &h.a.sec
	for {
		h.a.mu.Lock()
		done := h.at.secretsDone
		s.mu.Lock()
		h.a.mu.Unlock()
		if done {
			s.mu.Unlock()
			return ErrSecretGone
		}
		ls := s.entry(h.at.job.Lease, true)
		if ls.dropped || ls.used[id] {
			s.mu.Unlock()
			return ErrSecretGone
		}
		if hs := ls.items[id]; hs != nil {
			delete(ls.items, id)
			ls.used[id] = true
			s.mu.Unlock()
			hs.timer.Stop()
			defer clear(hs.b[:cap(hs.b)])
			return fn(hs.b)
		}
		changed := ls.changed
		s.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// dropSecrets zeroes and forgets every secret of at's lease; later
// deliveries for it are refused (the executor returned).
func (a *Agent) dropSecrets(at *attempt) {
	a.mu.Lock()
	defer a.mu.Unlock()
	at.secretsDone = true
	s := &a.sec
	s.mu.Lock()
	defer s.mu.Unlock()
	if ls := s.byLease[at.job.Lease]; ls != nil {
		for id, hs := range ls.items {
			hs.timer.Stop()
			clear(hs.b[:cap(hs.b)])
			delete(ls.items, id)
		}
		ls.dropped = true
		close(ls.changed)
		ls.changed = make(chan struct{})
		delete(s.byLease, at.job.Lease)
	}
}

// putSecret stores m (taking ownership of m.Bytes) when this agent runs
// m.Lease's attempt and m has not expired; it reports whether it did.
func (a *Agent) putSecret(m *agentwire.SecretMaterialV1) bool {
	now := a.daemonNow() // the expiry is on the daemon's clock (clock.go)
	if int64(m.ExpiresAtMs) <= now.UnixMilli() {
		return false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	held := false
	for _, at := range a.attempts {
		if at.job.Lease == m.Lease && !at.finished && !at.secretsDone {
			held = true
			break
		}
	}
	if !held {
		return false
	}
	s := &a.sec
	s.mu.Lock()
	defer s.mu.Unlock()
	ls := s.entry(m.Lease, true)
	if ls.used[m.SecretID] {
		return false // a secret is delivered and used once
	}
	if _, dup := ls.items[m.SecretID]; !dup && len(ls.items) >= maxSecretsPerLease {
		return false
	}
	if old := ls.items[m.SecretID]; old != nil {
		old.timer.Stop()
		clear(old.b[:cap(old.b)])
	}
	b := m.Bytes
	m.Bytes = nil
	lease, id := m.Lease, m.SecretID
	hs := &heldSecret{b: b}
	hs.timer = time.AfterFunc(time.UnixMilli(int64(m.ExpiresAtMs)).Sub(now), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if ls := s.byLease[lease]; ls != nil && ls.items[id] == hs {
			delete(ls.items, id)
			clear(hs.b[:cap(hs.b)])
		}
	})
	ls.items[id] = hs
	close(ls.changed)
	ls.changed = make(chan struct{})
	return true
}

// serveSecrets accepts the daemon's bidirectional streams on l until ctx
// ends: secret streams are received, every other kind is refused.
func (a *Agent) serveSecrets(ctx context.Context, l *link) {
	for {
		st, err := l.sc.AcceptStream(ctx)
		if err != nil {
			return
		}
		if st.Kind() != wire.StreamSecret || !a.execs {
			st.CancelRead(semantics.StreamRefused)
			st.CancelWrite(semantics.StreamRefused)
			continue
		}
		a.wg.Add(1)
		go func() { defer a.wg.Done(); a.receiveSecrets(ctx, st) }()
	}
}

// receiveSecrets reads one secret stream: up to 16 SecretMaterialV1
// envelopes, then the daemon's end of stream. On any failure (malformed,
// not a secret, lease not held, expired) the material not yet stored is
// zeroed and the stream reset with StreamRefused. Success is acknowledged
// by closing this side.
func (a *Agent) receiveSecrets(ctx context.Context, st *semantics.Stream) {
	_ = st.SetReadDeadline(time.Now().Add(a.cfg.RequestTimeout))
	stop := context.AfterFunc(ctx, func() { st.CancelRead(semantics.StreamCancelled); st.CancelWrite(semantics.StreamCancelled) })
	defer stop()
	var got []*agentwire.SecretMaterialV1
	refuse := func(why string) {
		for _, m := range got {
			m.Zero()
		}
		st.CancelRead(semantics.StreamRefused)
		st.CancelWrite(semantics.StreamRefused)
		a.log.Info("secret stream refused", "reason", why)
	}
	for {
		b, err := st.ReadFrame()
		if err == io.EOF {
			break
		}
		if err != nil {
			refuse("read failed")
			return
		}
		var env wire.Envelope
		derr := env.Decode(b, registry.Default)
		clear(b) // the frame held the material in clear
		m, ok := env.Payload.(*agentwire.SecretMaterialV1)
		if derr != nil || !ok {
			if ok {
				m.Zero()
			}
			refuse("not a valid SecretMaterialV1")
			return
		}
		got = append(got, m)
		if err := m.Validate(); err != nil || len(got) > 16 {
			refuse("invalid secret material")
			return
		}
	}
	if len(got) == 0 {
		refuse("empty secret stream")
		return
	}
	a.mu.Lock()
	ok := true
	for _, m := range got {
		held := false
		for _, at := range a.attempts {
			if at.job.Lease == m.Lease && !at.finished && !at.secretsDone {
				held = true
			}
		}
		ok = ok && held
	}
	a.mu.Unlock()
	if !ok {
		refuse("lease not held by this agent")
		return
	}
	for i, m := range got {
		if !a.putSecret(m) {
			got = got[i:]
			refuse("secret expired, repeated or over the per-lease bound")
			return
		}
	}
	_ = st.SendStream.Close()
	a.log.Debug("secrets received", "count", len(got))
}
