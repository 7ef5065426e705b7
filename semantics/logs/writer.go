package logs

import (
	"bytes"
	"compress/flate"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// Writer defaults.
const (
	DefaultMemoryLimit      = 4 << 20   // bytes of pending log data kept in memory
	DefaultSpoolLimit       = 256 << 20 // bytes of pending log data with a spool
	DefaultMaxPendingFrames = 1 << 16   // pending (unacknowledged) frames
	DefaultSegmentSize      = 8 << 20   // spool segment file size
)

// maxFlateChunk is the chunk size of a Flate stream: small enough that a
// chunk DEFLATE cannot shrink still fits MaxLogChunk as stored blocks.
const maxFlateChunk = wlogs.MaxLogChunk - 256

// Alike in shape to the other packages' sentinel-error blocks, but these are
// this package's own failures, each a stable API value: they stay apart.

// Errors of the Writer.
var (
	// ErrClosed: Write after Close or Finalize.
	ErrClosed = errors.New("logs: writer closed")
	// ErrDropped: the write did not fit the pending-data cap and was
	// dropped whole; the loss is counted in Stats and LogsFinalizedV1.
	ErrDropped = errors.New("logs: pending log data over its cap; write dropped and counted")
	// ErrRefused: the daemon refused the attempt's log (a hard quota, or
	// a stream reset with StreamRefused/StreamForbidden). Everything not
	// yet durable is counted as dropped; later writes are dropped too.
	ErrRefused = errors.New("logs: daemon refused the attempt's log")
	// ErrResumeAhead: Attach was asked to start after the last frame the
	// writer produced (the daemon claims frames it never got).
	ErrResumeAhead = errors.New("logs: resume sequence beyond the writer's log")
	// ErrSuperseded: a newer Attach took over the writer.
	ErrSuperseded = errors.New("logs: superseded by a newer Attach")
)

// Config configures a Writer. Attempt and Lease are required; zero limits
// take the defaults above.
type Config struct {
	Attempt wire.JobAttemptId
	Lease   wire.LeaseId
	// Epoch is the agent session registration epoch put in every stream
	// header.
	Epoch uint64
	// SpoolDir, when set, is the root of the on-disk spool: the writer
	// uses (and first empties) SpoolDir/<attempt>. Empty: memory only.
	SpoolDir string
	// MemoryLimit bounds the pending log bytes held in memory. Without a
	// spool it is the cap of pending data; with one it bounds the cache
	// of pending chunks (the rest is re-read from disk to be sent), and
	// memory use stays below MemoryLimit plus the open chunk (ChunkSize).
	MemoryLimit int64
	// SpoolLimit caps the pending log bytes when a spool is used.
	SpoolLimit int64
	// MaxPendingFrames caps the pending frames (each costs a small index
	// entry in memory even when its data is on disk).
	MaxPendingFrames int
	// SegmentSize is the spool's segment file size.
	SegmentSize int64
	// Compress selects LogEncodingFlate for the streams: each chunk is
	// DEFLATE-compressed and sent as stored (uncompressed) DEFLATE blocks
	// when compression saves less than 10 %.
	Compress bool
	// ChunkSize is the largest chunk (frame payload); 0 or above the
	// maximum means MaxLogChunk (MaxLogChunk-256 with Compress).
	ChunkSize int
	// Now is the clock for frame timestamps; nil means time.Now.
	Now func() time.Time
	// Metrics, when set, counts accepted and dropped bytes, sealed frames
	// and the pending (unacknowledged) bytes (side=agent). Nil disables
	// them.
	Metrics *telemetry.Metrics
}

// WriterStats are a Writer's counters; see Writer.Stats.
type WriterStats struct {
	// LastSeq is the last sequence number assigned (0: none); Acked the
	// highest acknowledged durable.
	LastSeq, Acked uint64
	// PendingFrames/PendingBytes are the sealed frames not yet durable
	// plus the open chunk; MemoryBytes the part held in memory;
	// SpoolDiskBytes the spool's file sizes.
	PendingFrames  int
	PendingBytes   int64
	MemoryBytes    int64
	SpoolDiskBytes int64
	// TotalBytes counts every byte given to Write, dropped or not.
	TotalBytes uint64
	// DroppedFrames/DroppedBytes count data lost to the cap or a refusal
	// (frames a dropped write would have filled).
	DroppedFrames, DroppedBytes uint64
	// FramesSent counts frames written to streams, FramesResent those
	// sent again after a reconnect, WireBytes the chunk bytes sent
	// (after compression), RawBytesSent before it.
	FramesSent, FramesResent uint64
	WireBytes, RawBytesSent  uint64
	// Attaches counts Attach calls that opened a stream.
	Attaches uint64
	// SpoolErrors counts spool I/O failures (the chunk is then kept in
	// memory instead).
	SpoolErrors uint64
	Refused     bool
}

// Writer is the agent side of one attempt's log (see the package doc). It
// is safe for concurrent use: Write from the job's output readers, Attach
// from the connection manager, Ack and HandleFinalizedAck from the control
// stream reader.
type Writer struct {
	cfg   Config
	chunk int
	limit int64 // cap of PendingBytes
	now   func() time.Time
	kick  chan struct{} // wakes the sender; capacity 1

	mu       sync.Mutex
	next     uint64 // next seq to assign; starts at 1
	acked    uint64
	maxSent  uint64 // highest seq ever written to a stream
	pend     []*chunk
	tail     []byte
	tailKind wlogs.LogStreamKind
	tailTs   uint64
	pendB    int64
	memB     int64
	sp       *spool
	closed   bool
	refused  bool
	raw      bool // SetCompress(false): streams use LogEncodingRaw despite cfg.Compress
	att      *attachment
	finSeq   uint64        // LastSeq of the acknowledged finalization
	finDone  chan struct{} // closed by HandleFinalizedAck
	st       WriterStats
}

type chunk struct {
	seq  uint64
	kind wlogs.LogStreamKind
	ts   uint64
	n    int
	data []byte // nil when only in the spool
	seg  *segment
	off  int64
}

type attachment struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// positiveOr sets *v to def unless it is positive: the fields of the
// package's configs (Config, ReceiverConfig, BucketSinkConfig) where zero
// or a negative value means the default.
func positiveOr[T ~int | ~int64](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// NewWriter returns a Writer for one attempt. With cfg.SpoolDir it creates
// (emptying) the attempt's spool directory.
func NewWriter(cfg Config) (*Writer, error) {
	if cfg.Attempt.IsZero() || cfg.Lease.IsZero() {
		return nil, errors.New("logs: Config.Attempt and Config.Lease are required")
	}
	positiveOr(&cfg.MemoryLimit, DefaultMemoryLimit)
	positiveOr(&cfg.SpoolLimit, DefaultSpoolLimit)
	positiveOr(&cfg.MaxPendingFrames, DefaultMaxPendingFrames)
	positiveOr(&cfg.SegmentSize, DefaultSegmentSize)
	max := wlogs.MaxLogChunk
	if cfg.Compress {
		max = maxFlateChunk
	}
	if cfg.ChunkSize <= 0 || cfg.ChunkSize > max {
		cfg.ChunkSize = max
	}
	w := &Writer{cfg: cfg, chunk: cfg.ChunkSize, now: cfg.Now, kick: make(chan struct{}, 1), next: 1,
		finDone: make(chan struct{}), limit: cfg.MemoryLimit}
	if w.now == nil {
		w.now = time.Now
	}
	if cfg.SpoolDir != "" {
		sp, err := newSpool(filepath.Join(cfg.SpoolDir, cfg.Attempt.String()), cfg.SegmentSize)
		if err != nil {
			return nil, err
		}
		w.sp, w.limit = sp, cfg.SpoolLimit
	}
	return w, nil
}

// SetCompress selects the encoding of the streams later Attach calls open:
// Flate when on (and the writer was created with Config.Compress), Raw
// otherwise. An agent calls it before each Attach with whether the daemon
// negotiated wire.FeatureLogCompressionV1 (protocol 1.1); the frames'
// chunk sizes stay those of Config.Compress, which fit both encodings.
func (w *Writer) SetCompress(on bool) {
	w.mu.Lock()
	w.raw = !on
	w.mu.Unlock()
}

func (w *Writer) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// Write appends p to the attempt's log as output of kind. It never blocks
// on the network: data is coalesced into chunks of at most ChunkSize
// bytes, which are kept (in memory or the spool) until the daemon
// acknowledges them durable.
//
// Drop policy: "drop new". If p does not fit the cap of pending data
// (MemoryLimit, or SpoolLimit with a spool, and MaxPendingFrames), all of
// p is dropped, counted (DroppedFrames = the chunks it would have filled,
// DroppedBytes = len(p)), and ErrDropped is returned. Data already
// accepted is never discarded, so sequence numbers stay consecutive and
// the daemon sees no gap; the loss is reported in Stats and in
// LogsFinalizedV1. After Close it returns ErrClosed (not counted); after a
// refusal ErrRefused (counted).
func (w *Writer) Write(kind wlogs.LogStreamKind, p []byte) error {
	if kind > wlogs.LogSystem {
		return fmt.Errorf("logs: unknown stream kind %d", kind)
	}
	if len(p) == 0 {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrClosed
	}
	w.st.TotalBytes += uint64(len(p))
	frames := (len(p) + w.chunk - 1) / w.chunk
	if w.refused || w.pendB+int64(len(p)) > w.limit || len(w.pend)+frames+1 > w.cfg.MaxPendingFrames {
		w.st.DroppedFrames += uint64(frames)
		w.st.DroppedBytes += uint64(len(p))
		w.cfg.Metrics.LogDropped(len(p))
		if w.refused {
			return ErrRefused
		}
		return ErrDropped
	}
	w.cfg.Metrics.LogAccepted(false, 0, len(p))
	w.cfg.Metrics.LogSpoolAdd(len(p))
	ts := uint64(w.now().UnixMilli())
	for len(p) > 0 {
		if len(w.tail) > 0 && (w.tailKind != kind || len(w.tail) == w.chunk) {
			w.sealLocked()
		}
		if len(w.tail) == 0 {
			w.tailKind, w.tailTs = kind, ts
		}
		k := min(len(p), w.chunk-len(w.tail))
		w.tail = append(w.tail, p[:k]...)
		w.pendB += int64(k)
		w.memB += int64(k)
		p = p[k:]
	}
	w.wake()
	return nil
}

// sealLocked turns the open chunk into a numbered pending frame.
func (w *Writer) sealLocked() {
	c := &chunk{seq: w.next, kind: w.tailKind, ts: w.tailTs, n: len(w.tail), data: w.tail}
	w.next++
	w.tail = nil
	w.cfg.Metrics.LogAccepted(false, 1, 0)
	if w.sp != nil {
		seg, off, err := w.sp.append(c.seq, c.kind, c.ts, c.data)
		if err != nil {
			w.st.SpoolErrors++
		} else {
			c.seg, c.off = seg, off
			if w.memB > w.cfg.MemoryLimit {
				// Over the cache budget: keep it on disk only and reuse
				// the buffer for the next chunk.
				w.memB -= int64(c.n)
				w.tail, c.data = c.data[:0], nil
			}
		}
	}
	w.pend = append(w.pend, c)
}

// Ack records that the daemon stored every frame up to durable (LogAckV1,
// or a LogResumeRequestV1's FromSeq-1): those frames are released from
// memory and the spool. Stale or out-of-range values are ignored.
func (w *Writer) Ack(durable uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ackLocked(durable)
}

func (w *Writer) ackLocked(durable uint64) {
	if durable >= w.next {
		durable = w.next - 1
	}
	if durable <= w.acked {
		return
	}
	i := 0
	for i < len(w.pend) && w.pend[i].seq <= durable {
		c := w.pend[i]
		w.pendB -= int64(c.n)
		w.cfg.Metrics.LogSpoolAdd(-c.n)
		if c.data != nil {
			w.memB -= int64(c.n)
		}
		w.pend[i] = nil
		i++
	}
	w.pend = w.pend[i:]
	w.acked = durable
	if w.sp != nil {
		w.sp.release(durable)
	}
}

// Close ends the log: later writes fail with ErrClosed, the open chunk is
// sealed, and an attached sender sends the remaining frames, then closes
// its stream. Close is idempotent.
func (w *Writer) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		if len(w.tail) > 0 {
			w.sealLocked()
		}
	}
	w.wake()
}

