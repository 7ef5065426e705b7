package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"forgeyard.dev/transport/backends/quic"
	"forgeyard.dev/transport/backends/yamux"
	"forgeyard.dev/transport/backends/yamux/proxy"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/doctor"
	"forgeyard.dev/transport/internal/setup/agentsetup"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// Doctor defaults.
const (
	// DefaultDoctorTimeout bounds each network check of one endpoint.
	DefaultDoctorTimeout = 3 * time.Second
	// DefaultMaxClockSkew is the clock difference to the daemon above
	// which doctor warns.
	DefaultMaxClockSkew = 30 * time.Second
)

const doctorHelp = `Usage: forgeyard-agent doctor [--config FILE] [agent flags] [--json] [--timeout D]

Checks, with the agent's own configuration, whether this agent can reach and
use its daemon, and says in plain words what to fix. It never registers (a
running agent on this machine is not disturbed). Checks, in order:

  config       the configuration loads
  certificate  the agent's certificate: not expired, RunnerId URI present,
               not expiring within the warning window (§22)
  for every endpoint:
  dns          the host name resolves
  udp          (quic, webtransport) a QUIC handshake gets an answer
  tcp          (yamux) a TCP connection opens, through HTTPS_PROXY if set
  tls-trust    the daemon certificate verifies against the configured CA
               and matches the server name (the exact x509 reason if not)
  client-cert  the daemon accepts this agent's certificate
  protocol     a Hello/HelloAck round trip: negotiated version and features,
               or the daemon's rejection
  clock        the daemon's clock (from HelloAck) is within --max-skew
  mtu          what can be said about the path MTU

A QUIC or WebTransport endpoint without a UDP path (dropped, unreachable) is
WARN, not FAIL, when a TCP or relay endpoint passed every check: the agent
is healthy over it (networks without UDP by design). Proxy failures say what
the proxy answered (407 and the schemes it offers, 403, 502/503) and what to
change.

Exit status 0 when nothing FAILed, 1 otherwise, 2 on a usage error.

Flags:
`

// doctorFlagSet is doctor's flags: the agent's and its own.
func doctorFlagSet(f *flags, out io.Writer) (fs *flag.FlagSet, asJSON *bool, timeout, maxSkew *time.Duration) {
	fs = newFlagSet(f, out)
	fs.Init("forgeyard-agent doctor", flag.ContinueOnError)
	asJSON = fs.Bool("json", false, "print the findings as JSON")
	timeout = fs.Duration("timeout", DefaultDoctorTimeout, "how long each network check of an endpoint may take")
	maxSkew = fs.Duration("max-skew", DefaultMaxClockSkew, "warn when the daemon's clock differs from this machine's by more")
	cli.SetUsage(fs, doctorHelp, "")
	return fs, asJSON, timeout, maxSkew
}

// runDoctor is `forgeyard-agent doctor`.
func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var f flags
	fs, asJSON, timeout, maxSkew := doctorFlagSet(&f, stderr)
	if code, ok := cli.ParseNoArgs(fs, args, stdout, stderr, "forgeyard-agent doctor"); !ok {
		return code
	}
	if *timeout < 100*time.Millisecond || *timeout > time.Minute {
		fmt.Fprintln(stderr, "forgeyard-agent doctor: --timeout must be 100ms–1m")
		return cli.ExitUsage
	}
	r := &doctor.Report{}
	cfg, err := buildConfig(fs, &f)
	if err != nil {
		r.Add(doctor.Finding{Check: "config", Target: f.ConfigFile, Result: doctor.Fail, Detail: err.Error(), Fix: "fix the configuration key named above"})
	} else {
		eps := make([]string, 0, len(cfg.ControlPlane.Endpoints))
		for _, e := range cfg.Endpoints() {
			eps = append(eps, e.String())
		}
		noun := "endpoints"
		if len(eps) == 1 {
			noun = "endpoint"
		}
		r.Add(doctor.Finding{Check: "config", Target: f.ConfigFile, Result: doctor.OK, Detail: fmt.Sprintf("%d %s: %s", len(eps), noun, strings.Join(eps, ", "))})
		d := &agentDoctor{cfg: cfg, timeout: *timeout, maxSkew: *maxSkew, now: time.Now, r: r}
		px, err := agentsetup.ProxyFor(cfg.ControlPlane.Proxy, cfg.ControlPlane.NoProxy)
		if err != nil {
			r.Add(doctor.Finding{Check: "proxy", Target: cfg.ControlPlane.Proxy, Result: doctor.Fail, Detail: err.Error(),
				Fix: "set control_plane.proxy (--proxy) to http://[user:pass@]host:port, or \"none\""})
		} else {
			d.px = px
			d.run(ctx)
		}
	}
	_ = r.Print(stdout, *asJSON)
	if r.Failed() {
		return cli.ExitFail
	}
	return cli.ExitOK
}

