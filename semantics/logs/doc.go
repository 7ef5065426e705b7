// Package logs carries an attempt's log from agent to daemon: sequenced,
// resumable and bounded log streams (§43, §83–86, §154–155, §233, §243,
// §268, §277). The protocol is described in
// docs/protocols/internal/logs.md.
//
// One unidirectional stream of kind wire.StreamLog per attempt carries a
// LogStreamHeaderV1{attempt, lease, first_seq, encoding, epoch}, then
// LogFrameV1 frames with increasing, gap-free sequence numbers (the first
// frame of the log is seq 1). The daemon acknowledges durability on the
// control stream (LogAckV1); after a reconnect the agent opens a new log
// stream whose first_seq is the daemon's durable sequence + 1. Before
// completing the attempt the agent passes the logs-finalized barrier:
// LogsFinalizedV1 → LogsFinalizedAckV1.
//
// Agent side: a Writer per attempt buffers the job's output in memory and,
// with Config.SpoolDir, in an on-disk spool, until the daemon acknowledges
// it durable; the cap is enforced by dropping new writes, counted and
// reported (never silent). Daemon side: a Receiver checks each stream
// (authorization, sequence, decompressed size, per-attempt rate and byte
// quota) and appends to a LogSink (FileSink by default).
//
// The control channel is not part of this package: acks, resume requests
// and the finalization messages travel through callbacks and methods, so
// the daemon and agent wire them to their control streams.
//
// Embedding, agent (per attempt):
//
//	w, _ := logs.NewWriter(logs.Config{Attempt: a, Lease: l, Epoch: e, SpoolDir: dir, Compress: true})
//	go w.Attach(ctx, conn, 0)            // after every (re)connect; fromSeq from a LogResumeRequestV1/LogAckV1
//	w.Write(wlogs.LogStdout, chunk)      // from the job's output readers
//	// control reader: LogAckV1 → w.Ack(m.DurableSeq);
//	//   LogResumeRequestV1 → go w.Attach(ctx, conn, m.FromSeq);
//	//   LogsFinalizedAckV1 → w.HandleFinalizedAck(m)
//	err := w.Finalize(ctx, func(m *wlogs.LogsFinalizedV1) error { return control.Send(m) })
//
// Embedding, daemon (one Receiver for all attempts):
//
//	r, _ := logs.NewReceiver(logs.ReceiverConfig{Sink: sink,
//		Authorize: func(a wire.JobAttemptId, l wire.LeaseId) error { return leases.Check(a, l) },
//		Ack:    func(m wlogs.LogAckV1) { control.Send(&m) },
//		Resume: func(m wlogs.LogResumeRequestV1) { control.Send(&m) }})
//	// accept loop: rs.Kind() == wire.StreamLog → go r.Serve(ctx, rs)
//	// control reader: LogsFinalizedV1 → ack, err := r.Finalized(ctx, m); control.Send(&ack)
//	// attempt completed: r.Forget(attempt)
package logs
