package logs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/internal/tokenbucket"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	wlogs "forgeyard.dev/transport/wire/logs"
	"forgeyard.dev/transport/wire/postcard"
)

// Receiver defaults.
const (
	DefaultMaxAttemptBytes = 1 << 30 // hard cap of log bytes per attempt
	DefaultAckBytes        = 1 << 20 // sync and acknowledge after this many bytes
	DefaultAckInterval     = 250 * time.Millisecond
	DefaultMaxAttempts     = 4096
)

// StreamBufferBound is the most log data one Serve call holds at a time,
// in bytes: one frame as read (at most wire.MaxLogFrame, inside the
// RecvStream's frame buffer) plus one decompressed chunk (MaxLogChunk+1).
// A Receiver's buffered bytes never exceed this times the number of
// concurrent Serve calls: under a rate limit it stops reading instead.
const StreamBufferBound = wire.MaxLogFrame + wlogs.MaxLogChunk + 1

// ReceiverConfig configures a Receiver. Sink is required.
type ReceiverConfig struct {
	Sink LogSink
	// Authorize checks that the stream's attempt and lease may send logs
	// (the lease is current and held by this connection's agent). nil
	// allows everything. An error resets the stream with StreamForbidden.
	Authorize func(attempt wire.JobAttemptId, lease wire.LeaseId) error
	// AuthorizeContext, when set, is used instead of Authorize; it gets
	// the ctx passed to Serve, so an engine serving many connections can
	// tell which connection opened the stream (e.g. from a context value).
	AuthorizeContext func(ctx context.Context, attempt wire.JobAttemptId, lease wire.LeaseId) error
	// Ack sends a LogAckV1 to the agent over the control stream. Called
	// without locks held, possibly concurrently and out of order for one
	// attempt (the agent keeps the highest). nil: no acks.
	Ack func(wlogs.LogAckV1)
	// Resume sends a LogResumeRequestV1 over the control stream after a
	// stream was rejected for a sequence gap. nil: none.
	Resume func(wlogs.LogResumeRequestV1)
	// RateBytes limits each attempt's log to this many uncompressed bytes
	// per second (token bucket, §277): a stream over it is not read until
	// tokens accrue, which backpressures the agent through flow control.
	// 0: unlimited.
	RateBytes float64
	// BurstBytes is the bucket size; at least MaxLogChunk (the default,
	// or RateBytes if larger).
	BurstBytes int64
	// MaxAttemptBytes is the hard cap of one attempt's log (§268); above
	// it the stream is reset with StreamRefused and the attempt refused.
	// 0: DefaultMaxAttemptBytes; negative: none.
	MaxAttemptBytes int64
	// AckBytes and AckInterval trigger Sync+Ack: after AckBytes appended
	// bytes, and every AckInterval while appended frames are
	// unacknowledged. Zero values take the defaults.
	AckBytes    int64
	AckInterval time.Duration
	// MaxAttempts bounds the attempts tracked at once (see Forget); a
	// stream for one more is reset with StreamRefused.
	MaxAttempts int
	// OnStream, when set, is called with each stream's header once it
	// was decoded and authorized, before its frames are read (the ctx
	// passed to Serve). It must not block.
	OnStream func(ctx context.Context, hdr wlogs.LogStreamHeaderV1)
	// Metrics, when set, counts the frames and bytes appended to the sink
	// (side=daemon). Nil disables them.
	Metrics *telemetry.Metrics
}

// RejectReason classifies a RejectError.
type RejectReason uint8