type agentDoctor struct {
	cfg     *config.Agent
	timeout time.Duration
	maxSkew time.Duration
	now     func() time.Time
	r       *doctor.Report

	leaf   *x509.Certificate // the agent's certificate, if it parsed
	client *tls.Config       // client TLS config for the dials, nil if unusable
	// px is the agent's proxy for TCP endpoints (agentsetup.ProxyFor;
	// nil: direct).
	px *proxy.Dialer
	// udpDown indexes the findings where a UDP endpoint got no UDP path
	// (dropped, unreachable); healthy is the first TCP or relay endpoint
	// whose every check passed. With both, the UDP findings become WARN.
	udpDown []int
	healthy string
}

func (d *agentDoctor) add(check, target string, res doctor.Result, detail, fix string) {
	d.r.Add(doctor.Finding{Check: check, Target: target, Result: res, Detail: detail, Fix: fix})
}

func (d *agentDoctor) run(ctx context.Context) {
	d.checkCertificate()
	d.buildClientTLS()
	for _, e := range d.cfg.Endpoints() {
		d.checkEndpoint(ctx, e)
	}
	d.judgeUDP()
}

// judgeUDP: an agent on a network without UDP (by design, or a firewall)
// that is healthy over a TCP endpoint or a relay is not broken, so
// monitoring built on `doctor` must not alarm forever. Its QUIC and
// WebTransport endpoints' "no UDP path" findings become WARN, saying so;
// any other failure (certificates, protocol, a refused relay) stays FAIL.
func (d *agentDoctor) judgeUDP() {
	if d.healthy == "" {
		return
	}
	for _, i := range d.udpDown {
		f := d.r.Findings[i]
		f.Result = doctor.Warn
		f.Detail = "QUIC unavailable here, and the agent is healthy over " + d.healthy + ": " + f.Detail
		f.Fix = "nothing to do where UDP is blocked by design; to use QUIC (lower latency), " + f.Fix
		d.r.Replace(i, f)
	}
}

// addUDPDown adds a FAIL for a UDP endpoint without a UDP path and
// remembers it for judgeUDP.
func (d *agentDoctor) addUDPDown(target, detail, fix string) {
	d.udpDown = append(d.udpDown, len(d.r.Findings))
	d.add("udp", target, doctor.Fail, detail, fix)
}

// server names what serves endpoint e: "the daemon" or "forgeyard-relay".
func server(e config.Endpoint) string {
	if e.Relay {
		return "forgeyard-relay"
	}
	return "the daemon"
}

// listenKey is the listen key of the server of e that serves its backend.
func listenKey(e config.Endpoint) string {
	switch e.Backend {
	case config.BackendYamux:
		return "listen.yamux"
	case config.BackendWebTransport:
		return "listen.webtransport"
	}
	return "listen.quic"
}

// fallbacks lists the configured TCP and relay endpoints (what the agent
// uses when UDP fails).
func (d *agentDoctor) fallbacks() []string {
	var out []string
	for _, e := range d.cfg.Endpoints() {
		if e.Backend == config.BackendYamux {
			out = append(out, e.String())
		}
	}
	return out
}

