package authority

import (
	"fmt"
	"testing"

	"forgeyard.dev/transport/wire"
)

// TestParseEventPayloads: the payload notify writes (with the runner) and
// an older daemon's (without it) both parse; a malformed runner does not.
func TestParseEventPayloads(t *testing.T) {
	ev := Event{Kind: EventRunner, Lease: wire.NewLeaseId(), Attempt: wire.NewJobAttemptId(), Session: wire.NewAgentSessionId(),
		Reason: RunnerEventDrained, Runner: wire.NewRunnerId()}
	p := fmt.Sprintf("o1 %d %x %x %x %d %x", ev.Kind, ev.Lease.ULID[:], ev.Attempt.ULID[:], ev.Session.ULID[:], ev.Reason, ev.Runner.ULID[:])
	origin, got, ok := parseEvent(p)
	if !ok || origin != "o1" || got != ev {
		t.Fatalf("parseEvent(%q) = %q, %+v, %v; want %+v", p, origin, got, ok, ev)
	}
	old := Event{Kind: EventCancel, Lease: ev.Lease, Attempt: ev.Attempt, Session: ev.Session, Reason: 3}
	p = fmt.Sprintf("o2 %d %x %x %x %d", old.Kind, old.Lease.ULID[:], old.Attempt.ULID[:], old.Session.ULID[:], old.Reason)
	if _, got, ok := parseEvent(p); !ok || got != old {
		t.Fatalf("six-field payload: %+v, %v; want %+v", got, ok, old)
	}
	if _, _, ok := parseEvent(p + " zz"); ok {
		t.Fatal("a malformed runner field parsed")
	}
}
