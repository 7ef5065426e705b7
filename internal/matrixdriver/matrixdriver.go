// Package matrixdriver is the client side of the daemon's compatibility
// matrix driver (forgeyard-daemon --matrix-driver: JSON under /v1/matrix/
// on its admin endpoint, described in cmd/forgeyard-daemon/driver.go). The
// matrix (matrix/) and the load generator (internal/tools/loadgen) both
// drive a daemon process through it.
package matrixdriver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// maxAnswer bounds an answer's body.
const maxAnswer = 4 << 20

// Error is an answer with a status other than 2xx.
type Error struct {
	Method, Path string
	Code         int    // the HTTP status code
	Status       string // the HTTP status ("409 Conflict")
	Msg          string // the driver's {"error": "..."}
}

func (e *Error) Error() string {
	return fmt.Sprintf("%s %s: %s: %s", e.Method, e.Path, e.Status, e.Msg)
}

// Call does one request to the driver of the daemon whose admin endpoint
// is admin (host:port), with hc. body, when not nil, is sent as JSON; a 2xx
// answer is decoded into out when out is not nil; any other is an *Error.
func Call(ctx context.Context, hc *http.Client, admin, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+admin+path, rd)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var e struct{ Error string }
		_ = json.Unmarshal(b, &e)
		return &Error{Method: method, Path: path, Code: resp.StatusCode, Status: resp.Status, Msg: e.Error}
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}
