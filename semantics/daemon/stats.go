package daemon

import (
	"sync"
	"sync/atomic"
	"time"
)

// Stats are the daemon's counters since New. Latency slices hold the most
// recent samples (at most 1024 each), oldest first.
type Stats struct {
	Registrations int64 // accepted registrations
	// RegistrationsAbandoned: registrations whose connection ended before
	// they were answered (the agent gave up); not in Registrations.
	RegistrationsAbandoned int64
	Rejections             int64 // rejected hellos and registrations
	Reconnects             int64 // registrations of an already known agent session (epoch > 1)
	Resyncs                int64
	LeasesOffered          int64
	LeasesAccepted         int64
	LeasesRejected         int64
	DuplicateAnswers       int64 // repeated answers to an already answered offer
	OfferResends           int64 // offers sent again (same MessageId)
	// OffersAdopted: offers of leases created elsewhere (another daemon
	// sharing the authority, or before a restart) this daemon re-sent after
	// the agent's resync here.
	OffersAdopted int64
	// OffersSettledElsewhere: pending offers settled from the authority
	// because they were answered, completed or revoked through another
	// daemon or transport.
	OffersSettledElsewhere int64
	LeasesRevoked          int64 // revoked by expiry
	Probes                 int64 // LeaseProbeV1 sent
	Renewals               int64
	Completions            [4]int64 // by wire CompletionAckKind
	Fenced                 int64    // transports fenced by a newer registration
	ClonedIdentity         int64    // fenced transports that kept talking
	Cancels                int64
	ProtocolErrors         int64 // state/role violations and bad frames
	HeartbeatsDropped      int64 // seq ≤ last seen
	DedupPruned            int64
	OfferToAccept          []time.Duration
	CompletionToAck        []time.Duration // receipt → authority answered, ack about to be written (sampled before Hooks.OnCompletion)
	CancelDelivery         []time.Duration // CancelAttempt → CancelAckV1
	LogsFinalized          int64           // LogsFinalizedV1 barriers acknowledged
	OutputsFinalized       int64           // OutputsFinalizedV1 recorded
	SendRefused            int64           // envelopes refused at send: type not daemon-sendable to the peer's role (send.go)
	// CapabilitiesRecovered counts snapshots fetched because a heartbeat's
	// capability digest differed from the one held (§236).
	CapabilitiesRecovered int64
	// RestartTokens counts the restart tokens given (RestartTokenV1,
	// restarttoken.go).
	RestartTokens int64
}

type latencies struct {
	mu  sync.Mutex
	buf []time.Duration
	n   int
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	if len(l.buf) < maxLatencyKeep {
		l.buf = append(l.buf, d)
	} else {
		l.buf[l.n%maxLatencyKeep] = d
	}
	l.n++
	l.mu.Unlock()
}

func (l *latencies) snapshot() []time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) < maxLatencyKeep {
		return append([]time.Duration(nil), l.buf...)
	}
	i := l.n % maxLatencyKeep
	return append(append([]time.Duration(nil), l.buf[i:]...), l.buf[:i]...)
}

type stats struct {
	registrations, rejections, reconnects, resyncs        atomic.Int64
	abandoned                                             atomic.Int64 // register.go
	leasesOffered, leasesAccepted, leasesRejected, dupAns atomic.Int64
	resends, leasesRevoked, probes, renewals              atomic.Int64
	completions                                           [4]atomic.Int64
	fenced, cloned, cancels, protoErrs, hbDropped         atomic.Int64
	dedupPruned, adopted, settledElsewhere                atomic.Int64
	offerLat, complLat, cancelLat                         latencies
	logsFinalized, outputsFinalized                       atomic.Int64
	sendRefused                                           atomic.Int64 // send.go
	capRecovered                                          atomic.Int64 // inventory.go checkDigest
	restartTokens                                         atomic.Int64 // restarttoken.go
}

// Stats returns a snapshot of the counters.
func (d *Daemon) Stats() Stats {
	s := &d.st
	out := Stats{
		Registrations: s.registrations.Load(), RegistrationsAbandoned: s.abandoned.Load(), Rejections: s.rejections.Load(), Reconnects: s.reconnects.Load(),
		Resyncs: s.resyncs.Load(), LeasesOffered: s.leasesOffered.Load(), LeasesAccepted: s.leasesAccepted.Load(),
		LeasesRejected: s.leasesRejected.Load(), DuplicateAnswers: s.dupAns.Load(), OfferResends: s.resends.Load(),
		OffersAdopted: s.adopted.Load(), OffersSettledElsewhere: s.settledElsewhere.Load(),
		LeasesRevoked: s.leasesRevoked.Load(), Probes: s.probes.Load(), Renewals: s.renewals.Load(),
		Fenced: s.fenced.Load(), ClonedIdentity: s.cloned.Load(), Cancels: s.cancels.Load(),
		ProtocolErrors: s.protoErrs.Load(), HeartbeatsDropped: s.hbDropped.Load(), DedupPruned: s.dedupPruned.Load(),
		OfferToAccept: s.offerLat.snapshot(), CompletionToAck: s.complLat.snapshot(), CancelDelivery: s.cancelLat.snapshot(),
		LogsFinalized: s.logsFinalized.Load(), OutputsFinalized: s.outputsFinalized.Load(),
		SendRefused: s.sendRefused.Load(), CapabilitiesRecovered: s.capRecovered.Load(),
		RestartTokens: s.restartTokens.Load(),
	}
	for i := range s.completions {
		out.Completions[i] = s.completions[i].Load()
	}
	return out
}
