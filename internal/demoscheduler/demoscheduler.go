// Package demoscheduler is the smallest host scheduler built on the public
// daemon API (docs/embedding.md): once per new agent session it offers N
// synthetic leases (random job and spec, a payload named after the spec)
// and logs the answers. `forgeyard-daemon --demo-leases N` runs it; it is
// also the second example of docs/embedding.md, beside the runnable
// Example_host of semantics/daemon.
//
// It offers a session no more leases at a time than the agent advertised
// it runs (RunnerCapabilitiesV1.MaxParallel, from the Capabilities hook):
// the next once one completes (the Completed hook), so an agent is never
// offered work it must reject with AtCapacity.
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
	agentwire "forgeyard.dev/transport/wire/agent"
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
	// per session offered to: its capacity and leases outstanding;
	// guarded by mu.
	sessions map[wire.AgentSessionId]*slots
}

// capacityWait bounds how long the offers wait for the session's
// capabilities (reported right after registration) before assuming 1.
const capacityWait = 2 * time.Second

// slots are one session's lease slots: free is sent to before an offer
// and received from when one of its leases completes.
type slots struct {
	known       chan struct{} // closed once free is made (capacity known)
	free        chan struct{}
	outstanding int // offered and not completed; guarded by Scheduler.mu
}

// New returns a scheduler offering perSession leases on d; log receives one
// line per answered offer. Call Registered, Capabilities and Completed
// from daemon.Hooks.OnRegistered, OnCapabilities and OnCompletion, and Stop
// before shutting d down.
func New(d *daemon.Daemon, perSession int, log *slog.Logger) *Scheduler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Scheduler{d: d, n: perSession, log: log, ctx: ctx, cancel: cancel, seen: map[wire.AgentSessionId]bool{},
		sessions: map[wire.AgentSessionId]*slots{}}
}

// Capabilities is the OnCapabilities hook: the session's advertised
// capacity sets how many of its leases may be outstanding.
func (s *Scheduler) Capabilities(si daemon.SessionInfo, c agentwire.RunnerCapabilitiesV1) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.sessions[si.Session]; sl != nil && sl.free == nil {
		sl.free = make(chan struct{}, max(1, int(c.MaxParallel)))
		close(sl.known)
	}
}

// Completed is the OnCompletion hook: a completed lease frees its
// session's slot for the next offer.
func (s *Scheduler) Completed(e daemon.CompletionEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.sessions[e.Session]; sl != nil && sl.outstanding > 0 {
		sl.outstanding--
		<-sl.free
	}
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
		clear(s.sessions)
	}
	s.seen[si.Session] = true
	sl := &slots{known: make(chan struct{})}
	s.sessions[si.Session] = sl
	s.wg.Go(func() { s.offer(si.Runner, sl) })
}

// acquire waits for a free slot of sl (its capacity known, or 1 after
// capacityWait); false once the scheduler stops.
func (s *Scheduler) acquire(sl *slots) bool {
	t := time.NewTimer(capacityWait)
	defer t.Stop()
	select {
	case <-sl.known:
	case <-t.C:
		s.mu.Lock()
		if sl.free == nil { // no capabilities reported: one at a time
			sl.free = make(chan struct{}, 1)
			close(sl.known)
		}
		s.mu.Unlock()
	case <-s.ctx.Done():
		return false
	}
	select {
	case sl.free <- struct{}{}:
	case <-s.ctx.Done():
		return false
	}
	s.mu.Lock()
	sl.outstanding++
	s.mu.Unlock()
	return true
}

// unacquire gives back a slot whose offer failed.
func (s *Scheduler) unacquire(sl *slots) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl.outstanding > 0 {
		sl.outstanding--
		<-sl.free
	}
}

func (s *Scheduler) offer(runner wire.RunnerId, sl *slots) {
	for i := 0; i < s.n; i++ {
		if !s.acquire(sl) {
			return
		}
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
			s.unacquire(sl)
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
