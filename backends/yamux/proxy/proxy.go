// Package proxy dials TCP connections through an HTTP CONNECT proxy, for
// agents whose only way out of their network is a forward proxy (issue 6).
// It serves the TCP backends (TLS+yamux, plain or as an HTTP/1.1 Upgrade):
// UDP backends (QUIC, WebTransport) cannot use CONNECT and never go through
// it.
//
// The proxy is chosen per target the way Go's net/http and curl do:
// HTTPS_PROXY (or https_proxy) names the proxy, NO_PROXY (no_proxy) lists
// hosts, domains and CIDRs reached directly, and loopback targets are always
// direct (golang.org/x/net/http/httpproxy semantics), or an explicit proxy
// URL overrides the environment (Dialer.Fixed). Proxy URLs are
// http://[user:pass@]host[:port] (port 80 by default); the userinfo becomes
// Proxy-Authorization: Basic.
//
// A CONNECT exchange is bounded: the whole handshake by the context and
// Dialer.Timeout, the response header by MaxResponseHeader bytes. A 407
// answer is an *AuthRequiredError whose message says how to fix it (and,
// when the proxy offers only Digest, NTLM or Negotiate, that those are not
// supported); any other non-2xx is a *StatusError (502/503/504: "could not
// reach" the target); failing to talk to the proxy at all is a
// *ConnectError. Failed tells the three from the target's own failures. Bytes the proxy (or the target behind
// it) sent right after its 200 are kept: the returned connection reads them
// first.
package proxy

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"golang.org/x/net/http/httpproxy"

	"forgeyard.dev/transport/backends/internal/bufconn"
)

// Defaults.
const (
	// DefaultTimeout bounds a CONNECT handshake (TCP to the proxy, request,
	// response header) when Dialer.Timeout is zero.
	DefaultTimeout = 10 * time.Second
	// MaxResponseHeader bounds the proxy's response status line and header.
	MaxResponseHeader = 16 << 10
)

// Dialer dials through an HTTP CONNECT proxy when Proxy names one for the
// target, directly otherwise. The zero Dialer dials directly. Safe for
// concurrent use.
type Dialer struct {
	// Proxy returns the proxy URL for a target "host:port", or nil for a
	// direct connection. nil means always direct. See FromEnvironment and
	// Fixed.
	Proxy func(target string) (*url.URL, error)
	// Forward dials the TCP connection to the proxy (or, for a direct
	// target, to the target). nil means a net.Dialer.
	Forward func(ctx context.Context, network, addr string) (net.Conn, error)
	// Timeout bounds the handshake with the proxy; 0 means DefaultTimeout.
	Timeout time.Duration
}

// FromEnvironment returns a Dialer that reads HTTPS_PROXY/https_proxy and
// NO_PROXY/no_proxy now (the environment is not read again). With neither
// set it dials directly.
func FromEnvironment() *Dialer {
	return fromConfig(httpproxy.FromEnvironment())
}

// Fixed returns a Dialer that uses proxy for every target except those
// matched by noProxy (NO_PROXY syntax: comma-separated hosts, .domains,
// IPs and CIDRs; "*" disables the proxy). With a non-empty noProxy,
// loopback targets are direct too (httpproxy semantics); with an empty one
// every target, loopback included, goes through the proxy. proxy must be
// http://[user:pass@]host[:port].
func Fixed(proxy string, noProxy string) (*Dialer, error) {
	u, err := ParseURL(proxy)
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(noProxy) == "" {
		return &Dialer{Proxy: func(string) (*url.URL, error) { return u, nil }}, nil
	}
	return fromConfig(&httpproxy.Config{HTTPSProxy: u.String(), NoProxy: noProxy}), nil
}

func fromConfig(c *httpproxy.Config) *Dialer {
	if c.HTTPSProxy == "" {
		return &Dialer{}
	}
	fn := c.ProxyFunc()
	return &Dialer{Proxy: func(target string) (*url.URL, error) {
		u, err := fn(&url.URL{Scheme: "https", Host: target})
		if err != nil || u == nil {
			return nil, err
		}
		return ParseURL(u.String())
	}}
}

// ParseURL checks a proxy URL: scheme http (an https proxy, i.e. TLS to the
// proxy itself, is not supported), a host, an optional port (default 80)
// and optional user:password; nothing else.
func ParseURL(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		s = "http://" + s // like curl and net/http
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("proxy URL %q: %v", redact(s), err)
	}
	if u.Scheme != "http" {
		return nil, fmt.Errorf("proxy URL %q: scheme %q not supported (want http://host:port)", redact(s), u.Scheme)
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("proxy URL %q: missing host", redact(s))
	}
	if (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("proxy URL %q: only http://[user:pass@]host[:port] is allowed", redact(s))
	}
	if u.Port() == "" {
		u.Host = net.JoinHostPort(u.Hostname(), "80")
	}
	u.Path = ""
	return u, nil
}

