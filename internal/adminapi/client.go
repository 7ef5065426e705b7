package adminapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"
)

// TokenEnv is the environment variable the CLI reads the admin token from
// when no token file is given.
const TokenEnv = "FORGEYARD_ADMIN_TOKEN"

// MaxTokenFile bounds a token file.
const MaxTokenFile = 4 << 10

// maxBody bounds a response body.
const maxBody = 16 << 20

// ReadTokenFile reads a bearer token file: surrounding white space is
// trimmed; an empty file, a file over MaxTokenFile bytes or a token with
// inner white space is an error naming the path.
func ReadTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxTokenFile+1))
	if err != nil {
		return "", fmt.Errorf("token file %s: %w", path, err)
	}
	if len(b) > MaxTokenFile {
		return "", fmt.Errorf("token file %s: larger than %d bytes", path, MaxTokenFile)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty: put a random token in it (e.g. `openssl rand -hex 32 > %s`)", path, path)
	}
	if strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("token file %s: the token must be one line without spaces", path)
	}
	return tok, nil
}

// Client talks to one daemon admin endpoint.
type Client struct {
	target   string // for messages: "127.0.0.1:9464" or the socket path
	unixPath string // set for unix sockets
	base     string // URL prefix
	token    string
	tokenSrc string // "the token in /path" or "the token in FORGEYARD_ADMIN_TOKEN"
	hc       *http.Client
}

// NewClient parses admin ("http://host:port", "https://host:port",
// "host:port", "unix:///path" or "/path") and returns a client that sends
// token (from tokenSrc, a description used in error messages; "" when
// there is no token). timeout bounds each request.
func NewClient(admin, token, tokenSrc string, timeout time.Duration) (*Client, error) {
	c := &Client{token: token, tokenSrc: tokenSrc}
	switch {
	case admin == "":
		return nil, errors.New("no admin endpoint: pass --admin http://127.0.0.1:PORT (the daemon's --admin-listen) or --admin unix:///PATH (its --admin-socket)")
	case strings.HasPrefix(admin, "unix://"):
		c.unixPath = strings.TrimPrefix(admin, "unix://")
		if c.unixPath == "" || c.unixPath == "/" {
			return nil, fmt.Errorf("--admin %q: missing socket path (want unix:///run/forgeyard/admin.sock)", admin)
		}
	case strings.HasPrefix(admin, "/"):
		c.unixPath = admin
	default:
		if !strings.Contains(admin, "://") {
			admin = "http://" + admin
		}
		u, err := url.Parse(admin)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
			return nil, fmt.Errorf("--admin %q: want http://HOST:PORT or unix:///PATH", admin)
		}
		c.target, c.base = u.Host, u.Scheme+"://"+u.Host
	}
	tr := &http.Transport{Proxy: nil, MaxResponseHeaderBytes: 64 << 10, DisableCompression: true}
	if c.unixPath != "" {
		c.target, c.base = c.unixPath, "http://forgeyard-admin"
		path := c.unixPath
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
	}
	c.hc = &http.Client{Transport: tr, Timeout: timeout, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return c, nil
}

// Target is the endpoint address or socket path, for messages.
func (c *Client) Target() string { return c.target }

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Get fetches path and decodes the JSON answer into v. /healthz answers
// 503 with a body when the daemon is down; that is decoded too (ok=false
// then). Other failures are errors an operator can act on.
func (c *Client) Get(ctx context.Context, path string, v any) error {
	return c.do(ctx, http.MethodGet, path, nil, v)
}

// Post sends body as JSON to path and decodes the JSON answer into v, with
// Get's error handling.
func (c *Client) Post(ctx context.Context, path string, body, v any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, path, b, v)
}

func (c *Client) do(ctx context.Context, method, path string, reqBody []byte, v any) error {
	var rd io.Reader
	if reqBody != nil {
		rd = bytes.NewReader(reqBody)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if reqBody != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		return c.dialError(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return fmt.Errorf("admin endpoint %s: reading the answer to %s: %v", c.target, path, err)
	}
	if len(body) > maxBody {
		return fmt.Errorf("admin endpoint %s: answer to %s larger than %d bytes", c.target, path, maxBody)
	}
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode == http.StatusServiceUnavailable && (path == PathHealth || path == PathReady):
	case resp.StatusCode == http.StatusUnauthorized:
		if c.token == "" {
			return fmt.Errorf("401: admin endpoint %s requires a token: pass --token-file FILE (the daemon's admin.token_file) or set %s", c.target, TokenEnv)
		}
		return fmt.Errorf("401: %s does not match the daemon's admin.token_file", c.tokenSrc)
	case resp.StatusCode == http.StatusNotFound && !strings.HasPrefix(errorText(body), "no such admin path") && errorText(body) != "":
		return fmt.Errorf("404: %s", errorText(body)) // e.g. an unknown runner
	case resp.StatusCode == http.StatusNotFound:
		return fmt.Errorf("404: admin endpoint %s has no %s: is it a forgeyard-daemon admin endpoint of this version?", c.target, path)
	default:
		var eb ErrorBody
		if json.Unmarshal(body, &eb) == nil && eb.Error != "" {
			return fmt.Errorf("%d: %s", resp.StatusCode, eb.Error)
		}
		return fmt.Errorf("%d: admin endpoint %s answered %s: %s", resp.StatusCode, c.target, path, strings.TrimSpace(string(body)))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("admin endpoint %s: %s is not the expected JSON: %v", c.target, path, err)
	}
	return nil
}

// errorText is the error of a JSON error body, "" if it is none.
func errorText(body []byte) string {
	var eb ErrorBody
	if json.Unmarshal(body, &eb) != nil {
		return ""
	}
	return eb.Error
}

// dialError turns a transport error into an actionable message.
func (c *Client) dialError(err error) error {
	var ne net.Error
	switch {
	case c.unixPath != "" && errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("admin socket %s does not exist: is forgeyard-daemon running with --admin-socket %s?", c.unixPath, c.unixPath)
	case c.unixPath != "" && errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("admin socket %s: permission denied: run this as the daemon's user (the socket is mode 0600)", c.unixPath)
	case c.unixPath != "" && errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("admin socket %s refused the connection: the daemon is not running (a stale socket file is left)", c.unixPath)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("admin endpoint %s refused the connection: is forgeyard-daemon running with --admin-listen %s?", c.target, c.target)
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("admin endpoint %s did not answer in time: is the address right and the daemon healthy?", c.target)
	}
	return fmt.Errorf("admin endpoint %s: %v", c.target, err)
}
