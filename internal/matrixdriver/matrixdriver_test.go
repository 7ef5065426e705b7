package matrixdriver

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestCall(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/matrix/offer":
			var in struct{ Runner string }
			if r.Method != http.MethodPost || json.NewDecoder(r.Body).Decode(&in) != nil {
				http.Error(w, "bad", http.StatusBadRequest)
				return
			}
			if in.Runner == "busy" {
				w.WriteHeader(http.StatusConflict)
				_, _ = w.Write([]byte(`{"error":"rejected: busy"}`))
				return
			}
			_, _ = w.Write([]byte(`{"attempt":"A1"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	admin := strings.TrimPrefix(srv.URL, "http://")
	ctx := context.Background()
	var out struct{ Attempt string }
	if err := Call(ctx, srv.Client(), admin, http.MethodPost, "/v1/matrix/offer", map[string]string{"runner": "r"}, &out); err != nil || out.Attempt != "A1" {
		t.Fatalf("offer: %v, %+v", err, out)
	}
	err := Call(ctx, srv.Client(), admin, http.MethodPost, "/v1/matrix/offer", map[string]string{"runner": "busy"}, nil)
	var e *Error
	if !errors.As(err, &e) || e.Code != http.StatusConflict || e.Msg != "rejected: busy" ||
		err.Error() != "POST /v1/matrix/offer: 409 Conflict: rejected: busy" {
		t.Errorf("rejected offer: %v (%+v)", err, e)
	}
}
