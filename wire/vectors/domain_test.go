package vectors

import (
	"bytes"
	"encoding/hex"
	"path/filepath"
	"testing"
	"time"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/registry"
)

// This file documents §34–35: domain types are never serialized directly.
// The scheduler's view of a lease offer below has fields the wire never
// carries, other names and other types (time.Time instead of unix ms); a
// toWire conversion picks what goes on the wire. Refactoring the domain type
// — adding, renaming, reordering or retyping its fields — therefore cannot
// change a single byte of the golden vector. Only a change to
// agent.LeaseOfferV1 can, and the vector tests catch that.

// leaseOffer is a domain lease offer as a scheduler might hold it.
type leaseOffer struct {
	// Domain-only state: never on the wire.
	Tenant        string
	ReceivedAt    time.Time
	SchedulerNode string
	Preempted     bool // internal flag
	Retries       int
	Labels        map[string]string

	// State that maps onto wire fields, in domain types and domain order.
	Epoch   uint64
	Session wire.AgentSessionId
	Expires time.Time
	TTL     time.Duration
	Spec    wire.JobSpecId
	Payload wire.CasObjectRef
	Job     wire.JobId
	Attempt wire.JobAttemptId
	LeaseID wire.LeaseId
}

// toWire is the domain → wire conversion (§34).
func (o *leaseOffer) toWire() *agent.LeaseOfferV1 {
	return &agent.LeaseOfferV1{
		Lease:       o.LeaseID,
		Attempt:     o.Attempt,
		Job:         o.Job,
		SpecID:      o.Spec,
		ExpiresAtMs: uint64(o.Expires.UnixMilli()),
		TTLMs:       uint32(o.TTL / time.Millisecond),
		PayloadRef:  o.Payload,
		Session:     o.Session,
		Epoch:       o.Epoch,
	}
}

// leaseOfferFromWire is the wire → validated domain conversion (§34): it
// runs Validate first and fills only what the wire carries.
func leaseOfferFromWire(t *testing.T, m *agent.LeaseOfferV1) *leaseOffer {
	t.Helper()
	if err := m.Validate(); err != nil {
		t.Fatalf("golden lease offer does not validate: %v", err)
	}
	return &leaseOffer{
		LeaseID: m.Lease, Attempt: m.Attempt, Job: m.Job, Spec: m.SpecID,
		Expires: time.UnixMilli(int64(m.ExpiresAtMs)), TTL: time.Duration(m.TTLMs) * time.Millisecond,
		Payload: m.PayloadRef, Session: m.Session, Epoch: m.Epoch,
	}
}

func goldenVector(t *testing.T, name string) Vector {
	t.Helper()
	vs, err := ReadFile(filepath.Join(testdata, DirName(wire.V(1, 0)), "agent.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		if v.Name == name {
			return v
		}
	}
	t.Fatalf("no golden vector %s", name)
	return Vector{}
}

func TestDomainChangeKeepsVector(t *testing.T) {
	golden := goldenVector(t, "agent.LeaseOfferV1#0")
	env, err := Check(golden, registry.Default)
	if err != nil {
		t.Fatal(err)
	}
	offer := leaseOfferFromWire(t, env.Payload.(*agent.LeaseOfferV1))

	encode := func(o *leaseOffer) (body, frame string) {
		m := o.toWire()
		f, err := wire.AppendEnvelopeFrame(nil, wire.MaxAnyFrame, FixedEnvelope(wire.V(1, 0), m))
		if err != nil {
			t.Fatal(err)
		}
		return hex.EncodeToString(m.AppendPostcard(nil)), hex.EncodeToString(f)
	}

	if body, frame := encode(offer); body != golden.BodyHex || frame != golden.FrameHex {
		t.Fatalf("domain round trip changed the vector:\n body %s\nwant %s", body, golden.BodyHex)
	}

	// Change every domain-only field: the bytes stay those of the vector.
	offer.Tenant = "acme-corp"
	offer.ReceivedAt = time.Date(2031, 5, 6, 7, 8, 9, 0, time.UTC)
	offer.SchedulerNode = "scheduler-3"
	offer.Preempted = true
	offer.Retries = 7
	offer.Labels = map[string]string{"queue": "gpu", "priority": "high"}
	if body, frame := encode(offer); body != golden.BodyHex || frame != golden.FrameHex {
		t.Errorf("a domain-only change altered the wire bytes:\n body %s\nwant %s", body, golden.BodyHex)
	}

	// Sub-millisecond precision in a domain time is not wire state either:
	// the wire carries unix milliseconds.
	offer.Expires = offer.Expires.Add(999 * time.Microsecond)
	if body, _ := encode(offer); body != golden.BodyHex {
		t.Errorf("sub-millisecond domain time altered the wire bytes")
	}

	// Control: a change to state the wire carries does change the bytes, so
	// the equalities above are not vacuous.
	offer.TTL += time.Second
	if body, _ := encode(offer); body == golden.BodyHex {
		t.Error("changing the TTL left the wire bytes unchanged")
	}
	b, _ := hex.DecodeString(golden.BodyHex)
	if bytes.Contains(b, []byte("acme-corp")) {
		t.Error("tenant leaked into the vector")
	}
}
