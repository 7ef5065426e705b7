package agent

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/control"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/wire"
	wcas "forgeyard.dev/transport/wire/cas"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// Data plane defaults.
const (
	// DefaultSpoolDirName is the directory under os.TempDir() used when
	// Config.SpoolDir is empty.
	DefaultSpoolDirName = "forgeyard-spool"
	// dataTries bounds the links one finalization or upload is tried on.
	dataTries = 8
)

// ErrNoLog is returned by Output.Log when the attempt has no log writer
// (it could not be created; the failure is logged).
var ErrNoLog = errors.New("agent: attempt has no log")

// attemptIO is one attempt's log writer and local outputs.
type attemptIO struct {
	w    *logs.Writer // nil if it could not be created
	mu   sync.Mutex
	outs []wire.CasObjectRef // PutOutput order, deduplicated
}

// setupData prepares the agent's spool: Config.SpoolDir (or the default)
// / <session> holds log spools and the local content store of outputs.
func (a *Agent) setupData() error {
	root := a.cfg.SpoolDir
	if root == "" {
		root = filepath.Join(os.TempDir(), DefaultSpoolDirName)
	}
	a.spool = filepath.Join(root, a.session.String())
	st, err := cas.NewFSStore(cas.FSStoreConfig{Dir: filepath.Join(a.spool, "cas")})
	if err != nil {
		return fmt.Errorf("agent: output store: %w", err)
	}
	up, err := cas.NewUploader(cas.UploaderConfig{Source: st, Metrics: a.cfg.Metrics})
	if err != nil {
		return err
	}
	down, err := cas.NewDownloader(cas.DownloaderConfig{Store: st, Metrics: a.cfg.Metrics})
	if err != nil {
		return err
	}
	a.store, a.up, a.down = st, up, down
	return nil
}

// fetchPayload downloads the attempt's payload into the local store before
// the executor starts (Config.FetchPayload), on the current link and again
// on the next ones after a cut (the kept prefix is resumed, §92). The
// daemon authorizes only the lease's own payload (§93). It returns the
// source the executor's Job opens the payload from (nil when not fetched).
func (a *Agent) fetchPayload(ctx context.Context, at *attempt) (cas.Source, error) {
	ref := at.job.Payload
	if !a.cfg.FetchPayload || ref == (wire.CasObjectRef{}) || a.down == nil {
		return nil, nil
	}
	budget := max(4*a.cfg.RequestTimeout, 5*time.Second) + time.Duration(ref.Size>>18)*time.Second // as uploads: ≥ 256 KiB/s
	err := a.onLink(time.Now().Add(budget), func(err error) bool {
		// Forbidden and NotFound are final; Aborted (the daemon could not
		// ask its authority, or the transfer was cut) is retried.
		var oe *cas.OutcomeError
		return errors.As(err, &oe) && (oe.Outcome == wcas.CasForbidden || oe.Outcome == wcas.CasNotFound) || ctx.Err() != nil
	}, func(lctx context.Context, l *link) error {
		lctx, cancel := context.WithCancel(lctx)
		defer cancel()
		stop := context.AfterFunc(ctx, cancel) // the attempt's cancel ends the download
		defer stop()
		return a.down.Fetch(lctx, l.sc, at.job.Lease, ref)
	})
	if err != nil {
		a.st.payloadsFailed.Add(1)
		a.log.Warn("payload download failed", "attempt", at.job.Attempt.String(), "payload", ref.String(), "err", err)
		return nil, err
	}
	a.st.payloadsFetched.Add(1)
	return a.store, nil
}

// newAttemptIO creates the attempt's log writer (spooled on disk).
func (a *Agent) newAttemptIO(job Job, epoch uint64) *attemptIO {
	io := &attemptIO{}
	w, err := logs.NewWriter(logs.Config{Attempt: job.Attempt, Lease: job.Lease, Epoch: epoch,
		SpoolDir: filepath.Join(a.spool, "logs"), SpoolLimit: a.cfg.LogSpoolLimit, Compress: true, Now: a.now, Metrics: a.cfg.Metrics})
	if err != nil {
		a.log.Warn("attempt log unavailable", "attempt", job.Attempt.String(), "err", err)
	}
	io.w = w
	return io
}

