package codecbench

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
	"google.golang.org/protobuf/proto"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/internal/codecbench/pb"
	"forgeyard.dev/transport/wire/logs"
	"forgeyard.dev/transport/wire/postcard"
)

// vectorsPath locates the shared golden vectors; the repository sits beside
// shared/ (…/main/wire/internal/codecbench → …/shared).
const vectorsPath = "../../../../shared/postcard-vectors/vectors.json"

// ---- the lease-offer bench message ----

// leaseOfferBench is the exact message of the shared vector
// lease_offer/bench_value, the one timed in the Rust baseline. It is not
// agent.LeaseOfferV1, which has more fields:
//
//	struct LeaseOffer {
//	    lease: [u8;16], attempt: [u8;16], job: [u8;16], spec_id: [u8;32],
//	    expires_at: u64, payload_ref: PayloadRef { digest: [u8;32], size: u64 },
//	}
type leaseOfferBench struct {
	Lease         [16]byte `json:"lease"`
	Attempt       [16]byte `json:"attempt"`
	Job           [16]byte `json:"job"`
	SpecID        [32]byte `json:"spec_id"`
	ExpiresAt     uint64   `json:"expires_at,string"`
	PayloadDigest [32]byte `json:"-"`
	PayloadSize   uint64   `json:"-"`
}

func (m *leaseOfferBench) AppendPostcard(b []byte) []byte {
	b = append(b, m.Lease[:]...)
	b = append(b, m.Attempt[:]...)
	b = append(b, m.Job[:]...)
	b = append(b, m.SpecID[:]...)
	b = postcard.AppendU64(b, m.ExpiresAt)
	b = append(b, m.PayloadDigest[:]...)
	return postcard.AppendU64(b, m.PayloadSize)
}

func (m *leaseOfferBench) DecodePostcard(d *postcard.Decoder) {
	d.Array16(&m.Lease)
	d.Array16(&m.Attempt)
	d.Array16(&m.Job)
	d.Array32(&m.SpecID)
	m.ExpiresAt = d.U64()
	d.Array32(&m.PayloadDigest)
	m.PayloadSize = d.U64()
}

// ---- msgpack mirrors (plain structs, byte arrays encode as bin) ----

type mpAttempt struct {
	Attempt [16]byte
	Lease   [16]byte
	Phase   uint32
	LogSeq  uint64
}

type mpHeartbeat struct {
	Runner           [16]byte
	Session          [16]byte
	Seq              uint64
	ActiveAttempts   []mpAttempt
	CapabilityDigest [32]byte
	CPUMillis        uint32
	MemBytes         uint64
	DiskBytes        uint64
	RunningJobs      uint16
}

type mpPayloadRef struct {
	Digest [32]byte
	Size   uint64
}

type mpLeaseOffer struct {
	Lease      [16]byte
	Attempt    [16]byte
	Job        [16]byte
	SpecID     [32]byte
	ExpiresAt  uint64
	PayloadRef mpPayloadRef
}

type mpCasRef struct {
	Algorithm uint32
	Digest    [32]byte
	Size      uint64
}

type mpResult struct {
	Kind     uint32
	ExitCode int32
	Message  string
}

type mpCompletion struct {
	Job        [16]byte
	Attempt    [16]byte
	Lease      [16]byte
	Spec       [32]byte
	Result     mpResult
	Outputs    []mpCasRef
	LogLastSeq uint64
}

type mpLogFrame struct {
	Seq             uint64
	Stream          uint32
	TimestampMs     uint64
	UncompressedLen uint32
	Bytes           []byte
}

// ---- fixtures ----

type postcardMsg interface {
	AppendPostcard([]byte) []byte
	DecodePostcard(*postcard.Decoder)
}

type fixture struct {
	name string
	pc   postcardMsg
	pcTo func() postcardMsg // a fresh decode target
	pb   proto.Message
	mp   any
	mpTo func() any
}

type vectorJSON struct {
	Name  string          `json:"name"`
	Value json.RawMessage `json:"value"`
	Hex   string          `json:"hex"`
}