// checkCertificate checks the agent's own certificate file without the
// loader's refusals, so an expired certificate is described, not just
// refused.
func (d *agentDoctor) checkCertificate() {
	path := d.cfg.ControlPlane.Credential.Certificate
	fail := func(detail, fix string) { d.add("certificate", path, doctor.Fail, detail, fix) }
	b, err := readPEMFile(path)
	if err != nil {
		fail(err.Error(), "set control_plane.credential.certificate to the agent's certificate file")
		return
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		fail("no PEM CERTIFICATE block", "the file must hold the agent certificate in PEM form, leaf first")
		return
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		fail("cannot parse the certificate: "+err.Error(), "replace the file with a valid PEM certificate")
		return
	}
	d.leaf = c
	now := d.now()
	id, idErr := trust.RunnerIDFromCert(c)
	switch {
	case now.After(c.NotAfter):
		fail(fmt.Sprintf("certificate expired at %s (%s ago); the daemon refuses it", c.NotAfter.UTC().Format(time.RFC3339), now.Sub(c.NotAfter).Round(time.Second)),
			trust.MsgCredentialExpired)
	case now.Before(c.NotBefore):
		fail(fmt.Sprintf("certificate is valid only from %s", c.NotBefore.UTC().Format(time.RFC3339)),
			"check this machine's clock (timedatectl; enable NTP)")
	case idErr != nil:
		fail("no RunnerId: "+idErr.Error(), "issue the certificate with a URI SAN forgeyard://runner/<RunnerId>")
	case trust.ExpiresWithin(c, trust.DefaultExpiryWarningWindow, now):
		d.add("certificate", path, doctor.Warn, trust.ExpiryWarning(c, trust.DefaultExpiryWarningWindow, now), "rotate the certificate before it expires")
	default:
		d.add("certificate", path, doctor.OK, fmt.Sprintf("runner %s, valid until %s (%d days)", id, c.NotAfter.UTC().Format("2006-01-02"),
			int(c.NotAfter.Sub(now)/(24*time.Hour))), "")
	}
}

// buildClientTLS builds the dial configuration like trust.ClientConfig
// (TLS 1.3, the configured CA and server name, verification on), but
// also with a certificate trust.ClientConfig would refuse to load
// (expired), so the daemon's own answer to it can be reported.
func (d *agentDoctor) buildClientTLS() {
	cred := d.cfg.ControlPlane.Credential
	if c, err := agentsetup.LoadCredential(d.cfg.ControlPlane); err == nil {
		d.client = c.Client
		return
	}
	caPEM, err := readPEMFile(cred.CA)
	if err != nil {
		d.add("ca", cred.CA, doctor.Fail, err.Error(), "set control_plane.credential.ca to the CA that signs the daemon certificate")
		return
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		d.add("ca", cred.CA, doctor.Fail, "no PEM certificate in the CA file", "put the CA certificate (PEM) that signs the daemon certificate there")
		return
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pool, ServerName: d.cfg.ControlPlane.ServerName}
	if kp, err := tls.LoadX509KeyPair(cred.Certificate, cred.PrivateKey); err == nil {
		tc.Certificates = []tls.Certificate{kp}
	} else {
		d.add("key", cred.PrivateKey, doctor.Fail, err.Error(), "control_plane.credential.private_key must be the key of the certificate")
	}
	d.client = tc
}

