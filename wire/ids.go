package wire

import (
	"encoding/hex"
	"log/slog"

	"github.com/oklog/ulid/v2"

	"forgeyard.dev/transport/wire/postcard"
)

// Identifiers are ULIDs carried as 16 raw bytes (a Postcard [u8; 16], no
// length prefix). Each is a distinct type so that a LeaseId can never be
// passed where a JobAttemptId is expected. The zero value is the nil ULID,
// which validation rejects wherever an identifier is required.

// RunnerId names a stable logical runner (§13). It is bound to the runner's
// certificate.
type RunnerId struct{ ulid.ULID }

// AgentSessionId names one agent process/runtime session (§13).
type AgentSessionId struct{ ulid.ULID }

// TransportSessionId names one network connection (§12).
type TransportSessionId struct{ ulid.ULID }

// MessageId is stable across retries of one meaningful message (§31).
type MessageId struct{ ulid.ULID }

// CorrelationId links request/response pairs and lease lifecycles (§32).
type CorrelationId struct{ ulid.ULID }

// LeaseId names one lease of one attempt.
type LeaseId struct{ ulid.ULID }

// JobId names a job.
type JobId struct{ ulid.ULID }

// JobAttemptId names one attempt of a job.
type JobAttemptId struct{ ulid.ULID }

// NewRunnerId returns a fresh RunnerId. The New* constructors use ulid.Make,
// which is safe for concurrent use and monotonic within a millisecond.
func NewRunnerId() RunnerId { return RunnerId{ulid.Make()} }

// NewAgentSessionId returns a fresh AgentSessionId.
func NewAgentSessionId() AgentSessionId { return AgentSessionId{ulid.Make()} }

// NewTransportSessionId returns a fresh TransportSessionId.
func NewTransportSessionId() TransportSessionId { return TransportSessionId{ulid.Make()} }

// NewMessageId returns a fresh MessageId.
func NewMessageId() MessageId { return MessageId{ulid.Make()} }

// NewCorrelationId returns a fresh CorrelationId.
func NewCorrelationId() CorrelationId { return CorrelationId{ulid.Make()} }

// NewLeaseId returns a fresh LeaseId.
func NewLeaseId() LeaseId { return LeaseId{ulid.Make()} }

// NewJobId returns a fresh JobId.
func NewJobId() JobId { return JobId{ulid.Make()} }

// NewJobAttemptId returns a fresh JobAttemptId.
func NewJobAttemptId() JobAttemptId { return JobAttemptId{ulid.Make()} }

// AppendULID appends the 16 raw bytes of u.
func AppendULID(b []byte, u ulid.ULID) []byte { return append(b, u[:]...) }

// ReadULID reads 16 raw bytes into u.
func ReadULID(d *postcard.Decoder, u *ulid.ULID) { d.Array16((*[16]byte)(u)) }

// Digest is a 32-byte content digest (BLAKE3 or SHA-256; see
// DigestAlgorithm). It is a fixed array on the wire.
type Digest [32]byte

// String returns the lowercase hex form.
func (g Digest) String() string { return hex.EncodeToString(g[:]) }

// IsZero reports whether every byte is zero.
func (g Digest) IsZero() bool { return g == Digest{} }

// JobSpecId is the digest of a canonical JobSpec (§64–66).
type JobSpecId struct{ Digest }

// CapabilityDigest is the digest of a runner's capability snapshot (§94).
type CapabilityDigest struct{ Digest }

// AppendDigest appends the 32 raw bytes of g.
func AppendDigest(b []byte, g Digest) []byte { return append(b, g[:]...) }

// ReadDigest reads 32 raw bytes into g.
func ReadDigest(d *postcard.Decoder, g *Digest) { d.Array32((*[32]byte)(g)) }

// DigestAlgorithm names the hash of a CAS digest. Wire values are explicit
// and stable (a Postcard enum discriminant).
type DigestAlgorithm uint32

// Digest algorithms.
const (
	DigestSHA256 DigestAlgorithm = 0
	DigestBLAKE3 DigestAlgorithm = 1

	numDigestAlgorithms = 2
)

// String returns "sha256", "blake3" or "unknown".
func (a DigestAlgorithm) String() string {
	switch a {
	case DigestSHA256:
		return "sha256"
	case DigestBLAKE3:
		return "blake3"
	}
	return "unknown"
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (a DigestAlgorithm) LogValue() slog.Value { return slog.StringValue(a.String()) }

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (g Digest) LogValue() slog.Value { return slog.StringValue(g.String()) }

// CasObjectRef names a CAS object: its digest algorithm, digest and size in
// bytes.
type CasObjectRef struct {
	Algorithm DigestAlgorithm
	Digest    Digest
	Size      uint64
}

// CasObjectRefMinSize is the smallest encoding of a CasObjectRef.
const CasObjectRefMinSize = 1 + 32 + 1

// AppendPostcard appends r.
func (r *CasObjectRef) AppendPostcard(b []byte) []byte {
	b = postcard.AppendVariant(b, uint32(r.Algorithm))
	b = append(b, r.Digest[:]...)
	return postcard.AppendU64(b, r.Size)
}

// DecodePostcard reads r.
func (r *CasObjectRef) DecodePostcard(d *postcard.Decoder) {
	r.Algorithm = DigestAlgorithm(d.Variant(numDigestAlgorithms))
	ReadDigest(d, &r.Digest)
	r.Size = d.U64()
}

// String returns algorithm:digest, e.g. sha256:<hex>.
func (r CasObjectRef) String() string {
	return r.Algorithm.String() + ":" + r.Digest.String()
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (r CasObjectRef) LogValue() slog.Value { return slog.StringValue(r.String()) }