// redact hides a password in a URL string for error messages.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return s
}

// AuthRequiredError is a 407 answer from the proxy.
type AuthRequiredError struct {
	Proxy          string // host:port of the proxy
	HadCredentials bool   // the request carried Proxy-Authorization
	Challenge      string // the (first) Proxy-Authenticate header, if any
	// Schemes are the authentication schemes the proxy offered, one per
	// Proxy-Authenticate header and in its order ("Basic", "Digest",
	// "NTLM", "Negotiate", …); empty when it named none.
	Schemes []string
}

// BasicOffered reports whether the proxy accepts Basic authentication,
// the only scheme this package speaks: true when it offered Basic, or no
// scheme at all (the header is missing; trying Basic is all one can do).
func (e *AuthRequiredError) BasicOffered() bool {
	if len(e.Schemes) == 0 {
		return true
	}
	for _, s := range e.Schemes {
		if strings.EqualFold(s, "Basic") {
			return true
		}
	}
	return false
}

// AuthFailure reports that the proxy refused the request for its
// credentials: retrying with the same configuration fails the same way,
// and every retry with a wrong password is a failed login at the
// directory behind the proxy (an account lockout). The agent backs off to
// a long ceiling on such errors (semantics/agent Backoff.AuthMax).
func (e *AuthRequiredError) AuthFailure() bool { return true }

// Error says what to do.
func (e *AuthRequiredError) Error() string {
	switch {
	case !e.BasicOffered():
		return fmt.Sprintf("proxy %s requires %s authentication, which is not supported; use Basic or a proxy exception (no_proxy / NO_PROXY)", e.Proxy, strings.Join(e.Schemes, "/"))
	case e.HadCredentials:
		asks := ""
		if e.Challenge != "" {
			asks = fmt.Sprintf("; it asks for %s", e.Challenge)
		}
		return fmt.Sprintf("proxy authentication required by %s: the credentials in the proxy URL were refused (check user and password in http://user:pass@host:port%s)", e.Proxy, asks)
	}
	return fmt.Sprintf("proxy authentication required by %s: set credentials in the proxy URL (http://user:pass@host:port)", e.Proxy)
}

// authSchemes returns the scheme token of every Proxy-Authenticate header
// (RFC 9110 §11.6.2: a header may list several challenges separated by
// commas, but the parameters also contain commas; proxies send one
// challenge per header line in practice, which is what this reads).
func authSchemes(h http.Header) []string {
	var out []string
	for _, v := range h.Values("Proxy-Authenticate") {
		v = strings.TrimSpace(v)
		if v == "" {
			continue
		}
		scheme, _, _ := strings.Cut(v, " ")
		out = append(out, strings.TrimSuffix(scheme, ","))
	}
	return out
}

// StatusError is any other non-2xx answer to CONNECT.
type StatusError struct {
	Proxy  string // host:port of the proxy
	Target string // the host:port we asked for
	Code   int
	Status string // the status line's text, e.g. "403 Forbidden"
}

// Unreachable reports an answer that means the proxy tried the target and
// could not reach it (502 Bad Gateway, 503 Service Unavailable, 504
// Gateway Timeout): the target is down or unreachable from the proxy, not
// refused by its policy.
func (e *StatusError) Unreachable() bool {
	switch e.Code {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// Error names the proxy, the target and the status.
func (e *StatusError) Error() string {
	if e.Unreachable() {
		return fmt.Sprintf("proxy %s could not reach %s: %s (the endpoint is down or unreachable from the proxy)", e.Proxy, e.Target, e.Status)
	}
	return fmt.Sprintf("proxy %s refused CONNECT to %s: %s", e.Proxy, e.Target, e.Status)
}

// ConnectError is a failure to open the tunnel that is not the proxy's
// answer: the TCP connection to the proxy, writing the CONNECT request or
// reading the response (a timeout, a closed connection, an oversized
// header). Its message starts with "proxy host:port:".
type ConnectError struct {
	Proxy string // host:port of the proxy
	Err   error
}

// Error names the proxy and what failed.
func (e *ConnectError) Error() string { return fmt.Sprintf("proxy %s: %v", e.Proxy, e.Err) }

// Unwrap returns the underlying error (context errors, net errors).
func (e *ConnectError) Unwrap() error { return e.Err }

// DialContext connects to addr ("host:port") over network "tcp", "tcp4" or
// "tcp6", through the proxy Proxy names for addr, or directly.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	switch network {
	case "tcp", "tcp4", "tcp6":
	default:
		return nil, fmt.Errorf("proxy: network %q not supported (CONNECT carries TCP only)", network)
	}
	var pu *url.URL
	if d.Proxy != nil {
		var err error
		if pu, err = d.Proxy(addr); err != nil {
			return nil, fmt.Errorf("proxy: %w", err)
		}
	}
	forward := d.Forward
	if forward == nil {
		var nd net.Dialer
		forward = nd.DialContext
	}
	if pu == nil {
		return forward(ctx, network, addr)
	}
	timeout := d.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	nc, err := forward(hctx, "tcp", pu.Host)
	if err != nil {
		return nil, &ConnectError{Proxy: pu.Host, Err: err}
	}
	c, err := connect(hctx, nc, pu, addr)
	if err != nil {
		_ = nc.Close()
		return nil, err
	}
	return c, nil
}