func (d *agentDoctor) checkEndpoint(ctx context.Context, e config.Endpoint) {
	target := e.String()
	if !d.checkDNS(ctx, e) {
		return
	}
	if d.client == nil {
		d.add("tls-trust", target, doctor.Skip, "no usable TLS configuration (see above)", "")
		return
	}
	if e.Backend == config.BackendYamux && !d.checkTCP(ctx, e, d.proxy(e)) {
		return
	}
	tc := d.client.Clone()
	if tc.ServerName == "" {
		tc.ServerName = e.Host()
	}
	// The agent's own dialer for e (internal/setup/agentsetup): the proxy for TCP
	// endpoints, the HTTP Upgrade form, relays.
	ep, err := agentsetup.Endpoint(e, agentsetup.EndpointOptions{TLS: tc, Proxy: d.px,
		QUIC: quic.Config{HandshakeTimeout: d.timeout, Logger: discardLogger()}, Yamux: yamux.Config{HandshakeTimeout: d.timeout}})
	if err != nil {
		d.add("dial", target, doctor.Fail, err.Error(), "")
		return
	}
	dctx, cancel := context.WithTimeout(ctx, d.timeout+time.Second)
	start := time.Now()
	bc, err := ep.Dialer.Dial(dctx, ep.Address)
	cancel()
	udp := e.Backend != config.BackendYamux
	if err != nil {
		d.dialFailed(e, tc.ServerName, udp, err)
		return
	}
	defer bc.CloseWithCode(wire.CloseNormal, "doctor done")
	if udp {
		d.add("udp", target, doctor.OK, fmt.Sprintf("QUIC handshake completed in %s", time.Since(start).Round(time.Millisecond)), "")
	}
	d.add("tls-trust", target, doctor.OK, fmt.Sprintf("%s certificate verifies against %s for server name %q", strings.TrimPrefix(server(e), "the "), d.cfg.ControlPlane.Credential.CA, tc.ServerName), "")
	if !d.checkProtocol(ctx, e, bc) {
		return
	}
	if !udp && d.healthy == "" {
		d.healthy = target
	}
	if udp {
		d.add("mtu", target, doctor.OK, "QUIC handshake packets (at least 1200 bytes) pass; the path MTU quic-go discovers is not exposed, so trouble with larger packets is not detectable here", "")
	} else {
		d.add("mtu", target, doctor.OK, "TCP adapts to the path MTU; not detectable here", "")
	}
}

func (d *agentDoctor) checkDNS(ctx context.Context, e config.Endpoint) bool {
	host := e.Host()
	viaProxy := e.Backend == config.BackendYamux && d.proxy(e) != nil
	if _, err := netip.ParseAddr(host); err == nil {
		d.add("dns", e.String(), doctor.OK, host+" is an IP address; no lookup needed", "")
		return true
	}
	lctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(lctx, host)
	if err != nil || len(addrs) == 0 {
		msg := "no addresses"
		if err != nil {
			msg = err.Error()
		}
		if viaProxy {
			d.add("dns", e.String(), doctor.OK, "cannot resolve "+host+" here ("+msg+"); the proxy resolves it", "")
			return true
		}
		d.add("dns", e.String(), doctor.Fail, "cannot resolve "+host+": "+msg, "check the endpoint's host name and this machine's resolver (/etc/resolv.conf)")
		return false
	}
	d.add("dns", e.String(), doctor.OK, host+" resolves to "+strings.Join(addrs, ", "), "")
	return true
}

// proxy returns the proxy the agent uses for TCP endpoint e, or nil.
func (d *agentDoctor) proxy(e config.Endpoint) *url.URL {
	if d.px == nil || d.px.Proxy == nil || e.Backend != config.BackendYamux {
		return nil
	}
	u, err := d.px.Proxy(e.HostPort)
	if err != nil {
		return nil
	}
	return u
}

