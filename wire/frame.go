package wire

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"sync"

	"forgeyard.dev/transport/wire/postcard"
)

// Frame limits. A message stream carries frames `varint(len) ‖ body`; the
// length is checked against the stream kind's limit before anything is
// allocated (§38, §50, §52). The same constant bounds reading and writing.
const (
	MaxControlFrame      = 64 << 10  // control and heartbeat streams
	MaxLogFrame          = 256 << 10 // log stream frames (a 64 KiB chunk plus envelope; compressed chunks)
	MaxCasHeaderFrame    = 4 << 10   // CAS object stream header
	MaxStreamHeaderFrame = 64        // the StreamHeader that opens every stream
	MaxAnyFrame          = 1 << 20   // absolute ceiling for any frame

	maxFramePrefix = 10
)

// FrameTooLargeError reports a frame whose declared length exceeds the
// reader's or writer's limit. Nothing was allocated for it.
type FrameTooLargeError struct {
	Size  uint64
	Limit int
}

// Error gives the frame's declared size and the limit it exceeds.
func (e *FrameTooLargeError) Error() string {
	return fmt.Sprintf("wire: frame of %d bytes exceeds limit %d", e.Size, e.Limit)
}

// ErrFramePrefix reports a malformed length prefix.
var ErrFramePrefix = errors.New("wire: malformed frame length prefix")

// AppendFrame appends varint(len(body)) ‖ body where body is what encode
// appends. It encodes in place: one pass, one move of the body bytes.
func AppendFrame(b []byte, limit int, encode func([]byte) []byte) ([]byte, error) {
	start := len(b)
	b = append(b, make([]byte, maxFramePrefix)...)
	b = encode(b)
	n := len(b) - start - maxFramePrefix
	if n > limit {
		return b[:start], &FrameTooLargeError{Size: uint64(n), Limit: limit}
	}
	pl := postcard.UvarintLen(uint64(n))
	postcard.AppendUvarint(b[start:start], uint64(n))
	copy(b[start+pl:], b[start+maxFramePrefix:])
	return b[:start+pl+n], nil
}

// AppendFrameHead appends the head of a frame whose body is what encode
// appends followed by tailLen bytes that the caller writes separately (a
// vectored write): the length prefix covers both. It lets a bulk chunk that
// ends a message (a log chunk, §37) reach the stream without being copied
// into the frame buffer. The frame on the wire is the returned head ‖ tail.
func AppendFrameHead(b []byte, limit, tailLen int, encode func([]byte) []byte) ([]byte, error) {
	start := len(b)
	b = append(b, make([]byte, maxFramePrefix)...)
	b = encode(b)
	head := len(b) - start - maxFramePrefix
	n := head + tailLen
	if tailLen < 0 || n > limit {
		return b[:start], &FrameTooLargeError{Size: uint64(max(n, 0)), Limit: limit}
	}
	pl := postcard.UvarintLen(uint64(n))
	postcard.AppendUvarint(b[start:start], uint64(n))
	copy(b[start+pl:], b[start+maxFramePrefix:])
	return b[:start+pl+head], nil
}

// AppendEnvelopeFrame appends e as one frame, refusing bodies above limit.
func AppendEnvelopeFrame(b []byte, limit int, e *Envelope) ([]byte, error) {
	return AppendFrame(b, limit, e.AppendPostcard)
}

// FrameReader reads length-prefixed frames from a stream. It allocates a
// body buffer only after checking the declared length against its limit,
// and grows it to at most the limit. Not safe for concurrent use.
//
// An idle stream holds no read buffer: between frames, when everything
// buffered has been consumed, the reader's 4 KiB bufio.Reader goes back to
// a pool, and the next frame's first byte is read straight from the stream
// before one is taken again. A daemon's thousands of idle control streams
// (one heartbeat every few seconds) then cost no buffer each, while a busy
// stream (frames back to back) keeps its buffer between frames. A reader
// whose Buffered was called (the stream switched to raw bytes) keeps its
// buffer for good, as does one made over the caller's own bufio.Reader.
type FrameReader struct {
	src    io.Reader
	r      *bufio.Reader // nil while idle (released to framePool)
	pooled bool          // r comes from framePool and may go back to it
	limit  int
	buf    []byte
	first  [1]byte
}

