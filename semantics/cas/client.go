package cas

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	wcas "forgeyard.dev/transport/wire/cas"
)

// ControlExchange carries one NeedObjectsV1 → MissingObjectsV1 exchange
// over the control stream (which belongs to the agent engine). A Server
// implements it directly (for tests and co-located use).
type ControlExchange interface {
	NeedObjects(ctx context.Context, m *wcas.NeedObjectsV1) (*wcas.MissingObjectsV1, error)
}

// Client defaults.
const (
	DefaultClientConcurrency = 4
	// maxResumeEntries bounds the interrupted uploads an Uploader
	// remembers.
	maxResumeEntries = 4096
	// maxUploadAttempts bounds the streams one Upload call opens when the
	// daemon asks to continue from another offset.
	maxUploadAttempts = 3
)

// UploaderConfig configures an Uploader. Source is required; zero fields
// take defaults.
type UploaderConfig struct {
	// Source provides the bytes of the objects to upload.
	Source Source
	// Concurrency bounds the uploads in progress (over all calls);
	// 0 means DefaultClientConcurrency.
	Concurrency int
	// Bandwidth paces the bytes written; nil is unlimited.
	Bandwidth *Bandwidth
	// Compression is applied to the bytes on the stream; None by default.
	Compression wcas.CasCompression
	// BufferSize is the copy buffer per upload; 0 means DefaultBufferSize.
	BufferSize int
	// IdleTimeout bounds a write without progress; 0 means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// AckTimeout bounds the wait for the daemon's verdict after the last
	// byte (the daemon verifies the digest then); 0 means
	// DefaultHeaderTimeout.
	AckTimeout time.Duration
	// Metrics, when set, counts uploaded bytes, verified uploads and
	// resumed uploads. Nil disables them.
	Metrics *telemetry.Metrics
}

// UploaderStats are an Uploader's counters.
type UploaderStats struct {
	Verified      int64 // uploads acknowledged Verified
	BytesSent     int64 // logical object bytes written to streams
	Probes        int64 // resume probes sent (after an interrupted upload)
	SkippedPrefix int64 // bytes not re-sent thanks to the daemon's kept prefix
}

// Uploader is the agent side of uploads. It outlives connections: it
// remembers which uploads were interrupted (bounded) and resumes them with
// a probe on the next attempt. Safe for concurrent use.
type Uploader struct {
	cfg UploaderConfig
	sem sem

	mu          sync.Mutex
	interrupted map[wire.CasObjectRef]struct{}

	verified, sent, probes, skipped atomic.Int64
}

// NewUploader validates cfg and returns an Uploader.
func NewUploader(cfg UploaderConfig) (*Uploader, error) {
	if cfg.Source == nil {
		return nil, errors.New("cas: UploaderConfig.Source is required")
	}
	if cfg.Concurrency < 0 || cfg.BufferSize < 0 || cfg.IdleTimeout < 0 || cfg.AckTimeout < 0 || cfg.Compression > wcas.CasCompressionFlate {
		return nil, errors.New("cas: invalid UploaderConfig")
	}
	orDefault(&cfg.Concurrency, DefaultClientConcurrency)
	transferDefaults(&cfg.BufferSize, &cfg.IdleTimeout, &cfg.AckTimeout)
	return &Uploader{cfg: cfg, sem: newSem(cfg.Concurrency), interrupted: map[wire.CasObjectRef]struct{}{}}, nil
}

// Stats returns a snapshot of the counters.
func (u *Uploader) Stats() UploaderStats {
	return UploaderStats{Verified: u.verified.Load(), BytesSent: u.sent.Load(), Probes: u.probes.Load(), SkippedPrefix: u.skipped.Load()}
}

func (u *Uploader) markInterrupted(ref wire.CasObjectRef, yes bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !yes {
		delete(u.interrupted, ref)
	} else if len(u.interrupted) < maxResumeEntries {
		u.interrupted[ref] = struct{}{}
	}
}

func (u *Uploader) wasInterrupted(ref wire.CasObjectRef) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	_, ok := u.interrupted[ref]
	return ok
}

