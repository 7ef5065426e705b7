package semantics

import (
	"log/slog"
	"reflect"

	"forgeyard.dev/transport/wire"
)

// Observers: how metrics reach the contract without the
// contract importing a metrics library. A Conn (Config.Metrics) and a
// control channel (control.Config.Metrics) call these hooks; an
// implementation (semantics/telemetry's *Metrics) turns them into
// Prometheus series. The interfaces are small and closed over wire types,
// so an implementation cannot create a series per identifier (§208).
//
// Hooks are called on the hot path, concurrently, with the connection's
// locks possibly held (Observer.QueueAdd): they must be cheap, must not
// block and must not call back into the Conn.
//
// A nil interface and an interface holding a nil pointer (e.g. a nil
// *telemetry.Metrics stored in Config.Metrics) both mean "no observer":
// NewConn and control.New drop them (see IsNilObserver), so no hook is
// called at all.

// Observer receives a connection's stream counts, bytes and write-queue
// depth.
type Observer interface {
	// StreamOpened is called when a stream of kind k takes a slot
	// (outgoing: opened; incoming: its header admitted).
	StreamOpened(k StreamKind)
	// StreamClosed is called once per StreamOpened, when both halves of
	// the stream are done.
	StreamClosed(k StreamKind)
	// BytesIn counts n bytes read on a stream of kind k (frame bodies and
	// raw reads).
	BytesIn(k StreamKind, n int)
	// BytesOut counts n bytes written on a stream of kind k.
	BytesOut(k StreamKind, n int)
	// QueueAdd adds delta (negative to remove) to the bytes of class c
	// queued in the write scheduler and not yet handed to the backend. It
	// is called with the scheduler's lock held.
	QueueAdd(c WriteClass, delta int)
}

// MessageObserver receives a control channel's message outcomes and
// protocol errors.
type MessageObserver interface {
	// MessageHandled counts one received message of family f with outcome
	// o. f is wire.NumFamilies when the payload did not decode.
	MessageHandled(f wire.Family, o Outcome)
	// ProtocolError counts a WireErrorV1 received, by its code.
	ProtocolError(code wire.ProtocolErrorCode)
}

// WriteClass groups priorities into the write scheduler's queues, the
// unit of Observer.QueueAdd.
type WriteClass uint8

// Write classes.
const (
	ClassControl WriteClass = iota // PriorityCancel, PriorityLease, PriorityControl
	ClassLog                       // PriorityLog
	ClassCAS                       // PriorityCAS
	NumWriteClasses
)

var writeClassNames = [NumWriteClasses]string{"control", "log", "cas"}

// String returns the write class's metric label.
func (c WriteClass) String() string {
	if c < NumWriteClasses {
		return writeClassNames[c]
	}
	return "class?"
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (c WriteClass) LogValue() slog.Value { return slog.StringValue(c.String()) }

// ClassOf returns the write class of priority p.
func ClassOf(p Priority) WriteClass {
	switch p {
	case PriorityLog:
		return ClassLog
	case PriorityCAS:
		return ClassCAS
	}
	return ClassControl
}

// Outcome is what became of one received message (§208: success or error,
// never a MessageId).
type Outcome uint8

// Outcomes.
const (
	OutcomeOK        Outcome = iota // handled
	OutcomeError                    // failed to decode, validate or apply
	OutcomeRejected                 // refused by policy (role, state, rate)
	OutcomeDuplicate                // a retry of an already handled MessageId
	NumOutcomes
)

var outcomeNames = [NumOutcomes]string{"ok", "error", "rejected", "duplicate"}

// String returns the outcome's metric label; "unknown" for a value out of range.
func (o Outcome) String() string {
	if o < NumOutcomes {
		return outcomeNames[o]
	}
	return "unknown"
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (o Outcome) LogValue() slog.Value { return slog.StringValue(o.String()) }

// IsNilObserver reports whether o is nil or an interface holding a nil
// pointer (or other nil reference), which callers treat as no observer.
// It is meant for constructors, not hot paths.
func IsNilObserver(o any) bool {
	if o == nil {
		return true
	}
	switch v := reflect.ValueOf(o); v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface, reflect.UnsafePointer:
		return v.IsNil()
	}
	return false
}
