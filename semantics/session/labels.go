package session

import (
	"strings"

	agentwire "forgeyard.dev/transport/wire/agent"
)

// SigningKeyLabelPrefix starts the capability label by which a signing
// worker advertises a key it holds (§99): "signing-key=<key ref>" in
// RegisterAgentV1's capabilities. The daemon routes a sign request to a
// connected signing worker that advertises the request's key ref. Labels are
// at most agentwire.MaxLabel (64) bytes, so an advertised key ref is at most
// MaxAdvertisedKeyRef bytes.
const SigningKeyLabelPrefix = "signing-key="

// MaxAdvertisedKeyRef is the longest key ref a signing worker can advertise
// in a capability label.
const MaxAdvertisedKeyRef = agentwire.MaxLabel - len(SigningKeyLabelPrefix)

// SigningKeyLabel returns the capability label advertising keyRef.
func SigningKeyLabel(keyRef string) string { return SigningKeyLabelPrefix + keyRef }

// AdvertisesKey reports whether labels advertise keyRef.
func AdvertisesKey(labels []string, keyRef string) bool {
	for _, l := range labels {
		if k, ok := strings.CutPrefix(l, SigningKeyLabelPrefix); ok && k == keyRef {
			return true
		}
	}
	return false
}
