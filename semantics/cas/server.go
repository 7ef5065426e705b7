package cas

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	wcas "forgeyard.dev/transport/wire/cas"
)

// Access is what a lease asks to do with an object.
type Access uint8

// Accesses.
const (
	// AccessRead: download the object (a lease input).
	AccessRead Access = 1
	// AccessWrite: upload the object (a lease output).
	AccessWrite Access = 2
)

// String returns "read" or "write", or Access(n) for any other value.
func (a Access) String() string {
	switch a {
	case AccessRead:
		return "read"
	case AccessWrite:
		return "write"
	}
	return fmt.Sprintf("Access(%d)", uint8(a))
}

// LogValue renders the value by its String form in logs (JSON handlers
// included, which would otherwise print the number or the struct).
func (a Access) LogValue() slog.Value { return slog.StringValue(a.String()) }

// Authorizer decides whether a lease may read or write an object (§93,
// §193). It is called for every request, before the store is consulted,
// and must be safe for concurrent use. It should answer quickly; ctx ends
// with the request.
//
// Authorize returns nil when the access is allowed, an error wrapping
// ErrForbidden when it is not (the peer gets CasForbidden, which an agent
// does not retry), and any other error when it cannot tell now — the
// authority timed out or is unreachable. Such a transient failure is never
// reported as Forbidden: an upload or download is answered CasAborted at
// the offset the peer asked for (the agent retries it), and NeedObjects
// fails with the error.
type Authorizer interface {
	Authorize(ctx context.Context, lease wire.LeaseId, obj wire.CasObjectRef, access Access) error
}

// AuthorizerFunc adapts a function to Authorizer.
type AuthorizerFunc func(ctx context.Context, lease wire.LeaseId, obj wire.CasObjectRef, access Access) error

// Authorize implements Authorizer.
func (f AuthorizerFunc) Authorize(ctx context.Context, lease wire.LeaseId, obj wire.CasObjectRef, access Access) error {
	return f(ctx, lease, obj, access)
}

// authorize asks the Authorizer; forbidden is a permanent refusal, err a
// transient one (never both).
func (s *Server) authorize(ctx context.Context, lease wire.LeaseId, obj wire.CasObjectRef, access Access) (forbidden bool, err error) {
	switch err := s.cfg.Authorizer.Authorize(ctx, lease, obj, access); {
	case err == nil:
		return false, nil
	case errors.Is(err, ErrForbidden):
		return true, nil
	default:
		s.authUnavailable.Add(1)
		return false, err
	}
}

// Server defaults.
const (
	DefaultServerMaxConcurrent = 64
	DefaultServerMaxPerConn    = 16
)

// ServerConfig configures a Server. Store and Authorizer are required;
// zero fields take defaults.
type ServerConfig struct {
	Store      ContentStore
	Authorizer Authorizer
	// MaxConcurrent bounds transfers in progress over all sessions;
	// 0 means DefaultServerMaxConcurrent.
	MaxConcurrent int
	// MaxPerConn bounds transfers in progress per Session; 0 means
	// DefaultServerMaxPerConn.
	MaxPerConn int
	// Bandwidth paces the bytes of every transfer (both directions
	// together); nil is unlimited.
	Bandwidth *Bandwidth
	// Compression is applied to downloads; CasCompressionNone by default.
	Compression wcas.CasCompression
	// BufferSize is the copy buffer per transfer; 0 means DefaultBufferSize.
	BufferSize int
	// IdleTimeout bounds a read or write without progress; 0 means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// HeaderTimeout bounds the wait for a request or ack frame; 0 means
	// DefaultHeaderTimeout.
	HeaderTimeout time.Duration
	// Metrics, when set, counts object bytes, verified objects, resumed
	// uploads and digest mismatches (upload: received; download: sent).
	// Nil disables them.
	Metrics *telemetry.Metrics
}