// Reject reasons.
const (
	RejectBadHeader    RejectReason = 1 // first frame is not a valid LogStreamHeaderV1
	RejectUnauthorized RejectReason = 2 // Authorize failed
	RejectGap          RejectReason = 3 // first_seq or a frame's seq skips frames
	RejectBadFrame     RejectReason = 4 // malformed frame or frame out of order
	RejectPayload      RejectReason = 5 // payload fails to decode (bomb, corrupt, length)
	RejectQuota        RejectReason = 6 // MaxAttemptBytes exceeded, or too many attempts
	RejectSink         RejectReason = 7 // the sink failed
	// RejectLost: answering a LogResumeRequestV1, the agent's first frame
	// skips frames it no longer holds (a daemon acknowledged them as
	// durable and this one's sink lacks them): the attempt's log is
	// refused (StreamRefused) rather than asked for them again.
	RejectLost RejectReason = 8
	// RejectUnavailable: Authorize could not decide (its error wraps
	// ErrUnavailable: the authority timed out or is down). The stream is
	// reset with StreamInternalError, which the agent retries, never
	// StreamForbidden, on which it would give up the attempt's log.
	RejectUnavailable RejectReason = 9
)

// ErrUnavailable, wrapped by an Authorize error, says the check could not
// be made now (a transient authority failure) rather than that the stream
// is not allowed: Serve resets it as retryable (RejectUnavailable).
var ErrUnavailable = errors.New("logs: authorization unavailable; retry")

var rejectNames = [...]string{"", "bad header", "unauthorized", "sequence gap", "bad frame", "bad payload", "quota exceeded", "sink failure", "frames lost", "authorization unavailable"}

