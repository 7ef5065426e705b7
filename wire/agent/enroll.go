package agent

import (
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/internal/maxsize"
	"forgeyard.dev/transport/wire/internal/seq"
	"forgeyard.dev/transport/wire/postcard"
)

// Bounds of the enrollment and renewal messages.
const (
	MaxEnrollToken = 128  // CertificateRequestV1.token
	MaxCSR         = 4096 // CertificateRequestV1.csr (DER PKCS#10)
)

// Message type numbers of enrollment and certificate renewal (§20–21).
var (
	MsgCertificateRequest = id(0x1a)
	MsgCertificateIssued  = id(0x1b)
)

// CertificateRequestV1 asks the daemon for a client certificate for the
// key of a PKCS#10 request the agent made with its own, locally generated
// key (the private key never leaves the agent).
//
//	struct CertificateRequestV1 {
//	    token: String,   // ≤ MaxEnrollToken (128) bytes; empty for a renewal
//	    csr: Bytes,      // ≤ MaxCSR (4096) bytes, DER PKCS#10
//	}
//
// Enrollment (§20): sent after HelloAckV1 on a connection WITHOUT a client
// certificate, with a one-time bootstrap token; the daemon answers
// CertificateIssuedV1 bound to a fresh RunnerId (or WireErrorV1) and then
// closes the connection. Renewal (§21): sent by a registered agent on its
// authenticated session with an empty token; the certificate keeps the
// session's RunnerId. The message is Sensitive (the token is a secret).
//
// Validate: non-empty csr within its bound, token within its bound and
// valid UTF-8.
type CertificateRequestV1 struct {
	Token string
	CSR   []byte
}

const nameCertificateRequest = "agent.CertificateRequestV1"

var maxCertificateRequestSize = maxsize.Bytes(MaxEnrollToken) + maxsize.Bytes(MaxCSR)

// MessageType implements wire.Message.
func (*CertificateRequestV1) MessageType() wire.MessageTypeId { return MsgCertificateRequest }

// AppendPostcard implements wire.Message.
func (m *CertificateRequestV1) AppendPostcard(b []byte) []byte {
	b = postcard.AppendString(b, m.Token)
	return postcard.AppendBytes(b, m.CSR)
}

// DecodePostcard implements wire.Message. CSR is copied into the existing
// capacity of m.CSR.
func (m *CertificateRequestV1) DecodePostcard(d *postcard.Decoder) {
	m.Token = d.String(MaxEnrollToken)
	m.CSR = readBytesInto(d, m.CSR, MaxCSR)
}

// Validate implements wire.Message.
func (m *CertificateRequestV1) Validate() error {
	const n = nameCertificateRequest
	if err := checkString(n, "token", m.Token, MaxEnrollToken, false); err != nil {
		return err
	}
	return checkBytes(n, "csr", m.CSR, MaxCSR)
}

// String never shows the token.
func (m *CertificateRequestV1) String() string {
	if m.Token == "" {
		return "CertificateRequestV1{renewal}"
	}
	return "CertificateRequestV1{token: <redacted>}"
}

// GoString never shows the token.
func (m *CertificateRequestV1) GoString() string { return m.String() }

// CertificateIssuedV1 answers CertificateRequestV1: the certificate chain
// (leaf first) bound to Runner through its forgeyard://runner/ URI SAN.
//
//	struct CertificateIssuedV1 {
//	    runner: [u8;16],
//	    cert_chain: Vec<Bytes>,   // 1..MaxCertChain (4) × ≤ MaxCertDER (8192) bytes, DER, leaf first
//	    not_after_ms: u64,        // the leaf's expiry (unix ms), for the agent's renewal schedule
//	}
//
// Validate: non-zero runner, 1..MaxCertChain non-empty certificates within
// their bound, non-zero not_after_ms.
type CertificateIssuedV1 struct {
	Runner     wire.RunnerId
	CertChain  [][]byte
	NotAfterMs uint64
}

const nameCertificateIssued = "agent.CertificateIssuedV1"

var maxCertificateIssuedSize = maxsize.ID + maxsize.Seq(MaxCertChain, maxsize.Bytes(MaxCertDER)) + maxsize.U64

// MessageType implements wire.Message.
func (*CertificateIssuedV1) MessageType() wire.MessageTypeId { return MsgCertificateIssued }

// AppendPostcard implements wire.Message.
func (m *CertificateIssuedV1) AppendPostcard(b []byte) []byte {
	b = append(b, m.Runner.ULID[:]...)
	b = seq.AppendBytes(b, m.CertChain)
	return postcard.AppendU64(b, m.NotAfterMs)
}

// DecodePostcard implements wire.Message.
func (m *CertificateIssuedV1) DecodePostcard(d *postcard.Decoder) {
	wire.ReadULID(d, &m.Runner.ULID)
	m.CertChain = seq.DecodeBytes(d, MaxCertChain, MaxCertDER)
	m.NotAfterMs = d.U64()
}

// Validate implements wire.Message.
func (m *CertificateIssuedV1) Validate() error {
	const n = nameCertificateIssued
	if err := checkIDs(n, idField{"runner", m.Runner.ULID}); err != nil {
		return err
	}
	if len(m.CertChain) == 0 {
		return invalid(n, "cert_chain", "empty")
	}
	if len(m.CertChain) > MaxCertChain {
		return invalid(n, "cert_chain", "more elements than its bound")
	}
	if err := checkCerts(n, m.CertChain); err != nil {
		return err
	}
	if m.NotAfterMs == 0 {
		return invalid(n, "not_after_ms", "zero")
	}
	return nil
}