// ServerStats are a Server's counters (since NewServer).
type ServerStats struct {
	Active, MaxActive     int64 // transfers in progress, and the most at once
	UploadsVerified       int64 // uploads committed
	DownloadsServed       int64 // downloads fully sent
	Forbidden, NotFound   int64 // requests answered so
	Failed                int64 // other non-Verified outcomes and transport failures
	BytesIn, BytesOut     int64 // logical object bytes received and sent
	ResumedUploads        int64 // uploads that continued a stored prefix
	ResumedPrefixBytes    int64 // bytes of those prefixes (not re-sent)
	ProtocolErrors        int64 // streams reset for protocol violations
	DeduplicatedUploads   int64 // uploads answered Verified without bytes (already stored)
	UnsupportedAlgorithms int64 // requests naming BLAKE3
	AuthorizerUnavailable int64 // requests refused as retryable because the Authorizer could not tell (authority unreachable)
}

// Server is the daemon side of CAS transfer. Create it with NewServer and
// one Session per connection. Safe for concurrent use.
type Server struct {
	cfg    ServerConfig
	global sem

	active, maxActive                                   atomic.Int64
	upOK, downOK, forbidden, notFound, failed           atomic.Int64
	bytesIn, bytesOut, resumed, resumedBytes, protoErrs atomic.Int64
	dedup, unsupported, authUnavailable                 atomic.Int64
}

// NewServer validates cfg and returns a Server.
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Store == nil || cfg.Authorizer == nil {
		return nil, errors.New("cas: ServerConfig.Store and Authorizer are required")
	}
	if cfg.MaxConcurrent < 0 || cfg.MaxPerConn < 0 || cfg.BufferSize < 0 || cfg.IdleTimeout < 0 || cfg.HeaderTimeout < 0 {
		return nil, errors.New("cas: negative ServerConfig field")
	}
	if cfg.Compression > wcas.CasCompressionFlate {
		return nil, fmt.Errorf("cas: unknown compression %s", cfg.Compression)
	}
	orDefault(&cfg.MaxConcurrent, DefaultServerMaxConcurrent)
	orDefault(&cfg.MaxPerConn, DefaultServerMaxPerConn)
	transferDefaults(&cfg.BufferSize, &cfg.IdleTimeout, &cfg.HeaderTimeout)
	return &Server{cfg: cfg, global: newSem(cfg.MaxConcurrent)}, nil
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() ServerStats {
	return ServerStats{
		Active: s.active.Load(), MaxActive: s.maxActive.Load(),
		UploadsVerified: s.upOK.Load(), DownloadsServed: s.downOK.Load(),
		Forbidden: s.forbidden.Load(), NotFound: s.notFound.Load(), Failed: s.failed.Load(),
		BytesIn: s.bytesIn.Load(), BytesOut: s.bytesOut.Load(),
		ResumedUploads: s.resumed.Load(), ResumedPrefixBytes: s.resumedBytes.Load(),
		ProtocolErrors: s.protoErrs.Load(), DeduplicatedUploads: s.dedup.Load(),
		UnsupportedAlgorithms: s.unsupported.Load(), AuthorizerUnavailable: s.authUnavailable.Load(),
	}
}

// NeedObjects answers a NeedObjectsV1 batch (≤ wcas.MaxBatch objects, §88–
// 89) with the objects the daemon does not hold. Enumeration guard (§93,
// §269): an object is reported present only when the lease may read or
// write it AND it is stored; every other object — unauthorized, unknown,
// or of an unsupported algorithm — is reported missing, so the answer for
// an object the lease may not touch is the same whether or not it exists.
// Uploading such an object then fails with Forbidden. An invalid batch
// (Validate) fails with ErrProtocol; an Authorizer that cannot tell now
// fails the batch with its error (retryable), rather than reporting
// objects missing that the lease may well hold.
func (s *Server) NeedObjects(ctx context.Context, m *wcas.NeedObjectsV1) (*wcas.MissingObjectsV1, error) {
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	out := &wcas.MissingObjectsV1{Lease: m.Lease}
	for _, ref := range m.Objects {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if ref.Algorithm != wire.DigestSHA256 {
			out.Objects = append(out.Objects, ref)
			continue
		}
		forbidden, err := s.authorize(ctx, m.Lease, ref, AccessWrite)
		if err == nil && forbidden {
			forbidden, err = s.authorize(ctx, m.Lease, ref, AccessRead)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrAuthUnavailable, err)
		}
		if !forbidden {
			st, err := s.cfg.Store.Stat(ref)
			if err != nil {
				return nil, err
			}
			if st.Complete {
				continue
			}
		}
		out.Objects = append(out.Objects, ref)
	}
	return out, nil
}

