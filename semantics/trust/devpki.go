package trust

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"forgeyard.dev/transport/semantics/internal/atomicfile"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"forgeyard.dev/transport/wire"
)

// Development PKI defaults.
const (
	// DevCAValidity is the lifetime of a generated development CA.
	DevCAValidity = 365 * 24 * time.Hour
	// DevLeafValidity is the lifetime of generated server and agent
	// certificates.
	DevLeafValidity = 90 * 24 * time.Hour
	// DevBackdate is subtracted from NotBefore so that peers whose clocks
	// lag by a few minutes accept fresh certificates.
	DevBackdate = 5 * time.Minute
	// DevManifestFile is the manifest GenerateDevPKI writes in its
	// directory and LoadDevPKI reads.
	DevManifestFile = "dev-pki.json"
	// devManifestVersion is the manifest format version.
	devManifestVersion = 1
	// maxDevAgents bounds one directory's agent count.
	maxDevAgents = 1000
)

// File names inside a development PKI directory.
const (
	DevCACertFile     = "ca.pem"
	DevCAKeyFile      = "ca-key.pem"
	DevServerCertFile = "server.pem"
	DevServerKeyFile  = "server-key.pem"
)

// DevAgentCertFile and DevAgentKeyFile return the file names of agent name.
func DevAgentCertFile(name string) string { return "agent-" + name + ".pem" }

// DevAgentKeyFile returns the key file name of agent name.
func DevAgentKeyFile(name string) string { return "agent-" + name + "-key.pem" }

// Errors of GenerateDevPKI and LoadDevPKI.
var (
	// ErrInvalidDevPKIOptions: the options are unusable (bad agent or
	// server name, duplicate, too many agents). A usage error.
	ErrInvalidDevPKIOptions = errors.New("trust: invalid dev PKI options")
	// ErrDevPKIConflict: the directory holds files that cannot be reused
	// (half a key pair, a certificate from another CA, an expired CA, a
	// server certificate lacking a requested name). Nothing was
	// overwritten; rerun with Force to start over.
	ErrDevPKIConflict = errors.New("trust: existing dev PKI files cannot be reused")
)

// DevPKIOptions configures GenerateDevPKI. The zero value creates a CA and
// a server certificate for localhost only, and no agents.
type DevPKIOptions struct {
	// Agents names the agent certificates to ensure. A name is 1–63
	// characters of [A-Za-z0-9._-] starting with a letter or digit; its
	// files are agent-<name>.pem and agent-<name>-key.pem.
	Agents []string
	// ServerNames are added to the server certificate's SANs after
	// localhost, 127.0.0.1 and ::1; IP literals become IP SANs.
	ServerNames []string
	// Force regenerates the CA, the server certificate and every agent
	// (requested and already listed in the manifest) with fresh
	// RunnerIds, replacing existing files.
	Force bool
	// CAValidity and LeafValidity override DevCAValidity and
	// DevLeafValidity when positive.
	CAValidity, LeafValidity time.Duration
	// Now overrides the clock (tests). Nil means time.Now.
	Now func() time.Time
}

// DevCert describes one certificate and key pair of a development PKI.
type DevCert struct {
	CertFile string    `json:"cert"`      // path of the PEM certificate
	KeyFile  string    `json:"key"`       // path of the PEM private key (mode 0600)
	NotAfter time.Time `json:"not_after"` // expiry
	Created  bool      `json:"created"`   // written by this call (false: reused)
}

// DevServer is the server certificate of a development PKI.
type DevServer struct {
	DevCert
	Names []string `json:"names"` // DNS and IP SANs
}

// DevAgent is one agent certificate of a development PKI.
type DevAgent struct {
	Name   string        `json:"name"`
	Runner wire.RunnerId `json:"runner_id"` // bound through forgeyard://runner/<ULID>
	DevCert
}

// DevPKI describes a development PKI directory. Paths are absolute.
type DevPKI struct {
	Dir      string     `json:"dir"`
	Manifest string     `json:"manifest"`
	CA       DevCert    `json:"ca"`
	Server   DevServer  `json:"server"`
	Agents   []DevAgent `json:"agents"` // sorted by Name
	// Warnings are non-fatal findings (loose key file modes, certificates
	// expiring soon, manifest entries whose files disappeared).
	Warnings []string `json:"warnings,omitempty"`
}

