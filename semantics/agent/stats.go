package agent

import (
	"fmt"
	"slices"
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
	deferrals                                                         atomic.Int64 // connect.go: waits that obeyed a retry hint
	hbQuickened                                                       atomic.Int64 // heartbeat.go: switches to quickened heartbeats
	restartHints, hintTimeouts                                        atomic.Int64 // heartbeat.go: restart hints answered; links ended by one
	restartTokens, restartTokenEnds                                   atomic.Int64 // heartbeat.go: tokens armed; links ended by an authenticated hint
	leaseExpired, capUpdates, healthProbes                            atomic.Int64 // clock.go, inventory.go
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
	// LeasesExpired counts attempts stopped because their lease expired on
	// the daemon's clock (plus Config.LeaseGrace) without a renewal.
	LeasesExpired int64
	// CapabilityUpdates counts CapabilityUpdateV1 snapshots sent (after
	// SetCapabilities, and in answer to RefreshCapabilitiesV1).
	CapabilityUpdates int64
	// HealthProbes counts health probes run for the daemon.
	HealthProbes int64
	DialFailures int64
	// RetryHintsObeyed counts reconnect waits set by the daemon's retry
	// hint (RegistrationDeferredV1, feature RetryAfterV1).
	RetryHintsObeyed int64
	// HeartbeatsQuickened counts the times the agent switched to
	// quickened heartbeats (every quarter interval) because none was acked
	// for more than an interval and a quarter.
	HeartbeatsQuickened int64
	// RestartHints counts the restart hints (semantics.PeerHinter) the
	// agent answered with an immediate heartbeat.
	RestartHints int64
	// RestartHintTimeouts counts the links ended because no heartbeat was
	// acked within 1 s of a restart hint (ErrRestartHinted).
	RestartHintTimeouts int64
	// RestartTokens counts the restart tokens the daemon gave (armed on
	// the link's connection, agentwire.RestartTokenV1).
	RestartTokens int64
	// RestartTokenEnds counts the links ended by a restart hint carrying
	// the link's token (ErrDaemonRestarted).
	RestartTokenEnds  int64
	LogFinalizeFailed int64 // attempts completed without a passed logs-finalized barrier
	OutputsUploaded   int64 // outputs uploaded (or already held) before completions
	OutputsFailed     int64 // local outputs that could not be uploaded (left out of completions)
	// OutputsStorageRetries counts upload retries because the daemon's
	// content store was unavailable (WireErrorV1 StorageUnavailable) or
	// the link failed under the upload.
	OutputsStorageRetries int64
	// LogStorageRetries counts logs-finalized barriers retried because the
	// daemon's log store was unavailable, the link failed under them or
	// the daemon answered transiently (the log stays spooled and is re-sent).
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
	// LastDialError is the last failed dial of any endpoint, "backend
	// address: error" (the error starts with what failed: the proxy, tcp,
	// tls, …), kept after a later success so a flapping path is visible;
	// LastDialErrorAt is when it happened. Empty before the first failure.
	LastDialError   string
	LastDialErrorAt time.Time
	// DialErrors is the last failed dial of each endpoint that failed
	// since the agent started, newest first (a QUIC timeout does not hide
	// the proxy's 407 of the relay endpoint).
	DialErrors []DialError
	// NextRetry is when the agent dials again while it is not connected
	// (zero when connected or before the first wait).
	NextRetry time.Time
}

// DialError is one endpoint's last failed dial (Status.DialErrors).
type DialError struct {
	Backend, Endpoint string
	Err               string
	At                time.Time
}

// maxDialErrors bounds Status.DialErrors (one per endpoint; endpoints are
// at most a few, GoAway alternates included).
const maxDialErrors = 32

// noteDialError records a failed dial for Status.LastDialError and
// DialErrors.
func (a *Agent) noteDialError(ep Endpoint, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	at := a.now()
	a.lastDialErr = fmt.Sprintf("%s %s: %v", ep.Backend, ep.Address, err)
	a.lastDialAt = at
	d := DialError{Backend: ep.Backend, Endpoint: ep.Address, Err: err.Error(), At: at}
	for i, o := range a.dialErrs {
		if o.Endpoint == d.Endpoint && o.Backend == d.Backend {
			a.dialErrs = append(a.dialErrs[:i], a.dialErrs[i+1:]...)
			break
		}
	}
	a.dialErrs = append([]DialError{d}, a.dialErrs...)
	if len(a.dialErrs) > maxDialErrors {
		a.dialErrs = a.dialErrs[:maxDialErrors]
	}
}

// Status returns the current status.
func (a *Agent) Status() Status {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := Status{Epoch: a.epoch, LastHeartbeatAck: a.lastAck, Draining: a.draining, Network: a.network,
		LastDialError: a.lastDialErr, LastDialErrorAt: a.lastDialAt, DialErrors: slices.Clone(a.dialErrs)}
	if l := a.link; l == nil {
		s.NextRetry = a.retryAt
	}
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
		RetryHintsObeyed: s.deferrals.Load(), HeartbeatsQuickened: s.hbQuickened.Load(),
		RestartHints: s.restartHints.Load(), RestartHintTimeouts: s.hintTimeouts.Load(),
		RestartTokens: s.restartTokens.Load(), RestartTokenEnds: s.restartTokenEnds.Load(),
		LeasesExpired: s.leaseExpired.Load(), CapabilityUpdates: s.capUpdates.Load(), HealthProbes: s.healthProbes.Load(),
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