// Session serves the CAS streams of one connection, bounding its
// concurrent transfers by ServerConfig.MaxPerConn. Safe for concurrent
// use.
type Session struct {
	srv *Server
	sem sem
}

// NewSession returns the Session of one connection.
func (s *Server) NewSession() *Session {
	return &Session{srv: s, sem: newSem(s.cfg.MaxPerConn)}
}

// Handle serves one stream the peer opened, of kind wire.StreamCasUpload
// or wire.StreamCasDownload (any other kind is reset with
// StreamProtocolError), and ends both halves of it before returning. It
// waits for a transfer slot (per session, then global) until ctx ends,
// then resets the stream with StreamShutdown. ctx ending during the
// transfer resets the stream; an upload's stored prefix is kept. Run it on
// its own goroutine per stream. The error is nil when the request was
// answered (whatever the outcome) and describes transport or protocol
// failures otherwise.
func (ss *Session) Handle(ctx context.Context, st *semantics.Stream) error {
	s := ss.srv
	kind := st.Kind()
	if kind != wire.StreamCasUpload && kind != wire.StreamCasDownload {
		reset(st, semantics.StreamProtocolError)
		s.protoErrs.Add(1)
		return fmt.Errorf("%w: %s stream", ErrProtocol, kind)
	}
	if err := ss.sem.acquire(ctx); err != nil {
		reset(st, semantics.StreamShutdown)
		return err
	}
	defer ss.sem.release()
	if err := s.global.acquire(ctx); err != nil {
		reset(st, semantics.StreamShutdown)
		return err
	}
	defer s.global.release()
	n := s.active.Add(1)
	defer s.active.Add(-1)
	for m := s.maxActive.Load(); n > m && !s.maxActive.CompareAndSwap(m, n); m = s.maxActive.Load() {
	}
	stop := context.AfterFunc(ctx, func() { reset(st, semantics.StreamShutdown) })
	defer stop()
	var err error
	if kind == wire.StreamCasUpload {
		err = s.upload(ctx, st)
	} else {
		err = s.download(ctx, st)
	}
	if errors.Is(err, ErrProtocol) {
		s.protoErrs.Add(1)
		reset(st, semantics.StreamProtocolError)
	} else if err != nil {
		s.failed.Add(1)
		reset(st, semantics.StreamCancelled)
	}
	return err
}

// reset ends both halves of st abruptly.
func reset(st *semantics.Stream, code semantics.StreamErrorCode) {
	st.CancelRead(code)
	st.CancelWrite(code)
}

// ack writes the ack, stops reading what the peer may still send (with
// readCode, unless the range was read to its FIN) and closes the send half.
func (s *Server) ack(st *semantics.Stream, lease wire.LeaseId, ref wire.CasObjectRef, o wcas.CasOutcome, verified uint64, readCode semantics.StreamErrorCode, drained bool) error {
	if !drained {
		st.CancelRead(readCode)
	}
	switch o {
	case wcas.CasForbidden:
		s.forbidden.Add(1)
	case wcas.CasNotFound:
		s.notFound.Add(1)
	case wcas.CasVerified:
	default:
		s.failed.Add(1)
	}
	if o == wcas.CasVerified {
		verified = ref.Size
	}
	_ = st.SetWriteDeadline(time.Now().Add(s.cfg.IdleTimeout))
	err := writeMsg(&st.SendStream, &wcas.CasObjectAckV1{Lease: lease, Object: ref, Outcome: o, VerifiedOffset: verified})
	if err != nil {
		st.CancelWrite(semantics.StreamCancelled)
		return err
	}
	return st.SendStream.Close()
}