// Agent returns the agent called name, if present.
func (p *DevPKI) Agent(name string) (DevAgent, bool) {
	for _, a := range p.Agents {
		if a.Name == name {
			return a, true
		}
	}
	return DevAgent{}, false
}

// devManifest is the on-disk form of a DevPKI: paths relative to the
// directory, agents keyed by name.
type devManifest struct {
	Version int                      `json:"version"`
	Note    string                   `json:"note"`
	CA      manifestCert             `json:"ca"`
	Server  manifestServer           `json:"server"`
	Agents  map[string]manifestAgent `json:"agents"`
}

type manifestCert struct {
	Cert     string    `json:"cert"`
	Key      string    `json:"key"`
	NotAfter time.Time `json:"not_after"`
}

type manifestServer struct {
	manifestCert
	Names []string `json:"names"`
}

type manifestAgent struct {
	RunnerID wire.RunnerId `json:"runner_id"`
	manifestCert
}

// ValidDevAgentName reports whether name is usable as an agent name.
func ValidDevAgentName(name string) bool {
	if len(name) == 0 || len(name) > 63 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || (c != '.' && c != '_' && c != '-')) {
			return false
		}
	}
	return true
}

func validServerName(name string) bool {
	if net.ParseIP(name) != nil {
		return true
	}
	if len(name) == 0 || len(name) > 253 {
		return false
	}
	for _, label := range strings.Split(name, ".") {
		if len(label) == 0 || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || (c == '*' && i == 0 && len(label) == 1)) {
				return false
			}
		}
	}
	return true
}

// GenerateDevPKI creates or completes a development PKI in dir: a CA
// (ca.pem, ca-key.pem), a server certificate (server.pem, server-key.pem)
// for localhost, 127.0.0.1, ::1 and opts.ServerNames, and one client
// certificate per agent (agent-<name>.pem, agent-<name>-key.pem) bound to a
// fresh RunnerId, plus the manifest dev-pki.json mapping agent names to
// RunnerIds, files and expiry dates. Keys are ECDSA P-256 in PKCS#8 PEM,
// mode 0600; certificates are mode 0644; dir is created with mode 0700.
//
// It is idempotent: existing files are verified and reused (an agent keeps
// its RunnerId, read from its certificate), and only what is missing is
// generated. It never overwrites a certificate or key silently: files that
// cannot be reused yield ErrDevPKIConflict unless opts.Force is set, in
// which case everything is regenerated. The manifest is always rewritten
// from the certificates, which are the source of truth.
//
// Concurrent calls on one directory are not coordinated, but without Force
// files are created exclusively (O_EXCL), so neither call overwrites the
// other's files: the loser fails with ErrDevPKIConflict.
//
// These credentials are for development and tests only: the CA key sits
// next to the certificates it signs.
func GenerateDevPKI(dir string, opts DevPKIOptions) (*DevPKI, error) {
	if err := checkDevOptions(&opts); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("trust: dev PKI directory %q: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("trust: create dev PKI directory: %w", err)
	}
	g := &devGen{dir: abs, opts: opts, now: opts.Now()}
	return g.run()
}

func checkDevOptions(o *DevPKIOptions) error {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.CAValidity <= 0 {
		o.CAValidity = DevCAValidity
	}
	if o.LeafValidity <= 0 {
		o.LeafValidity = DevLeafValidity
	}
	if len(o.Agents) > maxDevAgents {
		return fmt.Errorf("%w: %d agents requested, at most %d", ErrInvalidDevPKIOptions, len(o.Agents), maxDevAgents)
	}
	seen := make(map[string]bool, len(o.Agents))
	for _, n := range o.Agents {
		if !ValidDevAgentName(n) {
			return fmt.Errorf("%w: agent name %q: use 1-63 characters of A-Z a-z 0-9 . _ - starting with a letter or digit", ErrInvalidDevPKIOptions, n)
		}
		if seen[n] {
			return fmt.Errorf("%w: agent name %q given twice", ErrInvalidDevPKIOptions, n)
		}
		seen[n] = true
	}
	for _, n := range o.ServerNames {
		if !validServerName(n) {
			return fmt.Errorf("%w: server name %q is neither a DNS name nor an IP address", ErrInvalidDevPKIOptions, n)
		}
	}
	return nil
}

