package agent

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
	"forgeyard.dev/transport/wire/postcard"
)

// SecretBytes holds secret material. Every way of printing or marshalling it
// (String, GoString, fmt verbs through Format, slog through LogValue,
// encoding/json through MarshalJSON) yields "<redacted N bytes>", never the
// bytes. Code that really needs the bytes indexes or slices them explicitly.
type SecretBytes []byte

func redacted(n int) string { return "<redacted " + strconv.Itoa(n) + " bytes>" }

// String returns "<redacted N bytes>".
func (s SecretBytes) String() string { return redacted(len(s)) }

// GoString returns "<redacted N bytes>".
func (s SecretBytes) GoString() string { return redacted(len(s)) }

// Format prints "<redacted N bytes>" for every verb and flag.
func (s SecretBytes) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(redacted(len(s)))) }

// LogValue implements slog.LogValuer with the redacted form.
func (s SecretBytes) LogValue() slog.Value { return slog.StringValue(redacted(len(s))) }

// MarshalJSON encodes the redacted form as a JSON string.
func (s SecretBytes) MarshalJSON() ([]byte, error) { return json.Marshal(redacted(len(s))) }

// SecretMaterialV1 delivers one short-lived secret for a lease from daemon to
// agent (§149–152; the spec's SecretMaterialWire). It travels only on a
// dedicated TLS-protected stream of kind wire.StreamSecret, never on the
// control stream (semantics/daemon.SendSecrets, semantics/agent.UseSecret),
// is registered as Sensitive (never logged or persisted by the transport),
// and redacts itself: String, GoString, Format,
// LogValue and MarshalJSON print the lease, secret id, length and expiry but
// never the bytes (§152).
//
//	struct SecretMaterialV1 {
//	    lease: [u8;16],
//	    secret_id: String,                  // ≤ MaxSecretID (128) bytes: the SecretRef, not secret
//	    bytes: Bytes,                       // ≤ MaxSecretBytes (61440) bytes
//	    expires_at_ms: u64,                 // Unix ms; the agent discards the secret after it
//	}
//
// Validate: non-zero lease and expires_at_ms, non-empty secret_id and bytes
// within their bounds. MaxSecretBytes is 60 KiB, not 64 KiB, so that the
// largest SecretMaterialV1 in a full envelope fits one frame of the secret
// stream (wire.StreamSecret.FrameLimit, 64 KiB including the envelope).
//
// DecodePostcard copies the bytes out of the input into m.Bytes (zeroing the
// storage it replaces); the caller should zero the input frame too. Call
// Zero once the secret has been used.
type SecretMaterialV1 struct {
	Lease       wire.LeaseId
	SecretID    string
	Bytes       SecretBytes
	ExpiresAtMs uint64
}

const nameSecretMaterial = "agent.SecretMaterialV1"

var maxSecretMaterialSize = maxsize.ID + maxsize.Bytes(MaxSecretID) + maxsize.Bytes(MaxSecretBytes) + maxsize.U64

// MessageType implements wire.Message.
func (*SecretMaterialV1) MessageType() wire.MessageTypeId { return MsgSecretMaterial }

// AppendPostcard implements wire.Message.
func (m *SecretMaterialV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Lease.ULID[:]...)
	b = postcard.AppendString(b, m.SecretID)
	b = postcard.AppendBytes(b, m.Bytes)
	return postcard.AppendU64(b, m.ExpiresAtMs)
}

// DecodePostcard implements wire.Message.
func (m *SecretMaterialV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Lease.ULID)
	m.SecretID = d.String(MaxSecretID)
	p := d.BytesRef(MaxSecretBytes)
	m.Zero()
	switch {
	case len(p) == 0:
		m.Bytes = nil
	case len(p) > cap(m.Bytes):
		m.Bytes = append(make(SecretBytes, 0, len(p)), p...)
	default:
		m.Bytes = append(m.Bytes[:0], p...)
	}
	m.ExpiresAtMs = d.U64()
}

// Validate implements wire.Message.
func (m *SecretMaterialV1) Validate() error {
	const n = nameSecretMaterial
	if err := checkID(n, "lease", m.Lease.ULID); err != nil {
		return err
	}
	if err := checkString(n, "secret_id", m.SecretID, MaxSecretID, true); err != nil {
		return err
	}
	if err := checkBytes(n, "bytes", m.Bytes, MaxSecretBytes); err != nil {
		return err
	}
	if m.ExpiresAtMs == 0 {
		return invalid(n, "expires_at_ms", "zero")
	}
	return nil
}

// Zero overwrites the secret bytes with zeros (the whole capacity, so that a
// shorter reuse leaves nothing behind). Length is unchanged.
func (m *SecretMaterialV1) Zero() { clear(m.Bytes[:cap(m.Bytes)]) }

// String returns the redacted form:
//
//	SecretMaterialV1{lease=01H…, secret_id=ci/deploy-key, bytes=<redacted 12 bytes>, expires_at_ms=…}
func (m SecretMaterialV1) String() string {
	return "SecretMaterialV1{lease=" + m.Lease.String() + ", secret_id=" + strconv.Quote(m.SecretID) +
		", bytes=" + redacted(len(m.Bytes)) + ", expires_at_ms=" + strconv.FormatUint(m.ExpiresAtMs, 10) + "}"
}

// GoString returns the redacted form with Go field names.
func (m SecretMaterialV1) GoString() string {
	return "agent.SecretMaterialV1{Lease:" + m.Lease.String() + ", SecretID:" + strconv.Quote(m.SecretID) +
		", Bytes:" + redacted(len(m.Bytes)) + ", ExpiresAtMs:" + strconv.FormatUint(m.ExpiresAtMs, 10) + "}"
}

// Format prints the redacted form for every verb: GoString for %#v, String
// otherwise.
func (m SecretMaterialV1) Format(f fmt.State, verb rune) {
	s := m.String()
	if verb == 'v' && f.Flag('#') {
		s = m.GoString()
	}
	_, _ = f.Write([]byte(s))
}

// LogValue implements slog.LogValuer: a group of lease, secret_id, the
// redacted bytes and expires_at_ms.
func (m SecretMaterialV1) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("lease", m.Lease.String()),
		slog.String("secret_id", m.SecretID),
		slog.String("bytes", redacted(len(m.Bytes))),
		slog.Uint64("expires_at_ms", m.ExpiresAtMs),
	)
}

// MarshalJSON encodes the redacted form:
// {"lease":…,"secret_id":…,"bytes":"<redacted N bytes>","expires_at_ms":…}.
func (m SecretMaterialV1) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Lease       string `json:"lease"`
		SecretID    string `json:"secret_id"`
		Bytes       string `json:"bytes"`
		ExpiresAtMs uint64 `json:"expires_at_ms"`
	}{m.Lease.String(), m.SecretID, redacted(len(m.Bytes)), m.ExpiresAtMs})
}
