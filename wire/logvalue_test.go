package wire_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"

	"forgeyard.dev/transport/wire"
)

// TestLogValueJSON: slog's JSON handler writes versions, ranges, codes and
// kinds by name (without LogValue it writes {"Major":1,"Minor":2} and
// numbers).
func TestLogValueJSON(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	log.Info("x", "protocol", wire.V(1, 2), "range", wire.Supported, "code", wire.ErrCodeOverloaded,
		"close", wire.CloseOverloaded, "kind", wire.StreamKind(0), "feature", wire.FeatureTraceContextV1)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"protocol": "1.2", "range": wire.Supported.String(), "code": wire.ErrCodeOverloaded.String(),
		"close": wire.CloseOverloaded.String(), "kind": wire.StreamKind(0).String(), "feature": wire.FeatureTraceContextV1.String(),
	} {
		if rec[k] != want {
			t.Errorf("%s = %#v, want %q (line %s)", k, rec[k], want, buf.String())
		}
	}
}