// checkTCP opens (and closes) a TCP connection to a yamux endpoint,
// through proxy when not nil.
func (d *agentDoctor) checkTCP(ctx context.Context, e config.Endpoint, proxy *url.URL) bool {
	target := e.String()
	tctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	if proxy != nil {
		c, err := d.px.DialContext(tctx, "tcp", e.HostPort)
		if err != nil {
			d.add("tcp", target, doctor.Fail, fmt.Sprintf("through proxy %s: %v", proxy.Host, err), d.proxyFix(e, proxy, err))
			return false
		}
		c.Close()
		d.add("tcp", target, doctor.OK, "TCP connection through proxy "+proxy.Host+" opened (HTTP CONNECT)", "")
		return true
	}
	var nd net.Dialer
	c, err := nd.DialContext(tctx, "tcp", e.HostPort)
	if err != nil {
		var ne net.Error
		switch {
		case errors.Is(err, syscall.ECONNREFUSED):
			d.add("tcp", target, doctor.Fail, "TCP to "+e.HostPort+" refused: nothing listens there",
				fmt.Sprintf("check that %s runs on %s and serves %s on port %s", server(e), e.Host(), listenKey(e), port(e.HostPort)))
		case errors.As(err, &ne) && ne.Timeout():
			d.add("tcp", target, doctor.Fail, "TCP to "+e.HostPort+" is blocked or dropped (no answer within "+d.timeout.String()+")",
				fmt.Sprintf("allow TCP %s from this machine to %s, or set control_plane.proxy (or HTTPS_PROXY) if this network allows only a proxy; a stock proxy allows CONNECT to 443 only: use relay+yamux://<relay>:443", port(e.HostPort), e.Host()))
		case isUnreachable(err):
			d.add("tcp", target, doctor.Fail, "TCP to "+e.HostPort+": "+err.Error()+": this machine has no route there",
				fmt.Sprintf("check this machine's routes to %s (ip route get %s; a VPN?), or set control_plane.proxy (or HTTPS_PROXY) if this network allows only a proxy", e.Host(), e.Host()))
		default:
			d.add("tcp", target, doctor.Fail, "TCP to "+e.HostPort+": "+err.Error(), fmt.Sprintf("check routing and firewalls between this machine and %s", e.HostPort))
		}
		return false
	}
	c.Close()
	d.add("tcp", target, doctor.OK, "TCP connection to "+e.HostPort+" opened", "")
	return true
}

// dialFailed classifies a failed dial: no answer at all (UDP blocked), a
// server certificate that does not verify, or the daemon refusing ours.
func (d *agentDoctor) dialFailed(e config.Endpoint, serverName string, udp bool, err error) {
	target := e.String()
	if reason := x509Reason(err); reason != "" {
		if udp {
			d.add("udp", target, doctor.OK, "the daemon answered over UDP", "")
		}
		d.add("tls-trust", target, doctor.Fail, "the daemon certificate does not verify: "+reason, trustFix(reason, d.cfg.ControlPlane.Credential.CA, serverName))
		return
	}
	if alert := remoteAlert(err); alert != "" {
		if udp {
			d.add("udp", target, doctor.OK, "the daemon answered over UDP", "")
		}
		d.add("tls-trust", target, doctor.OK, "daemon certificate verifies", "")
		d.clientCertRefused(target, alert)
		return
	}
	if udp {
		h, p := e.Host(), port(e.HostPort)
		switch {
		case isTimeout(err):
			d.addUDPDown(target, fmt.Sprintf("UDP to %s:%s is blocked or dropped (no answer within %s)", h, p, d.timeout), d.udpFix(e))
			return
		case isUnreachable(err):
			d.addUDPDown(target, fmt.Sprintf("UDP to %s:%s: %v: this machine has no UDP path there", h, p, unreachableReason(err)),
				fmt.Sprintf("check this machine's routes and local firewall for UDP to %s (ip route get %s); %s", h, h, d.udpFix(e)))
			return
		case errors.Is(err, syscall.ECONNREFUSED):
			d.add("udp", target, doctor.Fail, fmt.Sprintf("nothing answers on UDP %s at %s (port unreachable)", p, h),
				fmt.Sprintf("check that %s runs on %s and serves %s on UDP port %s", server(e), h, listenKey(e), p))
			return
		}
		d.add("udp", target, doctor.Fail, err.Error(),
			fmt.Sprintf("check that %s runs on %s and serves %s on UDP port %s", server(e), h, listenKey(e), p))
		return
	}
	d.add("tls", target, doctor.Fail, err.Error(), d.tcpDialFix(e, err))
}

