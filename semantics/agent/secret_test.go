package agent

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// secretAgent is an Agent with just what the secret store needs: one
// running attempt of lease.
func secretAgent(lease wire.LeaseId) (*Agent, *attempt) {
	at := &attempt{job: Job{Lease: lease, Attempt: wire.NewJobAttemptId()}}
	a := &Agent{now: time.Now, attempts: map[wire.JobAttemptId]*attempt{at.job.Attempt: at}}
	return a, at
}

func material(lease wire.LeaseId, id, value string, ttl time.Duration) *agentwire.SecretMaterialV1 {
	return &agentwire.SecretMaterialV1{Lease: lease, SecretID: id, Bytes: agentwire.SecretBytes(value),
		ExpiresAtMs: uint64(time.Now().Add(ttl).UnixMilli())}
}

// TestSecretStoreLifecycle: a secret is stored only for a lease the agent
// runs and not yet expired; UseSecret waits for it, hands it over once and
// zeroes it; expiry and the end of Execute zero what is left; a delivery
// after Execute returned is refused.
func TestSecretStoreLifecycle(t *testing.T) {
	lease := wire.NewLeaseId()
	a, at := secretAgent(lease)
	ctx := a.withSecrets(context.Background(), at)

	if a.putSecret(material(wire.NewLeaseId(), "k", "other-lease", time.Minute)) {
		t.Fatal("secret for a lease the agent does not run was stored")
	}
	if a.putSecret(material(lease, "k", "stale", -time.Second)) {
		t.Fatal("expired secret stored")
	}

	// UseSecret waits for the delivery.
	got := make(chan []byte, 1)
	done := make(chan error, 1)
	go func() {
		done <- UseSecret(ctx, "k", func(b agentwire.SecretBytes) error {
			got <- bytes.Clone(b)
			return nil
		})
	}()
	m := material(lease, "k", "s3cr3t", time.Minute)
	held := m.Bytes
	if !a.putSecret(m) {
		t.Fatal("secret for a running lease refused")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if g := <-got; string(g) != "s3cr3t" {
		t.Fatalf("executor got %q", g)
	}
	if !bytes.Equal(held, make([]byte, len(held))) {
		t.Fatal("secret not zeroed after use")
	}
	if err := UseSecret(ctx, "k", func(agentwire.SecretBytes) error { return nil }); !errors.Is(err, ErrSecretGone) {
		t.Fatalf("second use: %v", err)
	}
	if a.putSecret(material(lease, "k", "again", time.Minute)) {
		t.Fatal("a used secret id was stored again")
	}

	// Expiry zeroes an unused secret.
	short := material(lease, "short", "short-lived", 30*time.Millisecond)
	shortBytes := short.Bytes
	if !a.putSecret(short) {
		t.Fatal("short-lived secret refused")
	}
	deadline := time.Now().Add(5 * time.Second)
	for !bytes.Equal(shortBytes, make([]byte, len(shortBytes))) {
		if time.Now().After(deadline) {
			t.Fatal("expired secret never zeroed")
		}
		time.Sleep(5 * time.Millisecond) // the expiry timer has no event to await
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := UseSecret(wctx, "short", func(agentwire.SecretBytes) error { return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("expired secret: %v", err)
	}

	// The end of Execute zeroes what is left and refuses later deliveries.
	left := material(lease, "unused", "never-used", time.Minute)
	leftBytes := left.Bytes
	if !a.putSecret(left) {
		t.Fatal("secret refused")
	}
	a.dropSecrets(at)
	if !bytes.Equal(leftBytes, make([]byte, len(leftBytes))) {
		t.Fatal("unused secret not zeroed when Execute returned")
	}
	if a.putSecret(material(lease, "late", "late", time.Minute)) {
		t.Fatal("secret stored after Execute returned")
	}
	if err := UseSecret(ctx, "unused", func(agentwire.SecretBytes) error { return nil }); !errors.Is(err, ErrSecretGone) {
		t.Fatalf("use after Execute returned: %v", err)
	}
	if err := UseSecret(context.Background(), "k", func(agentwire.SecretBytes) error { return nil }); !errors.Is(err, ErrNoSecrets) {
		t.Fatalf("outside an attempt: %v", err)
	}
}
