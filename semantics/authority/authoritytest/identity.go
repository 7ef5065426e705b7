package authoritytest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"

	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/wire"
)

func identities(t *testing.T, a authority.Authority) authority.Identities {
	t.Helper()
	return facet(t, a, authority.IdentitiesOf, "does not implement authority.Identities")
}

func newToken(name string, ttl time.Duration) authority.EnrollmentToken {
	h := sha256.Sum256([]byte(name + wire.NewMessageId().String()))
	return authority.EnrollmentToken{Hash: h, ID: fmt.Sprintf("%x", h[:6]), Name: name, Labels: []string{"linux", "gpu"},
		CreatedAt: t0, ExpiresAt: t0.Add(ttl)}
}

func testTokens(t *testing.T, o Opener) {
	ctx := context.Background()
	id := identities(t, o.Open(t))
	tok := newToken("build-1", time.Hour)
	if err := id.CreateEnrollmentToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	if err := id.CreateEnrollmentToken(ctx, tok); !errors.Is(err, authority.ErrConflict) {
		t.Fatalf("duplicate create: %v, want ErrConflict", err)
	}
	runner := wire.NewRunnerId()
	got, err := id.ConsumeEnrollmentToken(ctx, tok.Hash, runner, t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if got.Runner != runner || got.Name != "build-1" || len(got.Labels) != 2 || got.Labels[1] != "gpu" || !got.UsedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("consumed token = %+v", got)
	}
	if _, err := id.ConsumeEnrollmentToken(ctx, tok.Hash, wire.NewRunnerId(), t0.Add(2*time.Minute)); !errors.Is(err, authority.ErrTokenUsed) {
		t.Fatalf("second use: %v, want ErrTokenUsed", err)
	}
	if err := id.RevokeEnrollmentToken(ctx, tok.ID, t0); !errors.Is(err, authority.ErrTokenUsed) {
		t.Fatalf("revoke used: %v, want ErrTokenUsed", err)
	}
	var unknown [32]byte
	unknown[0] = 1
	if _, err := id.ConsumeEnrollmentToken(ctx, unknown, runner, t0); !errors.Is(err, authority.ErrTokenUnknown) {
		t.Fatalf("unknown: %v", err)
	}
	exp := newToken("build-2", time.Minute)
	if err := id.CreateEnrollmentToken(ctx, exp); err != nil {
		t.Fatal(err)
	}
	if _, err := id.ConsumeEnrollmentToken(ctx, exp.Hash, runner, t0.Add(time.Minute)); !errors.Is(err, authority.ErrTokenExpired) {
		t.Fatalf("expired: %v, want ErrTokenExpired", err)
	}
	rev := newToken("build-3", time.Hour)
	if err := id.CreateEnrollmentToken(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if err := id.RevokeEnrollmentToken(ctx, rev.ID, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := id.ConsumeEnrollmentToken(ctx, rev.Hash, runner, t0); !errors.Is(err, authority.ErrTokenRevoked) {
		t.Fatalf("revoked: %v, want ErrTokenRevoked", err)
	}
	if err := id.RevokeEnrollmentToken(ctx, "nope", t0); !errors.Is(err, authority.ErrNotFound) {
		t.Fatalf("revoke unknown: %v", err)
	}
	list, err := id.EnrollmentTokens(ctx, 10)
	if err != nil || len(list) != 3 {
		t.Fatalf("list = %d, %v", len(list), err)
	}
	bad := newToken("x", time.Hour)
	bad.Labels = []string{"a\nb"}
	if err := id.CreateEnrollmentToken(ctx, bad); err == nil {
		t.Fatal("label with newline accepted")
	}
}

// consumeRace consumes one token from n goroutines spread over the given
// authorities and checks that exactly one succeeds and the rest get
// ErrTokenUsed.
func consumeRace(t *testing.T, as []authority.Identities, n int) {
	t.Helper()
	ctx := context.Background()
	tok := newToken("race", time.Hour)
	if err := as[0].CreateEnrollmentToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, n)
	together(n, func(i int) {
		_, errs[i] = as[i%len(as)].ConsumeEnrollmentToken(ctx, tok.Hash, wire.NewRunnerId(), t0.Add(time.Second))
	})
	ok := 0
	for i, err := range errs {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, authority.ErrTokenUsed):
			t.Errorf("consumer %d: %v, want ErrTokenUsed", i, err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d consumers succeeded, want exactly 1", ok)
	}
}

func testTokenRace(t *testing.T, o Opener) {
	consumeRace(t, []authority.Identities{identities(t, o.Open(t))}, 8)
}

func testCertificates(t *testing.T, o Opener) {
	ctx := context.Background()
	a := o.Open(t)
	id := identities(t, a)
	r1, r2 := wire.NewRunnerId(), wire.NewRunnerId()
	c1 := authority.IssuedCertificate{Serial: "1a2b", Runner: r1, NotAfter: t0.Add(time.Hour), IssuedAt: t0}
	c2 := authority.IssuedCertificate{Serial: "3c4d", Runner: r2, NotAfter: t0.Add(time.Hour), IssuedAt: t0}
	for _, c := range []authority.IssuedCertificate{c1, c2, c1} {
		if err := id.RecordCertificate(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := id.RecordCertificate(ctx, authority.IssuedCertificate{Serial: "1a2b", Runner: r2}); !errors.Is(err, authority.ErrConflict) {
		t.Fatalf("serial reuse: %v", err)
	}
	if err := id.RecordCertificate(ctx, authority.IssuedCertificate{Serial: "XYZ", Runner: r2}); err == nil {
		t.Fatal("non-hex serial accepted")
	}
	creds := []authority.Credential{{Runner: r1, Serial: "1a2b"}, {Runner: r2, Serial: "3c4d"}, {Runner: wire.NewRunnerId()}}
	if rv, err := id.CheckCredentials(ctx, creds); err != nil || len(rv) != 0 {
		t.Fatalf("all good: %v, %v", rv, err)
	}
	if err := id.RevokeCertificate(ctx, "1A:2B", "key leaked", t0); err != nil {
		t.Fatal(err)
	}
	if err := id.RevokeCertificate(ctx, "ffff", "x", t0); !errors.Is(err, authority.ErrNotFound) {
		t.Fatalf("revoke unknown serial: %v", err)
	}
	if err := a.SetRunnerEnabled(ctx, r2, false, "decommissioned", t0); err != nil {
		t.Fatal(err)
	}
	rv, err := id.CheckCredentials(ctx, creds)
	if err != nil || len(rv) != 2 {
		t.Fatalf("revocations = %+v, %v", rv, err)
	}
	if rv[0].Runner != r1 || rv[0].RunnerDisabled || rv[0].Reason != "key leaked" {
		t.Errorf("cert revocation = %+v", rv[0])
	}
	if rv[1].Runner != r2 || !rv[1].RunnerDisabled || rv[1].Reason != "decommissioned" {
		t.Errorf("runner revocation = %+v", rv[1])
	}
	list, err := id.Certificates(ctx, r1)
	if err != nil || len(list) != 1 || !list[0].Revoked {
		t.Fatalf("Certificates = %+v, %v", list, err)
	}
	// Many credentials in one call (several query chunks).
	many := make([]authority.Credential, 1200)
	for i := range many {
		many[i] = authority.Credential{Runner: wire.NewRunnerId(), Serial: fmt.Sprintf("%x", i+0x10000)}
	}
	many[1100] = authority.Credential{Runner: r2}
	if rv, err := id.CheckCredentials(ctx, many); err != nil || len(rv) != 1 || rv[0].Runner != r2 {
		t.Fatalf("chunked check = %+v, %v", rv, err)
	}
	if _, err := id.CheckCredentials(ctx, make([]authority.Credential, authority.MaxCheckCredentials+1)); err == nil {
		t.Fatal("unbounded CheckCredentials accepted")
	}
}

// testIdentityShared: a token consumed through one daemon's authority is
// used for the other; racing consumers on two instances yield one winner;
// a revocation made through one is seen by the other.
func testIdentityShared(t *testing.T, o Opener) {
	ctx := context.Background()
	a := o.Open(t)
	b := o.Shared(t)
	ia, ib := identities(t, a), identities(t, b)
	consumeRace(t, []authority.Identities{ia, ib}, 8)
	r := wire.NewRunnerId()
	if err := ia.RecordCertificate(ctx, authority.IssuedCertificate{Serial: "abc", Runner: r, NotAfter: t0.Add(time.Hour), IssuedAt: t0}); err != nil {
		t.Fatal(err)
	}
	if err := ib.RevokeCertificate(ctx, "abc", "stolen", t0); err != nil {
		t.Fatal(err)
	}
	rv, err := ia.CheckCredentials(ctx, []authority.Credential{{Runner: r, Serial: "abc"}})
	if err != nil || len(rv) != 1 {
		t.Fatalf("revocation through the other daemon not seen: %+v, %v", rv, err)
	}
}