// attachLog streams at's log on l (after every (re)connect and on start).
func (a *Agent) attachLog(l *link, at *attempt, fromSeq uint64) {
	if at.io == nil || at.io.w == nil || l.ctx == nil {
		return
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		// A stream that fails on a live link (a write timeout, a reset) is
		// reopened after a pause, from the daemon's last ack; the daemon
		// skips frames it already holds.
		pause := 20 * time.Millisecond
		// Protocol 1.1: compressed log streams only when the daemon
		// negotiated LogCompressionV1; a 1.0 daemon gets Raw frames.
		at.io.w.SetCompress(l.features.Has(wire.FeatureLogCompressionV1))
		for {
			err := at.io.w.Attach(l.ctx, l.sc, fromSeq)
			if err == nil || errors.Is(err, logs.ErrRefused) || errors.Is(err, logs.ErrSuperseded) ||
				errors.Is(err, logs.ErrClosed) || l.ctx.Err() != nil {
				return
			}
			a.log.Debug("log stream failed; reattaching", "attempt", at.job.Attempt.String(), "err", err)
			if !sleepCtx(l.ctx, pause) {
				return
			}
			pause = min(2*pause, time.Second)
			fromSeq = 0
		}
	}()
}

// attachAll reattaches every live attempt's log to l.
func (a *Agent) attachAll(l *link) {
	a.mu.Lock()
	var ats []*attempt
	for _, at := range a.attempts {
		if at.compl == nil {
			ats = append(ats, at)
		}
	}
	a.mu.Unlock()
	for _, at := range ats {
		a.attachLog(l, at, 0)
	}
}

func (a *Agent) writerOf(id wire.JobAttemptId) *logs.Writer {
	a.mu.Lock()
	defer a.mu.Unlock()
	if at := a.attempts[id]; at != nil && at.io != nil {
		return at.io.w
	}
	return nil
}

// handleData handles the log and CAS control messages; false if m is not
// one.
func (a *Agent) handleData(l *link, m wire.Message) bool {
	switch m := m.(type) {
	case *wlogs.LogAckV1:
		if w := a.writerOf(m.Attempt); w != nil {
			w.Ack(m.DurableSeq)
		}
	case *wlogs.LogResumeRequestV1:
		a.mu.Lock()
		at := a.attempts[m.Attempt]
		a.mu.Unlock()
		if at != nil {
			a.attachLog(l, at, m.FromSeq)
		}
	case *wlogs.LogsFinalizedAckV1:
		if w := a.writerOf(m.Attempt); w != nil {
			w.HandleFinalizedAck(m)
		}
	default:
		return false
	}
	return true
}

// Log appends p to the attempt's log stream kind (stdout, stderr, system).
// It never blocks on the network: data over the writer's cap is dropped
// and counted (ErrDropped).
func (o output) Log(kind wlogs.LogStreamKind, p []byte) error {
	if o.at.io == nil || o.at.io.w == nil {
		return ErrNoLog
	}
	return o.at.io.w.Write(kind, p)
}

// PutOutput stores data as an output of the attempt in the agent's local
// content store and returns its reference; it is uploaded to the daemon
// before the completion is sent and listed in the completion's outputs.
func (o output) PutOutput(data []byte) (wire.CasObjectRef, error) {
	ref := wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(data), Size: uint64(len(data))}
	st := o.a.store
	if s, err := st.Stat(ref); err != nil {
		return ref, err
	} else if !s.Complete {
		p, err := st.Create(ref)
		switch {
		case errors.Is(err, cas.ErrExists):
		case err != nil:
			return ref, err
		default:
			err = p.Append(data[min(uint64(len(data)), p.Len()):])
			if err == nil {
				err = p.Commit()
			} else {
				_ = p.Abort()
			}
			_ = p.Close()
			if err != nil && !errors.Is(err, cas.ErrExists) {
				return ref, err
			}
		}
	}
	io := o.at.io
	io.mu.Lock()
	if !slices.Contains(io.outs, ref) {
		io.outs = append(io.outs, ref)
	}
	io.mu.Unlock()
	return ref, nil
}

// linkExchange carries NeedObjectsV1 → MissingObjectsV1 on a link's
// control channel.
type linkExchange struct {
	l       *link
	timeout time.Duration
}