// devGen carries one GenerateDevPKI run.
type devGen struct {
	dir    string
	opts   DevPKIOptions
	now    time.Time
	caCert *x509.Certificate
	caKey  crypto.Signer
	out    DevPKI
}

func (g *devGen) path(name string) string { return filepath.Join(g.dir, name) }

func (g *devGen) conflict(format string, args ...any) error {
	return fmt.Errorf("%w: %s (in %s; rerun with --force / Force to regenerate everything)", ErrDevPKIConflict, fmt.Sprintf(format, args...), g.dir)
}

func (g *devGen) warn(format string, args ...any) {
	g.out.Warnings = append(g.out.Warnings, fmt.Sprintf(format, args...))
}

func (g *devGen) run() (*DevPKI, error) {
	g.out.Dir = g.dir
	g.out.Manifest = g.path(DevManifestFile)

	// Agents to ensure: those requested plus those already in the manifest.
	names := slices.Clone(g.opts.Agents)
	requested := make(map[string]bool, len(names))
	for _, n := range names {
		requested[n] = true
	}
	if m, err := readManifest(g.out.Manifest); err == nil {
		for n := range m.Agents {
			if !requested[n] && ValidDevAgentName(n) {
				names = append(names, n)
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) && !g.opts.Force {
		return nil, g.conflict("%s is unreadable: %v", DevManifestFile, err)
	}
	slices.Sort(names)
	if len(names) > maxDevAgents {
		return nil, fmt.Errorf("%w: %d agents in total, at most %d", ErrInvalidDevPKIOptions, len(names), maxDevAgents)
	}

	if err := g.ensureCA(); err != nil {
		return nil, err
	}
	if err := g.ensureServer(); err != nil {
		return nil, err
	}
	for _, n := range names {
		if err := g.ensureAgent(n, requested[n]); err != nil {
			return nil, err
		}
	}
	if err := g.writeManifest(); err != nil {
		return nil, err
	}
	return &g.out, nil
}

// pairState reports which of a cert/key pair exists.
func (g *devGen) pairState(certName, keyName string) (certOK, keyOK bool, err error) {
	exists := func(name string) (bool, error) {
		_, err := os.Lstat(g.path(name))
		if err == nil {
			return true, nil
		}
		if errors.Is(err, fs.ErrNotExist) {
			return false, nil
		}
		return false, err
	}
	if certOK, err = exists(certName); err != nil {
		return
	}
	keyOK, err = exists(keyName)
	return
}

// loadPair reads an existing pair written by GenerateDevPKI (or a
// compatible tool), checking that the key matches.
func (g *devGen) loadPair(certName, keyName string) (*x509.Certificate, crypto.Signer, error) {
	certPEM, err := readFile(certName, g.path(certName))
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err := readFile(keyName, g.path(keyName))
	if err != nil {
		return nil, nil, err
	}
	certs, err := parseCertsPEM(certName, g.path(certName), certPEM)
	if err != nil {
		return nil, nil, err
	}
	key, err := parseKeyPEM(keyName, g.path(keyName), keyPEM)
	if err != nil {
		return nil, nil, err
	}
	if !publicKeysEqual(key.Public(), certs[0].PublicKey) {
		return nil, nil, &FileError{Field: keyName, Path: g.path(keyName), Kind: ErrKeyMismatch}
	}
	if st, err := os.Stat(g.path(keyName)); err == nil && st.Mode().Perm()&0o077 != 0 {
		g.warn("%s has mode %#o; run chmod 600 %s", keyName, st.Mode().Perm(), g.path(keyName))
	}
	return certs[0], key, nil
}

// reusable decides whether an existing pair is reused (true), generated
// (false), or is a conflict (error).
func (g *devGen) reusable(certName, keyName string) (bool, error) {
	if g.opts.Force {
		return false, nil
	}
	c, k, err := g.pairState(certName, keyName)
	switch {
	case err != nil:
		return false, g.conflict("%v", err)
	case c && k:
		return true, nil
	case c:
		return false, g.conflict("%s exists without %s", certName, keyName)
	case k:
		return false, g.conflict("%s exists without %s", keyName, certName)
	}
	return false, nil
}

func (g *devGen) ensureCA() error {
	reuse, err := g.reusable(DevCACertFile, DevCAKeyFile)
	if err != nil {
		return err
	}
	g.out.CA = DevCert{CertFile: g.path(DevCACertFile), KeyFile: g.path(DevCAKeyFile)}
	if reuse {
		cert, key, err := g.loadPair(DevCACertFile, DevCAKeyFile)
		if err != nil {
			return g.conflict("%v", err)
		}
		if !cert.IsCA || !cert.BasicConstraintsValid {
			return g.conflict("%s is not a CA certificate", DevCACertFile)
		}
		if g.now.After(cert.NotAfter) {
			return g.conflict("%s expired at %s", DevCACertFile, cert.NotAfter.UTC().Format(time.RFC3339))
		}
		g.caCert, g.caKey = cert, key
		g.out.CA.NotAfter = cert.NotAfter
		if ExpiresWithin(cert, g.opts.LeafValidity, g.now) {
			g.warn("CA %s expires at %s, before new leaf certificates would; regenerate with --force soon",
				DevCACertFile, cert.NotAfter.UTC().Format(time.RFC3339))
		}
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("trust: generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "Forgeyard development CA", Organization: []string{"Forgeyard (development only)"}},
		NotBefore:             g.now.Add(-DevBackdate),
		NotAfter:              g.now.Add(g.opts.CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	cert, err := g.sign(tmpl, key, tmpl, key)
	if err != nil {
		return err
	}
	if err := g.writePair(DevCACertFile, DevCAKeyFile, cert, key); err != nil {
		return err
	}
	g.caCert, g.caKey = cert, key
	g.out.CA.NotAfter, g.out.CA.Created = cert.NotAfter, true
	return nil
}

// serverSANs returns the DNS names and IPs of the server certificate.
func (g *devGen) serverSANs() (dns []string, ips []net.IP, all []string) {
	dns = []string{"localhost"}
	ips = []net.IP{net.IPv4(127, 0, 0, 1).To4(), net.IPv6loopback}
	for _, n := range g.opts.ServerNames {
		if ip := net.ParseIP(n); ip != nil {
			if !slices.ContainsFunc(ips, ip.Equal) {
				ips = append(ips, ip)
			}
		} else if !slices.Contains(dns, strings.ToLower(n)) {
			dns = append(dns, strings.ToLower(n))
		}
	}
	all = slices.Clone(dns)
	for _, ip := range ips {
		all = append(all, ip.String())
	}
	return dns, ips, all
}

// verifyLeaf checks an existing leaf against the CA for usage at now.
func (g *devGen) verifyLeaf(name string, c *x509.Certificate, usage x509.ExtKeyUsage) error {
	pool := x509.NewCertPool()
	pool.AddCert(g.caCert)
	if _, err := c.Verify(x509.VerifyOptions{Roots: pool, CurrentTime: g.now, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return g.conflict("%s does not verify against %s: %v", name, DevCACertFile, err)
	}
	return nil
}

// reuseLeaf returns the leaf certName (with keyName) that the directory
// already holds, verified against the CA for usage, or nil when there is
// none to reuse (g.reusable).
func (g *devGen) reuseLeaf(certName, keyName string, usage x509.ExtKeyUsage) (*x509.Certificate, error) {
	reuse, err := g.reusable(certName, keyName)
	if err != nil || !reuse {
		return nil, err
	}
	cert, _, err := g.loadPair(certName, keyName)
	if err != nil {
		return nil, g.conflict("%v", err)
	}
	if err := g.verifyLeaf(certName, cert, usage); err != nil {
		return nil, err
	}
	return cert, nil
}

func (g *devGen) ensureServer() error {
	dns, ips, all := g.serverSANs()
	g.out.Server = DevServer{DevCert: DevCert{CertFile: g.path(DevServerCertFile), KeyFile: g.path(DevServerKeyFile)}, Names: all}
	cert, err := g.reuseLeaf(DevServerCertFile, DevServerKeyFile, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return err
	}
	if cert != nil {
		for _, n := range all {
			if cert.VerifyHostname(n) != nil {
				return g.conflict("%s does not cover the requested name %q", DevServerCertFile, n)
			}
		}
		// Report what the certificate really covers.
		g.out.Server.Names = slices.Clone(cert.DNSNames)
		for _, ip := range cert.IPAddresses {
			g.out.Server.Names = append(g.out.Server.Names, ip.String())
		}
		g.out.Server.NotAfter = cert.NotAfter
		g.warnExpiring(DevServerCertFile, cert)
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("trust: generate server key: %w", err)
	}
	cn := "localhost"
	if len(g.opts.ServerNames) > 0 {
		cn = g.opts.ServerNames[0]
	}
	tmpl := g.leafTemplate(cn, x509.ExtKeyUsageServerAuth)
	tmpl.DNSNames, tmpl.IPAddresses = dns, ips
	cert, err = g.sign(tmpl, key, g.caCert, g.caKey)
	if err != nil {
		return err
	}
	if err := g.writePair(DevServerCertFile, DevServerKeyFile, cert, key); err != nil {
		return err
	}
	g.out.Server.NotAfter, g.out.Server.Created = cert.NotAfter, true
	return nil
}

func (g *devGen) ensureAgent(name string, requested bool) error {
	certName, keyName := DevAgentCertFile(name), DevAgentKeyFile(name)
	a := DevAgent{Name: name, DevCert: DevCert{CertFile: g.path(certName), KeyFile: g.path(keyName)}}
	cert, err := g.reuseLeaf(certName, keyName, x509.ExtKeyUsageClientAuth)
	if err != nil {
		return err
	}
	if cert != nil {
		id, err := RunnerIDFromCert(cert)
		if err != nil {
			return g.conflict("%s: %v", certName, err)
		}
		a.Runner, a.NotAfter = id, cert.NotAfter
		g.warnExpiring(certName, cert)
		g.out.Agents = append(g.out.Agents, a)
		return nil
	}
	if !requested && !g.opts.Force {
		g.warn("agent %q is listed in %s but its files are gone; dropped from the manifest", name, DevManifestFile)
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("trust: generate agent key: %w", err)
	}
	id := wire.NewRunnerId()
	tmpl := g.leafTemplate("forgeyard agent "+name, x509.ExtKeyUsageClientAuth)
	tmpl.URIs = []*url.URL{RunnerURI(id)}
	cert, err = g.sign(tmpl, key, g.caCert, g.caKey)
	if err != nil {
		return err
	}
	if err := g.writePair(certName, keyName, cert, key); err != nil {
		return err
	}
	a.Runner, a.NotAfter, a.Created = id, cert.NotAfter, true
	g.out.Agents = append(g.out.Agents, a)
	return nil
}

func (g *devGen) warnExpiring(name string, c *x509.Certificate) {
	if msg := ExpiryWarning(c, DefaultExpiryWarningWindow, g.now); msg != "" {
		g.warn("%s: %s", name, msg)
	}
}

// leafTemplate returns a leaf template valid for LeafValidity, clipped to
// the CA's lifetime.
func (g *devGen) leafTemplate(cn string, usage x509.ExtKeyUsage) *x509.Certificate {
	notAfter := g.now.Add(g.opts.LeafValidity)
	if notAfter.After(g.caCert.NotAfter) {
		notAfter = g.caCert.NotAfter
	}
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn, Organization: []string{"Forgeyard (development only)"}},
		NotBefore:   g.now.Add(-DevBackdate),
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
}

func (g *devGen) sign(tmpl *x509.Certificate, key *ecdsa.PrivateKey, parent *x509.Certificate, parentKey crypto.Signer) (*x509.Certificate, error) {
	sn, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("trust: serial number: %w", err)
	}
	tmpl.SerialNumber = sn.Add(sn, big.NewInt(1))
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		return nil, fmt.Errorf("trust: sign %q: %w", tmpl.Subject.CommonName, err)
	}
	return x509.ParseCertificate(der)
}

// writePair writes the key (0600) then the certificate (0644).
func (g *devGen) writePair(certName, keyName string, cert *x509.Certificate, key *ecdsa.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("trust: encode key: %w", err)
	}
	if err := g.write(keyName, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		return err
	}
	return g.write(certName, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), 0o644)
}

// write creates name with data and mode. Without Force it refuses to
// replace an existing file (O_EXCL); with Force it replaces it atomically.
func (g *devGen) write(name string, data []byte, mode os.FileMode) error {
	if g.opts.Force {
		return writeAtomic(g.path(name), data, mode)
	}
	f, err := os.OpenFile(g.path(name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		if errors.Is(err, fs.ErrExist) {
			return g.conflict("%s appeared while generating", name)
		}
		return fmt.Errorf("trust: write %s: %w", g.path(name), err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode) // regardless of umask
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(g.path(name))
		return fmt.Errorf("trust: write %s: %w", g.path(name), err)
	}
	return nil
}

// writeAtomic replaces path with data crash-safely (atomicfile.WriteFile:
// the file is fsynced before the rename and the directory after it, so a
// crash leaves the old or the new file, never an empty one, and a write
// reported done stays done), with exactly the permission bits mode.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	if err := atomicfile.WriteFile(path, data, mode); err != nil {
		return fmt.Errorf("trust: write %s: %w", path, err)
	}
	return nil
}