func loadVector(tb testing.TB, name string) (json.RawMessage, []byte) {
	tb.Helper()
	raw, err := os.ReadFile(vectorsPath)
	if err != nil {
		tb.Fatalf("codecbench: shared postcard vectors not found at %s: %v", vectorsPath, err)
	}
	var vs []vectorJSON
	if err := json.Unmarshal(raw, &vs); err != nil {
		tb.Fatal(err)
	}
	for _, v := range vs {
		if v.Name == name {
			b, err := hex.DecodeString(v.Hex)
			if err != nil {
				tb.Fatal(err)
			}
			return v.Value, b
		}
	}
	tb.Fatalf("codecbench: vector %s missing", name)
	return nil, nil
}

var phases = map[string]agent.AttemptPhase{
	"Preparing": agent.PhasePreparing, "Running": agent.PhaseRunning, "UploadingOutputs": agent.PhaseUploadingOutputs,
}

func heartbeatFixture(tb testing.TB) fixture {
	value, want := loadVector(tb, "heartbeat/bench_value")
	var v struct {
		Runner         [16]byte `json:"runner"`
		Session        [16]byte `json:"session"`
		Seq            uint64   `json:"seq,string"`
		ActiveAttempts []struct {
			Attempt [16]byte `json:"attempt"`
			Lease   [16]byte `json:"lease"`
			Phase   struct {
				Variant string `json:"variant"`
			} `json:"phase"`
			LogSeq uint64 `json:"log_seq,string"`
		} `json:"active_attempts"`
		CapabilityDigest [32]byte `json:"capability_digest"`
		Resources        struct {
			CPUMillis   uint32 `json:"cpu_millis"`
			MemBytes    uint64 `json:"mem_bytes,string"`
			DiskBytes   uint64 `json:"disk_bytes,string"`
			RunningJobs uint16 `json:"running_jobs"`
		} `json:"resources"`
	}
	if err := json.Unmarshal(value, &v); err != nil {
		tb.Fatal(err)
	}
	m := &agent.HeartbeatV1{Seq: v.Seq}
	m.Runner.ULID, m.Session.ULID = v.Runner, v.Session
	m.CapabilityDigest.Digest = v.CapabilityDigest
	m.Resources = agent.ResourceSummaryV1{CPUMillis: v.Resources.CPUMillis, MemBytes: v.Resources.MemBytes,
		DiskBytes: v.Resources.DiskBytes, RunningJobs: v.Resources.RunningJobs}
	p := &pb.Heartbeat{Runner: v.Runner[:], Session: v.Session[:], Seq: v.Seq, CapabilityDigest: v.CapabilityDigest[:],
		Resources: &pb.ResourceSummary{CpuMillis: v.Resources.CPUMillis, MemBytes: v.Resources.MemBytes,
			DiskBytes: v.Resources.DiskBytes, RunningJobs: uint32(v.Resources.RunningJobs)}}
	mp := &mpHeartbeat{Runner: v.Runner, Session: v.Session, Seq: v.Seq, CapabilityDigest: v.CapabilityDigest,
		CPUMillis: v.Resources.CPUMillis, MemBytes: v.Resources.MemBytes, DiskBytes: v.Resources.DiskBytes,
		RunningJobs: v.Resources.RunningJobs}
	for _, a := range v.ActiveAttempts {
		ph, ok := phases[a.Phase.Variant]
		if !ok {
			tb.Fatalf("unknown phase %q", a.Phase.Variant)
		}
		at := agent.ActiveAttemptV1{Phase: ph, LogSeq: a.LogSeq}
		at.Attempt.ULID, at.Lease.ULID = a.Attempt, a.Lease
		m.ActiveAttempts = append(m.ActiveAttempts, at)
		p.ActiveAttempts = append(p.ActiveAttempts, &pb.ActiveAttempt{Attempt: a.Attempt[:], Lease: a.Lease[:],
			Phase: pb.AttemptPhase(ph), LogSeq: a.LogSeq})
		mp.ActiveAttempts = append(mp.ActiveAttempts, mpAttempt{Attempt: a.Attempt, Lease: a.Lease, Phase: uint32(ph), LogSeq: a.LogSeq})
	}
	if len(m.ActiveAttempts) != 4 {
		tb.Fatalf("bench heartbeat has %d attempts, want 4", len(m.ActiveAttempts))
	}
	if got := m.AppendPostcard(nil); !bytes.Equal(got, want) {
		tb.Fatalf("heartbeat bytes differ from heartbeat/bench_value:\n got %x\nwant %x", got, want)
	}
	return fixture{name: "heartbeat", pc: m, pcTo: func() postcardMsg { return new(agent.HeartbeatV1) },
		pb: p, mp: mp, mpTo: func() any { return new(mpHeartbeat) }}
}

