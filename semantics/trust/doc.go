// Package trust is the TLS and identity layer of Forgeyard Transport: it
// builds TLS 1.3 server and client configurations from PEM files, binds an
// agent's client certificate to its RunnerId (§17), checks the verified peer
// of a connection, warns before certificates expire (§22) and generates a
// development PKI for demos and tests.
//
// # Runner identity
//
// An agent certificate names its runner with exactly one URI subject
// alternative name of the form
//
//	forgeyard://runner/<ULID>
//
// where <ULID> is the canonical 26-character upper-case Crockford base32
// form of the RunnerId. RunnerURI builds that URI; RunnerIDFromCert parses
// it back; VerifyPeer does so for the verified leaf of a TLS connection.
// URIs with another scheme, or with the forgeyard scheme and another host,
// are ignored (they are reserved for other identities), so a certificate may
// also carry, say, a SPIFFE ID.
//
// # Security posture
//
// Every configuration built here is TLS 1.3 only and never sets
// InsecureSkipVerify (§19). Identity is taken only from cs.VerifiedChains,
// never from the unverified cs.PeerCertificates.
//
// # Enrollment and rotation
//
// Enrollment (§20) and rotation (§21) use the pieces in enroll.go and
// credentials.go: one-time bootstrap tokens (NewEnrollmentToken; the
// authority stores only HashEnrollmentToken), agent keys and CSRs
// (GenerateKey, CreateCSR; the private key never leaves the agent), the
// daemon's checks and signing (ParseCSR, Issuer), and Credentials, a
// certificate that TLS configurations fetch at every handshake
// (GetClientCertificate / GetCertificate) so it can be renewed without
// restarting listeners or dialers, with crash-safe file updates. The
// operator-facing texts for expired and revoked credentials
// (MsgCredentialExpired, MsgCredentialRevoked, MsgRunnerDisabled,
// ExplainHandshakeError) live here so the daemon, agent and CLI agree. The
// protocol is docs/protocols/internal/enrollment.md.
//
// This package imports only the standard library and wire; it imports no
// backend.
package trust
