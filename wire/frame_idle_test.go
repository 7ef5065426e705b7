package wire

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"
)

// TestFrameReaderIdleHoldsNoBuffer (issue 26 item 1): over a plain
// reader, a FrameReader holds no read buffer before its first frame and
// after each frame that left nothing buffered; frames sent back to back
// keep the buffer until the last is read; every frame still arrives
// whole, in order; a reader switched to raw bytes (Buffered) keeps its
// buffer, and one over the caller's bufio.Reader never gives it away.
func TestFrameReaderIdleHoldsNoBuffer(t *testing.T) {
	pr, pw := io.Pipe()
	fr := NewFrameReader(pr, 1<<20)
	if fr.r != nil {
		t.Fatal("a new reader holds a buffer")
	}
	frame := func(body string) []byte {
		b, err := AppendFrame(nil, 1<<20, func(b []byte) []byte { return append(b, body...) })
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	send := func(b []byte) {
		go func() { _, _ = pw.Write(b) }()
	}
	// One frame at a time: idle again after each.
	for _, body := range []string{"heartbeat 1", "heartbeat 2", string(bytes.Repeat([]byte("x"), 300))} {
		send(frame(body))
		got, err := fr.Next()
		if err != nil || string(got) != body {
			t.Fatalf("Next = %q, %v; want %q", got, err, body)
		}
		if fr.r != nil {
			t.Fatalf("after %q with nothing buffered the reader still holds its buffer", body[:min(len(body), 12)])
		}
	}
	// A large frame's body buffer is not kept while idle.
	if cap(fr.buf) != 300 {
		t.Fatalf("body buffer %d bytes after a 300-byte frame", cap(fr.buf))
	}
	send(frame("small"))
	if got, err := fr.Next(); err != nil || string(got) != "small" || cap(fr.buf) > idleBodyKeep {
		t.Fatalf("Next = %q, %v; body buffer %d bytes, want ≤ %d", got, err, cap(fr.buf), idleBodyKeep)
	}
	// Three frames in one write (a pipe delivers them in one Read): the
	// buffer stays while frames are buffered, and goes after the last.
	burst := append(append(frame("a"), frame("bb")...), frame("ccc")...)
	send(burst)
	for i, body := range []string{"a", "bb", "ccc"} {
		got, err := fr.Next()
		if err != nil || string(got) != body {
			t.Fatalf("burst frame %d: Next = %q, %v", i, got, err)
		}
		if last := i == 2; (fr.r == nil) != last {
			t.Fatalf("burst frame %d: holds buffer %v, want %v", i, fr.r != nil, !last)
		}
	}
	// Switched to raw bytes: the buffer is kept.
	send(append(frame("head"), "raw tail"...))
	if got, err := fr.Next(); err != nil || string(got) != "head" {
		t.Fatalf("Next = %q, %v", got, err)
	}
	br := fr.Buffered()
	tail := make([]byte, 8)
	if _, err := io.ReadFull(br, tail); err != nil || string(tail) != "raw tail" {
		t.Fatalf("raw tail %q, %v", tail, err)
	}
	send(frame("after"))
	if got, err := fr.Next(); err != nil || string(got) != "after" || fr.r != br {
		t.Fatalf("after Buffered: Next = %q, %v; reader kept %v", got, err, fr.r == br)
	}
	_ = pw.Close()
	if _, err := fr.Next(); err != io.EOF {
		t.Fatalf("at the end: %v, want io.EOF", err)
	}

	own := bufio.NewReader(bytes.NewReader(frame("mine")))
	fo := NewFrameReader(own, 64)
	if got, err := fo.Next(); err != nil || string(got) != "mine" || fo.r != own {
		t.Fatalf("caller's bufio.Reader: %q, %v, kept %v", got, err, fo.r == own)
	}
}

// TestFrameReaderIdleEdges: a stream that ends inside the length prefix
// after the first byte (read while idle) is io.ErrUnexpectedEOF, and an
// over-limit length found from an idle start is still refused.
func TestFrameReaderIdleEdges(t *testing.T) {
	fr := NewFrameReader(bytes.NewReader([]byte{0x80}), 64)
	if _, err := fr.Next(); err != io.ErrUnexpectedEOF {
		t.Fatalf("prefix cut after its first byte: %v, want io.ErrUnexpectedEOF", err)
	}
	fr = NewFrameReader(bytes.NewReader([]byte{0x41}), 64)
	var tooLarge *FrameTooLargeError
	if _, err := fr.Next(); err == nil || !errors.As(err, &tooLarge) || tooLarge.Size != 0x41 {
		t.Fatalf("over-limit length from idle: %v", err)
	}
}

// oneFrameReader hands out one frame per Read, as a stream does when
// frames arrive one at a time (heartbeats).
type oneFrameReader struct {
	frame []byte
	off   int
}

func (r *oneFrameReader) Read(p []byte) (int, error) {
	n := copy(p, r.frame[r.off:])
	r.off = (r.off + n) % len(r.frame)
	return n, nil
}

// BenchmarkFrameReaderOneAtATime: the cost of a heartbeat-sized frame
// that arrives alone, with the idle reader's pooled buffer ("pooled",
// NewFrameReader over a plain reader) beside a reader that keeps its
// buffer ("kept", over the caller's bufio.Reader: the old behaviour).
func BenchmarkFrameReaderOneAtATime(b *testing.B) {
	frame, err := AppendFrame(nil, 1<<10, func(b []byte) []byte { return append(b, bytes.Repeat([]byte{7}, 40)...) })
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"pooled", "kept"} {
		b.Run(mode, func(b *testing.B) {
			var src io.Reader = &oneFrameReader{frame: frame}
			if mode == "kept" {
				src = bufio.NewReaderSize(src, frameReadSize)
			}
			fr := NewFrameReader(src, 1<<10)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := fr.Next(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
