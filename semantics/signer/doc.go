// Package signer is the signing worker (§99, §191): a peer that registers
// with the signing role, holds its keys locally, and answers typed sign
// requests — a key ref, a digest, the CAS material the digest covers and the
// policy proof that authorizes it — with a signature or a stable refusal.
// It is never sent execution work: the agent endpoint it runs on
// (agent.Config.Service) refuses every message outside the signing family
// with RoleForbidden before it reaches the Worker.
//
// Keys are files (LoadKeyFile, GenerateKeyFile): a PKCS#8 PEM Ed25519 or
// ECDSA P-256 private key, mode 0600, never sent anywhere; a request names a
// key by its ref (KeyRef). The worker advertises the refs it holds as
// capability labels (Worker.Labels, session.SigningKeyLabel) so the daemon
// can route a request to a worker that holds the key.
//
// A request is signed only when the worker's Policy allows it:
//
//   - the key ref is one of the worker's keys and the request's algorithm is
//     that key's;
//   - the policy proof names a policy the worker trusts, and its attestation
//     is the Ed25519 signature of that policy's authority over the request
//     (AttestationMessage: policy id, key ref, algorithm, subject, material
//     refs, validity) — the authority signs with Attest;
//   - the proof is valid now, and not longer-lived than Policy.MaxProofLifetime;
//   - the material refs use allowed digest algorithms, and there is at
//     least one when Policy.RequireMaterial.
//
// Otherwise the answer is SignResponseV1{Rejected} whose reason starts with
// a stable RefusalCode ("unknown-key: …"), followed by fixed text: no
// internal error text reaches the wire (§212). Ed25519 signs the 32 subject
// bytes; ECDSA P-256 signs them as the SHA-256 digest (ASN.1 DER signature).
package signer
