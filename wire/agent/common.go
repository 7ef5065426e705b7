package agent

import (
	"unicode/utf8"

	"github.com/oklog/ulid/v2"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
	"forgeyard.dev/transport/wire/internal/seq"
	"forgeyard.dev/transport/wire/postcard"
)

// Conventions shared by every message of the family:
//
//   - Times named *_ms / *Ms are Unix milliseconds (UTC) for instants and
//     milliseconds for durations. They come from the daemon's clock; the agent
//     converts them to local deadlines on receipt (§146–148).
//   - Option<T> fields are a value plus a Has* flag. When the flag is false
//     the value is zero after decoding and must be zero before encoding
//     (Validate enforces it), so that decode→encode reproduces the bytes.
//   - Strings and byte strings are bounded by the named Max* constants. The
//     decoder rejects a longer value with postcard.ErrLengthOverBound before
//     allocating. Free-text `message` fields are truncated on encode at a
//     UTF-8 boundary (as wire.WireErrorV1 does); every other string is
//     encoded as is, and Validate rejects it when it is over its bound, so
//     call Validate before sending.
//   - Sequences are bounded the same way, and each element's minimum size is
//     checked against the remaining input before anything is allocated.
//     DecodePostcard reuses the capacity of the slices already in the value,
//     so decoding into the same value again allocates nothing for them; an
//     empty sequence decodes as nil into a fresh value and may decode as an
//     empty non-nil slice into a reused one.

// Bounds on the variable-length fields of the agent family, in bytes for
// strings and byte strings and in elements for sequences. The same constant
// bounds encoding (Validate) and decoding.
const (
	MaxAgentVersion       = 64       // TransportHelloV1/RegisterAgentV1 agent_version
	MaxOSName             = 32       // RunnerCapabilitiesV1.os
	MaxArchName           = 32       // RunnerCapabilitiesV1.arch
	MaxLabel              = 64       // one capability label
	MaxLabels             = 64       // capability labels
	MaxTool               = 64       // one capability tool name
	MaxTools              = 64       // capability tools
	MaxKeyProof           = 512      // RegisterAgentV1.key_proof
	MaxEndpoint           = 256      // one alternate endpoint (URL or host:port)
	MaxAlternateEndpoints = 16       // alternate endpoints in RegistrationAcceptedV1/GoAwayV1
	MaxFallbackStagger    = 8        // RegistrationAcceptedV1.fallback_stagger_ms
	MaxRejectMessage      = 512      // RegistrationRejectedV1.message
	MaxMessage            = 256      // every other free-text message field
	MaxOutputs            = 1024     // AttemptCompletionV1.outputs
	MaxRemoteAddr         = 128      // SessionFencedV1.holder_remote
	MaxSecretID           = 128      // SecretMaterialV1.secret_id
	MaxSecretBytes        = 60 << 10 // SecretMaterialV1.bytes (fits one control-sized frame)
	MaxCertChain          = 4        // RegisterAgentV1.cert_chain entries
	MaxCertDER            = 8192     // one DER certificate in RegisterAgentV1.cert_chain
)

// Encoded-size building blocks of this family beyond wire/internal/maxsize
// (every discriminant of this family is below 128, so maxsize.Enum holds).
const (
	rangeMax = 4 * maxsize.U16
	verMax   = 2 * maxsize.U16
	// A FeatureSet may list up to wire.MaxFeatures u16 values on the wire
	// (a newer peer may send numbers this build drops).
	featuresMax = 1 + wire.MaxFeatures*maxsize.U16
)

// ValidationError reports a message that breaks a rule its encoding cannot
// express: a zero identifier, an unknown enum value, an out-of-range number,
// an over-long string. Message and Field name the wire type and field
// ("agent.LeaseOfferV1", "expires_at_ms"); Reason is static text. None of
// them ever holds a value taken from the message, so the error is safe to
// log and to send to the peer.
type ValidationError struct {
	Message string
	Field   string
	Reason  string
}

// Error returns "<message>: invalid <field>: <reason>".
func (e *ValidationError) Error() string {
	return e.Message + ": invalid " + e.Field + ": " + e.Reason
}

func invalid(msg, field, reason string) error {
	return &ValidationError{Message: msg, Field: field, Reason: reason}
}

// checkID rejects the nil ULID.
func checkID(msg, field string, u ulid.ULID) error {
	if u == (ulid.ULID{}) {
		return invalid(msg, field, "zero identifier")
	}
	return nil
}

// checkIDs returns the first error of checkID over (field, id) pairs.
func checkIDs(msg string, ids ...idField) error {
	for _, f := range ids {
		if err := checkID(msg, f.name, f.id); err != nil {
			return err
		}
	}
	return nil
}