// Stats returns a snapshot of the counters.
func (w *Writer) Stats() WriterStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.st
	st.LastSeq, st.Acked = w.next-1, w.acked
	st.PendingFrames, st.PendingBytes, st.MemoryBytes = len(w.pend), w.pendB, w.memB
	if len(w.tail) > 0 {
		st.PendingFrames++
	}
	if w.sp != nil {
		st.SpoolDiskBytes = w.sp.disk
	}
	st.Refused = w.refused
	return st
}

// FinalizedMessage closes the writer and returns its LogsFinalizedV1:
// LastSeq is the last frame of the log, and the totals include every
// dropped byte.
func (w *Writer) FinalizedMessage() wlogs.LogsFinalizedV1 {
	w.Close()
	w.mu.Lock()
	defer w.mu.Unlock()
	return wlogs.LogsFinalizedV1{Attempt: w.cfg.Attempt, Lease: w.cfg.Lease, LastSeq: w.next - 1,
		TotalBytes: w.st.TotalBytes, DroppedFrames: w.st.DroppedFrames, DroppedBytes: w.st.DroppedBytes}
}

// Finalize is the logs-finalized barrier (§243): it closes the writer,
// sends its LogsFinalizedV1 through send (the agent's control stream), and
// waits until HandleFinalizedAck delivers the daemon's LogsFinalizedAckV1
// for it, or ctx ends. On success the spool is deleted. It may be called
// again (after a reconnect) with the same effect; the frames themselves
// travel on the log stream of the current Attach.
func (w *Writer) Finalize(ctx context.Context, send func(*wlogs.LogsFinalizedV1) error) error {
	m := w.FinalizedMessage()
	if err := send(&m); err != nil {
		return err
	}
	select {
	case <-w.finDone:
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sp != nil {
		w.sp.close()
		w.sp = nil
	}
	return nil
}

// HandleFinalizedAck delivers the daemon's LogsFinalizedAckV1. It reports
// whether the ack completes the barrier (it is for this attempt and covers
// LastSeq, or the log was refused); it also acknowledges the frames it
// covers.
func (w *Writer) HandleFinalizedAck(a *wlogs.LogsFinalizedAckV1) bool {
	if a.Attempt != w.cfg.Attempt {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ackLocked(a.LastSeq)
	if !w.closed || (a.LastSeq < w.next-1 && !w.refused) {
		return false
	}
	select {
	case <-w.finDone:
	default:
		w.finSeq = a.LastSeq
		close(w.finDone)
	}
	return true
}

// refuseLocked handles a refusal by the daemon: pending frames become
// counted drops.
func (w *Writer) refuseLocked() {
	if w.refused {
		return
	}
	w.refused = true
	for _, c := range w.pend {
		if c.seq > w.acked {
			w.st.DroppedFrames++
			w.st.DroppedBytes += uint64(c.n)
		}
	}
	if len(w.tail) > 0 {
		w.st.DroppedFrames++
		w.st.DroppedBytes += uint64(len(w.tail))
		w.cfg.Metrics.LogDropped(len(w.tail))
		w.cfg.Metrics.LogSpoolAdd(-len(w.tail))
		w.pendB -= int64(len(w.tail))
		w.memB -= int64(len(w.tail))
		w.tail = nil
	}
	// The sequence numbers stay assigned; acknowledging them all releases
	// the memory and the spool.
	w.ackLocked(w.next - 1)
}

// Attach streams the log on conn: it opens a log stream (kind
// wire.StreamLog), sends a LogStreamHeaderV1 with FirstSeq = fromSeq, then
// every frame from fromSeq on, as they are written, until the writer is
// closed and every frame is sent (it then closes the stream and returns
// nil), the stream or connection fails, or ctx ends (the stream is reset
// with StreamCancelled). fromSeq is the daemon's durable sequence + 1
// (from LogResumeRequestV1.FromSeq or the last LogAckV1); 0 means "after
// the last Ack". Frames up to fromSeq-1 are acknowledged by the call.
//
// One Attach runs at a time: a new call cancels the previous one (which
// returns ErrSuperseded) and waits for it to end. After a reconnect, call
// Attach again on the new connection. A reset by the daemon with
// StreamRefused or StreamForbidden is a refusal (ErrRefused): pending
// frames are counted as dropped.
func (w *Writer) Attach(ctx context.Context, conn *semantics.Conn, fromSeq uint64) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	me := &attachment{cancel: cancel, done: make(chan struct{})}
	defer close(me.done)
	if err := w.supersede(ctx, me); err != nil {
		return err
	}
	defer w.detach(me)

	hdr, err := w.resumePoint(fromSeq)
	if err != nil {
		return err
	}

	s, err := conn.OpenUniStream(ctx, wire.StreamLog)
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { s.CancelWrite(semantics.StreamCancelled) })
	defer stop()
	if err := s.WriteEnvelope(&wire.Envelope{Protocol: wire.Current, MessageID: wire.NewMessageId(),
		SentAtMs: uint64(w.now().UnixMilli()), Payload: &hdr}); err != nil {
		s.CancelWrite(semantics.StreamCancelled)
		return w.sendErr(ctx, err)
	}
	return w.sendFrames(ctx, conn, s, hdr)
}

