package yamux

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"forgeyard.dev/transport/backends/internal/bufconn"
)

// The HTTP/1.1 Upgrade form of the backend, for TLS port 443 behind
// HTTP-aware middleboxes. After the TLS handshake (ALPN "http/1.1") the
// dialer sends
//
//	GET /.well-known/forgeyard/agent HTTP/1.1
//	Host: <server name>
//	Connection: Upgrade
//	Upgrade: forgeyard-yamux/1
//
// and the listener answers "HTTP/1.1 101 Switching Protocols" with the same
// Connection and Upgrade headers, immediately followed by the ready byte;
// from there on the connection is exactly the raw form (yamux, control
// stream first). A request for another path or without the Upgrade token
// gets a 404 or 426 and the connection is closed.
const (
	// ALPNHTTP1 is the ALPN of the Upgrade form.
	ALPNHTTP1 = "http/1.1"
	// UpgradeToken is the Upgrade header's protocol token.
	UpgradeToken = "forgeyard-yamux/1"
	// UpgradePath is the request path of the Upgrade form.
	UpgradePath = "/.well-known/forgeyard/agent"
	// maxUpgradeHeader bounds the request and response header bytes.
	maxUpgradeHeader = 8 << 10
)

// limitedReader is io.LimitedReader with a limit that can be lifted.
type limitedReader struct {
	r net.Conn
	n int
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, errHeaderTooLarge
	}
	if len(p) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= n
	return n, err
}

var errHeaderTooLarge = fmt.Errorf("header exceeds %d bytes", maxUpgradeHeader)

// wrap returns nc, reading first what br holds past the header
// (bufconn.Wrap); the limit no longer applies.
func wrap(nc net.Conn, lr *limitedReader, br *bufio.Reader) net.Conn {
	lr.n = 1 << 62
	return bufconn.Wrap(nc, br)
}

func hasToken(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for f := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), token) {
				return true
			}
		}
	}
	return false
}

// clientUpgrade sends the Upgrade request on nc and reads the 101. The
// returned conn yields the bytes after the response header (the ready byte
// first).
func clientUpgrade(nc net.Conn, host string, dl time.Time) (net.Conn, error) {
	_ = nc.SetDeadline(dl)
	req := "GET " + UpgradePath + " HTTP/1.1\r\nHost: " + host + "\r\nConnection: Upgrade\r\nUpgrade: " + UpgradeToken +
		"\r\nUser-Agent: forgeyard-agent\r\n\r\n"
	if _, err := io.WriteString(nc, req); err != nil {
		return nil, err
	}
	lr := &limitedReader{r: nc, n: maxUpgradeHeader}
	br := bufio.NewReaderSize(lr, 1024)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodGet})
	if err != nil {
		if lr.n <= 0 {
			return nil, errHeaderTooLarge
		}
		return nil, fmt.Errorf("reading the response: %w", err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		return nil, fmt.Errorf("server answered %q, want 101 Switching Protocols", resp.Status)
	}
	if !hasToken(resp.Header, "Upgrade", UpgradeToken) || !hasToken(resp.Header, "Connection", "upgrade") {
		return nil, errors.New("101 without Upgrade: " + UpgradeToken)
	}
	_ = nc.SetDeadline(time.Time{})
	return wrap(nc, lr, br), nil
}

// serverUpgrade reads and checks the Upgrade request on nc. On success it
// returns the conn to run yamux on and the 101 response to send (the caller
// appends the ready byte); otherwise it answers the error itself.
func serverUpgrade(nc net.Conn, dl time.Time) (net.Conn, []byte, error) {
	_ = nc.SetDeadline(dl)
	defer func() { _ = nc.SetReadDeadline(time.Time{}) }()
	lr := &limitedReader{r: nc, n: maxUpgradeHeader}
	br := bufio.NewReaderSize(lr, 1024)
	req, err := http.ReadRequest(br)
	if err != nil {
		if lr.n <= 0 {
			refuse(nc, "431 Request Header Fields Too Large")
			return nil, nil, errHeaderTooLarge
		}
		refuse(nc, "400 Bad Request")
		return nil, nil, fmt.Errorf("reading the request: %w", err)
	}
	switch {
	case req.URL.Path != UpgradePath:
		refuse(nc, "404 Not Found")
		return nil, nil, fmt.Errorf("request for %q, want %s", req.URL.Path, UpgradePath)
	case req.Method != http.MethodGet:
		refuse(nc, "405 Method Not Allowed")
		return nil, nil, fmt.Errorf("method %s, want GET", req.Method)
	case !hasToken(req.Header, "Upgrade", UpgradeToken) || !hasToken(req.Header, "Connection", "upgrade"):
		refuse(nc, "426 Upgrade Required\r\nUpgrade: "+UpgradeToken+"\r\nConnection: Upgrade")
		return nil, nil, errors.New("request without Upgrade: " + UpgradeToken)
	}
	resp := "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + UpgradeToken + "\r\n\r\n"
	return wrap(nc, lr, br), []byte(resp), nil
}

func refuse(nc net.Conn, status string) {
	_, _ = io.WriteString(nc, "HTTP/1.1 "+status+"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
}