func (x linkExchange) NeedObjects(ctx context.Context, m *wcas.NeedObjectsV1) (*wcas.MissingObjectsV1, error) {
	env, err := x.l.ch.Call(ctx, control.Out{Msg: m}, x.timeout)
	if err != nil {
		return nil, err
	}
	switch p := env.Payload.(type) {
	case *wcas.MissingObjectsV1:
		return p, nil
	case *wire.WireErrorV1:
		return nil, fmt.Errorf("agent: NeedObjects refused: %w", p)
	}
	return nil, errors.New("agent: unexpected answer to NeedObjectsV1")
}

// onLink runs f on the current link with a ctx that ends at deadline, at
// Close, or when the link changes; it retries on the next link (at most
// dataTries links) until f succeeds or permanent reports the error
// permanent.
func (a *Agent) onLink(deadline time.Time, permanent func(error) bool, f func(ctx context.Context, l *link) error) error {
	var last error
	for try := 0; try < dataTries; try++ {
		l, changed := a.currentLink()
		if l == nil {
			t := time.NewTimer(time.Until(deadline))
			select {
			case <-changed:
				t.Stop()
				try--
				continue
			case <-t.C:
				return errors.Join(last, context.DeadlineExceeded)
			case <-a.ctx.Done():
				t.Stop()
				return a.ctx.Err()
			}
		}
		ctx, cancel := context.WithDeadline(a.ctx, deadline)
		stop := make(chan struct{})
		go func() {
			select {
			case <-changed:
				cancel()
			case <-stop:
			}
		}()
		err := f(ctx, l)
		close(stop)
		cancel()
		if err == nil {
			return nil
		}
		last = err
		if permanent(err) || a.ctx.Err() != nil || !time.Now().Before(deadline) {
			return err
		}
		if errors.Is(err, cas.ErrBusy) {
			// Another attempt of this agent is transferring the same
			// object (a shared payload): wait for it, bounded by the
			// deadline rather than by dataTries.
			try--
		}
		t := time.NewTimer(min(time.Until(deadline), 50*time.Millisecond))
		select {
		case <-changed:
		case <-t.C:
		case <-a.ctx.Done():
		}
		t.Stop()
	}
	return last
}

