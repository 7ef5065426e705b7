package agent

import "forgeyard.dev/transport/wire/postcard"

// RenewOutcomeV1 and ResyncDecisionV1 are one enum layout under two names,
// the daemon's verdict on a lease: variant 0 keeps it until a new expiry
// {expires_at_ms: u64, ttl_ms: u32}, variant 1 ends it {reason:
// CancellationReason}, variant 2 carries nothing. The functions below
// encode, decode and validate that layout once; each type passes its own
// fields (and its own error text, which names its variants).
const (
	verdictKeep = 0 // RenewExtended, DecisionContinue
	verdictEnd  = 1 // RenewRevoked, DecisionCancel
	verdictNone = 2 // RenewUnknown, DecisionStale
	numVerdicts = 3
)

func appendVerdict(b []byte, kind uint32, expiresAtMs uint64, ttlMs uint32, reason CancellationReason) []byte {
	b = postcard.AppendVariant(b, kind)
	switch kind {
	case verdictKeep:
		b = postcard.AppendU64(b, expiresAtMs)
		b = postcard.AppendU32(b, ttlMs)
	case verdictEnd:
		b = postcard.AppendVariant(b, uint32(reason))
	}
	return b
}

// decodeVerdict reads the layout; the fields the variant does not carry
// are zero.
func decodeVerdict(d *postcard.Decoder) (kind uint32, expiresAtMs uint64, ttlMs uint32, reason CancellationReason) {
	kind = d.Variant(numVerdicts)
	switch kind {
	case verdictKeep:
		expiresAtMs = d.U64()
		ttlMs = d.U32()
	case verdictEnd:
		reason = CancellationReason(d.Variant(numCancellationReasons))
	}
	return kind, expiresAtMs, ttlMs, reason
}

// checkVerdict validates the layout: a keep with a non-zero expiry and ttl
// (zeroExpiry reports one that is zero), an end with a known reason, and
// no field set that the variant does not carry.
func checkVerdict(msg, field, zeroExpiry string, kind uint32, expiresAtMs uint64, ttlMs uint32, reason CancellationReason) error {
	switch kind {
	case verdictKeep:
		if expiresAtMs == 0 || ttlMs == 0 {
			return invalid(msg, field, zeroExpiry)
		}
		if reason != 0 {
			return invalid(msg, field, "field set that its variant does not carry")
		}
	case verdictEnd:
		if !reason.Valid() {
			return invalid(msg, field, "unknown cancellation reason")
		}
		if expiresAtMs != 0 || ttlMs != 0 {
			return invalid(msg, field, "field set that its variant does not carry")
		}
	case verdictNone:
		if expiresAtMs != 0 || ttlMs != 0 || reason != 0 {
			return invalid(msg, field, "field set that its variant does not carry")
		}
	default:
		return invalid(msg, field, "unknown variant")
	}
	return nil
}
