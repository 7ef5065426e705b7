package loadgen

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
)

// RunnerValidity is the lifetime of generated runner certificates (clipped
// to the CA's); a cache whose certificates expire within RunnerMinLife is
// regenerated.
const (
	RunnerValidity = 30 * 24 * time.Hour
	RunnerMinLife  = 24 * time.Hour
	// MaxRunners bounds N (a cache file holds ~1 KiB per runner).
	MaxRunners = 200_000
)

// PKI is the fleet's trust material: the development PKI the daemon serves
// with (CA, server certificate; trust.GenerateDevPKI in Dir) and N runner
// identities signed by its CA.
type PKI struct {
	Dev     *trust.DevPKI
	Roots   *x509.CertPool
	Runners []Runner
	// CacheFile holds the runners; Generated says whether this call wrote
	// it (false: read back from the cache).
	CacheFile string
	Generated bool
	Took      time.Duration
	// Curves restricts the key exchange of the fleet, the daemon the
	// loadgen configures and the raw herd's server (config.ParseCurves
	// names; empty: Go's default hybrid). See SetCurves.
	Curves   []string
	curveIDs []tls.CurveID
}

// SetCurves sets p.Curves after checking the names.
func (p *PKI) SetCurves(names []string) error {
	ids, err := config.ParseCurves("--curves", names)
	if err != nil {
		return err
	}
	p.Curves, p.curveIDs = names, ids
	return nil
}

// Runner is one agent identity: its RunnerId and client certificate.
type Runner struct {
	ID   wire.RunnerId
	Cert tls.Certificate
}

// ClientTLS returns the TLS client configuration of runner i (mTLS to the
// dev server certificate, which names localhost and 127.0.0.1).
func (p *PKI) ClientTLS(i int) *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: p.Roots, ServerName: "localhost",
		Certificates: []tls.Certificate{p.Runners[i].Cert}, CurvePreferences: p.curveIDs}
}

// PreparePKI creates or reuses the development PKI in dir (the daemon's
// --dev-pki directory) and n runner certificates signed by its CA. The
// runners are cached in dir as runners-<CA fingerprint>-<n>.pem: a rerun
// with the same CA and n reads them back instead of generating (ECDSA
// P-256, on every core).
func PreparePKI(dir string, n int) (*PKI, error) {
	if n < 1 || n > MaxRunners {
		return nil, fmt.Errorf("loadgen: %d runners out of range 1–%d", n, MaxRunners)
	}
	start := time.Now()
	dev, err := trust.GenerateDevPKI(dir, trust.DevPKIOptions{})
	if err != nil {
		return nil, err
	}
	ca, err := tls.LoadX509KeyPair(dev.CA.CertFile, dev.CA.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("loadgen: dev CA: %w", err)
	}
	caCert, err := x509.ParseCertificate(ca.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("loadgen: dev CA: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(caCert)
	fp := sha256.Sum256(caCert.Raw)
	p := &PKI{Dev: dev, Roots: roots, CacheFile: filepath.Join(dev.Dir, fmt.Sprintf("runners-%s-%d.pem", hex.EncodeToString(fp[:6]), n))}
	if rs, err := readRunners(p.CacheFile, n); err == nil {
		p.Runners, p.Took = rs, time.Since(start)
		return p, nil
	}
	signer, ok := ca.PrivateKey.(*ecdsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("loadgen: dev CA key is %T, want ECDSA", ca.PrivateKey)
	}
	if p.Runners, err = generateRunners(caCert, signer, n); err != nil {
		return nil, err
	}
	if err := writeRunners(p.CacheFile, p.Runners); err != nil {
		return nil, err
	}
	p.Generated, p.Took = true, time.Since(start)
	return p, nil
}

// generateRunners issues n runner certificates on every core.
func generateRunners(ca *x509.Certificate, caKey *ecdsa.PrivateKey, n int) ([]Runner, error) {
	out := make([]Runner, n)
	now := time.Now()
	notAfter := now.Add(RunnerValidity)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	var wg sync.WaitGroup
	errs := make([]error, runtime.GOMAXPROCS(0))
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	for w := range errs {
		wg.Go(func() {
			for i := range next {
				r, err := issueRunner(ca, caKey, i, now, notAfter)
				if err != nil {
					errs[w] = err
					return
				}
				out[i] = r
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

func issueRunner(ca *x509.Certificate, caKey *ecdsa.PrivateKey, i int, now, notAfter time.Time) (Runner, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Runner{}, err
	}
	sn, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return Runner{}, err
	}
	id := wire.NewRunnerId()
	tmpl := &x509.Certificate{
		SerialNumber: sn.Add(sn, big.NewInt(1)),
		Subject:      pkix.Name{CommonName: fmt.Sprintf("forgeyard loadgen runner %d", i), Organization: []string{"Forgeyard (development only)"}},
		NotBefore:    now.Add(-trust.DevBackdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{trust.RunnerURI(id)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return Runner{}, fmt.Errorf("loadgen: sign runner %d: %w", i, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return Runner{}, err
	}
	return Runner{ID: id, Cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}}, nil
}

// writeRunners writes the cache atomically (mode 0600: it holds keys).
func writeRunners(path string, rs []Runner) error {
	var b bytes.Buffer
	for _, r := range rs {
		der, err := x509.MarshalPKCS8PrivateKey(r.Cert.PrivateKey)
		if err != nil {
			return err
		}
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: r.Cert.Certificate[0]})
		_ = pem.Encode(&b, &pem.Block{Type: "PRIVATE KEY", Bytes: der})
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o600); err != nil {
		return fmt.Errorf("loadgen: runner cache: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("loadgen: runner cache: %w", err)
	}
	return nil
}

// readRunners reads a cache written by writeRunners and checks that it
// holds n runners valid for RunnerMinLife.
func readRunners(path string, n int) ([]Runner, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := make([]Runner, 0, n)
	deadline := time.Now().Add(RunnerMinLife)
	for len(data) > 0 {
		cb, rest := pem.Decode(data)
		if cb == nil || cb.Type != "CERTIFICATE" {
			break
		}
		kb, rest := pem.Decode(rest)
		if kb == nil || kb.Type != "PRIVATE KEY" {
			return nil, errors.New("loadgen: runner cache: certificate without key")
		}
		data = rest
		leaf, err := x509.ParseCertificate(cb.Bytes)
		if err != nil {
			return nil, err
		}
		// The file name carries the CA's fingerprint: only expiry is left to check.
		if leaf.NotAfter.Before(deadline) {
			return nil, errors.New("loadgen: runner cache: stale certificate")
		}
		key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
		if err != nil {
			return nil, err
		}
		id, err := trust.RunnerIDFromCert(leaf)
		if err != nil {
			return nil, err
		}
		out = append(out, Runner{ID: id, Cert: tls.Certificate{Certificate: [][]byte{cb.Bytes}, PrivateKey: key, Leaf: leaf}})
	}
	if len(out) != n {
		return nil, fmt.Errorf("loadgen: runner cache holds %d runners, want %d", len(out), n)
	}
	return out, nil
}