// finishData runs before the completion (§243): the logs-finalized
// barrier, then the upload of the outputs in the local store, then
// OutputsFinalizedV1. It returns the outputs to claim in the completion:
// outs minus the local objects that could not be uploaded.
func (a *Agent) finishData(at *attempt, outs []wire.CasObjectRef) []wire.CasObjectRef {
	job := at.job
	budget := max(4*a.cfg.RequestTimeout, 5*time.Second)
	if io := at.io; io != nil && io.w != nil && io.w.Stats().TotalBytes == 0 {
		// Nothing was ever written: no frame to make durable, no barrier
		// (saves a round trip per attempt).
		io.w.Close()
		_ = os.RemoveAll(filepath.Join(a.spool, "logs", job.Attempt.String()))
	} else if io != nil && io.w != nil {
		tries := 0
		finalize := func() error {
			return a.onLink(time.Now().Add(budget), func(err error) bool {
				// A final answer ends the barrier; a transient one that asks
				// for a backoff (StorageUnavailable, RateLimited) returns to
				// the backoff loop below.
				var we *wire.WireErrorV1
				return !linkFailure(err) || errors.As(err, &we) && we.Retry == wire.RetryBackoff
			}, func(ctx context.Context, l *link) error {
				tries++
				return a.finalizeLog(ctx, l, at, tries > 1)
			})
		}
		err := finalize()
		// The barrier failed with its link (cut, replaced, a daemon restart,
		// no answer within the budget), was refused as transient (the
		// daemon's authority unavailable, rate limited, the log not durable
		// in time) or the daemon's log store failed (StorageUnavailable):
		// keep the log spooled, re-send it from the daemon's durable point
		// and try again, for at most storageRetryFor, while the attempt is
		// ours (issue 15 items 4 and 6). A completion never goes out with a
		// log the daemon has not durably stored while the lease is live; a
		// final refusal (Forbidden: the lease is no longer ours) ends it.
		err = a.retryKept(at, err, func(err error) bool {
			return linkFailure(err) || a.storageFaultSince(budget+time.Second)
		}, &a.st.logStorageRetries, "logs-finalized barrier failed; log kept, retrying", finalize)
		if err != nil {
			a.st.logFinalizeFailed.Add(1)
			a.log.Warn("logs-finalized barrier failed", "attempt", job.Attempt.String(), "err", err)
			io.w.Close()
		}
		_ = os.RemoveAll(filepath.Join(a.spool, "logs", job.Attempt.String()))
	}
	var local []wire.CasObjectRef
	for _, r := range outs {
		if s, err := a.store.Stat(r); err == nil && s.Complete {
			local = append(local, r)
		}
	}
	if len(local) == 0 {
		return outs
	}
	// Uploads get the fixed budget plus time for their bytes at a floor of
	// 256 KiB/s: a stalled transfer fails sooner through the uploader's
	// idle timeout; a big output on a slow link is not cut off.
	var total uint64
	for _, r := range local {
		total += r.Size
	}
	upload := func() error {
		return a.onLink(time.Now().Add(budget+time.Duration(total>>18)*time.Second), func(err error) bool {
			var oe *cas.OutcomeError
			return errors.As(err, &oe) && oe.Outcome == wcas.CasForbidden
		}, func(ctx context.Context, l *link) error {
			return a.up.UploadAll(ctx, l.sc, linkExchange{l: l, timeout: a.cfg.RequestTimeout}, job.Lease, local)
		})
	}
	err := upload()
	// The daemon's content store is full or failing, or the link failed
	// under the upload: keep the outputs in the local store and retry
	// with backoff (issue 15 items 4 and 6), for at most storageRetryFor,
	// while the attempt is ours.
	err = a.retryKept(at, err, func(err error) bool {
		return storageUnavailable(err) || linkFailure(err)
	}, &a.st.outputsStorageRetries, "output upload failed; outputs kept, retrying", upload)
	if err != nil {
		a.st.outputsFailed.Add(int64(len(local)))
		a.log.Warn("output upload failed; outputs not claimed", "attempt", job.Attempt.String(), "err", err)
		outs = slices.DeleteFunc(outs, func(r wire.CasObjectRef) bool { return slices.Contains(local, r) })
		return outs
	}
	a.st.outputsUploaded.Add(int64(len(local)))
	if l, _ := a.currentLink(); l != nil {
		_, _ = l.ch.SendMsg(&wcas.OutputsFinalizedV1{Attempt: job.Attempt, Lease: job.Lease, Outputs: outs})
	}
	return outs
}

// retryKept is the backoff loop of finishData's two retries (the
// logs-finalized barrier and the output upload), whose data stays kept
// meanwhile: while err is not nil and retryable(err), for at most
// storageRetryFor and while the attempt is ours and the agent runs, it
// counts a retry in retries, logs msg, waits (100 ms doubling to 5 s) and
// calls op again. It returns the last error.
func (a *Agent) retryKept(at *attempt, err error, retryable func(error) bool, retries *atomic.Int64, msg string, op func() error) error {
	for wait, until := 100*time.Millisecond, time.Now().Add(storageRetryFor); err != nil && retryable(err) && time.Now().Before(until); wait = min(2*wait, 5*time.Second) {
		a.mu.Lock()
		discard := at.discard
		a.mu.Unlock()
		if discard || a.ctx.Err() != nil {
			break
		}
		retries.Add(1)
		a.log.Warn(msg, "attempt", at.job.Attempt.String(), "in", wait, "err", err)
		sleepCtx(a.ctx, wait) // the agent stopping ends the loop at its top
		err = op()
	}
	return err
}

// errLogShort is the end of a logs-finalized barrier whose ack covers less
// than the agent's last frame: the daemon refused the rest of the log
// (its per-attempt quota, §268); final, not retried.
var errLogShort = errors.New("agent: the daemon acknowledged the log only in part (refused the rest)")

