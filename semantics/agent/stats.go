package agent

import (
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/wire"
)

type agentStats struct {
	reconnects, registrations, resyncs, dupOffers, accepted, rejected atomic.Int64
	started, complSent, complRetried, cancels, hbSent, hbAcked        atomic.Int64
	acks                                                              [4]atomic.Int64
	dialFailures                                                      atomic.Int64
	logFinalizeFailed, outputsUploaded, outputsFailed                 atomic.Int64
	outputsStorageRetries, logStorageRetries                          atomic.Int64
	probes, probesOK, moves                                           atomic.Int64
	payloadsFetched, payloadsFailed                                   atomic.Int64
	hbTimeouts                                                        atomic.Int64
}

// Stats are the agent's counters.
type Stats struct {
	Reconnects         int64 // registrations after the first
	Registrations      int64
	Resyncs            int64
	DuplicatesAbsorbed int64 // duplicate offers answered from memory
	LeasesAccepted     int64
	LeasesRejected     int64
	AttemptsStarted    int64
	CompletionsSent    int64
	CompletionsRetried int64
	CompletionAcks     [4]int64 // by CompletionAckKind
	Cancels            int64
	HeartbeatsSent     int64
	HeartbeatsAcked    int64
	// HeartbeatTimeouts counts links ended because no heartbeat was acked
	// for Config.HeartbeatMisses intervals (reconnect reason
	// "heartbeat_timeout").
	HeartbeatTimeouts int64
	DialFailures      int64
	LogFinalizeFailed int64 // attempts completed without a passed logs-finalized barrier
	OutputsUploaded   int64 // outputs uploaded (or already held) before completions
	OutputsFailed     int64 // local outputs that could not be uploaded (left out of completions)
	// OutputsStorageRetries counts upload retries because the daemon's
	// content store was unavailable (WireErrorV1 StorageUnavailable).
	OutputsStorageRetries int64
	// LogStorageRetries counts logs-finalized barriers retried because the
	// daemon's log store was unavailable.
	LogStorageRetries int64
	PayloadsFetched   int64 // payloads downloaded and verified (Config.FetchPayload)
	PayloadsFailed    int64 // attempts ended InfraError because their payload could not be fetched
	Probes            int64 // background probes of a better backend
	ProbesSucceeded   int64
	MovesBack         int64 // moves to a better backend after probing
	// BackendChanges counts registrations over a different backend than
	// the previous one, by from/to backend; the first registration counts
	// from the best configured backend when it is a fallback.
	BackendChanges map[BackendChange]int64
}

// Status is the agent's current view.
type Status struct {
	Connected        bool
	Endpoint         string
	Backend          string
	Protocol         wire.ProtocolVersion
	Features         wire.FeatureSet // negotiated: the daemon's and the agent's in common
	Transport        wire.TransportSessionId
	Epoch            uint64
	LastHeartbeatAck time.Time
	Running          []wire.JobAttemptId
	Draining         bool
	// Class is the current endpoint's fallback class ("quic",
	// "webtransport", "tcp", "relay"; "" when not connected).
	Class string
	// FallbackReason says why this backend was chosen (which candidates
	// failed or were slower, a remembered choice, or a move back); when
	// the agent is probing a better backend, the probe's progress follows.
	FallbackReason string
	// Network is the network identity the choice is remembered under.
	Network string
}

// Status returns the current status.
func (a *Agent) Status() Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := Status{Epoch: a.epoch, LastHeartbeatAck: a.lastAck, Draining: a.draining, Network: a.network}
	if l := a.link; l != nil {
		s.Connected, s.Endpoint, s.Backend, s.Protocol, s.Transport = true, l.ep.Address, l.bc.Backend(), l.protocol, l.transport
		s.Features = l.features
		s.Class = l.ep.class().String()
		s.FallbackReason = a.reason
		if a.probeNote != "" {
			s.FallbackReason += "; " + a.probeNote
		}
	}
	for id, at := range a.attempts {
		if !at.finished {
			s.Running = append(s.Running, id)
		}
	}
	return s
}

// Stats returns the counters.
func (a *Agent) Stats() Stats {
	s := &a.st
	out := Stats{Reconnects: s.reconnects.Load(), Registrations: s.registrations.Load(), Resyncs: s.resyncs.Load(),
		DuplicatesAbsorbed: s.dupOffers.Load(), LeasesAccepted: s.accepted.Load(), LeasesRejected: s.rejected.Load(),
		AttemptsStarted: s.started.Load(), CompletionsSent: s.complSent.Load(), CompletionsRetried: s.complRetried.Load(),
		Cancels: s.cancels.Load(), HeartbeatsSent: s.hbSent.Load(), HeartbeatsAcked: s.hbAcked.Load(), HeartbeatTimeouts: s.hbTimeouts.Load(), DialFailures: s.dialFailures.Load(),
		LogFinalizeFailed: s.logFinalizeFailed.Load(), OutputsUploaded: s.outputsUploaded.Load(), OutputsFailed: s.outputsFailed.Load(),
		OutputsStorageRetries: s.outputsStorageRetries.Load(), LogStorageRetries: s.logStorageRetries.Load(),
		PayloadsFetched: s.payloadsFetched.Load(), PayloadsFailed: s.payloadsFailed.Load(),
		Probes: s.probes.Load(), ProbesSucceeded: s.probesOK.Load(), MovesBack: s.moves.Load(),
		BackendChanges: map[BackendChange]int64{}}
	a.mu.Lock()
	for k, v := range a.changes {
		out.BackendChanges[k] = v
	}
	a.mu.Unlock()
	for i := range s.acks {
		out.CompletionAcks[i] = s.acks[i].Load()
	}
	return out
}