// String returns the reason's name, or RejectReason(n) for an undefined value.
func (r RejectReason) String() string {
	if int(r) < len(rejectNames) && r != 0 {
		return rejectNames[r]
	}
	return "RejectReason(" + strconv.Itoa(int(r)) + ")"
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (r RejectReason) LogValue() slog.Value { return slog.StringValue(r.String()) }

// RejectError is returned by Serve when it reset a stream. Code is the
// reset code sent to the agent; NextSeq, for RejectGap, the sequence the
// resume request asked for.
type RejectError struct {
	Reason  RejectReason
	Code    semantics.StreamErrorCode
	Attempt wire.JobAttemptId
	NextSeq uint64
	Err     error
}

// Error gives the reset code sent, the reason and, when present, the underlying error.
func (e *RejectError) Error() string {
	s := "logs: stream rejected (" + e.Code.String() + "): " + e.Reason.String()
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Unwrap returns the underlying error.
func (e *RejectError) Unwrap() error { return e.Err }

// ReceiverStats are a Receiver's counters.
type ReceiverStats struct {
	Streams        int64 // Serve calls
	Rejected       int64 // streams reset by the receiver
	Superseded     int64 // streams cancelled by a newer stream of the same attempt
	FramesAppended int64
	BytesAppended  int64 // uncompressed bytes handed to the sink
	Duplicates     int64 // frames at or below the appended sequence, skipped
	Gaps           int64
	Acks           int64
	// ShortFinals counts logs-finalized barriers answered with less than
	// their LastSeq although the log was not refused: the agent had sent
	// everything it still held (its stream ended cleanly) and the frames in
	// between are not in the sink — acknowledged as durable by a daemon
	// whose log store this one does not share, or lost by a store that is
	// not durable (see Finalized).
	ShortFinals int64
	// Lost counts attempts whose log was refused because, asked to
	// resume, the agent no longer held the frames (RejectLost).
	Lost          int64
	ThrottleWaits int64         // times a stream waited for the rate limit
	Throttled     time.Duration // total wait
	// BufferedBytes is the log data Serve calls hold now, MaxBuffered its
	// high-water mark (see StreamBufferBound).
	BufferedBytes, MaxBuffered int64
}

// AttemptState is what the Receiver knows of one attempt.
type AttemptState struct {
	Appended, Durable uint64
	Bytes             int64
	Refused           bool
	// Epoch is the agent session epoch of the latest accepted stream
	// header.
	Epoch uint64
	// Finalized is the agent's LogsFinalizedV1, once received.
	Finalized *wlogs.LogsFinalizedV1
}

// Receiver is the daemon side of the log protocol (see the package doc).
// It is safe for concurrent use: one Serve per accepted log stream,
// Finalized from the control stream reader.
type Receiver struct {
	cfg ReceiverConfig

	mu       sync.Mutex
	attempts map[wire.JobAttemptId]*attemptLog

	streams, rejected, superseded, frames, bytes, dups, gaps, acks, waits, shortFinals, lost atomic.Int64
	throttled, buffered, maxBuffered                                                         atomic.Int64
}

type attemptLog struct {
	id wire.JobAttemptId
	mu sync.Mutex // serializes sink calls for the attempt; guards below
	// appended is the last seq handed to the sink, acked the last
	// durable seq acknowledged.
	appended, acked uint64
	bytes           int64
	sinceAck        int64
	refused         bool
	epoch           uint64
	final           *wlogs.LogsFinalizedV1
	// resumeFrom is the FromSeq of the last LogResumeRequestV1 sent (0:
	// none).
	resumeFrom uint64
	// drained: the latest stream ended cleanly (the agent's writer closed
	// it after its last frame): the agent holds nothing beyond appended.
	drained bool
	owner   *serveOwner
	changed chan struct{} // closed and replaced when appended/refused changes, if waited on
	waited  bool
	bucket  *tokenbucket.Bucket // RateBytes; nil when unlimited
}

type serveOwner struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// NewReceiver returns a Receiver; cfg.Sink is required.
func NewReceiver(cfg ReceiverConfig) (*Receiver, error) {
	if cfg.Sink == nil {
		return nil, errors.New("logs: ReceiverConfig.Sink is required")
	}
	if cfg.MaxAttemptBytes == 0 {
		cfg.MaxAttemptBytes = DefaultMaxAttemptBytes
	}
	positiveOr(&cfg.AckBytes, DefaultAckBytes)
	positiveOr(&cfg.AckInterval, DefaultAckInterval)
	positiveOr(&cfg.MaxAttempts, DefaultMaxAttempts)
	if cfg.RateBytes < 0 {
		return nil, errors.New("logs: ReceiverConfig.RateBytes is negative")
	}
	cfg.BurstBytes = max(cfg.BurstBytes, wlogs.MaxLogChunk, int64(cfg.RateBytes))
	return &Receiver{cfg: cfg, attempts: map[wire.JobAttemptId]*attemptLog{}}, nil
}

// Stats returns a snapshot of the counters.
func (r *Receiver) Stats() ReceiverStats {
	return ReceiverStats{Streams: r.streams.Load(), Rejected: r.rejected.Load(), Superseded: r.superseded.Load(),
		FramesAppended: r.frames.Load(), BytesAppended: r.bytes.Load(), Duplicates: r.dups.Load(),
		Gaps: r.gaps.Load(), Acks: r.acks.Load(), ShortFinals: r.shortFinals.Load(), Lost: r.lost.Load(), ThrottleWaits: r.waits.Load(),
		Throttled: time.Duration(r.throttled.Load()), BufferedBytes: r.buffered.Load(), MaxBuffered: r.maxBuffered.Load()}
}

// Attempt returns what the Receiver knows of an attempt; ok is false for
// an attempt it does not track.
func (r *Receiver) Attempt(a wire.JobAttemptId) (st AttemptState, ok bool) {
	r.mu.Lock()
	at := r.attempts[a]
	r.mu.Unlock()
	if at == nil {
		return st, false
	}
	at.mu.Lock()
	defer at.mu.Unlock()
	return AttemptState{Appended: at.appended, Durable: at.acked, Bytes: at.bytes, Refused: at.refused, Epoch: at.epoch, Finalized: at.final}, true
}

// Forget drops the Receiver's state of an attempt, after the attempt
// completed, its log was finalized and its streams ended (a stream still
// being served would append out of order and be reset). A later stream
// for it starts from the sink's Durable again. A sink implementing
// Forgetter forgets the attempt too (closing its files), so nothing is
// retained per forgotten attempt.
func (r *Receiver) Forget(a wire.JobAttemptId) {
	r.mu.Lock()
	at := r.attempts[a]
	delete(r.attempts, a)
	r.mu.Unlock()
	f, ok := r.cfg.Sink.(Forgetter)
	if !ok {
		return
	}
	if at != nil {
		// at.mu serializes the attempt's sink calls: a call in progress
		// ends before the files close.
		at.mu.Lock()
		defer at.mu.Unlock()
	}
	_ = f.Forget(a)
}

func (r *Receiver) attempt(a wire.JobAttemptId) *attemptLog {
	r.mu.Lock()
	defer r.mu.Unlock()
	at := r.attempts[a]
	if at == nil {
		if len(r.attempts) >= r.cfg.MaxAttempts {
			return nil
		}
		at = &attemptLog{id: a}
		if r.cfg.RateBytes > 0 {
			at.bucket = tokenbucket.New(r.cfg.RateBytes, int(r.cfg.BurstBytes))
		}
		// First sight (or after a restart): the sink's durable point is
		// where the log continues.
		at.mu.Lock()
		at.appended = r.cfg.Sink.Durable(a)
		at.acked = at.appended
		at.mu.Unlock()
		r.attempts[a] = at
	}
	return at
}

// resume asks the agent to resend at's log from the frame from.
func (r *Receiver) resume(at *attemptLog, from uint64) {
	if r.cfg.Resume == nil {
		return
	}
	at.mu.Lock()
	at.resumeFrom = from
	at.mu.Unlock()
	r.cfg.Resume(wlogs.LogResumeRequestV1{Attempt: at.id, FromSeq: from})
}

func (at *attemptLog) notifyLocked() {
	if at.waited {
		close(at.changed)
		at.changed, at.waited = nil, false
	}
}

func (r *Receiver) hold(n int64) {
	v := r.buffered.Add(n)
	for {
		m := r.maxBuffered.Load()
		if v <= m || r.maxBuffered.CompareAndSwap(m, v) {
			return
		}
	}
}

// Serve reads one log stream to its end: rs is a stream the daemon
// accepted with AcceptUniStream whose Kind is wire.StreamLog. It returns
// nil at a clean end of stream (after syncing and acknowledging), the
// stream's or connection's error, ctx's cause, or a *RejectError after it
// reset the stream:
//
//   - header not a valid LogStreamHeaderV1: StreamProtocolError;
//   - Authorize failed: StreamForbidden, or StreamInternalError when its
//     error wraps ErrUnavailable (the agent retries);
//   - first_seq beyond the next expected sequence (a gap): StreamProtocolError,
//     and a LogResumeRequestV1 naming the expected sequence is sent;
//   - a malformed frame, a frame whose seq does not increase, or a payload
//     that fails to decompress within its bound (a compression bomb):
//     StreamProtocolError;
//   - the attempt's MaxAttemptBytes exceeded (or MaxAttempts):
//     StreamRefused, and the attempt stays refused;
//   - a stream answering a LogResumeRequestV1 whose first frame skips the
//     frames asked for (the agent released them on an earlier daemon's
//     acknowledgement; this sink lacks them): StreamRefused, RejectLost,
//     and the attempt stays refused (asking again would loop).
//
// Frames at or below the attempt's appended sequence are skipped (counted
// as Duplicates); a frame is appended exactly when its seq is the next
// one. A newer stream for the same attempt cancels an older one still
// being served (StreamCancelled). Serve never panics on peer input and
// holds at most StreamBufferBound bytes of log data.
func (r *Receiver) Serve(ctx context.Context, rs *semantics.RecvStream) error {
	r.streams.Add(1)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { rs.CancelRead(semantics.StreamCancelled) })
	defer stop()

	hdr, at, err := r.admit(ctx, rs)
	if err != nil {
		return err
	}

	// Take over the attempt from an older stream.
	me := &serveOwner{cancel: cancel, done: make(chan struct{})}
	defer close(me.done)
	if err := r.takeOver(ctx, at, me); err != nil {
		return err
	}
	defer r.release(at, me)

	answersResume, err := r.startPoint(rs, at, hdr)
	if err != nil {
		return err
	}

	// Periodic acknowledgement while the stream is open.
	ackDone := make(chan struct{})
	defer close(ackDone)
	go r.ackLoop(at, ackDone)

	return r.readFrames(ctx, rs, at, hdr, answersResume)
}

// reject counts a rejected stream, resets rs with code and returns the
// *RejectError.
func (r *Receiver) reject(rs *semantics.RecvStream, reason RejectReason, code semantics.StreamErrorCode, a wire.JobAttemptId, err error) error {
	r.rejected.Add(1)
	rs.CancelRead(code)
	return &RejectError{Reason: reason, Code: code, Attempt: a, Err: err}
}

// admit is Serve's header step: it reads and validates the stream's
// LogStreamHeaderV1, authorizes its attempt and lease, and returns the
// attempt's log (a *RejectError when any of them fails).
func (r *Receiver) admit(ctx context.Context, rs *semantics.RecvStream) (wlogs.LogStreamHeaderV1, *attemptLog, error) {
	var hdr wlogs.LogStreamHeaderV1
	body, err := rs.ReadFrame()
	if err != nil {
		return hdr, nil, r.readErr(ctx, err)
	}
	r.hold(int64(len(body)))
	err = decodeMessage(body, &hdr)
	r.hold(-int64(len(body)))
	if err == nil {
		err = hdr.Validate()
	}
	if err != nil {
		return hdr, nil, r.reject(rs, RejectBadHeader, semantics.StreamProtocolError, hdr.Attempt, err)
	}
	if auth := r.authorize(ctx); auth != nil {
		if err := auth(hdr.Attempt, hdr.Lease); err != nil {
			if errors.Is(err, ErrUnavailable) {
				return hdr, nil, r.reject(rs, RejectUnavailable, semantics.StreamInternalError, hdr.Attempt, err)
			}
			return hdr, nil, r.reject(rs, RejectUnauthorized, semantics.StreamForbidden, hdr.Attempt, err)
		}
	}
	if r.cfg.OnStream != nil {
		r.cfg.OnStream(ctx, hdr)
	}
	at := r.attempt(hdr.Attempt)
	if at == nil {
		return hdr, nil, r.reject(rs, RejectQuota, semantics.StreamRefused, hdr.Attempt, errors.New("too many attempts"))
	}
	return hdr, at, nil
}

// takeOver is Serve's take-over step: it makes me the attempt's owner,
// cancelling an older stream still being served and waiting for it to end.
func (r *Receiver) takeOver(ctx context.Context, at *attemptLog, me *serveOwner) error {
	return takeOver(ctx, &at.mu, &at.owner, me, func(old *serveOwner) <-chan struct{} {
		r.superseded.Add(1)
		old.cancel()
		return old.done
	})
}

// takeOver makes me the holder of *cur (guarded by mu), the one stream or
// attachment that may work for an attempt or writer: while another holds
// it, supersede cancels that one and returns a channel closed when it has
// ended; takeOver waits for it (or returns ctx's cause), clears *cur if the
// old holder still has it, and tries again. Receiver.takeOver and
// Writer.supersede.
func takeOver[T comparable](ctx context.Context, mu *sync.Mutex, cur *T, me T, supersede func(old T) <-chan struct{}) error {
	var none T
	for {
		mu.Lock()
		old := *cur
		if old == none {
			*cur = me
			mu.Unlock()
			return nil
		}
		mu.Unlock()
		done := supersede(old)
		select {
		case <-done:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		mu.Lock()
		if *cur == old {
			*cur = none
		}
		mu.Unlock()
	}
}

// release ends me's ownership of the attempt (unless a newer stream took it).
func (r *Receiver) release(at *attemptLog, me *serveOwner) {
	at.mu.Lock()
	if at.owner == me {
		at.owner = nil
	}
	at.mu.Unlock()
}

// startPoint is Serve's first-sequence step: it refuses a refused attempt
// and a gap before hdr.FirstSeq (asking the agent to resume at the expected
// sequence), and reports whether the stream answers a LogResumeRequestV1.
func (r *Receiver) startPoint(rs *semantics.RecvStream, at *attemptLog, hdr wlogs.LogStreamHeaderV1) (answersResume bool, err error) {
	at.mu.Lock()
	refused, next := at.refused, at.appended+1
	at.epoch = hdr.Epoch
	at.drained = false
	// A stream that starts where this receiver asked the agent to resume
	// must carry that frame first: if it skips ahead, the agent no longer
	// holds the frames in between.
	answersResume = at.resumeFrom != 0 && hdr.FirstSeq == at.resumeFrom && hdr.FirstSeq == next
	at.mu.Unlock()
	if refused {
		return false, r.reject(rs, RejectQuota, semantics.StreamRefused, at.id, errors.New("attempt refused"))
	}
	if hdr.FirstSeq > next || hdr.FirstSeq == 0 {
		r.gaps.Add(1)
		err := r.reject(rs, RejectGap, semantics.StreamProtocolError, at.id,
			fmt.Errorf("first_seq %d, expected at most %d", hdr.FirstSeq, next))
		err.(*RejectError).NextSeq = next
		r.resume(at, next)
		return false, err
	}
	return answersResume, nil
}

// ackLoop is Serve's periodic acknowledgement while the stream is open,
// until done is closed.
func (r *Receiver) ackLoop(at *attemptLog, done <-chan struct{}) {
	t := time.NewTicker(r.cfg.AckInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			r.syncAck(at, false)
		case <-done:
			return
		}
	}
}

// readFrames is Serve's frame step: it appends the stream's frames until a
// clean end of stream (then syncs, acknowledges and marks the attempt
// drained) or an error.
func (r *Receiver) readFrames(ctx context.Context, rs *semantics.RecvStream, at *attemptLog, hdr wlogs.LogStreamHeaderV1, answersResume bool) error {
	var f wlogs.LogFrameV1
	payload := make([]byte, 0, wlogs.MaxLogChunk+1)
	expect := hdr.FirstSeq // the lowest seq the next frame may carry
	for {
		body, err := rs.ReadFrame()
		if err != nil {
			if err2 := r.readErr(ctx, err); err2 != nil {
				return err2
			}
			r.syncAck(at, true)
			// A clean end: the agent's writer is closed and sent every
			// frame it still held; a barrier waiting for more learns here
			// that none will come.
			at.mu.Lock()
			at.drained = true
			at.notifyLocked()
			at.mu.Unlock()
			return nil
		}
		r.hold(int64(len(body)))
		err = r.frame(ctx, at, body, &f, hdr.Encoding, &payload, &expect)
		r.hold(-int64(len(body)))
		if err != nil {
			var re *RejectError
			if errors.As(err, &re) {
				r.rejectFrame(rs, at, re, answersResume && re.NextSeq == hdr.FirstSeq)
			}
			return err
		}
	}
}

// rejectFrame resets the stream for a frame's *RejectError and asks the
// agent to resume where it must: after a gap, at the expected sequence
// (unless skipped answers a LogResumeRequestV1: the frames are lost), and
// after a sink failure, after the durable point.
func (r *Receiver) rejectFrame(rs *semantics.RecvStream, at *attemptLog, re *RejectError, skipped bool) {
	r.rejected.Add(1)
	if re.Reason == RejectGap && skipped {
		// Asked for them, the agent skipped the frames: it
		// released them when a daemon acknowledged them as
		// durable. Asking again would loop; the log is refused.
		r.lost.Add(1)
		at.mu.Lock()
		at.refused = true
		at.notifyLocked()
		at.mu.Unlock()
		re.Reason, re.Code = RejectLost, semantics.StreamRefused
	}
	rs.CancelRead(re.Code)
	if re.Reason == RejectGap {
		r.resume(at, re.NextSeq)
	}
	if re.Reason == RejectSink && r.cfg.Resume != nil {
		// The sink failed (disk full, I/O error): the agent
		// still spools everything after the durable point and
		// resends it on a new stream.
		at.mu.Lock()
		next := r.cfg.Sink.Durable(at.id) + 1
		at.mu.Unlock()
		r.resume(at, next)
	}
}

// authorize returns the configured check bound to ctx, or nil.
func (r *Receiver) authorize(ctx context.Context) func(wire.JobAttemptId, wire.LeaseId) error {
	if f := r.cfg.AuthorizeContext; f != nil {
		return func(a wire.JobAttemptId, l wire.LeaseId) error { return f(ctx, a, l) }
	}
	return r.cfg.Authorize
}

// frame handles one frame body; *RejectError means reset the stream.
func (r *Receiver) frame(ctx context.Context, at *attemptLog, body []byte, f *wlogs.LogFrameV1, enc wlogs.LogEncoding, payload *[]byte, expect *uint64) error {
	if err := decodeMessage(body, f); err != nil {
		return &RejectError{Reason: RejectBadFrame, Code: semantics.StreamProtocolError, Attempt: at.id, Err: err}
	}
	if f.Seq < *expect {
		return &RejectError{Reason: RejectBadFrame, Code: semantics.StreamProtocolError, Attempt: at.id,
			Err: fmt.Errorf("frame seq %d after %d", f.Seq, *expect-1)}
	}
	*expect = f.Seq + 1
	at.mu.Lock()
	appended, refused := at.appended, at.refused
	at.mu.Unlock()
	if refused {
		return &RejectError{Reason: RejectQuota, Code: semantics.StreamRefused, Attempt: at.id, Err: errors.New("attempt refused")}
	}
	if f.Seq <= appended {
		r.dups.Add(1)
		return nil
	}
	if f.Seq > appended+1 {
		r.gaps.Add(1)
		return &RejectError{Reason: RejectGap, Code: semantics.StreamProtocolError, Attempt: at.id, NextSeq: appended + 1,
			Err: fmt.Errorf("frame seq %d, expected %d", f.Seq, appended+1)}
	}
	// Quota before the work: the declared length is bounded by MaxLogChunk.
	n := int64(f.UncompressedLen)
	if lim := r.cfg.MaxAttemptBytes; lim > 0 {
		at.mu.Lock()
		over := at.bytes+n > lim
		if over {
			at.refused = true
			at.notifyLocked()
		}
		at.mu.Unlock()
		if over {
			// Acknowledge what is stored before the reset, so the agent
			// counts exactly the rest as dropped.
			r.syncAck(at, false)
			return &RejectError{Reason: RejectQuota, Code: semantics.StreamRefused, Attempt: at.id,
				Err: fmt.Errorf("attempt log over %d bytes", lim)}
		}
	}
	if err := r.throttle(ctx, at, n); err != nil {
		return err
	}
	p, err := f.Payload(enc, (*payload)[:0])
	if err != nil {
		return &RejectError{Reason: RejectPayload, Code: semantics.StreamProtocolError, Attempt: at.id, Err: err}
	}
	*payload = p[:0]
	r.hold(int64(len(p)))
	defer r.hold(-int64(len(p)))
	at.mu.Lock()
	err = r.cfg.Sink.Append(at.id, f.Seq, f.Stream, f.TimestampMs, p)
	if err == nil {
		at.appended = f.Seq
		at.bytes += int64(len(p))
		at.sinceAck += int64(len(p))
		at.notifyLocked()
	}
	due := at.sinceAck >= r.cfg.AckBytes
	at.mu.Unlock()
	if err != nil {
		return &RejectError{Reason: RejectSink, Code: semantics.StreamInternalError, Attempt: at.id, Err: err}
	}
	r.frames.Add(1)
	r.bytes.Add(int64(len(p)))
	r.cfg.Metrics.LogAccepted(true, 1, len(p))
	if due {
		r.syncAck(at, false)
	}
	return nil
}

// throttle takes n tokens from the attempt's bucket, waiting (not reading
// the stream) until they accrue.
func (r *Receiver) throttle(ctx context.Context, at *attemptLog, n int64) error {
	if at.bucket == nil || n == 0 {
		return nil
	}
	wait := at.bucket.Reserve(time.Now(), int(n))
	if wait <= 0 {
		return nil
	}
	r.waits.Add(1)
	r.throttled.Add(int64(wait))
	if !tokenbucket.Sleep(ctx, wait) {
		return context.Cause(ctx)
	}
	return nil
}

// syncAck makes the attempt's appended frames durable (Syncer) and
// acknowledges the durable point if it advanced (or always, if force).
func (r *Receiver) syncAck(at *attemptLog, force bool) {
	at.mu.Lock()
	if at.appended == at.acked && !force {
		at.mu.Unlock()
		return
	}
	if s, ok := r.cfg.Sink.(Syncer); ok {
		_ = s.Sync(at.id) // a failed sync leaves Durable behind; the agent keeps the frames
	}
	d := r.cfg.Sink.Durable(at.id)
	adv := d > at.acked
	if adv {
		at.acked = d
		at.notifyLocked()
	}
	at.sinceAck = 0
	at.mu.Unlock()
	if (adv || force) && r.cfg.Ack != nil {
		r.acks.Add(1)
		r.cfg.Ack(wlogs.LogAckV1{Attempt: at.id, DurableSeq: d})
	}
}

// Finalized handles the agent's LogsFinalizedV1 (§243): it waits until
// every frame up to m.LastSeq is durable in the sink (they arrive on the
// attempt's log stream), then returns the LogsFinalizedAckV1 to send back.
// For a refused attempt it answers at once with the durable sequence. So
// it does once the agent's latest stream ended cleanly (its writer, closed,
// sent every frame it still held) with frames up to LastSeq still missing:
// the agent released them when a daemon acknowledged them as durable, so
// they will not come — a daemon restarted over a log store that is not
// durable, or an agent that moved from a daemon whose store this one does
// not share. The short answer (counted in ReceiverStats.ShortFinals) ends
// the barrier instead of leaving it to wait out the lease. It
// returns ctx's cause if ctx ends first, or an error for an invalid m.
func (r *Receiver) Finalized(ctx context.Context, m *wlogs.LogsFinalizedV1) (wlogs.LogsFinalizedAckV1, error) {
	if err := m.Validate(); err != nil {
		return wlogs.LogsFinalizedAckV1{}, err
	}
	at := r.attempt(m.Attempt)
	if at == nil {
		return wlogs.LogsFinalizedAckV1{}, errors.New("logs: too many attempts")
	}
	for {
		at.mu.Lock()
		fm := *m
		at.final = &fm
		if at.appended >= m.LastSeq || at.refused || at.drained {
			at.mu.Unlock()
			r.syncAck(at, false)
			at.mu.Lock()
			d := at.acked
			if d >= m.LastSeq || at.refused || at.drained && d >= at.appended {
				short := d < m.LastSeq && !at.refused
				at.mu.Unlock()
				if short {
					r.shortFinals.Add(1)
				}
				return wlogs.LogsFinalizedAckV1{Attempt: m.Attempt, LastSeq: min(d, m.LastSeq)}, nil
			}
		}
		if !at.waited {
			at.changed, at.waited = make(chan struct{}), true
		}
		ch := at.changed
		at.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return wlogs.LogsFinalizedAckV1{}, context.Cause(ctx)
		}
	}
}

func (r *Receiver) readErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// decodeMessage decodes an envelope frame body whose payload must be m's
// type, into m, without allocating.
func decodeMessage(b []byte, m wire.Message) error {
	d := postcard.NewDecoder(b)
	var env wire.Envelope
	env.DecodeHeader(&d)
	fam, variant := d.U32(), d.U32()
	if err := d.Err(); err != nil {
		return err
	}
	if env.Protocol.Major != wire.Current.Major {
		return fmt.Errorf("logs: protocol %d.%d", env.Protocol.Major, env.Protocol.Minor)
	}
	if fam >= 256 || variant >= 256 || wire.TypeID(wire.Family(fam), uint8(variant)) != m.MessageType() {
		return fmt.Errorf("logs: unexpected message type %d/%d, want %s", fam, variant, m.MessageType())
	}
	m.DecodePostcard(&d)
	if err := d.Finish(); err != nil {
		return err
	}
	return m.Validate()
}