// UploadAll asks the daemon which of refs it is missing (NeedObjectsV1
// batches of at most wcas.MaxBatch over ctl) and uploads those, at most
// Concurrency at once. It returns nil when every missing object was
// acknowledged Verified, else the errors joined (each an *OutcomeError or
// a transport error naming its object).
func (u *Uploader) UploadAll(ctx context.Context, conn *semantics.Conn, ctl ControlExchange, lease wire.LeaseId, refs []wire.CasObjectRef) error {
	b := newBoundedGroup(u.cfg.Concurrency)
	for start := 0; start < len(refs); start += wcas.MaxBatch {
		batch := refs[start:min(len(refs), start+wcas.MaxBatch)]
		missing, err := ctl.NeedObjects(ctx, &wcas.NeedObjectsV1{Lease: lease, Objects: batch})
		if err != nil {
			b.add(err)
			break
		}
		if err := missing.Validate(); err != nil || len(missing.Objects) > len(batch) {
			b.add(fmt.Errorf("%w: invalid MissingObjectsV1", ErrProtocol))
			break
		}
		upload := func(ref wire.CasObjectRef) error { return u.Upload(ctx, conn, lease, ref) }
		if ref, err := b.runEach(ctx, missing.Objects, "upload", upload); err != nil {
			// ctx ended before the upload of ref started: it is not
			// uploaded, so UploadAll must fail (the fault-injection
			// soak found completions claiming outputs never sent
			// when the link changed here).
			b.add(fmt.Errorf("cas: upload %s: %w", ref, err))
		}
	}
	return b.wait()
}

// Upload sends one object on its own StreamCasUpload stream and waits for
// the daemon's verdict. If an earlier upload of ref was interrupted, it
// first asks the daemon for its kept prefix and sends only the rest. When
// the daemon answers Aborted with another offset, Upload continues from
// that offset on a new stream (bounded). Errors: *OutcomeError for a
// non-Verified verdict, ErrUnsupportedAlgorithm, ErrProtocol, or a
// transport error (the upload is then remembered as interrupted).
func (u *Uploader) Upload(ctx context.Context, conn *semantics.Conn, lease wire.LeaseId, ref wire.CasObjectRef) error {
	if err := startTransfer(ctx, u.sem, ref); err != nil {
		return err
	}
	defer u.sem.release()
	buf := make([]byte, u.cfg.BufferSize)
	probe := u.wasInterrupted(ref)
	var offset uint64
	for attempt := 0; ; attempt++ {
		done, next, err := u.attempt(ctx, conn, lease, ref, offset, probe, buf)
		if err != nil {
			if transportErr(err) {
				u.markInterrupted(ref, true)
			}
			return err
		}
		if done {
			u.markInterrupted(ref, false)
			u.verified.Add(1)
			u.cfg.Metrics.CasVerified(true)
			return nil
		}
		if attempt+1 >= maxUploadAttempts {
			return &OutcomeError{Object: ref, Outcome: wcas.CasAborted, VerifiedOffset: next, Remote: true}
		}
		offset, probe = next, false
	}
}

