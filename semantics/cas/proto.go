package cas

import (
	"bufio"
	"compress/flate"
	"context"
	"errors"
	"fmt"
	"hash"
	"io"
	"time"

	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
	wcas "forgeyard.dev/transport/wire/cas"
)

// Defaults shared by Server, Uploader and Downloader.
const (
	// DefaultBufferSize is the fixed copy buffer of one transfer (bytes).
	DefaultBufferSize = 64 << 10
	// DefaultIdleTimeout bounds how long one read or write of a transfer
	// may make no progress.
	DefaultIdleTimeout = 30 * time.Second
	// DefaultHeaderTimeout bounds the wait for a request, header or ack
	// frame.
	DefaultHeaderTimeout = 10 * time.Second
)

var registry = wire.MustRegistry(wcas.Messages)

// writeMsg writes m as one envelope frame.
func writeMsg(s *semantics.SendStream, m wire.Message) error {
	e := wire.Envelope{
		Protocol:  wire.Current,
		MessageID: wire.NewMessageId(),
		SentAtMs:  uint64(time.Now().UnixMilli()),
		Payload:   m,
	}
	return s.WriteEnvelope(&e)
}

// transportErr reports whether err comes from the stream or connection
// (reset, close, cut, deadline) rather than from the peer's content.
func transportErr(err error) bool {
	var se *semantics.StreamError
	var ce *semantics.ConnError
	return errors.As(err, &se) || errors.As(err, &ce) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled) || isTimeout(err)
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// readMsg reads one envelope frame within timeout and returns its
// validated payload. A malformed frame or payload is ErrProtocol; stream
// and connection errors are returned as they are.
func readMsg(s *semantics.RecvStream, timeout time.Duration) (wire.Message, error) {
	_ = s.SetReadDeadline(time.Now().Add(timeout))
	b, err := s.ReadFrame()
	_ = s.SetReadDeadline(time.Time{})
	if err != nil {
		if transportErr(err) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	var e wire.Envelope
	if err := e.Decode(b, registry); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	if err := e.Payload.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrProtocol, err)
	}
	return e.Payload, nil
}

// pacedWriter writes to a stream through the bandwidth bucket, refreshing
// the write deadline per write.
type pacedWriter struct {
	ctx  context.Context
	s    *semantics.SendStream
	bw   *Bandwidth
	idle time.Duration
	n    uint64 // bytes written to the stream
}

func (w *pacedWriter) Write(p []byte) (int, error) {
	if err := w.bw.Wait(w.ctx, len(p)); err != nil {
		return 0, err
	}
	_ = w.s.SetWriteDeadline(time.Now().Add(w.idle))
	n, err := w.s.Write(p)
	w.n += uint64(n)
	return n, err
}

// sendBody writes length logical bytes of src to s, flate-compressed when
// asked. It returns the logical bytes taken from src. It never holds more
// than buf (plus the flate window) in memory.
func sendBody(w *pacedWriter, src io.Reader, length uint64, comp wcas.CasCompression, buf []byte) (uint64, error) {
	var dst io.Writer = w
	var fw *flate.Writer
	if comp == wcas.CasCompressionFlate {
		var err error
		if fw, err = flate.NewWriter(w, flate.BestSpeed); err != nil {
			return 0, err
		}
		dst = fw
	}
	var sent uint64
	for sent < length {
		k := int(min(uint64(len(buf)), length-sent))
		n, err := io.ReadFull(src, buf[:k])
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return sent, werr
			}
			sent += uint64(n)
		}
		if err != nil {
			return sent, fmt.Errorf("cas: reading source at %d of %d: %w", sent, length, err)
		}
	}
	if fw != nil {
		if err := fw.Close(); err != nil {
			return sent, err
		}
	}
	return sent, nil
}

// maxCompressed bounds the compressed bytes accepted for length logical
// bytes: stored DEFLATE blocks add 5 bytes per 64 KiB, so this is generous.
func maxCompressed(length uint64) int64 {
	n := length + length/1024 + 1024
	if n < length || n > 1<<62 {
		return 1 << 62
	}
	return int64(n)
}

