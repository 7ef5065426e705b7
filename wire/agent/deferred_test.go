package agent

import (
	"testing"

	"forgeyard.dev/transport/wire"
)

// RegistrationDeferredV1 rejects a zero code, a zero or too long wait and
// bad text; the bounds are inclusive.
func TestRegistrationDeferredValidate(t *testing.T) {
	ok := RegistrationDeferredV1{Code: wire.ErrCodeOverloaded, RetryAfterMs: MaxRetryAfterMs, Message: "retry later"}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid message refused: %v", err)
	}
	for name, m := range map[string]RegistrationDeferredV1{
		"zero code": {RetryAfterMs: 1},
		"zero wait": {Code: wire.ErrCodeOverloaded},
		"long wait": {Code: wire.ErrCodeOverloaded, RetryAfterMs: MaxRetryAfterMs + 1},
		"bad text":  {Code: wire.ErrCodeOverloaded, RetryAfterMs: 1, Message: "\xff"},
	} {
		if err := m.Validate(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
