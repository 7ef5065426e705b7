package yamux

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// Write batching below TLS (issue 19 item 3).
//
// yamux's send loop writes every frame as two calls, the 12-byte header and
// then the body, and crypto/tls turns every call into one record per
// 16 KiB of plaintext with one write(2) per record. On loopback each
// write(2) runs the whole TCP receive path of the peer, so a 16 KiB bulk
// chunk cost two system calls, one of them for a 34-byte segment, and the
// profile of a single bulk stream was dominated by write(2).
//
// batchConn sits between crypto/tls and the socket. While a batch is open
// the records crypto/tls writes are appended to a buffer instead of the
// socket; closing the batch writes them with one write(2). sockConn opens a
// batch for a data-frame header that announces a body and closes it after
// the body, so a frame (header record + body records) leaves in one system
// call. A batch is written out before it would exceed batchMax, so a large
// frame (yamux frames are as large as the stream window) is not copied
// whole before its first byte leaves. The header's record (34 bytes) waits
// in a small array and leaves with the body's first record in one
// writev(2) (issue 26 item 4), so a frame whose body is one record — every
// 16 KiB bulk chunk of the semantics scheduler — is not copied at all;
// only a larger body's further records are gathered in the buffer. Writes that crypto/tls makes outside a
// batch (handshake, alerts, a KeyUpdate answer from the read path) go to the
// socket directly; the mutex keeps them in order with a batch's flush.

// batchMax bounds the bytes an open batch holds.
const batchMax = 64 << 10

// batchBufs recycles batch buffers, so an idle connection holds none.
var batchBufs = sync.Pool{New: func() any {
	b := make([]byte, 0, batchMax)
	return &b
}}

// batchConn is the net.Conn crypto/tls writes to.
type batchConn struct {
	net.Conn
	mu  sync.Mutex
	on  bool
	buf *[]byte // nil unless a batch holds bytes beyond its first record
	// A batch's first record when it is small (a frame header's) waits in
	// head, and leaves with the next record in one writev(2): a frame whose
	// body is one record (a 16 KiB bulk chunk) is not copied into buf.
	head  [batchHeadMax]byte
	headN int
	vec   [2][]byte
	bufs  net.Buffers
	// written counts the bytes the socket accepted, added after each
	// write(2) returns; Conn.QueuedBytes bounds the socket's unsent bytes
	// with it between two SIOCOUTQNSD reads (queue.go).
	written atomic.Int64
}

// batchHeadMax bounds a first record held in batchConn.head: a 12-byte
// yamux header sealed by TLS 1.3 (5-byte record header, content type,
// 16-byte tag) is 34 bytes.
const batchHeadMax = 64

// Write appends p to the open batch, or writes it to the socket.
func (b *batchConn) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.on {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
		return b.write(p)
	}
	if b.buf == nil && b.headN == 0 && len(p) <= batchHeadMax {
		b.headN = copy(b.head[:], p)
		return len(p), nil
	}
	if b.headN > 0 {
		if _, ok := b.Conn.(*net.TCPConn); ok {
			return b.writeHead(p)
		}
		// No writev(2) below (tests): the head joins the batch buffer.
		b.buf = batchBufs.Get().(*[]byte)
		*b.buf = append(*b.buf, b.head[:b.headN]...)
		b.headN = 0
	}
	if b.buf != nil && len(*b.buf)+len(p) > batchMax {
		if err := b.flushLocked(); err != nil {
			return 0, err
		}
	}
	if len(p) >= batchMax {
		return b.write(p) // nothing to gain from copying it
	}
	if b.buf == nil {
		b.buf = batchBufs.Get().(*[]byte)
	}
	*b.buf = append(*b.buf, p...)
	return len(p), nil
}

// begin opens a batch (a no-op if one is open).
func (b *batchConn) begin() {
	b.mu.Lock()
	b.on = true
	b.mu.Unlock()
}

// end closes the batch and writes what it holds with one write(2).
func (b *batchConn) end() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.on = false
	return b.flushLocked()
}

// write writes p to the socket and counts what it accepted.
func (b *batchConn) write(p []byte) (int, error) {
	n, err := b.Conn.Write(p)
	b.written.Add(int64(n))
	return n, err
}

// writeHead writes the held first record and p with one writev(2).
func (b *batchConn) writeHead(p []byte) (int, error) {
	b.vec = [2][]byte{b.head[:b.headN], p}
	b.bufs = b.vec[:]
	n, err := b.bufs.WriteTo(b.Conn)
	b.written.Add(n)
	m := int(n) - b.headN
	b.headN, b.vec, b.bufs = 0, [2][]byte{}, nil
	return max(m, 0), err
}

func (b *batchConn) flushLocked() error {
	if b.headN > 0 {
		n, err := b.write(b.head[:b.headN])
		b.headN = 0
		if err == nil && n == 0 {
			err = io.ErrShortWrite
		}
		if err != nil {
			return err
		}
	}
	if b.buf == nil {
		return nil
	}
	buf := b.buf
	b.buf = nil
	_, err := b.write(*buf)
	*buf = (*buf)[:0]
	if cap(*buf) <= 2*batchMax {
		batchBufs.Put(buf)
	}
	return err
}

// yamux v0.1.2 frame header: version (0), type, flags (2), stream id (4),
// length (4); type 0 is data, whose length is the size of the body written
// next.
const (
	yamuxHeaderSize = 12
	yamuxTypeData   = 0
)

// announcesBody reports whether p is a yamux data-frame header followed by
// a body write.
func announcesBody(p []byte) bool {
	return len(p) == yamuxHeaderSize && p[0] == 0 && p[1] == yamuxTypeData &&
		binary.BigEndian.Uint32(p[8:12]) > 0
}
