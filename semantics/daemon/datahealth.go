package daemon

import (
	"context"
	"errors"
	"io/fs"
	"sync"
	"syscall"
	"time"

	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/objstore"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// Data stores, as named in DataFault, metrics and the audit log.
const (
	StoreLogs = "logs"
	StoreCAS  = "cas"
)

// Causes of a DataFault.
const (
	CauseNoSpace = "no_space"
	CauseIOError = "io_error"
)

// probeEvery bounds how often a failing store is probed for recovery.
const probeEvery = time.Second

// DataFault is a data store that failed its last write (issue 15 item 4):
// the daemon answers the data-plane requests it cannot serve with
// WireErrorV1{StorageUnavailable, RetryBackoff}, /healthz reports it
// degraded, and it clears at the store's next successful write or probe.
type DataFault struct {
	Store string    // StoreLogs or StoreCAS
	Cause string    // CauseNoSpace or CauseIOError
	Since time.Time // first failure of this fault
	Error string    // the last error (operator text; never sent to agents)
}

// Text is the safe text sent to agents in a WireErrorV1.
func (f DataFault) Text() string {
	what := "log store"
	if f.Store == StoreCAS {
		what = "content store"
	}
	if f.Cause == CauseNoSpace {
		return what + " unavailable: no space left on the daemon's data volume; retry later"
	}
	return what + " unavailable: I/O error on the daemon's data volume; retry later"
}

// prober is implemented by stores that can test a small write (FileSink,
// FSStore, BucketSink, BucketStore).
type prober interface{ Probe() error }

// dataHealth tracks the faults of the log and CAS stores.
type dataHealth struct {
	mu        sync.Mutex
	faults    map[string]*DataFault
	lastProbe map[string]time.Time
	notify    chan struct{} // closed and replaced when a fault starts
}

func newDataHealth() *dataHealth {
	return &dataHealth{faults: map[string]*DataFault{}, lastProbe: map[string]time.Time{}, notify: make(chan struct{})}
}

// storeCause classifies err as a store fault: no space, an I/O error, or
// not a fault of the store ("" — a protocol-level refusal).
func storeCause(err error) string {
	var pe *fs.PathError
	switch {
	case err == nil:
		return ""
	case objstore.IsNoSpace(err):
		return CauseNoSpace
	case errors.Is(err, syscall.EIO), errors.Is(err, syscall.EROFS), errors.Is(err, objstore.ErrUnavailable),
		errors.As(err, &pe):
		return CauseIOError
	}
	return ""
}

// storeFailed records a failed store operation: a metric always, an audit
// record and a warning when the fault starts.
func (d *Daemon) storeFailed(store string, err error) {
	cause := storeCause(err)
	if cause == "" {
		return
	}
	d.cfg.Metrics.DataStoreError(store, cause)
	h := d.dataHealth
	h.mu.Lock()
	f := h.faults[store]
	started := f == nil
	if started {
		f = &DataFault{Store: store, Cause: cause, Since: time.Now()}
		h.faults[store] = f
		close(h.notify)
		h.notify = make(chan struct{})
	}
	f.Cause, f.Error = cause, err.Error()
	h.mu.Unlock()
	if started {
		reason := telemetry.ReasonIOError
		if cause == CauseNoSpace {
			reason = telemetry.ReasonNoSpace
		}
		d.audit.Emit(context.Background(), telemetry.EventDataStoreFailed, telemetry.Code(wire.ErrCodeStorageUnavailable),
			telemetry.Reason(reason))
		d.log.Error("data store failing", "store", store, "cause", cause, "err", err)
	}
}

// storeOK clears store's fault after a successful write.
func (d *Daemon) storeOK(store string) {
	h := d.dataHealth
	h.mu.Lock()
	f := h.faults[store]
	delete(h.faults, store)
	h.mu.Unlock()
	if f != nil {
		d.log.Info("data store recovered", "store", store, "failing_for", time.Since(f.Since).Round(time.Millisecond))
	}
}

// dataFault returns store's current fault after probing the store for
// recovery (at most every probeEvery).
func (d *Daemon) dataFault(store string) (DataFault, bool) {
	h := d.dataHealth
	h.mu.Lock()
	f := h.faults[store]
	if f == nil {
		h.mu.Unlock()
		return DataFault{}, false
	}
	probe := time.Since(h.lastProbe[store]) >= probeEvery
	if probe {
		h.lastProbe[store] = time.Now()
	}
	out := *f
	h.mu.Unlock()
	if probe {
		var p prober
		switch store {
		case StoreLogs:
			p, _ = d.logSink.(prober)
		case StoreCAS:
			p, _ = d.cfg.ContentStore.(prober)
		}
		if p != nil {
			if err := p.Probe(); err == nil {
				d.storeOK(store)
				return DataFault{}, false
			} else {
				d.storeFailed(store, err)
			}
		}
	}
	return out, true
}

// faultNotify returns a channel closed when a new fault starts.
func (d *Daemon) faultNotify() <-chan struct{} {
	d.dataHealth.mu.Lock()
	defer d.dataHealth.mu.Unlock()
	return d.dataHealth.notify
}

// DataFaults returns the data stores failing now (none when healthy), for
// /healthz and /status.
func (d *Daemon) DataFaults() []DataFault {
	var out []DataFault
	for _, s := range []string{StoreLogs, StoreCAS} {
		if f, ok := d.dataFault(s); ok {
			out = append(out, f)
		}
	}
	return out
}

// probeData probes the failing stores (maintenance): a fault clears
// without waiting for the next request.
func (d *Daemon) probeData() {
	_ = d.DataFaults()
}

// ---- watching wrappers ----

// watchedSink passes a LogSink through, recording its failures and
// successes. After a failed Append or Sync the attempt is forgotten (in
// the receiver and the sink), so the next stream starts again from what is
// durable instead of a sticky error.
type watchedSink struct {
	s logs.LogSink
	d *Daemon
}

var (
	_ logs.LogSink   = watchedSink{}
	_ logs.Syncer    = watchedSink{}
	_ logs.Forgetter = watchedSink{}
)

func (w watchedSink) failed(a wire.JobAttemptId, err error) {
	if storeCause(err) == "" {
		return
	}
	w.d.storeFailed(StoreLogs, err)
	// The receiver serializes this attempt's sink calls and holds its lock
	// now: forget off this goroutine. The next stream then starts from the
	// sink's durable point (the agent still spools the rest).
	if r := w.d.logRecv; r != nil {
		go func() {
			r.Forget(a)
			// Ask the agent to resend from the durable point: nothing else
			// would, if the failed frames were its last.
			w.d.sendToAttempt(a, &wlogs.LogResumeRequestV1{Attempt: a, FromSeq: w.s.Durable(a) + 1})
		}()
	} else if f, ok := w.s.(logs.Forgetter); ok {
		_ = f.Forget(a)
	}
}

func (w watchedSink) Append(a wire.JobAttemptId, seq uint64, kind wlogs.LogStreamKind, ts uint64, data []byte) error {
	err := w.s.Append(a, seq, kind, ts, data)
	if err != nil {
		w.failed(a, err)
	}
	return err
}

func (w watchedSink) Durable(a wire.JobAttemptId) uint64 { return w.s.Durable(a) }

func (w watchedSink) Sync(a wire.JobAttemptId) error {
	s, ok := w.s.(logs.Syncer)
	if !ok {
		return nil
	}
	err := s.Sync(a)
	if err != nil {
		w.failed(a, err)
	} else if w.d.hasFault(StoreLogs) {
		w.d.storeOK(StoreLogs)
	}
	return err
}

func (w watchedSink) Forget(a wire.JobAttemptId) error {
	if f, ok := w.s.(logs.Forgetter); ok {
		return f.Forget(a)
	}
	return nil
}

func (d *Daemon) hasFault(store string) bool {
	d.dataHealth.mu.Lock()
	defer d.dataHealth.mu.Unlock()
	return d.dataHealth.faults[store] != nil
}

// watchedStore passes a ContentStore through, recording its failures and
// successes.
type watchedStore struct {
	cas.ContentStore
	d *Daemon
}

func (w watchedStore) Stat(ref wire.CasObjectRef) (cas.Status, error) {
	st, err := w.ContentStore.Stat(ref)
	if err != nil {
		w.d.storeFailed(StoreCAS, err)
	}
	return st, err
}

func (w watchedStore) Create(ref wire.CasObjectRef) (cas.PartialObject, error) {
	p, err := w.ContentStore.Create(ref)
	if err != nil {
		w.d.storeFailed(StoreCAS, err)
		return nil, err
	}
	return watchedPartial{p, w.d}, nil
}

type watchedPartial struct {
	cas.PartialObject
	d *Daemon
}

func (p watchedPartial) Append(b []byte) error {
	err := p.PartialObject.Append(b)
	if err != nil {
		p.d.storeFailed(StoreCAS, err)
	}
	return err
}

func (p watchedPartial) Commit() error {
	err := p.PartialObject.Commit()
	if err != nil {
		p.d.storeFailed(StoreCAS, err)
	} else if p.d.hasFault(StoreCAS) {
		p.d.storeOK(StoreCAS)
	}
	return err
}

func (p watchedPartial) Close() error {
	err := p.PartialObject.Close()
	if err != nil {
		p.d.storeFailed(StoreCAS, err)
	}
	return err
}