// tcpDialFix is the fix line for a TLS+yamux dial that failed after TCP
// (or the proxy's CONNECT) succeeded.
func (d *agentDoctor) tcpDialFix(e config.Endpoint, err error) string {
	if px := d.proxy(e); px != nil && proxy.Failed(err) {
		return d.proxyFix(e, px, err)
	}
	if strings.Contains(err.Error(), "yamux: alpn") || strings.Contains(err.Error(), "yamux: http upgrade") {
		if e.Upgrade {
			return fmt.Sprintf("%s at %s did not answer the HTTP/1.1 Upgrade: check that it is a forgeyard listener (%s) and that no middlebox answers in its place", server(e), e.HostPort, listenKey(e))
		}
		return fmt.Sprintf("%s at %s did not negotiate ALPN forgeyard/1: a TLS-intercepting middlebox is on the path, or it is not a forgeyard listener; try %s",
			server(e), e.HostPort, strings.Replace(e.String(), e.Scheme()+"://", e.Scheme()+"+upgrade://", 1))
	}
	return fmt.Sprintf("check that %s runs on %s and serves %s on port %s", server(e), e.Host(), listenKey(e), port(e.HostPort))
}

// proxyFix is the fix line for a failure of the proxy step towards e.
func (d *agentDoctor) proxyFix(e config.Endpoint, px *url.URL, err error) string {
	p := port(e.HostPort)
	var ae *proxy.AuthRequiredError
	var se *proxy.StatusError
	var ce *proxy.ConnectError
	switch {
	case errors.As(err, &ae) && !ae.BasicOffered():
		return fmt.Sprintf("proxy %s offers only %s: have it accept Basic for this agent, or exempt %s from the proxy (control_plane.no_proxy or NO_PROXY) if it is reachable directly", px.Host, strings.Join(ae.Schemes, "/"), e.Host())
	case errors.As(err, &ae) && ae.HadCredentials:
		return fmt.Sprintf("correct the user and password in control_plane.proxy (or HTTPS_PROXY): http://user:pass@%s; the agent retries a refused login only slowly (backoff.auth_after, backoff.auth_max) so the account is not locked", px.Host)
	case errors.As(err, &ae):
		return fmt.Sprintf("set the proxy credentials: control_plane.proxy = \"http://user:pass@%s\" (or HTTPS_PROXY)", px.Host)
	case errors.As(err, &se) && se.Unreachable():
		return fmt.Sprintf("the proxy reached nothing at %s: check that %s runs there and serves %s on port %s", e.HostPort, server(e), listenKey(e), p)
	case errors.As(err, &se) && se.Code == http.StatusForbidden:
		if p == "443" {
			return fmt.Sprintf("proxy %s refuses CONNECT to %s: have it allowed, or exempt it (control_plane.no_proxy or NO_PROXY)", px.Host, e.HostPort)
		}
		return fmt.Sprintf("proxy %s refuses CONNECT to port %s (stock proxies allow 443 only, squid SSL_ports): run the relay on 443 (its default listen.yamux) and use relay+yamux://%s:443, or have port %s allowed", px.Host, p, e.Host(), p)
	case errors.As(err, &se):
		return fmt.Sprintf("proxy %s answered %s to CONNECT %s: read the proxy's log for this request", px.Host, se.Status, e.HostPort)
	case errors.As(err, &ce):
		return fmt.Sprintf("the proxy %s itself is not reachable: check control_plane.proxy (or HTTPS_PROXY) and that the proxy runs", px.Host)
	}
	return fmt.Sprintf("check control_plane.proxy (or HTTPS_PROXY/NO_PROXY) and that proxy %s allows CONNECT to port %s", px.Host, p)
}

// udpFix is the fix line for a UDP endpoint e without a UDP path.
func (d *agentDoctor) udpFix(e config.Endpoint) string {
	h, p := e.Host(), port(e.HostPort)
	if fb := d.fallbacks(); len(fb) > 0 {
		return fmt.Sprintf("allow UDP %s from this machine to %s; meanwhile the agent uses %s", p, h, strings.Join(fb, ", "))
	}
	return fmt.Sprintf("allow UDP %s from this machine to %s, or add a TCP endpoint: a forgeyard-relay on TCP 443 (control_plane.endpoints += \"relay+yamux://<relay>:443\") or the daemon's TLS+yamux listener (\"yamux://<daemon>:7444\")", p, h)
}

