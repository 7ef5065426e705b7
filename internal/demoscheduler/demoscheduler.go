// Package demoscheduler is the smallest host scheduler built on the public
// daemon API (docs/embedding.md): once per new agent session it offers N
// synthetic leases (random job and spec, a payload named after the spec)
// and logs the answers. `forgeyard-daemon --demo-leases N` runs it; it is
// also the second example of docs/embedding.md, beside the runnable
// Example_host of semantics/daemon.
//
// It shows the three rules a real scheduler follows:
//   - hooks must not block: Registered starts a goroutine;
//   - the registration hook runs before the session is active, so an offer
//     made from it may see daemon.ErrNotConnected for a moment: retry it;
//   - a reconnect of a session that already got its work gets none again
//     (the daemon re-sends outstanding offers itself). With HA daemons the
//     reconnect may land on another daemon, whose scheduler never saw the
//     session: the authority's epoch tells (a session's first registration
//     is epoch 1, every later one — on any daemon sharing the authority —
//     is higher), so that daemon leaves the session's leases to resync
//     (§229: the new daemon reads the authoritative store and answers
//     Continue) instead of offering them a second time.
package demoscheduler

import (
	"context"
	"crypto/rand"
	"errors"
	"log/slog"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
)

// MaxSessions bounds the remembered sessions (then the memory starts over).
const MaxSessions = 4096

// Scheduler offers PerSession synthetic leases to every new agent session.
type Scheduler struct {
	d      *daemon.Daemon
	n      int
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	seen   map[wire.AgentSessionId]bool
}

// New returns a scheduler offering perSession leases on d; log receives one
// line per answered offer. Call Registered from daemon.Hooks.OnRegistered
// and Stop before shutting d down.
func New(d *daemon.Daemon, perSession int, log *slog.Logger) *Scheduler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Scheduler{d: d, n: perSession, log: log, ctx: ctx, cancel: cancel, seen: map[wire.AgentSessionId]bool{}}
}

// Registered is the OnRegistered hook: a new agent session gets its leases
// from a goroutine; a reconnect gets none — of a session this daemon saw,
// or of one registered before anywhere (epoch > 1: it got its leases from
// the daemon that saw its first registration).
func (s *Scheduler) Registered(si daemon.SessionInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen[si.Session] || si.Epoch > 1 || s.ctx.Err() != nil {
		return // a reconnect of a session that already got its leases
	}
	if len(s.seen) >= MaxSessions {
		clear(s.seen)
	}
	s.seen[si.Session] = true
	s.wg.Add(1)
	go s.offer(si.Runner)
}

func (s *Scheduler) offer(runner wire.RunnerId) {
	defer s.wg.Done()
	for i := 0; i < s.n; i++ {
		o := daemon.LeaseOffer{Job: wire.NewJobId()}
		_, _ = rand.Read(o.Spec.Digest[:])
		o.Payload = SyntheticPayload(o.Spec)
		var err error
		// The registration hook runs before the session is active: retry
		// ErrNotConnected briefly.
		for try := 0; try < 50; try++ {
			_, err = s.d.OfferLease(s.ctx, runner, o)
			if !errors.Is(err, daemon.ErrNotConnected) {
				break
			}
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		if s.ctx.Err() != nil {
			return
		}
		if err != nil {
			s.log.Warn("demo lease not accepted", "runner", runner, "n", i+1, "err", err)
			continue
		}
		s.log.Info("demo lease accepted", "runner", runner, "n", i+1, "of", s.n)
	}
}

// Stop cancels the offers in flight and waits for their goroutines.
func (s *Scheduler) Stop() {
	s.cancel()
	s.wg.Wait()
}

// SyntheticPayload names a (non-existent) CAS object for a synthetic job;
// the synthetic executor never fetches it.
func SyntheticPayload(spec wire.JobSpecId) wire.CasObjectRef {
	return wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: spec.Digest, Size: 1}
}