// attempt runs one upload stream. done reports Verified; otherwise next
// is the offset the daemon asked to continue from.
func (u *Uploader) attempt(ctx context.Context, conn *semantics.Conn, lease wire.LeaseId, ref wire.CasObjectRef, offset uint64, probe bool, buf []byte) (done bool, next uint64, err error) {
	st, end, err := openTransfer(ctx, conn, wire.StreamCasUpload)
	if err != nil {
		return false, 0, err
	}
	ok := false
	defer func() { end(ok) }()
	if probe {
		u.probes.Add(1)
		if err := writeMsg(&st.SendStream, &wcas.CasRangeResumeRequestV1{Lease: lease, Object: ref}); err != nil {
			return false, 0, err
		}
		m, err := readMsg(&st.RecvStream, u.cfg.AckTimeout)
		if err != nil {
			return false, 0, err
		}
		switch m := m.(type) {
		case *wcas.CasRangeResumeRequestV1:
			if m.Object != ref {
				return false, 0, fmt.Errorf("%w: resume answer for another object", ErrProtocol)
			}
			offset = m.VerifiedOffset
			u.skipped.Add(int64(offset))
			if offset > 0 {
				u.cfg.Metrics.CasResumed(true)
			}
		case *wcas.CasObjectAckV1:
			ok = true
			st.CancelRead(semantics.StreamCancelled)
			st.CancelWrite(semantics.StreamCancelled)
			return u.verdict(m, ref, offset)
		default:
			return false, 0, fmt.Errorf("%w: resume answered with %T", ErrProtocol, m)
		}
	}
	src, err := u.cfg.Source.Open(ref, offset)
	if err != nil {
		return false, 0, err
	}
	defer src.Close()
	hdr := &wcas.CasObjectStreamHeaderV1{Lease: lease, Object: ref, Offset: offset, Length: ref.Size - offset, Compression: u.cfg.Compression}
	if err := writeMsg(&st.SendStream, hdr); err != nil {
		return false, 0, err
	}
	w := &pacedWriter{ctx: ctx, s: &st.SendStream, bw: u.cfg.Bandwidth, idle: u.cfg.IdleTimeout}
	sent, werr := sendBody(w, src, hdr.Length, hdr.Compression, buf)
	u.sent.Add(int64(sent))
	u.cfg.Metrics.CasTransferred(true, int64(sent))
	if werr == nil {
		werr = st.SendStream.Close()
	}
	if werr != nil && ctx.Err() != nil {
		return false, 0, ctx.Err()
	}
	var se *semantics.StreamError
	if werr != nil && !(errors.As(werr, &se) && se.Remote) {
		// A local failure (source, connection): no verdict will come.
		return false, 0, werr
	}
	// Sent, or the daemon stopped reading: its verdict follows.
	m, err := readMsg(&st.RecvStream, u.cfg.AckTimeout)
	if err != nil {
		if werr != nil {
			return false, 0, werr
		}
		return false, 0, err
	}
	a, isAck := m.(*wcas.CasObjectAckV1)
	if !isAck {
		return false, 0, fmt.Errorf("%w: upload answered with %T", ErrProtocol, m)
	}
	ok = true
	st.CancelRead(semantics.StreamCancelled)
	if werr != nil {
		st.CancelWrite(semantics.StreamCancelled)
	}
	return u.verdict(a, ref, offset)
}

// verdict maps an ack to Upload's loop: Verified → done; Aborted at
// another offset → continue there; anything else → *OutcomeError.
func (u *Uploader) verdict(a *wcas.CasObjectAckV1, ref wire.CasObjectRef, offset uint64) (bool, uint64, error) {
	if a.Object != ref {
		return false, 0, fmt.Errorf("%w: ack for another object", ErrProtocol)
	}
	switch {
	case a.Outcome == wcas.CasVerified:
		return true, 0, nil
	case a.Outcome == wcas.CasAborted && a.VerifiedOffset != offset:
		return false, a.VerifiedOffset, nil
	}
	return false, 0, &OutcomeError{Object: ref, Outcome: a.Outcome, VerifiedOffset: a.VerifiedOffset, Remote: true}
}

// DownloaderConfig configures a Downloader. Store is required; zero fields
// take defaults.
type DownloaderConfig struct {
	// Store receives the objects (and keeps partial prefixes for resume).
	Store ContentStore
	// Concurrency bounds downloads in progress (over all calls); 0 means
	// DefaultClientConcurrency.
	Concurrency int
	// Bandwidth paces the bytes read; nil is unlimited.
	Bandwidth *Bandwidth
	// BufferSize is the copy buffer per download; 0 means
	// DefaultBufferSize.
	BufferSize int
	// IdleTimeout bounds a read without progress; 0 means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// HeaderTimeout bounds the wait for the daemon's answer; 0 means
	// DefaultHeaderTimeout.
	HeaderTimeout time.Duration
	// Metrics, when set, counts downloaded bytes, verified downloads,
	// resumed downloads and digest mismatches. Nil disables them.
	Metrics *telemetry.Metrics
}

// startTransfer opens Upload and Fetch: ref's algorithm must be one this
// build implements (else ErrUnsupportedAlgorithm at once, without waiting),
// then the transfer waits for a slot of s. The caller releases the slot.
func startTransfer(ctx context.Context, s sem, ref wire.CasObjectRef) error {
	if err := checkAlgorithm(ref.Algorithm); err != nil {
		return err
	}
	return s.acquire(ctx)
}

