package trust_test

import (
	"crypto/x509"
	"errors"
	"net/url"
	"strings"
	"testing"

	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
)

func certWithURIs(t *testing.T, raw ...string) *x509.Certificate {
	t.Helper()
	c := &x509.Certificate{}
	for _, r := range raw {
		u, err := url.Parse(r)
		if err != nil {
			t.Fatalf("url.Parse(%q): %v", r, err)
		}
		c.URIs = append(c.URIs, u)
	}
	return c
}

func TestRunnerURIRoundTrip(t *testing.T) {
	id := wire.NewRunnerId()
	u := trust.RunnerURI(id)
	if want := "forgeyard://runner/" + id.String(); u.String() != want {
		t.Fatalf("RunnerURI = %q, want %q", u, want)
	}
	got, err := trust.RunnerIDFromCert(certWithURIs(t, u.String()))
	if err != nil || got != id {
		t.Fatalf("RunnerIDFromCert = %v, %v; want %v", got, err, id)
	}
	// Through a real certificate as well (x509 encodes and re-parses SANs).
	p := trusttest.NewPKI(t)
	leaf := p.IssueClient(t, id, trusttest.LeafOptions{}).Leaf
	if got, err := trust.RunnerIDFromCert(leaf); err != nil || got != id {
		t.Fatalf("real cert: RunnerIDFromCert = %v, %v; want %v", got, err, id)
	}
}

func TestRunnerIDFromCertEdgeCases(t *testing.T) {
	id := wire.NewRunnerId()
	good := "forgeyard://runner/" + id.String()
	other := "forgeyard://runner/" + wire.NewRunnerId().String()
	cases := []struct {
		name string
		uris []string
		want error // nil means success with id
	}{
		{"only", []string{good}, nil},
		{"alongside spiffe", []string{"spiffe://example.org/agent", good}, nil},
		{"alongside other forgeyard host", []string{"forgeyard://daemon/x", good}, nil},
		{"upper-case scheme is normalised by url.Parse", []string{"FORGEYARD://runner/" + id.String()}, nil},
		{"none", nil, trust.ErrNoRunnerURI},
		{"wrong scheme https", []string{"https://runner/" + id.String()}, trust.ErrNoRunnerURI},
		{"wrong scheme spiffe", []string{"spiffe://runner/" + id.String()}, trust.ErrNoRunnerURI},
		{"other forgeyard host only", []string{"forgeyard://agent/" + id.String()}, trust.ErrNoRunnerURI},
		{"two different", []string{good, other}, trust.ErrMultipleRunnerURIs},
		{"two identical", []string{good, good}, trust.ErrMultipleRunnerURIs},
		{"bad ULID chars", []string{"forgeyard://runner/01ARZ3NDEKTSV4RRFFQ69G5FAU"}, trust.ErrMalformedRunnerURI},
		{"ULID overflow", []string{"forgeyard://runner/8ZZZZZZZZZZZZZZZZZZZZZZZZZ"}, trust.ErrMalformedRunnerURI},
		{"ULID too short", []string{"forgeyard://runner/" + id.String()[:25]}, trust.ErrMalformedRunnerURI},
		{"ULID lower-case", []string{"forgeyard://runner/" + strings.ToLower(id.String())}, trust.ErrMalformedRunnerURI},
		{"zero ULID", []string{"forgeyard://runner/00000000000000000000000000"}, trust.ErrMalformedRunnerURI},
		{"no path", []string{"forgeyard://runner"}, trust.ErrMalformedRunnerURI},
		{"trailing slash", []string{good + "/"}, trust.ErrMalformedRunnerURI},
		{"extra segment", []string{good + "/x"}, trust.ErrMalformedRunnerURI},
		{"query", []string{good + "?a=b"}, trust.ErrMalformedRunnerURI},
		{"empty query", []string{good + "?"}, trust.ErrMalformedRunnerURI},
		{"fragment", []string{good + "#f"}, trust.ErrMalformedRunnerURI},
		{"port", []string{"forgeyard://runner:7443/" + id.String()}, trust.ErrMalformedRunnerURI},
		{"user info", []string{"forgeyard://u@runner/" + id.String()}, trust.ErrMalformedRunnerURI},
		{"upper-case host", []string{"forgeyard://RUNNER/" + id.String()}, trust.ErrMalformedRunnerURI},
		{"percent-encoded", []string{"forgeyard://runner/%30" + id.String()[1:]}, trust.ErrMalformedRunnerURI},
		{"malformed beats nothing else", []string{"https://x/", "forgeyard://runner/zz"}, trust.ErrMalformedRunnerURI},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := trust.RunnerIDFromCert(certWithURIs(t, c.uris...))
			if c.want == nil {
				if err != nil || got != id {
					t.Fatalf("got %v, %v; want %v", got, err, id)
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("err = %v, want %v", err, c.want)
			}
			if got != (wire.RunnerId{}) {
				t.Fatalf("returned id %v with error", got)
			}
			if errors.Is(c.want, trust.ErrMalformedRunnerURI) {
				var ue *trust.RunnerURIError
				if !errors.As(err, &ue) || ue.Reason == "" || ue.URI == "" {
					t.Fatalf("want *RunnerURIError with URI and Reason, got %#v", err)
				}
			}
		})
	}
}

func TestRunnerIDFromCertNil(t *testing.T) {
	if _, err := trust.RunnerIDFromCert(nil); !errors.Is(err, trust.ErrNoRunnerURI) {
		t.Fatalf("nil cert: %v", err)
	}
	c := &x509.Certificate{URIs: []*url.URL{nil}}
	if _, err := trust.RunnerIDFromCert(c); !errors.Is(err, trust.ErrNoRunnerURI) {
		t.Fatalf("nil URI entry: %v", err)
	}
}

func TestTwoRunnerURIsInRealCertificate(t *testing.T) {
	p := trusttest.NewPKI(t)
	leaf := p.IssueClient(t, wire.NewRunnerId(), trusttest.LeafOptions{
		URIs: []*url.URL{trust.RunnerURI(wire.NewRunnerId())},
	}).Leaf
	if _, err := trust.RunnerIDFromCert(leaf); !errors.Is(err, trust.ErrMultipleRunnerURIs) {
		t.Fatalf("err = %v, want ErrMultipleRunnerURIs", err)
	}
}

func FuzzRunnerIDFromCert(f *testing.F) {
	f.Add("forgeyard://runner/" + wire.NewRunnerId().String())
	f.Add("forgeyard://runner/")
	f.Add("forgeyard://runner:1/%zz")
	f.Fuzz(func(t *testing.T, s string) {
		u, err := url.Parse(s)
		if err != nil {
			return
		}
		id, err := trust.RunnerIDFromCert(&x509.Certificate{URIs: []*url.URL{u}})
		if err != nil {
			return
		}
		// Anything accepted must be exactly the canonical URI of its id.
		if trust.RunnerURI(id).String() != u.String() {
			t.Fatalf("accepted %q as %v, canonical %q", s, id, trust.RunnerURI(id))
		}
	})
}