type idField struct {
	name string
	id   ulid.ULID
}

// checkNonZero fails on the first of fields, in order, that is zero: the
// required numbers of a message (epochs, expiries, intervals).
func checkNonZero(msg string, fields ...numField) error {
	for _, f := range fields {
		if f.v == 0 {
			return invalid(msg, f.name, "zero")
		}
	}
	return nil
}

type numField struct {
	name string
	v    uint64
}

// checkString enforces a string bound, UTF-8 validity and, if required,
// non-emptiness.
func checkString(msg, field, s string, max int, required bool) error {
	switch {
	case len(s) > max:
		return invalid(msg, field, "longer than its bound")
	case required && s == "":
		return invalid(msg, field, "empty")
	case !utf8.ValidString(s):
		return invalid(msg, field, "not valid UTF-8")
	}
	return nil
}

// checkBytes validates a required byte string: non-empty and at most max
// bytes.
func checkBytes[B ~[]byte](msg, field string, p B, max int) error {
	switch {
	case len(p) == 0:
		return invalid(msg, field, "empty")
	case len(p) > max:
		return invalid(msg, field, "longer than its bound")
	}
	return nil
}

// checkText validates a free-text message field, which the encoder truncates
// to its bound, so only UTF-8 validity matters.
func checkText(msg, field, s string) error {
	if !utf8.ValidString(s) {
		return invalid(msg, field, "not valid UTF-8")
	}
	return nil
}

// checkStrings validates a bounded list of bounded, non-empty, distinct
// strings.
func checkStrings(msg, field string, ss []string, maxN, maxLen int) error {
	if len(ss) > maxN {
		return invalid(msg, field, "more elements than its bound")
	}
	for i, s := range ss {
		if err := checkString(msg, field, s, maxLen, true); err != nil {
			return err
		}
		for _, t := range ss[:i] {
			if s == t {
				return invalid(msg, field, "duplicate element")
			}
		}
	}
	return nil
}

// checkCerts validates each DER certificate of a cert_chain: non-empty and
// at most MaxCertDER bytes. (The chain's own length bound is the caller's:
// the messages word it differently.)
func checkCerts(msg string, chain [][]byte) error {
	for _, c := range chain {
		if len(c) == 0 || len(c) > MaxCertDER {
			return invalid(msg, "cert_chain", "certificate empty or longer than its bound")
		}
	}
	return nil
}

// checkCas validates a CAS reference: a known algorithm and a non-zero
// digest (the empty object has a non-zero digest too).
func checkCas(msg, field string, r *wire.CasObjectRef) error {
	if r.Algorithm != wire.DigestSHA256 && r.Algorithm != wire.DigestBLAKE3 {
		return invalid(msg, field, "unknown digest algorithm")
	}
	if r.Digest.IsZero() {
		return invalid(msg, field, "zero digest")
	}
	return nil
}

// checkRange validates a protocol range.
func checkRange(msg, field string, r wire.ProtocolRange) error {
	if !r.Valid() || r.Min.Major == 0 {
		return invalid(msg, field, "empty range or major version 0")
	}
	return nil
}

// truncateText cuts a free-text field to its bound on encode. Tests replace
// it to produce over-bound encodings.
var truncateText = wire.TruncateUTF8

// appendStrings appends a Vec<String>.
func appendStrings(b []byte, ss []string) []byte {
	return seq.Append(b, ss, func(s *string, b []byte) []byte { return postcard.AppendString(b, *s) })
}

// readStrings reads a Vec<String> of at most maxN strings of at most maxLen
// bytes, reusing the capacity of dst.
func readStrings(d *postcard.Decoder, dst []string, maxN, maxLen int) []string {
	for s := range seq.Decode(d, &dst, maxN, 1) {
		*s = d.String(maxLen)
	}
	return dst
}

// readBytesInto reads a byte string of at most max bytes into dst's storage
// (a copy, never aliasing the input). An empty value leaves a nil slice.
func readBytesInto(d *postcard.Decoder, dst []byte, max int) []byte {
	p := d.BytesRef(max)
	if len(p) == 0 {
		return nil
	}
	return append(dst[:0], p...)
}

// checkOptionID validates an Option<id>: non-zero when present, zero when
// absent (an absent value is not encoded, so a non-zero one would be lost).
func checkOptionID(msg, field string, has bool, u ulid.ULID) error {
	if has {
		return checkID(msg, field, u)
	}
	if u != (ulid.ULID{}) {
		return invalid(msg, field, "value set but Has flag false")
	}
	return nil
}
