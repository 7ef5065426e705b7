package signing

import (
	"log/slog"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/enum"
	"forgeyard.dev/transport/wire/internal/seq"
	"forgeyard.dev/transport/wire/postcard"
)

// SignOutcomeKind is the discriminant of SignOutcomeV1.
type SignOutcomeKind uint32

// Sign outcomes.
const (
	SignSigned   SignOutcomeKind = 0 // carries Signature and Chain
	SignRejected SignOutcomeKind = 1 // carries Reason

	numSignOutcomes = 2
)

// String returns Signed or Rejected, or SignOutcomeKind(n) for an undefined value.
func (k SignOutcomeKind) String() string {
	return enum.Name(signOutcomeKindNames[:], k, "SignOutcomeKind")
}

// Alike in shape to the other enums here (Valid, String by enum.Name,
// LogValue), but each is its own enum of the API with its own names.
var signOutcomeKindNames = [...]string{SignSigned: "Signed", SignRejected: "Rejected"}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (k SignOutcomeKind) LogValue() slog.Value { return slog.StringValue(k.String()) }

// SignOutcomeV1 is the worker's verdict, a Postcard enum with data:
//
//	enum SignOutcome {
//	    Signed { signature: Bytes /* 1..=1024 */, chain: Vec<Bytes /* 1..=8192 */> /* ≤ 4 */ } = 0,
//	    Rejected { reason: String /* 1..=256 */ } = 1,
//	}
//
// Chain holds DER certificates, leaf first, when the key is certified. Only
// the fields of Kind's variant are encoded; the others must be empty
// (Validate) and are empty after decoding.
type SignOutcomeV1 struct {
	Kind      SignOutcomeKind
	Signature []byte   // Signed
	Chain     [][]byte // Signed
	Reason    string   // Rejected: operator text, no secrets (§212)
}

// SignResponseV1 answers a SignRequestV1; the envelope's correlation id names
// the request.
//
//	struct SignResponseV1 { outcome: SignOutcome }
type SignResponseV1 struct {
	Outcome SignOutcomeV1
}

// MessageType implements wire.Message.
func (*SignResponseV1) MessageType() wire.MessageTypeId { return MsgSignResponse }

// AppendPostcard implements wire.Message.
func (m *SignResponseV1) AppendPostcard(b []byte) []byte {
	o := &m.Outcome
	b = postcard.AppendVariant(b, uint32(o.Kind))
	switch o.Kind {
	case SignSigned:
		b = postcard.AppendBytes(b, o.Signature)
		b = seq.AppendBytes(b, o.Chain)
	case SignRejected:
		b = postcard.AppendString(b, o.Reason)
	}
	return b
}

// DecodePostcard implements wire.Message. Signature and certificates are
// copied; an unknown outcome fails with postcard.ErrBadEnum.
func (m *SignResponseV1) DecodePostcard(d *postcard.Decoder) {
	m.Outcome = SignOutcomeV1{Kind: SignOutcomeKind(d.Variant(numSignOutcomes))}
	o := &m.Outcome
	if d.Failed() {
		return
	}
	switch o.Kind {
	case SignSigned:
		o.Signature = d.Bytes(MaxSignature)
		o.Chain = seq.DecodeBytes(d, MaxChain, MaxChainCert)
	case SignRejected:
		o.Reason = d.String(MaxReason)
	}
}

// Validate implements wire.Message: a known outcome whose own fields are
// within bounds and non-empty, and whose other variant's fields are empty.
func (m *SignResponseV1) Validate() error {
	o := &m.Outcome
	switch o.Kind {
	case SignSigned:
		if len(o.Signature) == 0 || len(o.Signature) > MaxSignature {
			return errInvalid("sign response: signature must be 1..=1024 bytes")
		}
		if len(o.Chain) > MaxChain {
			return errInvalid("sign response: more than 4 chain certificates")
		}
		for _, c := range o.Chain {
			if len(c) == 0 || len(c) > MaxChainCert {
				return errInvalid("sign response: chain certificate must be 1..=8192 bytes")
			}
		}
		if o.Reason != "" {
			return errInvalid("sign response: signed outcome with a reason")
		}
	case SignRejected:
		if !validText(o.Reason, MaxReason) {
			return errInvalid("sign response: reason must be 1..=256 bytes of UTF-8")
		}
		if len(o.Signature) != 0 || len(o.Chain) != 0 {
			return errInvalid("sign response: rejected outcome with a signature")
		}
	default:
		return errInvalid("sign response: unknown outcome")
	}
	return nil
}
