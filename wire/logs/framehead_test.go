package logs

import (
	"bytes"
	"errors"
	"testing"

	"forgeyard.dev/transport/wire"
)

func headFixture() (*wire.Envelope, *LogFrameV1) {
	chunk := bytes.Repeat([]byte("build step 7: compiling forgeyard.dev/transport/wire\n"), 1300)[:MaxLogChunk]
	m := &LogFrameV1{Seq: 9001, Stream: LogStderr, TimestampMs: 1767225600000, UncompressedLen: uint32(len(chunk)), Bytes: chunk}
	env := &wire.Envelope{Protocol: wire.V(1, 0), MessageID: wire.NewMessageId(), SentAtMs: 1767225600000, Payload: m}
	return env, m
}

// head ‖ chunk is byte for byte the contiguous frame, and decodes.
func TestAppendFrameHeadEqualsFrame(t *testing.T) {
	env, m := headFixture()
	whole, err := wire.AppendEnvelopeFrame(nil, wire.MaxLogFrame, env)
	if err != nil {
		t.Fatal(err)
	}
	head, err := AppendFrameHead([]byte("prefix"), wire.MaxLogFrame, env, m)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(head, []byte("prefix")) {
		t.Fatal("AppendFrameHead clobbered the caller's buffer")
	}
	got := append(append([]byte(nil), head[len("prefix"):]...), m.Bytes...)
	if !bytes.Equal(got, whole) {
		t.Fatalf("head‖chunk (%d bytes) differs from the contiguous frame (%d bytes)", len(got), len(whole))
	}
	if len(head)-len("prefix") > 64 {
		t.Fatalf("head is %d bytes; the chunk was copied into it", len(head)-len("prefix"))
	}
}

func TestAppendFrameHeadLimit(t *testing.T) {
	env, m := headFixture()
	_, err := AppendFrameHead(nil, len(m.Bytes), env, m)
	var tl *wire.FrameTooLargeError
	if !errors.As(err, &tl) || tl.Limit != len(m.Bytes) {
		t.Fatalf("frame over limit: %v, want *FrameTooLargeError", err)
	}
}

func TestAppendFrameHeadAllocs(t *testing.T) {
	env, m := headFixture()
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() {
		var err error
		if _, err = AppendFrameHead(buf[:0], wire.MaxLogFrame, env, m); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("AppendFrameHead allocates %v times per call, want 0", n)
	}
}