func (d *agentDoctor) clientCertRefused(target, alert string) {
	fix := "check that the agent certificate is issued by the daemon's tls.client_ca and is valid for client authentication"
	detail := "the daemon refused this agent's certificate (" + alert + ")"
	if d.leaf != nil && d.now().After(d.leaf.NotAfter) {
		detail = fmt.Sprintf("the daemon refused this agent's certificate: certificate expired at %s; renew it", d.leaf.NotAfter.UTC().Format(time.RFC3339))
		fix = trust.MsgCredentialExpired
	}
	d.add("client-cert", target, doctor.Fail, detail, fix)
}

// checkProtocol does a Hello round trip on bc: negotiated version and
// features, the daemon's clock.
func (d *agentDoctor) checkProtocol(ctx context.Context, e config.Endpoint, bc semantics.BackendConn) bool {
	target := e.String()
	sc, err := semantics.NewConn(bc, semantics.Config{Logger: discardLogger()})
	if err != nil {
		d.add("protocol", target, doctor.Fail, err.Error(), "")
		return false
	}
	octx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	st, err := sc.OpenStream(octx, wire.StreamControl)
	if err != nil {
		return d.protocolError(target, err)
	}
	ch := control.New(st, control.Config{Logger: discardLogger(), WriteTimeout: d.timeout})
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		_ = ch.Run(func(*wire.Envelope) {}, func(*control.DecodeError) {})
	}()
	defer func() {
		_ = bc.CloseWithCode(wire.CloseNormal, "doctor done")
		<-runDone
	}()
	t0 := time.Now()
	env, err := ch.Call(octx, control.Out{Msg: &agentwire.TransportHelloV1{Role: agentwire.RoleAgent, Versions: wire.Supported, Features: agentFeatures,
		HasAgentSession: true, AgentSession: wire.NewAgentSessionId(), AgentVersion: Version + " (doctor)"}}, d.timeout)
	t1 := time.Now()
	if err != nil {
		return d.protocolError(target, err)
	}
	switch m := env.Payload.(type) {
	case *agentwire.HelloAckV1:
		feats := "none"
		if l := m.Features.Intersect(agentFeatures).List(); len(l) > 0 {
			feats = m.Features.Intersect(agentFeatures).String()
		}
		d.add("client-cert", target, doctor.OK, "the daemon accepted this agent's certificate", "")
		d.add("protocol", target, doctor.OK, fmt.Sprintf("negotiated %s (daemon speaks %s, agent %s); features %s", m.Negotiated, m.ServerRange, wire.Supported, feats), "")
		d.checkClock(target, t0, t1, m.ServerTimeMs)
		return true
	case *agentwire.RegistrationRejectedV1:
		if m.Code == wire.ErrCodeUnsupportedVersion {
			d.add("client-cert", target, doctor.OK, "the daemon accepted this agent's certificate", "")
			d.add("protocol", target, doctor.Fail, fmt.Sprintf("no common protocol version: daemon speaks %s, this agent %s: %s", m.ServerRange, wire.Supported, m.Message),
				"upgrade the agent or the daemon so their protocol ranges overlap (see `forgeyard transport protocols`)")
			return false
		}
		d.add("protocol", target, doctor.Fail, fmt.Sprintf("the daemon refused the hello: %s (%v)", m.Message, m.Code), "read the daemon's audit log for this connection")
		return false
	default:
		d.add("protocol", target, doctor.Fail, fmt.Sprintf("unexpected answer %T to the hello", env.Payload), "")
		return false
	}
}

func (d *agentDoctor) protocolError(target string, err error) bool {
	if alert := remoteAlert(err); alert != "" || isAuthFailure(err) {
		if alert == "" {
			alert = err.Error()
		}
		d.clientCertRefused(target, alert)
		return false
	}
	d.add("protocol", target, doctor.Fail, "no answer to the hello: "+err.Error(), "check that the endpoint is a forgeyard daemon or relay and that it is healthy (forgeyard transport doctor)")
	return false
}