// supersede is Attach's take-over step: it makes me the writer's one
// attachment, cancelling an older one (ErrSuperseded) and waiting for it
// to end.
func (w *Writer) supersede(ctx context.Context, me *attachment) error {
	return takeOver(ctx, &w.mu, &w.att, me, func(old *attachment) <-chan struct{} {
		old.cancel(ErrSuperseded)
		return old.done
	})
}

// detach ends me's attachment (unless a newer Attach took it).
func (w *Writer) detach(me *attachment) {
	w.mu.Lock()
	if w.att == me {
		w.att = nil
	}
	w.mu.Unlock()
}

// resumePoint is Attach's resume point step: it resolves fromSeq (0: after
// the last Ack), acknowledges the frames before it and returns the stream's
// LogStreamHeaderV1.
func (w *Writer) resumePoint(fromSeq uint64) (wlogs.LogStreamHeaderV1, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.refused {
		return wlogs.LogStreamHeaderV1{}, ErrRefused
	}
	if fromSeq == 0 {
		fromSeq = w.acked + 1
	}
	if fromSeq > w.next {
		return wlogs.LogStreamHeaderV1{}, fmt.Errorf("%w: from %d, last %d", ErrResumeAhead, fromSeq, w.next-1)
	}
	w.ackLocked(fromSeq - 1)
	enc := wlogs.LogEncodingRaw
	if w.cfg.Compress && !w.raw {
		enc = wlogs.LogEncodingFlate
	}
	hdr := wlogs.LogStreamHeaderV1{Attempt: w.cfg.Attempt, Lease: w.cfg.Lease, FirstSeq: fromSeq, Encoding: enc, Epoch: w.cfg.Epoch}
	w.st.Attaches++
	return hdr, nil
}

