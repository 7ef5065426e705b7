package wire_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

func appendBody(p []byte) func([]byte) []byte {
	return func(b []byte) []byte { return append(b, p...) }
}

func TestFrameRoundTrip(t *testing.T) {
	sizes := []int{0, 1, 127, 128, 16383, 16384, wire.MaxControlFrame}
	var stream []byte
	var bodies [][]byte
	for i, n := range sizes {
		body := bytes.Repeat([]byte{byte(i + 1)}, n)
		before := len(stream)
		var err error
		stream, err = wire.AppendFrame(stream, wire.MaxControlFrame, appendBody(body))
		if err != nil {
			t.Fatalf("AppendFrame(%d): %v", n, err)
		}
		// The prefix is the shortest varint of the body length.
		prefix := postcard.AppendLen(nil, n)
		if !bytes.Equal(stream[before:before+len(prefix)], prefix) || len(stream)-before != len(prefix)+n {
			t.Fatalf("frame of %d: prefix %x, %d bytes", n, stream[before:before+len(prefix)], len(stream)-before)
		}
		bodies = append(bodies, body)
	}
	for _, oneByte := range []bool{false, true} {
		var r io.Reader = bytes.NewReader(stream)
		if oneByte {
			r = iotest.OneByteReader(r)
		}
		fr := wire.NewFrameReader(r, wire.MaxControlFrame)
		for i, want := range bodies {
			got, err := fr.Next()
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("oneByte=%v frame %d: %d bytes, %v; want %d", oneByte, i, len(got), err, len(want))
			}
		}
		if _, err := fr.Next(); err != io.EOF {
			t.Fatalf("oneByte=%v: after last frame: %v, want io.EOF", oneByte, err)
		}
	}
}

func TestAppendFrameOverLimit(t *testing.T) {
	prefix := []byte("keep")
	b, err := wire.AppendFrame(prefix, 100, appendBody(make([]byte, 101)))
	var fe *wire.FrameTooLargeError
	if !errors.As(err, &fe) || fe.Size != 101 || fe.Limit != 100 {
		t.Fatalf("err = %v", err)
	}
	if string(b) != "keep" {
		t.Fatalf("over-limit write left %q, want the buffer unchanged", b)
	}
	if !strings.Contains(err.Error(), "101") || !strings.Contains(err.Error(), "100") {
		t.Fatalf("message %q", err)
	}
	// Exactly at the limit is fine.
	if _, err := wire.AppendFrame(nil, 100, appendBody(make([]byte, 100))); err != nil {
		t.Fatal(err)
	}
	// The reader refuses the same frame.
	ok, _ := wire.AppendFrame(nil, 1000, appendBody(make([]byte, 101)))
	if _, err := wire.NewFrameReader(bytes.NewReader(ok), 100).Next(); !errors.As(err, &fe) || fe.Size != 101 {
		t.Fatalf("reader: %v", err)
	}
}

func TestAppendFrameAllocs(t *testing.T) {
	buf := make([]byte, 0, 4096)
	body := make([]byte, 1000)
	enc := appendBody(body)
	n := testing.AllocsPerRun(100, func() {
		var err error
		buf, err = wire.AppendFrame(buf[:0], wire.MaxControlFrame, enc)
		if err != nil {
			panic(err)
		}
	})
	if n != 0 {
		t.Fatalf("AppendFrame into a pre-sized buffer: %v allocs", n)
	}
}