func (d *agentDoctor) checkClock(target string, t0, t1 time.Time, serverMs uint64) {
	if serverMs == 0 {
		d.add("clock", target, doctor.Skip, "the daemon sent no time", "")
		return
	}
	mid := t0.Add(t1.Sub(t0) / 2)
	skew := time.UnixMilli(int64(serverMs)).Sub(mid)
	abs := skew.Abs().Round(time.Millisecond) // the daemon's time has millisecond resolution
	if abs > time.Second {
		abs = abs.Round(100 * time.Millisecond)
	}
	dir := "ahead of"
	if skew < 0 {
		dir = "behind"
	}
	if abs > d.maxSkew {
		d.add("clock", target, doctor.Warn, fmt.Sprintf("the daemon's clock is %s %s this machine's", abs, dir),
			"certificate validity and lease expiry depend on clocks: enable NTP on both machines (timedatectl set-ntp true)")
		return
	}
	d.add("clock", target, doctor.OK, fmt.Sprintf("the daemon's clock is %s %s this machine's (round trip %s)", abs, dir, t1.Sub(t0).Round(time.Millisecond)), "")
}

// x509Reason returns the x509 verification reason in err's chain or text.
func x509Reason(err error) string {
	var cve *tls.CertificateVerificationError
	if errors.As(err, &cve) && cve.Err != nil {
		return cve.Err.Error()
	}
	s := err.Error()
	if i := strings.Index(s, "x509: "); i >= 0 {
		return s[i:]
	}
	return ""
}

// remoteAlert returns the TLS alert the peer sent ("expired certificate",
// "bad certificate", ...) or "".
func remoteAlert(err error) string {
	s := err.Error()
	if i := strings.Index(s, "remote error: tls: "); i >= 0 {
		a := s[i+len("remote error: tls: "):]
		if j := strings.IndexAny(a, ")\n"); j >= 0 {
			a = a[:j]
		}
		return a
	}
	return ""
}

func isAuthFailure(err error) bool {
	var ce *semantics.ConnError
	return errors.As(err, &ce) && ce.Code == wire.CloseAuthenticationFailure
}

// unreachableErrnos say this machine has no path: no route, network or
// host unreachable, or a local firewall refusing the send (EPERM/EACCES on
// sendmsg).
var unreachableErrnos = []syscall.Errno{syscall.ENETUNREACH, syscall.EHOSTUNREACH, syscall.ENETDOWN, syscall.EPERM, syscall.EACCES}

func isUnreachable(err error) bool { return unreachableReason(err) != "" }

// unreachableReason is the errno text of an unreachable-path error, or ""
// (quic-go does not always wrap the socket error, so the text is checked
// too).
func unreachableReason(err error) string {
	for _, e := range unreachableErrnos {
		if errors.Is(err, e) || strings.Contains(err.Error(), e.Error()) {
			return e.Error()
		}
	}
	return ""
}

func isTimeout(err error) bool {
	var ne net.Error
	var ce *semantics.ConnError
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return true
	case errors.As(err, &ce) && ce.Code == wire.CloseIdleTimeout:
		return true
	}
	return strings.Contains(err.Error(), "timeout")
}

func trustFix(reason, caFile, serverName string) string {
	switch {
	case strings.Contains(reason, "unknown authority"):
		return "the daemon certificate is not signed by the CA in " + caFile + ": set control_plane.credential.ca to the CA that issued the daemon certificate"
	case strings.Contains(reason, "is valid for") || strings.Contains(reason, "not valid for any names"):
		return "the daemon certificate does not name " + strconv.Quote(serverName) + ": set control_plane.server_name to a name it holds, or reissue it with this name"
	case strings.Contains(reason, "expired") || strings.Contains(reason, "not yet valid"):
		return "the daemon certificate is outside its validity period: renew it on the daemon, or check this machine's clock"
	}
	return "check the daemon certificate chain against " + caFile
}

func port(hostPort string) string {
	_, p, err := net.SplitHostPort(hostPort)
	if err != nil {
		return hostPort
	}
	return p
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
