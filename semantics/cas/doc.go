// Package cas moves content-addressed objects between an agent and the
// daemon over a semantics.Conn (§44, §87–93, §134, §156, §234, §269): one
// bidirectional stream per object, the receiver verifying the digest of the
// logical content itself, resumable from the receiver's stored prefix, and
// every request scoped to a lease that an Authorizer checks.
//
// The protocol is described in docs/protocols/internal/cas-transfer.md. In
// short, on a StreamCasUpload stream opened by the agent:
//
//	agent  → CasObjectStreamHeaderV1{lease, object, offset, length, compression} ‖ bytes ‖ FIN
//	daemon → CasObjectAckV1{outcome, verified_offset} ‖ FIN
//
// optionally preceded, when the agent resumes an interrupted upload, by
//
//	agent  → CasRangeResumeRequestV1{lease, object, 0}    ("where are you?")
//	daemon → CasRangeResumeRequestV1{lease, object, held} (the prefix it keeps)
//	         or CasObjectAckV1 (Verified: already stored; Forbidden)
//
// and on a StreamCasDownload stream opened by the agent:
//
//	agent  → CasFetchRequestV1{lease, object, offset}
//	daemon → CasObjectStreamHeaderV1 ‖ bytes ‖ FIN   (or CasObjectAckV1{Forbidden|NotFound})
//	agent  → CasObjectAckV1 ‖ FIN
//
// # Roles
//
// Server is the daemon side: it answers NeedObjectsV1 batches (the control
// exchange, which belongs to the daemon's engine, calls Server.NeedObjects)
// and serves CAS streams (Session.Handle). Uploader and Downloader are the
// agent side. Each side stores objects in a ContentStore; FSStore is the
// filesystem default.
//
// # Embedding
//
// The daemon creates one Server and, per connection, one Session:
//
//	srv, _ := cas.NewServer(cas.ServerConfig{Store: store, Authorizer: auth})
//	sess := srv.NewSession()          // per *semantics.Conn
//	// in the accept loop, for streams of kind StreamCasUpload/StreamCasDownload:
//	go sess.Handle(ctx, stream)
//	// on the control stream, for a NeedObjectsV1 from the agent:
//	missing, err := srv.NeedObjects(ctx, need)
//
// The agent creates one Uploader and one Downloader for its lifetime (they
// remember interrupted uploads across reconnects) and passes the current
// *semantics.Conn to each call:
//
//	up, _ := cas.NewUploader(cas.UploaderConfig{Source: local})
//	err := up.UploadAll(ctx, conn, control, lease, outputs) // control: a ControlExchange over the control stream
//	dl, _ := cas.NewDownloader(cas.DownloaderConfig{Store: local})
//	err = dl.Fetch(ctx, conn, lease, input)
//
// # Verification and resume
//
// The receiver hashes every logical byte as it appends it to a partial
// object. When a transfer is cut, the partial object keeps the bytes that
// reached the store; its length is the "verified prefix" (the bytes were
// received intact over an authenticated, integrity-protected transport and
// are covered by the final digest check). On resume the receiver re-hashes
// the stored prefix from disk (no hash state is persisted), continues from
// there, and commits only when the digest of the whole logical content
// matches; a mismatch discards the partial object entirely.
//
// Only SHA-256 is implemented. BLAKE3 is a valid wire algorithm but this
// build has no implementation: Uploader and Downloader refuse such objects
// locally with ErrUnsupportedAlgorithm; a Server reports them missing in
// NeedObjects, answers a download of one with NotFound and an upload with
// Aborted (after the lease check, so Forbidden still wins).
package cas