func leaseOfferFixture(tb testing.TB) fixture {
	value, want := loadVector(tb, "lease_offer/bench_value")
	var v struct {
		leaseOfferBench
		PayloadRef struct {
			Digest [32]byte `json:"digest"`
			Size   uint64   `json:"size,string"`
		} `json:"payload_ref"`
	}
	if err := json.Unmarshal(value, &v); err != nil {
		tb.Fatal(err)
	}
	m := v.leaseOfferBench
	m.PayloadDigest, m.PayloadSize = v.PayloadRef.Digest, v.PayloadRef.Size
	if got := m.AppendPostcard(nil); !bytes.Equal(got, want) {
		tb.Fatalf("lease offer bytes differ from lease_offer/bench_value:\n got %x\nwant %x", got, want)
	}
	p := &pb.LeaseOffer{Lease: m.Lease[:], Attempt: m.Attempt[:], Job: m.Job[:], SpecId: m.SpecID[:],
		ExpiresAt: m.ExpiresAt, PayloadRef: &pb.PayloadRef{Digest: m.PayloadDigest[:], Size: m.PayloadSize}}
	mp := &mpLeaseOffer{Lease: m.Lease, Attempt: m.Attempt, Job: m.Job, SpecID: m.SpecID, ExpiresAt: m.ExpiresAt,
		PayloadRef: mpPayloadRef{Digest: m.PayloadDigest, Size: m.PayloadSize}}
	return fixture{name: "lease_offer", pc: &m, pcTo: func() postcardMsg { return new(leaseOfferBench) },
		pb: p, mp: mp, mpTo: func() any { return new(mpLeaseOffer) }}
}

func seq16(base byte) (u [16]byte) {
	for i := range u {
		u[i] = base + byte(i)*3
	}
	return u
}

func seq32(base byte) (u [32]byte) {
	for i := range u {
		u[i] = base + byte(i)*7
	}
	return u
}

func completionFixture(tb testing.TB) fixture {
	m := &agent.AttemptCompletionV1{
		Result:     agent.ExecutionResultV1{Kind: agent.ResultSucceeded, ExitCode: 0},
		LogLastSeq: 48213,
	}
	m.Job.ULID, m.Attempt.ULID, m.Lease.ULID = seq16(1), seq16(60), seq16(120)
	m.Spec.Digest = seq32(9)
	sizes := []uint64{1234, 1 << 20, 5 << 30, 77}
	p := &pb.AttemptCompletion{Job: m.Job.ULID[:], Attempt: m.Attempt.ULID[:], Lease: m.Lease.ULID[:],
		Spec: m.Spec.Digest[:], Result: &pb.AttemptCompletion_Succeeded{Succeeded: &pb.Succeeded{ExitCode: 0}},
		LogLastSeq: m.LogLastSeq}
	mp := &mpCompletion{Job: m.Job.ULID, Attempt: m.Attempt.ULID, Lease: m.Lease.ULID, Spec: m.Spec.Digest,
		Result: mpResult{Kind: uint32(agent.ResultSucceeded)}, LogLastSeq: m.LogLastSeq}
	for i, s := range sizes {
		ref := wire.CasObjectRef{Algorithm: wire.DigestBLAKE3, Digest: wire.Digest(seq32(byte(40 * i))), Size: s}
		m.Outputs = append(m.Outputs, ref)
		p.Outputs = append(p.Outputs, &pb.CasObjectRef{Algorithm: pb.DigestAlgorithm_BLAKE3, Digest: ref.Digest[:], Size: s})
		mp.Outputs = append(mp.Outputs, mpCasRef{Algorithm: uint32(ref.Algorithm), Digest: ref.Digest, Size: s})
	}
	if err := m.Validate(); err != nil {
		tb.Fatal(err)
	}
	return fixture{name: "completion", pc: m, pcTo: func() postcardMsg { return new(agent.AttemptCompletionV1) },
		pb: p, mp: mp, mpTo: func() any { return new(mpCompletion) }}
}

