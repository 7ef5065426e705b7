package authority

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Group commit. The operations agents drive at fleet rates (register,
// create/accept/reject/renew/complete, resync and its lease reads, the
// inventory's presence, capability, health and heartbeat writes) do not
// each run their own
// transaction: they queue on the store's batcher, and a worker runs a whole
// batch in ONE transaction with a savepoint per operation, then commits once.
// The commit's fsync (SQLite synchronous=FULL, PostgreSQL with fsync on) is
// paid once per batch instead of once per operation.
//
//   - Each operation runs exactly the code it ran in its own transaction,
//     under the same row locks, and sees the operations before it in the
//     batch as committed: the batch is equivalent to running them one after
//     another. Exactly-once and fencing are unchanged.
//   - An operation that fails (ErrStaleLease, a constraint, …) is undone
//     alone, as with a savepoint per operation (see try: savepoints are taken
//     only when a batch needs them); the other operations of the batch are
//     not affected.
//   - Every caller gets its own result, and only after the batch committed:
//     nothing is acknowledged that is not durable. If the commit fails every
//     caller of the batch gets the error (none of them took effect).
//   - A transient conflict (PostgreSQL serialization failure or deadlock,
//     SQLite busy) in any operation or in the commit rolls the batch back and
//     runs it again; after batchAttempts tries the operations run one by one
//     in their own transactions, with their own retries.
//   - The queue is bounded (a caller waits for room) and honours the
//     caller's context: a caller whose context ends while queued returns its
//     error and the worker skips the operation. Once the worker started an
//     operation it runs to the batch's end under the worker's context; the
//     caller returns at once, and the outcome is whatever the batch commits
//     (as with a cancelled single transaction, a retry with the same message
//     id is answered from the dedup record).
//
// Batches form by themselves: a worker takes everything queued (up to
// maxBatch) while it was busy, so an idle store runs each operation alone
// with no added latency, and a loaded one commits hundreds at once.
//
// Lazy operations (a heartbeat's time in the inventory: written at most
// every 30 s per connection, read by operators) may wait up to lazyLinger
// for company: a batch of lazy operations only is held until maxBatch
// operations, a non-lazy one or the linger's end, so 10,000 idle agents'
// 333 heartbeat writes a second share a few commits (each an fsync) a
// second instead of one each. A non-lazy operation never waits.

const (
	maxBatch      = 256
	queueLen      = 4096
	batchAttempts = 3
)

// lazyLinger is how long a batch of lazy operations waits for company (a
// variable for tests).
var lazyLinger = 100 * time.Millisecond

// errClosed: the store was closed while the operation was queued.
var errClosed = errors.New("authority: store closed")

type batchOp struct {
	ctx   context.Context
	fn    func(ctx context.Context, t *sql.Tx) error
	done  chan error   // buffered (1): the worker never blocks
	state atomic.Int32 // opQueued → opRunning (worker) or opAbandoned (caller)
	lazy  bool         // may wait lazyLinger for other operations
}

const (
	opQueued int32 = iota
	opRunning
	opAbandoned
)

type batcher struct {
	s        *store
	queue    chan *batchOp
	quit     chan struct{}
	stopped  chan struct{} // closed once the workers ended and the queue was drained
	wg       sync.WaitGroup
	closing  sync.Once
	batches  atomic.Int64 // batches run (tests)
	onLinger func()       // called as a lazy batch starts to wait (tests; nil otherwise)
}

func newBatcher(s *store, workers int) *batcher {
	b := &batcher{s: s, queue: make(chan *batchOp, queueLen), quit: make(chan struct{}), stopped: make(chan struct{})}
	for i := 0; i < workers; i++ {
		b.wg.Add(1)
		go b.run()
	}
	return b
}

// close stops the workers after the batches in progress; queued operations
// fail with errClosed.
func (b *batcher) close() {
	b.closing.Do(func() {
		close(b.quit)
		b.wg.Wait()
		defer close(b.stopped)
		for {
			select {
			case op := <-b.queue:
				if op.state.CompareAndSwap(opQueued, opRunning) {
					op.done <- errClosed
				}
			default:
				return
			}
		}
	})
}

// do queues fn and waits for the batch that ran it to commit. A lazy fn
// may wait up to lazyLinger for other operations to share its commit.
func (b *batcher) do(ctx context.Context, lazy bool, fn func(ctx context.Context, t *sql.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	op := &batchOp{ctx: ctx, fn: fn, done: make(chan error, 1), lazy: lazy}
	select {
	case b.queue <- op:
	case <-b.quit:
		return errClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-op.done:
		return err
	case <-b.stopped:
		// Queued in the instant close drained the queue: nobody will run it.
		if op.state.CompareAndSwap(opQueued, opAbandoned) {
			return errClosed
		}
		return <-op.done
	case <-ctx.Done():
		if op.state.CompareAndSwap(opQueued, opAbandoned) {
			return ctx.Err() // the worker will skip it
		}
		// Running: fn writes the caller's result variables until the batch
		// ends, so wait for it (one batch, bounded) and report its outcome.
		return <-op.done
	}
}

func (b *batcher) run() {
	defer b.wg.Done()
	ops := make([]*batchOp, 0, maxBatch)
	for {
		select {
		case <-b.quit:
			return
		case op := <-b.queue:
			ops = append(ops[:0], op)
		}
	fill:
		for len(ops) < maxBatch {
			select {
			case op := <-b.queue:
				ops = append(ops, op)
			default:
				break fill
			}
		}
		if allLazy(ops) {
			ops = b.linger(ops)
		}
		b.runBatch(ops)
		clear(ops)
	}
}

// allLazy reports whether every operation of ops is lazy.
func allLazy(ops []*batchOp) bool {
	for _, op := range ops {
		if !op.lazy {
			return false
		}
	}
	return true
}

// linger adds to a batch of lazy operations what arrives within
// lazyLinger, until the batch is full or a non-lazy operation joins it.
func (b *batcher) linger(ops []*batchOp) []*batchOp {
	t := time.NewTimer(lazyLinger)
	defer t.Stop()
	if b.onLinger != nil {
		b.onLinger()
	}
	for len(ops) < maxBatch {
		select {
		case op := <-b.queue:
			ops = append(ops, op)
			if !op.lazy {
				return ops
			}
		case <-t.C:
			return ops
		case <-b.quit:
			return ops
		}
	}
	return ops
}

// runBatch runs ops in one transaction and delivers each its result.
func (b *batcher) runBatch(ops []*batchOp) {
	// The statements run under the worker's context, not the callers': a
	// caller giving up must not abort a transaction that carries other
	// callers' operations. The timeout bounds a stuck database.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	live := ops[:0:0]
	for _, op := range ops {
		if !op.state.CompareAndSwap(opQueued, opRunning) {
			continue // abandoned by its caller
		}
		if err := op.ctx.Err(); err != nil {
			op.done <- err
			continue
		}
		live = append(live, op)
	}
	if len(live) == 0 {
		return
	}
	b.batches.Add(1)
	if len(live) == 1 {
		// Alone: the plain transaction (no savepoint round trips).
		op := live[0]
		op.done <- b.s.tx(ctx, func(t *sql.Tx) error { return op.fn(ctx, t) })
		return
	}
	results := make([]error, len(live))
	var err error
	savepoints := false
	for attempt := 0; attempt < batchAttempts; attempt++ {
		err = b.try(ctx, live, results, savepoints)
		if errors.Is(err, errIsolate) && !savepoints {
			savepoints, attempt = true, attempt-1 // not a conflict: again, isolated
			continue
		}
		if err == nil {
			for i, op := range live {
				op.done <- results[i]
			}
			return
		}
		if !retryable(err) {
			break
		}
	}
	if !retryable(err) {
		for _, op := range live {
			op.done <- err
		}
		return
	}
	// Conflicts kept failing the whole batch: one transaction each.
	for _, op := range live {
		op.done <- b.s.tx(ctx, func(t *sql.Tx) error { return op.fn(ctx, t) })
	}
}

// errIsolate: an operation failed after writing (or with a database
// error) in a batch run without savepoints; the batch runs again with them.
var errIsolate = errors.New("authority: batch needs savepoints")

// try runs one attempt of a batch. It returns a non-nil error when the batch
// as a whole failed (and was rolled back); otherwise results holds each
// operation's own outcome and the batch is committed.
//
// Without savepoints (the first attempt) an operation that fails must have
// failed cleanly: with one of the package's errors (ErrStaleLease, ErrFenced
// …, which the operations return after reads only) and no write issued
// (opTrace). Anything else — a database error, whose statement may have
// aborted the PostgreSQL transaction, or an error after a write — rolls the
// batch back with errIsolate and it runs again with a savepoint around every
// operation. Savepoints cost two round trips per operation on PostgreSQL;
// the common batch, where operations succeed or are refused by a check,
// pays none.
func (b *batcher) try(ctx context.Context, ops []*batchOp, results []error, savepoints bool) error {
	t, err := b.s.db.BeginTx(ctx, nil)
	if err != nil {
		return beforeCommit(err)
	}
	fail := func(err error) error {
		_ = t.Rollback()
		return beforeCommit(err)
	}
	for i, op := range ops {
		results[i] = nil
		if savepoints {
			if _, err := t.ExecContext(ctx, "SAVEPOINT fy_op"); err != nil {
				return fail(err)
			}
		}
		var tr opTrace
		opErr := op.fn(context.WithValue(ctx, opTraceKey{}, &tr), t)
		if opErr != nil && retryable(beforeCommit(opErr)) {
			return fail(opErr)
		}
		switch {
		case savepoints:
			undo := "RELEASE SAVEPOINT fy_op"
			if opErr != nil {
				undo = "ROLLBACK TO SAVEPOINT fy_op"
			}
			if _, err := t.ExecContext(ctx, undo); err != nil {
				return fail(err)
			}
			if opErr != nil {
				if _, err := t.ExecContext(ctx, "RELEASE SAVEPOINT fy_op"); err != nil {
					return fail(err)
				}
			}
		case opErr != nil && (tr.writes > 0 || !refusal(opErr)):
			return fail(errIsolate)
		}
		results[i] = opErr
	}
	return t.Commit()
}

// opTrace counts the writes one batched operation issued (store.exec).
type opTrace struct{ writes int }

type opTraceKey struct{}

func traceWrite(ctx context.Context) {
	if tr, ok := ctx.Value(opTraceKey{}).(*opTrace); ok {
		tr.writes++
	}
}

// refusal reports the package's own answers, which the operations return
// from checks, never from a failed statement.
func refusal(err error) bool {
	for _, e := range []error{ErrRunnerDisabled, ErrStaleSession, ErrSessionOwnership, ErrFenced, ErrNotFound, ErrStaleLease, ErrConflict} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// batch runs fn through the batcher (or in its own transaction when the
// store has none). fn must use the ctx it is given for its statements.
func (s *store) batch(ctx context.Context, fn func(ctx context.Context, t *sql.Tx) error) error {
	if s.b == nil {
		return s.tx(ctx, func(t *sql.Tx) error { return fn(ctx, t) })
	}
	return s.b.do(ctx, false, fn)
}

// batchLazy is batch for writes nobody waits on promptly (the inventory's
// heartbeat times): the operation may wait up to lazyLinger to share a
// commit with others.
func (s *store) batchLazy(ctx context.Context, fn func(ctx context.Context, t *sql.Tx) error) error {
	if s.b == nil {
		return s.tx(ctx, func(t *sql.Tx) error { return fn(ctx, t) })
	}
	return s.b.do(ctx, true, fn)
}