func (g *devGen) writeManifest() error {
	rel := func(c DevCert) manifestCert {
		return manifestCert{Cert: filepath.Base(c.CertFile), Key: filepath.Base(c.KeyFile), NotAfter: c.NotAfter.UTC()}
	}
	m := devManifest{
		Version: devManifestVersion,
		Note:    "Forgeyard development PKI: NOT for production. Paths are relative to this file.",
		CA:      rel(g.out.CA),
		Server:  manifestServer{manifestCert: rel(g.out.Server.DevCert), Names: g.out.Server.Names},
		Agents:  make(map[string]manifestAgent, len(g.out.Agents)),
	}
	for _, a := range g.out.Agents {
		m.Agents[a.Name] = manifestAgent{RunnerID: a.Runner, manifestCert: rel(a.DevCert)}
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("trust: encode manifest: %w", err)
	}
	return writeAtomic(g.out.Manifest, append(b, '\n'), 0o644)
}

func readManifest(path string) (*devManifest, error) {
	b, err := readFile("manifest", path)
	if err != nil {
		var fe *FileError
		if errors.As(err, &fe) && errors.Is(fe.Kind, ErrFileMissing) {
			return nil, fs.ErrNotExist
		}
		return nil, err
	}
	var m devManifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	if m.Version != devManifestVersion {
		return nil, fmt.Errorf("%s: unsupported manifest version %d", path, m.Version)
	}
	return &m, nil
}