// sendFrames is Attach's replay and live step: it sends every frame from
// hdr.FirstSeq on, the held ones first and then each as it is written,
// until the writer is closed and every frame is sent.
func (w *Writer) sendFrames(ctx context.Context, conn *semantics.Conn, s *semantics.SendStream, hdr wlogs.LogStreamHeaderV1) error {
	fe := newFrameEncoder(hdr.Encoding, conn.Limits().MaxFrame[wire.StreamLog])
	cursor := hdr.FirstSeq
	var rbuf []byte
	for {
		c, data, resent, err := w.nextFrame(ctx, conn, s, cursor, &rbuf)
		if c == nil {
			return err
		}

		n, err := fe.send(s, c, data, uint64(w.now().UnixMilli()))
		if err != nil {
			s.CancelWrite(semantics.StreamCancelled) // no-op if the stream was reset
			return w.sendErr(ctx, err)
		}
		w.mu.Lock()
		w.st.FramesSent++
		if resent {
			w.st.FramesResent++
		}
		w.st.WireBytes += uint64(n)
		w.st.RawBytesSent += uint64(c.n)
		w.mu.Unlock()
		cursor = c.seq + 1
	}
}

// nextFrame waits for the frame to send at cursor or after (read from the
// spool into *rbuf when it is only there) and reports whether it was sent
// before; a nil chunk ends the stream with the error returned (nil after
// closing it cleanly).
func (w *Writer) nextFrame(ctx context.Context, conn *semantics.Conn, s *semantics.SendStream, cursor uint64, rbuf *[]byte) (c *chunk, data []byte, resent bool, err error) {
	w.mu.Lock()
	for c == nil {
		if w.refused {
			w.mu.Unlock()
			s.CancelWrite(semantics.StreamCancelled)
			return nil, nil, false, ErrRefused
		}
		// Frames acknowledged meanwhile need not be sent; the
		// receiver accepts increasing sequence numbers that do not
		// pass its next expected one.
		cursor = max(cursor, w.acked+1)
		if cursor < w.next {
			c = w.pend[cursor-w.pend[0].seq]
			data = c.data
			if data == nil {
				if data, err = w.sp.read(c.seg, c.off, c.n, *rbuf); err != nil {
					w.mu.Unlock()
					s.CancelWrite(semantics.StreamInternalError)
					return nil, nil, false, err
				}
				*rbuf = data
			}
			break
		}
		if len(w.tail) > 0 {
			w.sealLocked()
			continue
		}
		if w.closed {
			w.mu.Unlock()
			return nil, nil, false, w.sendErr(ctx, s.Close())
		}
		w.mu.Unlock()
		select {
		case <-w.kick:
		case <-ctx.Done():
			return nil, nil, false, context.Cause(ctx)
		case <-conn.Done():
			return nil, nil, false, conn.Err()
		}
		w.mu.Lock()
	}
	resent = c.seq <= w.maxSent
	w.maxSent = max(w.maxSent, c.seq)
	w.mu.Unlock()
	return c, data, resent, nil
}

