package semantics_test

import (
	"bytes"
	"testing"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
)

// A restart token is a function of the key, the session and the
// transport (so the restarted daemon derives it again from what the
// authority lists): the same inputs give the same token, any other input
// another token; the key id names the key alone; a missing or short key
// gives no token.
func TestDeriveRestartToken(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	s, tr := wire.NewAgentSessionId(), wire.NewTransportSessionId()
	tok := semantics.DeriveRestartToken(key, s, tr)
	if tok.IsZero() || tok.Token == ([16]byte{}) || tok.KeyID == ([4]byte{}) {
		t.Fatalf("token %x under a 32-byte key: want a non-zero key id and token", tok)
	}
	if again := semantics.DeriveRestartToken(append([]byte(nil), key...), s, tr); again != tok || !again.Equal(tok) {
		t.Fatalf("derived again: %x, want %x", again, tok)
	}
	otherKey := bytes.Repeat([]byte{8}, 32)
	for name, o := range map[string]semantics.RestartToken{
		"another session":   semantics.DeriveRestartToken(key, wire.NewAgentSessionId(), tr),
		"another transport": semantics.DeriveRestartToken(key, s, wire.NewTransportSessionId()),
		"another key":       semantics.DeriveRestartToken(otherKey, s, tr),
	} {
		if o.Token == tok.Token || o.Equal(tok) {
			t.Errorf("%s: the same token %x", name, o.Token)
		}
		if (o.KeyID == tok.KeyID) != (name != "another key") {
			t.Errorf("%s: key id %x vs %x; want equal exactly under the same key", name, o.KeyID, tok.KeyID)
		}
	}
	if z := semantics.DeriveRestartToken(key[:31], s, tr); !z.IsZero() {
		t.Fatalf("a 31-byte key gave token %x, want none", z)
	}
	if z := semantics.DeriveRestartToken(nil, s, tr); !z.IsZero() {
		t.Fatalf("no key gave token %x, want none", z)
	}
}

// The backends' rule for a hint: the armed token ends the link, another
// session's token under the same key is dropped, and everything the
// connection cannot check (no token either side, another key) is the
// unauthenticated probe of before.
func TestClassifyRestartHint(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	s := wire.NewAgentSessionId()
	armed := semantics.DeriveRestartToken(key, s, wire.NewTransportSessionId())
	replayed := semantics.DeriveRestartToken(key, s, wire.NewTransportSessionId()) // the session's previous transport
	other := semantics.DeriveRestartToken(key, wire.NewAgentSessionId(), wire.NewTransportSessionId())
	rotated := semantics.DeriveRestartToken(bytes.Repeat([]byte{9}, 32), s, wire.NewTransportSessionId())
	forged := armed
	forged.Token[15] ^= 1
	for _, c := range []struct {
		name        string
		armed, hint semantics.RestartToken
		want        semantics.HintVerdict
	}{
		{"its token", armed, armed, semantics.HintRestarted},
		{"another session behind the address", armed, other, semantics.HintIgnore},
		{"a replayed hint of the session's previous transport", armed, replayed, semantics.HintIgnore},
		{"a forged token under the key id", armed, forged, semantics.HintIgnore},
		{"another key", armed, rotated, semantics.HintProbe},
		{"tokenless hint (an older daemon)", armed, semantics.RestartToken{}, semantics.HintProbe},
		{"unarmed connection (an older daemon's session)", semantics.RestartToken{}, armed, semantics.HintProbe},
		{"neither", semantics.RestartToken{}, semantics.RestartToken{}, semantics.HintProbe},
	} {
		if got := semantics.ClassifyRestartHint(c.armed, c.hint); got != c.want {
			t.Errorf("%s: verdict %d, want %d", c.name, got, c.want)
		}
	}
}
