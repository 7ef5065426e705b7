package trust_test

import (
	"crypto/x509"
	"fmt"
	"net/url"
	"os"
	"path/filepath"

	"forgeyard.dev/transport/semantics/trust"
)

func ExampleRunnerIDFromCert() {
	u, _ := url.Parse("forgeyard://runner/01JDQ7Z8X3M4N5P6Q7R8S9T0VW")
	cert := &x509.Certificate{URIs: []*url.URL{u}} // normally the verified leaf
	id, err := trust.RunnerIDFromCert(cert)
	fmt.Println(id, err)

	bad, _ := url.Parse("forgeyard://runner/not-a-ulid")
	_, err = trust.RunnerIDFromCert(&x509.Certificate{URIs: []*url.URL{bad}})
	fmt.Println(err)
	// Output:
	// 01JDQ7Z8X3M4N5P6Q7R8S9T0VW <nil>
	// trust: malformed runner URI SAN "forgeyard://runner/not-a-ulid": path must be /<ULID> with a 26-character ULID
}

func ExampleGenerateDevPKI() {
	dir, _ := os.MkdirTemp("", "forgeyard-dev-pki")
	defer os.RemoveAll(dir)

	pki, err := trust.GenerateDevPKI(dir, trust.DevPKIOptions{Agents: []string{"builder-1"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	a, _ := pki.Agent("builder-1")
	fmt.Println(filepath.Base(pki.CA.CertFile), filepath.Base(pki.Server.CertFile), filepath.Base(a.CertFile), filepath.Base(a.KeyFile))

	// The agent's certificate is bound to its RunnerId; load it like an agent would.
	cfg, err := trust.ClientConfig(trust.ClientFiles{CertFile: a.CertFile, KeyFile: a.KeyFile, CAFile: pki.CA.CertFile, ServerName: "localhost"})
	if err != nil {
		fmt.Println(err)
		return
	}
	id, _ := trust.RunnerIDFromCert(cfg.Certificates[0].Leaf)
	fmt.Println(id == a.Runner)

	// A second run reuses everything.
	again, _ := trust.GenerateDevPKI(dir, trust.DevPKIOptions{Agents: []string{"builder-1"}})
	fmt.Println(again.CA.Created, again.Agents[0].Runner == a.Runner)
	// Output:
	// ca.pem server.pem agent-builder-1.pem agent-builder-1-key.pem
	// true
	// false true
}