// pacedReader reads from a stream through the bandwidth bucket, refreshing
// the read deadline per read.
type pacedReader struct {
	ctx  context.Context
	s    *semantics.RecvStream
	bw   *Bandwidth
	idle time.Duration
}

func (r *pacedReader) Read(p []byte) (int, error) {
	_ = r.s.SetReadDeadline(time.Now().Add(r.idle))
	n, err := r.s.Read(p)
	if n > 0 {
		if werr := r.bw.Wait(r.ctx, n); werr != nil && err == nil {
			err = werr
		}
	}
	return n, err
}

// rehash feeds the stored prefix of p into h.
func rehash(h hash.Hash, p PartialObject, buf []byte) error {
	if p.Len() == 0 {
		return nil
	}
	_, err := io.CopyBuffer(h, io.NewSectionReader(p, 0, int64(p.Len())), buf)
	return err
}

// receiveBody reads the range announced by hdr from r into p (whose Len is
// hdr.Offset), hashing as it goes, and returns the verdict. A non-nil error
// is a transport or store failure: the caller keeps p's prefix (Close)
// when it is a transport failure. The digest is compared with hdr.Object
// only when the whole object arrived.
func receiveBody(r io.Reader, hdr *wcas.CasObjectStreamHeaderV1, p PartialObject, buf []byte) (wcas.CasOutcome, uint64, error) {
	h, err := newHash(hdr.Object.Algorithm)
	if err != nil {
		return wcas.CasAborted, 0, nil
	}
	if err := rehash(h, p, buf); err != nil {
		return wcas.CasAborted, 0, err
	}
	var src io.Reader
	var br *bufio.Reader
	limit := hdr.Length
	if hdr.Compression == wcas.CasCompressionFlate {
		br = bufio.NewReaderSize(io.LimitReader(r, maxCompressed(hdr.Length)), 16<<10)
		fr := flate.NewReader(br)
		defer fr.Close()
		src = fr
		limit++ // read one byte past the range to detect overflow (bomb)
	} else {
		src = r
	}
	var got uint64
	for {
		k := int(min(uint64(len(buf)), limit-got))
		if k == 0 {
			break
		}
		n, rerr := src.Read(buf[:k])
		if n > 0 {
			if got+uint64(n) > hdr.Length {
				return wcas.CasSizeMismatch, got, nil
			}
			h.Write(buf[:n])
			if err := p.Append(buf[:n]); err != nil {
				return wcas.CasAborted, got, err
			}
			got += uint64(n)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if transportErr(rerr) {
				return wcas.CasAborted, got, rerr
			}
			var ce flate.CorruptInputError
			if errors.As(rerr, &ce) {
				return wcas.CasDigestMismatch, got, nil
			}
			return wcas.CasSizeMismatch, got, nil // truncated compressed data
		}
	}
	if got != hdr.Length {
		return wcas.CasSizeMismatch, got, nil
	}
	// Nothing may follow the range: the next read must be the FIN.
	var tail io.Reader = r
	if br != nil {
		tail = br
	}
	var one [1]byte
	n, rerr := tail.Read(one[:])
	for i := 0; n == 0 && rerr == nil && i < 100; i++ {
		n, rerr = tail.Read(one[:])
	}
	if n > 0 {
		return wcas.CasSizeMismatch, got, nil
	}
	if rerr != io.EOF {
		if br != nil && !transportErr(rerr) {
			return wcas.CasSizeMismatch, got, nil
		}
		return wcas.CasAborted, got, rerr
	}
	var sum wire.Digest
	if h.Size() != len(sum) || p.Len() != hdr.Object.Size {
		return wcas.CasSizeMismatch, got, nil
	}
	h.Sum(sum[:0])
	if sum != hdr.Object.Digest {
		return wcas.CasDigestMismatch, got, nil
	}
	return wcas.CasVerified, got, nil
}