func (s *Server) upload(ctx context.Context, st *semantics.Stream) error {
	m, err := readMsg(&st.RecvStream, s.cfg.HeaderTimeout)
	if err != nil {
		return err
	}
	if probe, ok := m.(*wcas.CasRangeResumeRequestV1); ok {
		ref := probe.Object
		if ok, err := s.admit(ctx, st, probe.Lease, ref, AccessWrite, probe.VerifiedOffset, wcas.CasAborted); !ok {
			return err
		}
		stat, err := s.cfg.Store.Stat(ref)
		if err != nil {
			return s.ack(st, probe.Lease, ref, wcas.CasAborted, 0, semantics.StreamCancelled, false)
		}
		if stat.Complete {
			s.dedup.Add(1)
			return s.ack(st, probe.Lease, ref, wcas.CasVerified, ref.Size, semantics.StreamCancelled, false)
		}
		if err := writeMsg(&st.SendStream, &wcas.CasRangeResumeRequestV1{Lease: probe.Lease, Object: ref, VerifiedOffset: stat.Partial}); err != nil {
			return err
		}
		if m, err = readMsg(&st.RecvStream, s.cfg.HeaderTimeout); err != nil {
			return err
		}
		if h, ok := m.(*wcas.CasObjectStreamHeaderV1); !ok || h.Object != ref || h.Lease != probe.Lease {
			return fmt.Errorf("%w: resume probe not followed by the same object's header", ErrProtocol)
		}
	}
	hdr, ok := m.(*wcas.CasObjectStreamHeaderV1)
	if !ok {
		return fmt.Errorf("%w: upload stream opened with %T", ErrProtocol, m)
	}
	ref, lease := hdr.Object, hdr.Lease
	if ok, err := s.admit(ctx, st, lease, ref, AccessWrite, hdr.Offset, wcas.CasAborted); !ok {
		return err
	}
	if hdr.Offset+hdr.Length != ref.Size {
		return s.ack(st, lease, ref, wcas.CasSizeMismatch, 0, semantics.StreamProtocolError, false)
	}
	p, err := s.cfg.Store.Create(ref)
	switch {
	case errors.Is(err, ErrExists):
		s.dedup.Add(1)
		return s.ack(st, lease, ref, wcas.CasVerified, ref.Size, semantics.StreamCancelled, false)
	case errors.Is(err, ErrTooLarge):
		return s.ack(st, lease, ref, wcas.CasSizeMismatch, 0, semantics.StreamProtocolError, false)
	case err != nil: // busy, too many partials, I/O
		return s.ack(st, lease, ref, wcas.CasAborted, 0, semantics.StreamCancelled, false)
	}
	if hdr.Offset != p.Len() {
		// Only a range starting at the kept prefix is accepted; the ack
		// tells the uploader where to continue.
		held := p.Len()
		_ = p.Close()
		return s.ack(st, lease, ref, wcas.CasAborted, held, semantics.StreamCancelled, false)
	}
	if p.Len() > 0 {
		s.cfg.Metrics.CasResumed(true)
		s.resumed.Add(1)
		s.resumedBytes.Add(int64(p.Len()))
	}
	buf := make([]byte, s.cfg.BufferSize)
	r := &pacedReader{ctx: ctx, s: &st.RecvStream, bw: s.cfg.Bandwidth, idle: s.cfg.IdleTimeout}
	o, got, err := receiveBody(r, hdr, p, buf)
	s.bytesIn.Add(int64(got))
	s.cfg.Metrics.CasTransferred(true, int64(got))
	if o == wcas.CasDigestMismatch {
		s.cfg.Metrics.CasVerificationFailed(true)
	}
	if err != nil {
		_ = p.Close() // keep the prefix for a resume
		return err
	}
	drained := o == wcas.CasVerified || o == wcas.CasDigestMismatch
	if o == wcas.CasVerified {
		if err := p.Commit(); err != nil {
			return s.ack(st, lease, ref, wcas.CasAborted, 0, semantics.StreamCancelled, drained)
		}
		s.upOK.Add(1)
		s.cfg.Metrics.CasVerified(true)
		return s.ack(st, lease, ref, o, ref.Size, semantics.StreamCancelled, drained)
	}
	_ = p.Abort()
	code := semantics.StreamCancelled
	if o == wcas.CasSizeMismatch {
		code = semantics.StreamProtocolError
	}
	return s.ack(st, lease, ref, o, 0, code, drained)
}