func logFrameFixture(tb testing.TB) fixture {
	chunk := make([]byte, 64<<10)
	line := []byte("2026-11-29T13:26:25Z step 3/7: compiling forgeyard.dev/transport/wire ... ok\n")
	for i := range chunk {
		chunk[i] = line[i%len(line)]
	}
	m := &logs.LogFrameV1{Seq: 9001, Stream: logs.LogStdout, TimestampMs: 1767225600000,
		UncompressedLen: uint32(len(chunk)), Bytes: chunk}
	if err := m.Validate(); err != nil {
		tb.Fatal(err)
	}
	p := &pb.LogFrame{Seq: m.Seq, Stream: pb.LogStream_STDOUT, TimestampMs: m.TimestampMs,
		UncompressedLen: m.UncompressedLen, Bytes: chunk}
	mp := &mpLogFrame{Seq: m.Seq, Stream: uint32(m.Stream), TimestampMs: m.TimestampMs,
		UncompressedLen: m.UncompressedLen, Bytes: chunk}
	return fixture{name: "logframe_64k", pc: m, pcTo: func() postcardMsg { return new(logs.LogFrameV1) },
		pb: p, mp: mp, mpTo: func() any { return new(mpLogFrame) }}
}

func fixtures(tb testing.TB) []fixture {
	return []fixture{heartbeatFixture(tb), leaseOfferFixture(tb), completionFixture(tb), logFrameFixture(tb)}
}

func newMsgpackEncoder(w *bytes.Buffer) *msgpack.Encoder {
	enc := msgpack.NewEncoder(w)
	enc.UseCompactInts(true)         // smallest integer forms
	enc.UseArrayEncodedStructs(true) // no field names on the wire
	return enc
}

func encodeAll(tb testing.TB, f fixture) (pc, pbb, mp []byte) {
	pc = f.pc.AppendPostcard(nil)
	pbb, err := proto.MarshalOptions{}.MarshalAppend(nil, f.pb)
	if err != nil {
		tb.Fatal(err)
	}
	var buf bytes.Buffer
	if err := newMsgpackEncoder(&buf).Encode(f.mp); err != nil {
		tb.Fatal(err)
	}
	return pc, pbb, buf.Bytes()
}

// TestBaselinesEquivalent checks that every codec round-trips the same data,
// so the benchmarks compare like with like, and logs the encoded sizes.
func TestBaselinesEquivalent(t *testing.T) {
	for _, f := range fixtures(t) {
		pc, pbb, mp := encodeAll(t, f)
		d := postcard.NewDecoder(pc)
		got := f.pcTo()
		got.DecodePostcard(&d)
		if err := d.Finish(); err != nil {
			t.Fatalf("%s: postcard decode: %v", f.name, err)
		}
		if !reflect.DeepEqual(got, f.pc) {
			t.Fatalf("%s: postcard round trip differs", f.name)
		}
		gp := f.pb.ProtoReflect().New().Interface()
		if err := proto.Unmarshal(pbb, gp); err != nil || !proto.Equal(gp, f.pb) {
			t.Fatalf("%s: protobuf round trip: %v", f.name, err)
		}
		gm := f.mpTo()
		if err := msgpack.NewDecoder(bytes.NewReader(mp)).Decode(gm); err != nil || !reflect.DeepEqual(gm, f.mp) {
			t.Fatalf("%s: msgpack round trip: %v", f.name, err)
		}
		t.Logf("%-13s postcard %6d B  protobuf %6d B  msgpack %6d B", f.name, len(pc), len(pbb), len(mp))
		if len(pc) > len(pbb) || len(pc) > len(mp) {
			t.Errorf("%s: postcard (%d B) larger than protobuf (%d B) or msgpack (%d B)", f.name, len(pc), len(pbb), len(mp))
		}
	}
}

// TestZeroAllocEncode is the allocation target of the benchmarks as a test:
// postcard encode into a reused buffer and decode into a reused value
// allocate nothing.
func TestZeroAllocEncode(t *testing.T) {
	for _, f := range fixtures(t) {
		buf := f.pc.AppendPostcard(nil)
		if n := testing.AllocsPerRun(50, func() { buf = f.pc.AppendPostcard(buf[:0]) }); n != 0 {
			t.Errorf("%s: encode allocates %v times", f.name, n)
		}
		dst := f.pcTo()
		var d postcard.Decoder
		if n := testing.AllocsPerRun(50, func() {
			d.Reset(buf)
			dst.DecodePostcard(&d)
			if d.Finish() != nil {
				panic(d.Err())
			}
		}); n != 0 {
			t.Errorf("%s: decode into a reused value allocates %v times", f.name, n)
		}
	}
}