// finalizeLog runs the logs-finalized barrier (§243) once on l: it sends
// LogsFinalizedV1 as a request and waits, bounded by ctx, for its answer —
// LogsFinalizedAckV1 (the log is durable up to its last_seq) or a
// WireErrorV1, returned as the error, so a refused barrier ends at once
// rather than after the budget. With resend (every try after the first)
// the log stream is first re-attached on l from the daemon's durable
// point: a stream that ended (the writer closed, every frame sent) is not
// sent again by itself, and frames the daemon lost with a failing store, a
// link, or a cancelled stream would otherwise be waited for in vain. The
// daemon skips frames it holds. A daemon that lacks frames the agent no
// longer holds answers the barrier short (errLogShort, final).
func (a *Agent) finalizeLog(ctx context.Context, l *link, at *attempt, resend bool) error {
	w := at.io.w
	if resend {
		// Even with every frame acknowledged: the stream, empty then,
		// tells a daemon that lost them (restarted over a store that is
		// not durable, or not sharing the store of the daemon that
		// acknowledged them) that none will come, and it answers short
		// instead of waiting for them.
		a.attachLog(l, at, 0)
	}
	return w.Finalize(ctx, func(m *wlogs.LogsFinalizedV1) error {
		timeout := a.cfg.RequestTimeout
		if d, ok := ctx.Deadline(); ok {
			timeout = max(time.Until(d), time.Millisecond)
		}
		env, err := l.ch.Call(ctx, control.Out{Msg: m}, timeout)
		if err != nil {
			if storageUnavailable(err) {
				a.storageFault.Store(time.Now().UnixNano())
			}
			var we *wire.WireErrorV1
			if errors.As(err, &we) && we.Code == wire.ErrCodeForbidden {
				// Forbidden on a link the agent has left (the daemon fenced
				// it when a newer link registered, or it is no longer
				// active) says nothing of the lease: retried on the current
				// link, like a link failure (not wrapped: linkFailure).
				if cur, _ := a.currentLink(); cur != l || l.ctx.Err() != nil {
					return fmt.Errorf("agent: logs-finalized barrier refused on a replaced link: %v", err)
				}
			}
			return err
		}
		ack, ok := env.Payload.(*wlogs.LogsFinalizedAckV1)
		if !ok || ack.Attempt != m.Attempt {
			return fmt.Errorf("agent: unexpected answer %s to LogsFinalizedV1", env.Payload.MessageType())
		}
		if !w.HandleFinalizedAck(ack) {
			return fmt.Errorf("%w: durable to %d of %d", errLogShort, ack.LastSeq, m.LastSeq)
		}
		return nil
	})
}

// storageRetryFor bounds how long an agent keeps retrying the upload of an
// attempt's outputs while the daemon answers StorageUnavailable.
const storageRetryFor = 10 * time.Minute

// linkFailure reports whether a logs-finalized barrier or an output upload
// failed with its link — the connection cut or replaced, the daemon gone
// or silent past the deadline — or by a transient answer (a WireErrorV1
// whose retry class is Immediately or Backoff, an Aborted CAS outcome: the
// daemon was busy, could not reach its authority, or its store failed),
// rather than by a final answer (any other WireErrorV1, e.g. Forbidden
// when the lease is no longer ours; a CAS outcome other than Aborted; a
// log-stream rejection; a barrier acknowledged only in part; a stream the
// daemon reset, e.g. refused because it has no store). Those are retried
// on the next link: the fault-injection soak (issue 15 item 6) found
// outputs left out of completions and logs dropped after one budget of
// link churn or a daemon restart, though the attempt's lease was live.
func linkFailure(err error) bool {
	var we *wire.WireErrorV1
	var oe *cas.OutcomeError
	var re *logs.RejectError
	var se *semantics.StreamError
	switch {
	case errors.As(err, &oe) && oe.Outcome == wcas.CasAborted:
		return true // the daemon could not take it now (busy, authority hiccup): retry
	case errors.As(err, &we) && (we.Retry == wire.RetryImmediately || we.Retry == wire.RetryBackoff):
		return true // the daemon says transient (its authority unavailable, rate limited)
	case err == nil, errors.As(err, &we), errors.As(err, &oe), errors.As(err, &re), errors.Is(err, errLogShort):
		return false
	case errors.As(err, &se) && se.Remote && se.Code != semantics.StreamCancelled:
		return false
	}
	return true
}

// storageUnavailable reports whether err carries a daemon's
// WireErrorV1{StorageUnavailable}.
func storageUnavailable(err error) bool {
	var we *wire.WireErrorV1
	return errors.As(err, &we) && we.Code == wire.ErrCodeStorageUnavailable
}

// storageFaultSince reports whether a daemon answered StorageUnavailable
// within the last d.
func (a *Agent) storageFaultSince(d time.Duration) bool {
	t := a.storageFault.Load()
	return t != 0 && time.Since(time.Unix(0, t)) <= d
}