// sendErr classifies a stream write error.
func (w *Writer) sendErr(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	var se *semantics.StreamError
	if errors.As(err, &se) && se.Remote && (se.Code == semantics.StreamRefused || se.Code == semantics.StreamForbidden) {
		w.mu.Lock()
		w.refuseLocked()
		w.mu.Unlock()
		return fmt.Errorf("%w: %v", ErrRefused, err)
	}
	return err
}

// frameEncoder writes log frames: the frame head (envelope and frame
// fields) as one write, the chunk as a second, so the chunk is never
// copied (zero-copy framing).
type frameEncoder struct {
	enc    wlogs.LogEncoding
	limit  int
	head   []byte
	cbuf   bytes.Buffer
	fast   *flate.Writer
	stored *flate.Writer
}

func newFrameEncoder(enc wlogs.LogEncoding, limit int) *frameEncoder {
	fe := &frameEncoder{enc: enc, limit: limit, head: make([]byte, 0, 128)}
	if enc == wlogs.LogEncodingFlate {
		fe.fast, _ = flate.NewWriter(nil, flate.BestSpeed)
		fe.stored, _ = flate.NewWriter(nil, flate.NoCompression)
	}
	return fe
}

func (fe *frameEncoder) deflate(zw *flate.Writer, data []byte) []byte {
	fe.cbuf.Reset()
	zw.Reset(&fe.cbuf)
	_, _ = zw.Write(data) // a bytes.Buffer does not fail
	_ = zw.Close()
	return fe.cbuf.Bytes()
}

// send writes one frame and returns the chunk bytes sent.
func (fe *frameEncoder) send(s *semantics.SendStream, c *chunk, data []byte, nowMs uint64) (int, error) {
	m := wlogs.LogFrameV1{Seq: c.seq, Stream: c.kind, TimestampMs: c.ts, UncompressedLen: uint32(len(data)), Bytes: data}
	if fe.enc == wlogs.LogEncodingFlate {
		// Use compression only when it saves at least 10 %.
		if b := fe.deflate(fe.fast, data); len(b)*10 <= len(data)*9 {
			m.Bytes = b
		} else {
			m.Bytes = fe.deflate(fe.stored, data)
		}
	}
	env := wire.Envelope{Protocol: wire.Current, MessageID: wire.NewMessageId(), SentAtMs: nowMs}
	head, err := wlogs.AppendFrameHead(fe.head[:0], fe.limit, &env, &m)
	if err != nil {
		return 0, err
	}
	fe.head = head[:0]
	if _, err := s.Write(head); err != nil {
		return 0, err
	}
	if _, err := s.Write(m.Bytes); err != nil {
		return 0, err
	}
	return len(m.Bytes), nil
}