// DownloaderStats are a Downloader's counters.
type DownloaderStats struct {
	Verified      int64 // objects committed
	BytesReceived int64 // logical bytes received
	ResumedPrefix int64 // bytes not fetched again thanks to a kept prefix
}

// Downloader is the agent side of downloads. Safe for concurrent use.
type Downloader struct {
	cfg DownloaderConfig
	sem sem

	verified, received, resumed atomic.Int64
}

// NewDownloader validates cfg and returns a Downloader.
func NewDownloader(cfg DownloaderConfig) (*Downloader, error) {
	if cfg.Store == nil {
		return nil, errors.New("cas: DownloaderConfig.Store is required")
	}
	if cfg.Concurrency < 0 || cfg.BufferSize < 0 || cfg.IdleTimeout < 0 || cfg.HeaderTimeout < 0 {
		return nil, errors.New("cas: invalid DownloaderConfig")
	}
	orDefault(&cfg.Concurrency, DefaultClientConcurrency)
	transferDefaults(&cfg.BufferSize, &cfg.IdleTimeout, &cfg.HeaderTimeout)
	return &Downloader{cfg: cfg, sem: newSem(cfg.Concurrency)}, nil
}

// Stats returns a snapshot of the counters.
func (d *Downloader) Stats() DownloaderStats {
	return DownloaderStats{Verified: d.verified.Load(), BytesReceived: d.received.Load(), ResumedPrefix: d.resumed.Load()}
}

// FetchAll downloads every ref the Store does not hold, at most
// Concurrency at once, and returns the errors joined.
func (d *Downloader) FetchAll(ctx context.Context, conn *semantics.Conn, lease wire.LeaseId, refs []wire.CasObjectRef) error {
	b := newBoundedGroup(d.cfg.Concurrency)
	fetch := func(ref wire.CasObjectRef) error { return d.Fetch(ctx, conn, lease, ref) }
	if _, err := b.runEach(ctx, refs, "fetch", fetch); err != nil {
		b.add(err)
	}
	return b.wait()
}

// Fetch downloads ref into the Store on its own StreamCasDownload stream,
// continuing a kept partial prefix, verifies the digest and commits. It
// returns nil at once when the Store already holds ref. Errors:
// *OutcomeError (the daemon's Forbidden/NotFound, or the local verdict
// DigestMismatch/SizeMismatch — nothing is committed then),
// ErrUnsupportedAlgorithm, ErrProtocol, store errors, or a transport error
// (the received prefix is kept for the next Fetch).
func (d *Downloader) Fetch(ctx context.Context, conn *semantics.Conn, lease wire.LeaseId, ref wire.CasObjectRef) error {
	if err := startTransfer(ctx, d.sem, ref); err != nil {
		return err
	}
	defer d.sem.release()
	p, err := d.cfg.Store.Create(ref)
	if errors.Is(err, ErrExists) {
		return nil
	}
	if err != nil {
		return err
	}
	keep := true // on return without a verdict, keep the prefix
	defer func() {
		if keep {
			_ = p.Close()
		}
	}()
	offset := p.Len()
	st, end, err := openTransfer(ctx, conn, wire.StreamCasDownload)
	if err != nil {
		return err
	}
	clean := false
	defer func() { end(clean) }()
	if err := writeMsg(&st.SendStream, &wcas.CasFetchRequestV1{Lease: lease, Object: ref, Offset: offset}); err != nil {
		return err
	}
	m, err := readMsg(&st.RecvStream, d.cfg.HeaderTimeout)
	if err != nil {
		return err
	}
	switch m := m.(type) {
	case *wcas.CasObjectAckV1:
		if m.Object != ref {
			return fmt.Errorf("%w: answer for another object", ErrProtocol)
		}
		return &OutcomeError{Object: ref, Outcome: m.Outcome, VerifiedOffset: m.VerifiedOffset, Remote: true}
	case *wcas.CasObjectStreamHeaderV1:
		if m.Object != ref || m.Lease != lease || m.Offset != offset || m.Offset+m.Length != ref.Size {
			return fmt.Errorf("%w: download header does not match the request", ErrProtocol)
		}
		if offset > 0 {
			d.resumed.Add(int64(offset))
			d.cfg.Metrics.CasResumed(false)
		}
		buf := make([]byte, d.cfg.BufferSize)
		r := &pacedReader{ctx: ctx, s: &st.RecvStream, bw: d.cfg.Bandwidth, idle: d.cfg.IdleTimeout}
		o, got, err := receiveBody(r, m, p, buf)
		d.received.Add(int64(got))
		d.cfg.Metrics.CasTransferred(false, int64(got))
		if err != nil {
			return err
		}
		keep = false
		verified := uint64(0)
		var result error
		if o == wcas.CasVerified {
			if err := p.Commit(); err != nil {
				o, result = wcas.CasAborted, err
			} else {
				verified = ref.Size
				d.verified.Add(1)
				d.cfg.Metrics.CasVerified(false)
			}
		} else {
			_ = p.Abort()
			if o == wcas.CasDigestMismatch {
				d.cfg.Metrics.CasVerificationFailed(false)
			}
			result = &OutcomeError{Object: ref, Outcome: o}
		}
		st.CancelRead(semantics.StreamCancelled)
		_ = st.SetWriteDeadline(time.Now().Add(d.cfg.IdleTimeout))
		if err := writeMsg(&st.SendStream, &wcas.CasObjectAckV1{Lease: lease, Object: ref, Outcome: o, VerifiedOffset: verified}); err == nil {
			clean = st.SendStream.Close() == nil
		}
		return result
	default:
		return fmt.Errorf("%w: fetch answered with %T", ErrProtocol, m)
	}
}

