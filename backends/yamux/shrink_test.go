package yamux

import (
	"io"
	"runtime"
	"testing"

	"forgeyard.dev/transport/semantics"
)

// TestReadReleasesDrainedBuffer: a stream whose buffered data was read
// gives yamux's receive buffer back (Stream.Shrink), so an idle stream
// that once carried a 4 KiB message does not keep its buffer. Measured as
// heap per stream after the reads, against the same streams' heap with
// the messages still unread (the buffers held).
func TestReadReleasesDrainedBuffer(t *testing.T) {
	const n, size = 200, 4000
	p := newPair(t, Config{})
	ctx := ctxT(t)
	msg := make([]byte, size)
	var client []semantics.RawStream
	for range n {
		s, err := p.client.OpenStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write(msg); err != nil {
			t.Fatal(err)
		}
		client = append(client, s)
	}
	var server []semantics.RawStream
	for range n {
		s, err := p.server.AcceptStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		server = append(server, s)
	}
	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	// Every message has arrived once its first byte can be read; the rest
	// stays buffered in yamux.
	one := make([]byte, 1)
	for _, s := range server {
		if _, err := io.ReadFull(s, one); err != nil {
			t.Fatal(err)
		}
	}
	held := heap()
	buf := make([]byte, 2*size)
	for _, s := range server {
		// The rest is buffered already: one read larger than it drains
		// it, which gives the buffer back (once per shrinkEvery per stream).
		if n, err := s.Read(buf); err != nil || n != size-1 {
			t.Fatalf("read %d, %v; want the %d buffered bytes", n, err, size-1)
		}
	}
	after := heap()
	freed := (float64(held) - float64(after)) / n
	t.Logf("heap per stream: %.0f B freed by draining (message %d B)", freed, size)
	if freed < size/2 {
		t.Fatalf("draining %d streams freed %.0f B each, want ≥ %d: the receive buffers are kept", n, freed, size/2)
	}
	runtime.KeepAlive(client)
}
