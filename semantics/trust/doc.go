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
// This package imports only the standard library and wire; it imports no
// backend. Enrollment (§20), rotation (§21) and revocation (§224) build on
// it and are added later.
package trust