// gate takes a slot of g or fails with ctx's error.
// openTransfer opens a stream of kind for one transfer. The stream is reset
// (StreamCancelled) when ctx ends, and by end(false); end(true) leaves a
// stream that ended cleanly alone. Defer the call of end.
func openTransfer(ctx context.Context, conn *semantics.Conn, kind wire.StreamKind) (*semantics.Stream, func(ok bool), error) {
	st, err := conn.OpenStream(ctx, kind)
	if err != nil {
		return nil, nil, err
	}
	stop := context.AfterFunc(ctx, func() { reset(st, semantics.StreamCancelled) })
	return st, func(ok bool) {
		if !ok {
			reset(st, semantics.StreamCancelled)
		}
		stop()
	}, nil
}

// boundedGroup runs functions in at most n goroutines at once and joins
// the errors they (and the caller, through add) report.
type boundedGroup struct {
	slots chan struct{}
	wg    sync.WaitGroup
	mu    sync.Mutex
	errs  []error
}

func newBoundedGroup(n int) *boundedGroup { return &boundedGroup{slots: make(chan struct{}, n)} }

// run waits for a free slot, then runs f in a goroutine and records its
// error. It returns ctx's error (running nothing) if ctx ends first.
func (b *boundedGroup) run(ctx context.Context, f func() error) error {
	select {
	case b.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer func() { <-b.slots }()
		if err := f(); err != nil {
			b.add(err)
		}
	}()
	return nil
}

// add records err; safe while goroutines run.
// runEach runs do for each of refs in turn (an error of do is recorded as
// "cas: <verb> <ref>: …"). When ctx ends before one of them could start, it
// starts no more and returns that ref and ctx's error.
func (b *boundedGroup) runEach(ctx context.Context, refs []wire.CasObjectRef, verb string, do func(wire.CasObjectRef) error) (wire.CasObjectRef, error) {
	for _, ref := range refs {
		if err := b.run(ctx, func() error {
			if err := do(ref); err != nil {
				return fmt.Errorf("cas: %s %s: %w", verb, ref, err)
			}
			return nil
		}); err != nil {
			return ref, err
		}
	}
	return wire.CasObjectRef{}, nil
}

func (b *boundedGroup) add(err error) {
	b.mu.Lock()
	b.errs = append(b.errs, err)
	b.mu.Unlock()
}

// wait waits for every goroutine and returns the errors joined.
func (b *boundedGroup) wait() error {
	b.wg.Wait()
	return errors.Join(b.errs...)
}
