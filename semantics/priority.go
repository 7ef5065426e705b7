package semantics

import (
	"forgeyard.dev/transport/wire"
	"log/slog"
)

// Priority orders writes on one connection (§45–49): lower values go first.
// quic-go and yamux have no usable stream priorities, so the semantics layer
// enforces these with its write scheduler.
type Priority uint8

// Priority classes, highest first.
const (
	PriorityCancel  Priority = 0 // cancellation: never waits behind bulk data (§132)
	PriorityLease   Priority = 1 // lease renewal and heartbeat
	PriorityControl Priority = 2 // every other control message
	PriorityLog     Priority = 3 // log streams
	PriorityCAS     Priority = 4 // CAS transfers and background replication

	NumPriorities = 5
)

var priorityNames = [NumPriorities]string{"cancel", "lease", "control", "log", "cas"}

// String returns the priority's name as used in metric labels and logs.
func (p Priority) String() string {
	if p < NumPriorities {
		return priorityNames[p]
	}
	return "priority?"
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (p Priority) LogValue() slog.Value { return slog.StringValue(p.String()) }

// IsBulk reports whether p is a bulk class (paced, yields to control).
func (p Priority) IsBulk() bool { return p >= PriorityLog }

// DefaultPriority returns the priority of streams of kind k.
func DefaultPriority(k StreamKind) Priority {
	switch k {
	case wire.StreamHeartbeat:
		return PriorityLease
	case wire.StreamLog:
		return PriorityLog
	case wire.StreamCasUpload, wire.StreamCasDownload:
		return PriorityCAS
	default:
		return PriorityControl
	}
}