// frameReadSize is the read buffer of a FrameReader over a plain reader.
const frameReadSize = 4096

// idleBodyKeep is the largest body buffer an idle reader keeps: a
// heartbeat's, not a registration's or a lease offer's.
const idleBodyKeep = 512

var framePool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, frameReadSize) }}

// NewFrameReader returns a reader that rejects frames longer than limit
// (clipped to 0..MaxAnyFrame).
func NewFrameReader(r io.Reader, limit int) *FrameReader {
	limit = clipFrameLimit(limit)
	if br, ok := r.(*bufio.Reader); ok {
		return &FrameReader{src: br, r: br, limit: limit}
	}
	return &FrameReader{src: r, pooled: true, limit: limit}
}

// SetLimit changes the frame limit (clipped to 0..MaxAnyFrame).
func (fr *FrameReader) SetLimit(limit int) { fr.limit = clipFrameLimit(limit) }

// clipFrameLimit bounds a reader's limit. A negative limit must not wrap to
// a huge unsigned one in Next's comparison.
func clipFrameLimit(limit int) int {
	return min(max(limit, 0), MaxAnyFrame)
}

// Buffered exposes the underlying buffered reader, for protocols that switch
// from frames to raw bytes on the same stream (a CAS object after its
// header). Bytes already buffered are not lost. From then on the reader
// keeps its buffer.
func (fr *FrameReader) Buffered() *bufio.Reader {
	fr.take()
	fr.pooled = false
	return fr.r
}

// take gives an idle reader a buffer from the pool.
func (fr *FrameReader) take() {
	if fr.r == nil {
		fr.r = framePool.Get().(*bufio.Reader)
		fr.r.Reset(fr.src)
	}
}

// release returns the buffer to the pool once nothing is left in it.
func (fr *FrameReader) release() {
	if fr.pooled && fr.r != nil && fr.r.Buffered() == 0 {
		fr.r.Reset(nil)
		framePool.Put(fr.r)
		fr.r = nil
	}
}

// Next returns the next frame body. The slice aliases an internal buffer
// that is valid until the next call. At a clean end of stream between frames
// it returns io.EOF; a stream that ends inside a frame returns
// io.ErrUnexpectedEOF; an over-limit length returns *FrameTooLargeError.
func (fr *FrameReader) Next() ([]byte, error) {
	defer fr.release()
	var first []byte
	if fr.r == nil {
		// Idle: wait for the next frame holding no buffer — neither the
		// read buffer nor a body buffer grown by a large frame (the last
		// body is invalid from this call on).
		if cap(fr.buf) > idleBodyKeep {
			fr.buf = nil
		}
		if _, err := io.ReadFull(fr.src, fr.first[:]); err != nil {
			return nil, err
		}
		first = fr.first[:]
		fr.take()
	}
	n, err := fr.readLen(first)
	if err != nil {
		return nil, err
	}
	if n > uint64(fr.limit) {
		return nil, &FrameTooLargeError{Size: n, Limit: fr.limit}
	}
	if cap(fr.buf) < int(n) {
		fr.buf = make([]byte, n)
	}
	body := fr.buf[:n]
	if _, err := io.ReadFull(fr.r, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return body, nil
}

// readLen reads the length prefix; first, if not empty, is its first byte,
// already read.
func (fr *FrameReader) readLen(first []byte) (uint64, error) {
	var v uint64
	for i := 0; i < maxFramePrefix; i++ {
		var c byte
		if i == 0 && len(first) == 1 {
			c = first[0]
		} else {
			var err error
			if c, err = fr.r.ReadByte(); err != nil {
				if i > 0 && err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return 0, err
			}
		}
		if c < 0x80 {
			if i == maxFramePrefix-1 && c > 1 {
				return 0, ErrFramePrefix
			}
			return v | uint64(c)<<(7*uint(i)), nil
		}
		v |= uint64(c&0x7f) << (7 * uint(i))
	}
	return 0, ErrFramePrefix
}