// connect runs the CONNECT exchange on nc.
func connect(ctx context.Context, nc net.Conn, pu *url.URL, target string) (net.Conn, error) {
	// The context bounds the exchange: its deadline on the socket, and
	// cancellation closes the socket.
	if dl, ok := ctx.Deadline(); ok {
		_ = nc.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	var b strings.Builder
	fmt.Fprintf(&b, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n", target, target)
	auth := pu.User != nil
	if auth {
		pw, _ := pu.User.Password()
		cred := base64.StdEncoding.EncodeToString([]byte(pu.User.Username() + ":" + pw))
		fmt.Fprintf(&b, "Proxy-Authorization: Basic %s\r\n", cred)
	}
	b.WriteString("User-Agent: forgeyard-agent\r\n\r\n")
	if _, err := io.WriteString(nc, b.String()); err != nil {
		return nil, &ConnectError{Proxy: pu.Host, Err: fmt.Errorf("CONNECT %s: %w", target, ctxErr(ctx, err))}
	}
	lr := &io.LimitedReader{R: nc, N: MaxResponseHeader}
	br := bufio.NewReaderSize(lr, 4096)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		if lr.N <= 0 {
			return nil, &ConnectError{Proxy: pu.Host, Err: fmt.Errorf("CONNECT response header exceeds %d bytes", MaxResponseHeader)}
		}
		return nil, &ConnectError{Proxy: pu.Host, Err: fmt.Errorf("CONNECT %s: reading the response: %w", target, ctxErr(ctx, err))}
	}
	switch {
	case resp.StatusCode == http.StatusProxyAuthRequired:
		return nil, &AuthRequiredError{Proxy: pu.Host, HadCredentials: auth, Challenge: resp.Header.Get("Proxy-Authenticate"), Schemes: authSchemes(resp.Header)}
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return nil, &StatusError{Proxy: pu.Host, Target: target, Code: resp.StatusCode, Status: resp.Status}
	}
	if ctx.Err() != nil {
		return nil, &ConnectError{Proxy: pu.Host, Err: ctx.Err()}
	}
	if !stop() {
		return nil, &ConnectError{Proxy: pu.Host, Err: ctxErr(ctx, context.Canceled)}
	}
	_ = nc.SetDeadline(time.Time{})
	// The header was read through a limit; what the reader buffered beyond
	// it belongs to the tunnel. From here reads go to br (its buffer) and
	// then straight to nc, without the limit.
	lr.N = 1 << 62
	return bufconn.Wrap(nc, br), nil
}

func ctxErr(ctx context.Context, err error) error {
	if ce := ctx.Err(); ce != nil {
		return fmt.Errorf("%w (%v)", ce, err)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		// The socket deadline is the context's; it may fire first.
		return fmt.Errorf("%w (%v)", context.DeadlineExceeded, err)
	}
	return err
}

// IsProxyError reports whether err came from the proxy's answer (407 or
// another refusal) rather than the network.
func IsProxyError(err error) bool {
	var ae *AuthRequiredError
	var se *StatusError
	return errors.As(err, &ae) || errors.As(err, &se)
}

// Failed reports whether err is a failure of the proxy step of a dial:
// the proxy's answer (IsProxyError) or a *ConnectError (the proxy could not
// be reached or did not answer). A dial through a proxy that fails later
// (TLS with the target, …) is not a proxy failure.
func Failed(err error) bool {
	var ce *ConnectError
	return IsProxyError(err) || errors.As(err, &ce)
}