// admit answers an upload, resume probe or download request the server
// will not serve, as all three do: an authorization that failed (Aborted,
// at offset), a forbidden one (Forbidden) or an unsupported algorithm
// (unsupported: an upload or probe answers Aborted, a download NotFound).
// ok false means the request was answered; err is the answer's.
func (s *Server) admit(ctx context.Context, st *semantics.Stream, lease wire.LeaseId, ref wire.CasObjectRef, access Access, offset uint64, unsupported wcas.CasOutcome) (bool, error) {
	if forbidden, err := s.authorize(ctx, lease, ref, access); err != nil {
		return false, s.ack(st, lease, ref, wcas.CasAborted, offset, semantics.StreamCancelled, false)
	} else if forbidden {
		return false, s.ack(st, lease, ref, wcas.CasForbidden, 0, semantics.StreamForbidden, false)
	}
	if ref.Algorithm != wire.DigestSHA256 {
		s.unsupported.Add(1)
		return false, s.ack(st, lease, ref, unsupported, 0, semantics.StreamCancelled, false)
	}
	return true, nil
}

func (s *Server) download(ctx context.Context, st *semantics.Stream) error {
	m, err := readMsg(&st.RecvStream, s.cfg.HeaderTimeout)
	if err != nil {
		return err
	}
	req, ok := m.(*wcas.CasFetchRequestV1)
	if !ok {
		return fmt.Errorf("%w: download stream opened with %T", ErrProtocol, m)
	}
	ref, lease := req.Object, req.Lease
	if ok, err := s.admit(ctx, st, lease, ref, AccessRead, req.Offset, wcas.CasNotFound); !ok {
		return err
	}
	src, err := s.cfg.Store.Open(ref, req.Offset)
	switch {
	case errors.Is(err, ErrNotFound) || err != nil && req.Offset > ref.Size:
		return s.ack(st, lease, ref, wcas.CasNotFound, 0, semantics.StreamCancelled, false)
	case err != nil:
		// The store failed (an object store outage, an I/O error): the
		// object may well be there, so not NotFound, on which the agent
		// would give the payload up, but Aborted at the asked-for offset,
		// which it retries.
		return s.ack(st, lease, ref, wcas.CasAborted, req.Offset, semantics.StreamCancelled, false)
	}
	defer src.Close()
	hdr := &wcas.CasObjectStreamHeaderV1{Lease: lease, Object: ref, Offset: req.Offset, Length: ref.Size - req.Offset, Compression: s.cfg.Compression}
	if err := writeMsg(&st.SendStream, hdr); err != nil {
		return err
	}
	w := &pacedWriter{ctx: ctx, s: &st.SendStream, bw: s.cfg.Bandwidth, idle: s.cfg.IdleTimeout}
	sent, err := sendBody(w, src, hdr.Length, hdr.Compression, make([]byte, s.cfg.BufferSize))
	s.bytesOut.Add(int64(sent))
	s.cfg.Metrics.CasTransferred(false, int64(sent))
	if err != nil {
		return err
	}
	if err := st.SendStream.Close(); err != nil {
		return err
	}
	// The agent's verdict ends the exchange.
	am, err := readMsg(&st.RecvStream, s.cfg.HeaderTimeout+s.cfg.IdleTimeout)
	if err != nil {
		return err
	}
	a, ok := am.(*wcas.CasObjectAckV1)
	if !ok || a.Object != ref {
		return fmt.Errorf("%w: download answered with %T", ErrProtocol, am)
	}
	st.CancelRead(semantics.StreamCancelled) // nothing more is expected
	if a.Outcome == wcas.CasVerified {
		s.downOK.Add(1)
		s.cfg.Metrics.CasVerified(false)
	} else {
		s.failed.Add(1)
	}
	return nil
}

// orDefault sets *v to def when it is zero: the zero-means-default fields
// of the package's configs (Uploader, Downloader, Server, FSStore,
// BucketStore).
func orDefault[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// transferDefaults fills the settings every transfer config has (Uploader,
// Downloader, Server) when zero: the copy buffer, the idle timeout and the
// wait for a header, request or ack.
func transferDefaults(buf *int, idle, wait *time.Duration) {
	orDefault(buf, DefaultBufferSize)
	orDefault(idle, DefaultIdleTimeout)
	orDefault(wait, DefaultHeaderTimeout)
}
