package signer

import (
	"strings"
)

// RefusalCode is the stable reason a sign request was refused. It starts
// the SignOutcomeV1 reason ("<code>: <fixed text>"); ParseRefusal recovers
// it.
type RefusalCode string

// Refusal codes. Stable: hosts match on them.
const (
	RefuseUnknownKey       RefusalCode = "unknown-key"        // the worker holds no key of that ref
	RefuseAlgorithm        RefusalCode = "algorithm-mismatch" // the key is of another algorithm
	RefuseUnknownPolicy    RefusalCode = "unknown-policy"     // the proof names a policy the worker does not trust
	RefuseBadAttestation   RefusalCode = "bad-attestation"    // the attestation is not the policy authority's signature over this request
	RefuseProofNotValidNow RefusalCode = "proof-not-valid"    // now is outside the proof's validity
	RefuseProofTooLong     RefusalCode = "proof-too-long"     // the proof is valid for longer than the policy allows
	RefuseMaterial         RefusalCode = "material-refused"   // material refs missing or of a digest algorithm the policy refuses
	RefuseInternal         RefusalCode = "internal"           // the key failed to sign
)

var refusalText = map[RefusalCode]string{
	RefuseUnknownKey:       "this worker holds no key of that ref",
	RefuseAlgorithm:        "the key is not of the requested algorithm",
	RefuseUnknownPolicy:    "the policy is not trusted by this worker",
	RefuseBadAttestation:   "the policy attestation does not cover this request",
	RefuseProofNotValidNow: "the policy proof is not valid now",
	RefuseProofTooLong:     "the policy proof is valid for longer than allowed",
	RefuseMaterial:         "the material refs are not allowed by the policy",
	RefuseInternal:         "the signature could not be made",
}

// Reason returns the wire reason of code: the code, then a fixed text.
func (c RefusalCode) Reason() string {
	t, ok := refusalText[c]
	if !ok {
		t = "refused"
	}
	return string(c) + ": " + t
}

// ParseRefusal returns the code a refusal reason starts with, or "" when it
// names none this build knows.
func ParseRefusal(reason string) RefusalCode {
	code, _, _ := strings.Cut(reason, ":")
	if _, ok := refusalText[RefusalCode(code)]; ok {
		return RefusalCode(code)
	}
	return ""
}
