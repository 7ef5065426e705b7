package logs

import (
	"fmt"
	"sync"

	"forgeyard.dev/transport/wire"
)

// attemptSeq is the per-attempt sequence state FileSink and BucketSink
// share: what was appended, what is durable and a sticky error, under one
// mutex. Each sink embeds it in its own per-attempt type.
type attemptSeq struct {
	mu       sync.Mutex
	appended uint64
	durable  uint64
	err      error // sticky: set by a failed write or by Forget
}

func (q *attemptSeq) state() *attemptSeq { return q }

// seqHolder is a sink's per-attempt type embedding attemptSeq.
type seqHolder interface{ state() *attemptSeq }

// openLocked returns the attempt's state from open with its mutex held, or
// (unlocked) the error of open or the state's sticky error.
func openLocked[T seqHolder](open func(wire.JobAttemptId) (T, error), a wire.JobAttemptId) (T, error) {
	var zero T
	l, err := open(a)
	if err != nil {
		return zero, err
	}
	q := l.state()
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		return zero, q.err
	}
	return l, nil
}

// durableOf returns the attempt's durable sequence number from open; 0
// when open fails.
func durableOf[T seqHolder](open func(wire.JobAttemptId) (T, error), a wire.JobAttemptId) uint64 {
	l, err := open(a)
	if err != nil {
		return 0
	}
	q := l.state()
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.durable
}

// appendNext runs put, with the attempt's mutex held, for the append of
// seq: it fails when seq is not the one after the last appended (sink names
// the sink in the error, "file sink") and records seq as appended when put
// succeeds.
func appendNext[T seqHolder](open func(wire.JobAttemptId) (T, error), a wire.JobAttemptId, sink string, seq uint64, put func(T) error) error {
	l, err := openLocked(open, a)
	if err != nil {
		return err
	}
	q := l.state()
	defer q.mu.Unlock()
	if err := q.checkNext(sink, seq); err != nil {
		return err
	}
	if err := put(l); err != nil {
		return err
	}
	q.appended = seq
	return nil
}

// syncPending runs write, with the attempt's mutex held, when the attempt
// has appends that are not durable yet; write makes them durable and
// advances q.durable.
func syncPending[T seqHolder](open func(wire.JobAttemptId) (T, error), a wire.JobAttemptId, write func(T) error) error {
	l, err := openLocked(open, a)
	if err != nil {
		return err
	}
	q := l.state()
	defer q.mu.Unlock()
	if q.appended == q.durable {
		return nil
	}
	return write(l)
}

// checkNext, under q.mu, fails when seq is not the one after the last
// appended; sink names the sink in the error ("file sink").
func (q *attemptSeq) checkNext(sink string, seq uint64) error {
	if seq != q.appended+1 {
		return fmt.Errorf("logs: %s: append seq %d after %d", sink, seq, q.appended)
	}
	return nil
}