func TestFrameTruncated(t *testing.T) {
	full, _ := wire.AppendFrame(nil, 1000, appendBody(bytes.Repeat([]byte{7}, 300)))
	for _, n := range []int{1, 2, 3, 150, len(full) - 1} {
		for _, oneByte := range []bool{false, true} {
			var r io.Reader = bytes.NewReader(full[:n])
			if oneByte {
				r = iotest.OneByteReader(r)
			}
			if _, err := wire.NewFrameReader(r, 1000).Next(); err != io.ErrUnexpectedEOF {
				t.Fatalf("cut at %d (oneByte=%v): %v, want io.ErrUnexpectedEOF", n, oneByte, err)
			}
		}
	}
	// Clean EOF: empty stream.
	if _, err := wire.NewFrameReader(bytes.NewReader(nil), 1000).Next(); err != io.EOF {
		t.Fatalf("empty stream: %v, want io.EOF", err)
	}
	// Other read errors pass through.
	boom := errors.New("boom")
	if _, err := wire.NewFrameReader(iotest.ErrReader(boom), 1000).Next(); err != boom {
		t.Fatalf("read error: %v", err)
	}
	r := io.MultiReader(bytes.NewReader(full[:2]), iotest.ErrReader(boom))
	if _, err := wire.NewFrameReader(r, 1000).Next(); err != boom {
		t.Fatalf("read error mid-frame: %v", err)
	}
}

func TestFramePrefixMalformed(t *testing.T) {
	for _, p := range [][]byte{
		bytes.Repeat([]byte{0x80}, 11),                  // eleven-byte prefix
		append(bytes.Repeat([]byte{0x80}, 10), 0x00),    // ten continuation bytes then a terminator
		append(bytes.Repeat([]byte{0xff}, 9), 0x02),     // 10th byte above u64 range
		append(bytes.Repeat([]byte{0xff}, 10), 0x01),    // overlong
		append(bytes.Repeat([]byte{0x80}, 10), 1, 2, 3), // followed by data
	} {
		if _, err := wire.NewFrameReader(bytes.NewReader(p), 1000).Next(); !errors.Is(err, wire.ErrFramePrefix) {
			t.Fatalf("prefix %x: %v, want ErrFramePrefix", p, err)
		}
	}
	// A ten-byte u64::MAX length is well-formed but too large.
	p := append(bytes.Repeat([]byte{0xff}, 9), 0x01)
	var fe *wire.FrameTooLargeError
	if _, err := wire.NewFrameReader(bytes.NewReader(p), 1000).Next(); !errors.As(err, &fe) || fe.Size != 1<<64-1 {
		t.Fatalf("u64::MAX length: %v", err)
	}
}