func BenchmarkEncode(b *testing.B) {
	for _, f := range fixtures(b) {
		pc, pbb, mp := encodeAll(b, f)
		b.Run("msg="+f.name+"/codec=postcard", func(b *testing.B) {
			buf := make([]byte, 0, 2*len(pc))
			b.SetBytes(int64(len(pc)))
			b.ReportAllocs()
			for b.Loop() {
				buf = f.pc.AppendPostcard(buf[:0])
			}
			b.ReportMetric(float64(len(buf)), "B/msg")
		})
		b.Run("msg="+f.name+"/codec=protobuf", func(b *testing.B) {
			buf := make([]byte, 0, 2*len(pbb))
			opts := proto.MarshalOptions{}
			b.SetBytes(int64(len(pbb)))
			b.ReportAllocs()
			var err error
			for b.Loop() {
				if buf, err = opts.MarshalAppend(buf[:0], f.pb); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(buf)), "B/msg")
		})
		b.Run("msg="+f.name+"/codec=msgpack", func(b *testing.B) {
			var buf bytes.Buffer
			buf.Grow(2 * len(mp))
			enc := newMsgpackEncoder(&buf)
			b.SetBytes(int64(len(mp)))
			b.ReportAllocs()
			for b.Loop() {
				buf.Reset()
				if err := enc.Encode(f.mp); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(buf.Len()), "B/msg")
		})
	}
}

func BenchmarkDecode(b *testing.B) {
	for _, f := range fixtures(b) {
		pc, pbb, mp := encodeAll(b, f)
		b.Run("msg="+f.name+"/codec=postcard", func(b *testing.B) {
			dst := f.pcTo()
			var d postcard.Decoder
			b.SetBytes(int64(len(pc)))
			b.ReportAllocs()
			for b.Loop() {
				d.Reset(pc)
				dst.DecodePostcard(&d)
				if err := d.Finish(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(pc)), "B/msg")
		})
		b.Run("msg="+f.name+"/codec=protobuf", func(b *testing.B) {
			dst := f.pb.ProtoReflect().New().Interface()
			opts := proto.UnmarshalOptions{}
			b.SetBytes(int64(len(pbb)))
			b.ReportAllocs()
			for b.Loop() {
				if err := opts.Unmarshal(pbb, dst); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(pbb)), "B/msg")
		})
		b.Run("msg="+f.name+"/codec=msgpack", func(b *testing.B) {
			dst := f.mpTo()
			rd := bytes.NewReader(mp)
			dec := msgpack.NewDecoder(rd)
			b.SetBytes(int64(len(mp)))
			b.ReportAllocs()
			for b.Loop() {
				rd.Reset(mp)
				if err := dec.Decode(dst); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(mp)), "B/msg")
		})
	}
}

// BenchmarkLogFrameZeroCopy measures what a log stream actually does with a
// 64 KiB chunk: it frames the envelope and message head
// (logs.AppendFrameHead) and hands the chunk to the stream as a second,
// vectored write, so the chunk is never copied into a frame buffer (§37).
// The contiguous encodes in BenchmarkEncode copy 64 KiB and are bound by
// memmove for every codec.
func BenchmarkLogFrameZeroCopy(b *testing.B) {
	f := logFrameFixture(b)
	m := f.pc.(*logs.LogFrameV1)
	env := &wire.Envelope{Protocol: wire.V(1, 0), MessageID: wire.NewMessageId(), SentAtMs: 1767225600000, Payload: m}
	buf := make([]byte, 0, 128)
	b.Run("msg=logframe_64k/codec=postcard-framehead", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(m.Bytes)))
		for i := 0; i < b.N; i++ {
			var err error
			if buf, err = logs.AppendFrameHead(buf[:0], wire.MaxLogFrame, env, m); err != nil {
				b.Fatal(err)
			}
		}
	})
}