// LoadDevPKI reads the manifest of a development PKI in dir (written by
// GenerateDevPKI) and returns it with absolute paths, without generating,
// verifying or modifying anything. Created is false everywhere. Errors
// wrap fs.ErrNotExist when there is no manifest.
func LoadDevPKI(dir string) (*DevPKI, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("trust: dev PKI directory %q: %w", dir, err)
	}
	path := filepath.Join(abs, DevManifestFile)
	m, err := readManifest(path)
	if err != nil {
		return nil, fmt.Errorf("trust: load dev PKI: %w", err)
	}
	cert := func(c manifestCert) (DevCert, error) {
		// Only plain file names: a manifest must not point outside dir.
		if c.Cert != filepath.Base(c.Cert) || c.Key != filepath.Base(c.Key) || c.Cert == "" || c.Key == "" {
			return DevCert{}, fmt.Errorf("trust: load dev PKI: %s: bad file name %q / %q", path, c.Cert, c.Key)
		}
		return DevCert{CertFile: filepath.Join(abs, c.Cert), KeyFile: filepath.Join(abs, c.Key), NotAfter: c.NotAfter}, nil
	}
	out := &DevPKI{Dir: abs, Manifest: path}
	if out.CA, err = cert(m.CA); err != nil {
		return nil, err
	}
	if out.Server.DevCert, err = cert(m.Server.manifestCert); err != nil {
		return nil, err
	}
	out.Server.Names = m.Server.Names
	for name, a := range m.Agents {
		c, err := cert(a.manifestCert)
		if err != nil {
			return nil, err
		}
		out.Agents = append(out.Agents, DevAgent{Name: name, Runner: a.RunnerID, DevCert: c})
	}
	slices.SortFunc(out.Agents, func(a, b DevAgent) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}