// TestFrameHugeDeclaredLength is the allocation test: a stream declaring a
// 4 GiB frame is rejected before any body buffer is allocated.
func TestFrameHugeDeclaredLength(t *testing.T) {
	stream := postcard.AppendLen(nil, 4<<30)
	stream = append(stream, bytes.Repeat([]byte{0xAA}, 1024)...) // some body bytes follow
	const budget = 1 << 20
	for _, oneByte := range []bool{false, true} {
		var r io.Reader = bytes.NewReader(stream)
		if oneByte {
			r = iotest.OneByteReader(r)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		fr := wire.NewFrameReader(r, wire.MaxLogFrame)
		body, err := fr.Next()
		runtime.ReadMemStats(&after)
		var fe *wire.FrameTooLargeError
		if !errors.As(err, &fe) || fe.Size != 4<<30 || fe.Limit != wire.MaxLogFrame || body != nil {
			t.Fatalf("oneByte=%v: %v, want *FrameTooLargeError{4 GiB, %d}", oneByte, err, wire.MaxLogFrame)
		}
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc >= budget {
			t.Fatalf("oneByte=%v: reader allocated %d bytes for a rejected 4 GiB frame, budget %d", oneByte, alloc, budget)
		}
	}
	// A limit above MaxAnyFrame is clipped.
	fr := wire.NewFrameReader(bytes.NewReader(postcard.AppendLen(nil, wire.MaxAnyFrame+1)), 1<<40)
	var fe *wire.FrameTooLargeError
	if _, err := fr.Next(); !errors.As(err, &fe) || fe.Limit != wire.MaxAnyFrame {
		t.Fatalf("limit not clipped: %v", err)
	}
}

func TestFrameReaderBufferedAndSetLimit(t *testing.T) {
	s, _ := wire.AppendFrame(nil, 100, appendBody([]byte("head")))
	s = append(s, "raw tail"...)
	br := bufio.NewReader(bytes.NewReader(s))
	fr := wire.NewFrameReader(br, 100)
	if fr.Buffered() != br {
		t.Fatal("a *bufio.Reader must be used as is")
	}
	if b, err := fr.Next(); err != nil || string(b) != "head" {
		t.Fatalf("Next = %q, %v", b, err)
	}
	rest, _ := io.ReadAll(fr.Buffered())
	if string(rest) != "raw tail" {
		t.Fatalf("raw bytes after the frame: %q", rest)
	}
	s2, _ := wire.AppendFrame(nil, 100, appendBody(make([]byte, 50)))
	fr = wire.NewFrameReader(bytes.NewReader(append(s2, s2...)), 100)
	if _, err := fr.Next(); err != nil {
		t.Fatal(err)
	}
	fr.SetLimit(49)
	var fe *wire.FrameTooLargeError
	if _, err := fr.Next(); !errors.As(err, &fe) || fe.Limit != 49 {
		t.Fatalf("after SetLimit: %v", err)
	}
}

func TestEnvelopeFrame(t *testing.T) {
	reg := testRegistry(t)
	e := &wire.Envelope{Protocol: wire.V(1, 0), MessageID: wire.NewMessageId(),
		Payload: &wire.WireErrorV1{Code: wire.ErrCodeOverloaded, Retry: wire.RetryBackoff, Message: "busy"}}
	b, err := wire.AppendEnvelopeFrame(nil, wire.MaxControlFrame, e)
	if err != nil {
		t.Fatal(err)
	}
	body, err := wire.NewFrameReader(iotest.OneByteReader(bytes.NewReader(b)), wire.MaxControlFrame).Next()
	if err != nil {
		t.Fatal(err)
	}
	got, err := wire.DecodeEnvelope(body, reg)
	if err != nil || got.MessageID != e.MessageID || *got.Payload.(*wire.WireErrorV1) != *e.Payload.(*wire.WireErrorV1) {
		t.Fatalf("envelope frame: %+v, %v", got, err)
	}
	if _, err := wire.AppendEnvelopeFrame(nil, 10, e); err == nil {
		t.Fatal("envelope over the limit was written")
	}
}

func TestStreamHeader(t *testing.T) {
	for k := wire.StreamKind(0); k < wire.NumStreamKinds; k++ {
		h := wire.StreamHeader{Kind: k, Version: wire.V(1, 3)}
		f := wire.AppendStreamHeaderFrame(nil, h)
		body, err := wire.NewFrameReader(bytes.NewReader(f), wire.MaxStreamHeaderFrame).Next()
		if err != nil {
			t.Fatal(err)
		}
		got, err := wire.ParseStreamHeader(body)
		if err != nil || got != h {
			t.Fatalf("kind %v: %+v, %v", k, got, err)
		}
		if !k.Valid() {
			t.Fatalf("%v invalid", k)
		}
	}
	// Unknown kind.
	_, err := wire.ParseStreamHeader([]byte{byte(wire.NumStreamKinds), 1, 0})
	if !errors.Is(err, postcard.ErrBadEnum) {
		t.Fatalf("unknown kind: %v, want ErrBadEnum", err)
	}
	if _, err := wire.ParseStreamHeader([]byte{0, 1, 0, 0}); !errors.Is(err, postcard.ErrTrailingBytes) {
		t.Fatalf("trailing: %v", err)
	}
	if _, err := wire.ParseStreamHeader([]byte{0, 1}); !errors.Is(err, postcard.ErrUnexpectedEnd) {
		t.Fatalf("short: %v", err)
	}
	if wire.StreamKind(9).Valid() || wire.StreamKind(9).String() != "stream-kind(9)" {
		t.Fatal("kind 9")
	}
	want := map[wire.StreamKind]int{
		wire.StreamControl: wire.MaxControlFrame, wire.StreamHeartbeat: wire.MaxControlFrame,
		wire.StreamLog: wire.MaxLogFrame, wire.StreamCasUpload: wire.MaxCasHeaderFrame,
		wire.StreamCasDownload: wire.MaxCasHeaderFrame, wire.StreamSecret: wire.MaxControlFrame,
	}
	for k, l := range want {
		if k.FrameLimit() != l {
			t.Errorf("%v.FrameLimit() = %d, want %d", k, k.FrameLimit(), l)
		}
	}
}

// TestStableNumbers pins the wire numbers and names of every enum in the
// wire root: changing one is a protocol break (§159–160).
func TestStableNumbers(t *testing.T) {
	closeCodes := []struct {
		c    wire.CloseCode
		n    uint32
		name string
	}{
		{wire.CloseNormal, 0, "Normal"}, {wire.CloseShutdown, 1, "Shutdown"}, {wire.CloseProtocolError, 2, "ProtocolError"},
		{wire.CloseAuthenticationFailure, 3, "AuthenticationFailure"}, {wire.CloseVersionMismatch, 4, "VersionMismatch"},
		{wire.CloseSessionFenced, 5, "SessionFenced"}, {wire.CloseRunnerDisabled, 6, "RunnerDisabled"},
		{wire.CloseInternalError, 7, "InternalError"}, {wire.CloseRegistrationTimeout, 8, "RegistrationTimeout"},
		{wire.CloseLimitExceeded, 9, "LimitExceeded"}, {wire.CloseOverloaded, 10, "Overloaded"},
		{wire.CloseIdleTimeout, 11, "IdleTimeout"},
	}
	for _, c := range closeCodes {
		if uint32(c.c) != c.n || c.c.String() != c.name || !c.c.Known() {
			t.Errorf("CloseCode %d: %d %q", c.n, c.c, c.c.String())
		}
	}
	if wire.CloseCode(12).Known() || wire.CloseCode(12).String() != "CloseCode(12)" {
		t.Error("CloseCode 12 must be unknown")
	}
	errCodes := []string{"", "Malformed", "UnknownMessage", "UnsupportedVersion", "NotRegistered", "InvalidState",
		"RoleForbidden", "RateLimited", "Overloaded", "FrameTooLarge", "StaleLease", "StaleSession",
		"SessionFenced", "NotFound", "Forbidden", "InvalidValue", "Timeout", "LimitExceeded",
		"RunnerDisabled", "Draining", "Internal", "StorageUnavailable"}
	for n, name := range errCodes {
		c := wire.ProtocolErrorCode(n)
		if n == 0 {
			if c.Known() || c.String() != "ErrorCode(0)" {
				t.Error("ProtocolErrorCode 0 must be unknown")
			}
			continue
		}
		if c.String() != name || !c.Known() {
			t.Errorf("ProtocolErrorCode %d = %q, want %q", n, c.String(), name)
		}
	}
	if wire.ErrCodeMalformed != 1 || wire.ErrCodeFrameTooLarge != 9 || wire.ErrCodeInternal != 20 || wire.ErrCodeStorageUnavailable != 21 ||
		wire.ProtocolErrorCode(22).Known() || wire.ProtocolErrorCode(22).String() != "ErrorCode(22)" {
		t.Error("ProtocolErrorCode numbering")
	}
	retry := []string{"Never", "Immediately", "Backoff", "Resync", "Unsupported"}
	for n, name := range retry {
		if wire.RetryClass(n).String() != name {
			t.Errorf("RetryClass %d = %q, want %q", n, wire.RetryClass(n), name)
		}
	}
	if wire.RetryNever != 0 || wire.RetryUnsupported != 4 || wire.RetryClass(5).String() != "RetryClass(5)" {
		t.Error("RetryClass numbering")
	}
	kinds := []string{"control", "heartbeat", "log", "cas-upload", "cas-download", "diagnostic", "device", "signing", "secret"}
	for n, name := range kinds {
		if wire.StreamKind(n).String() != name {
			t.Errorf("StreamKind %d = %q", n, wire.StreamKind(n))
		}
	}
	if wire.StreamSecret != 8 || wire.FamilyCommon != 0 || wire.FamilyDevice != 7 {
		t.Error("stream kind / family numbering")
	}
	feats := map[wire.ProtocolFeature]string{1: "LogResumeV1", 2: "CasRangeResumeV1", 3: "DeviceControlV1",
		4: "LogCompressionV1", 5: "SigningV1", 6: "TraceContextV1", 7: "RetryAfterV1"}
	for f, name := range feats {
		if f.String() != name {
			t.Errorf("feature %d = %q", f, f)
		}
	}
}

func TestCloseFrame(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes
	f := wire.CloseFrame{Code: wire.CloseSessionFenced, Reason: long}
	b := f.AppendPostcard(nil)
	var got wire.CloseFrame
	d := postcard.NewDecoder(b)
	got.DecodePostcard(&d)
	if err := d.Finish(); err != nil || got.Code != f.Code || got.Reason != long[:wire.MaxCloseReason] {
		t.Fatalf("CloseFrame: %+v %v", got, err)
	}
	// A peer sending an over-long reason is refused.
	bad := postcard.AppendString(postcard.AppendU32(nil, 0), strings.Repeat("x", wire.MaxCloseReason+1))
	d = postcard.NewDecoder(bad)
	got.DecodePostcard(&d)
	if !errors.Is(d.Err(), postcard.ErrLengthOverBound) {
		t.Fatalf("over-long reason: %v", d.Err())
	}
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{{"abc", 5, "abc"}, {"abc", 2, "ab"}, {"é", 1, ""}, {"aé", 2, "a"}, {"€x", 3, "€"}, {"", 0, ""}} {
		if got := wire.TruncateUTF8(c.s, c.n); got != c.want {
			t.Errorf("TruncateUTF8(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
}

// FuzzFrameReader feeds arbitrary bytes to a reader with a 4 KiB limit: it
// must never panic and never return a frame above the limit.
func FuzzFrameReader(f *testing.F) {
	ok, _ := wire.AppendFrame(nil, 4096, appendBody([]byte("hello")))
	f.Add(ok)
	f.Add(append(bytes.Repeat([]byte{0x80}, 10), 0))
	f.Add(postcard.AppendLen(nil, 4097))
	f.Add(postcard.AppendLen(nil, 4<<30))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, in []byte) {
		const limit = 4 << 10
		fr := wire.NewFrameReader(bytes.NewReader(in), limit)
		total := 0
		for i := 0; i <= len(in); i++ { // every frame consumes at least one byte
			b, err := fr.Next()
			if err != nil {
				var fe *wire.FrameTooLargeError
				switch {
				case err == io.EOF, err == io.ErrUnexpectedEOF, errors.Is(err, wire.ErrFramePrefix):
				case errors.As(err, &fe):
					if fe.Size <= limit {
						t.Fatalf("FrameTooLargeError for %d bytes", fe.Size)
					}
				default:
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if len(b) > limit {
				t.Fatalf("frame of %d bytes above limit", len(b))
			}
			total += 1 + len(b)
			if total > len(in) {
				t.Fatalf("read %d bytes of frames from %d input bytes", total, len(in))
			}
		}
		t.Fatal("reader did not terminate")
	})
}

// TestFrameReaderNegativeLimit: a negative limit must refuse every non-empty
// frame, not wrap around to "no limit" and allocate whatever a peer declares.
func TestFrameReaderNegativeLimit(t *testing.T) {
	s := postcard.AppendLen(nil, 4<<30)
	var fe *wire.FrameTooLargeError
	if _, err := wire.NewFrameReader(bytes.NewReader(s), -1).Next(); !errors.As(err, &fe) {
		t.Fatalf("NewFrameReader(-1): %v, want *FrameTooLargeError", err)
	}
	fr := wire.NewFrameReader(bytes.NewReader(s), 100)
	fr.SetLimit(-5)
	if _, err := fr.Next(); !errors.As(err, &fe) {
		t.Fatalf("SetLimit(-5): %v, want *FrameTooLargeError", err)
	}
}
