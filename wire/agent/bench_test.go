package agent

import (
	"testing"

	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/postcard"
)

func benchMessages(b *testing.B) []wire.Message {
	return []wire.Message{
		first[*LeaseOfferV1](b), first[*HeartbeatV1](b), first[*RegisterAgentV1](b),
		first[*AttemptCompletionV1](b), first[*AgentResyncV1](b),
	}
}

func BenchmarkAppendPostcard(b *testing.B) {
	for _, m := range benchMessages(b) {
		b.Run(nameOf(m), func(b *testing.B) {
			buf := make([]byte, 0, 4096)
			b.ReportAllocs()
			for b.Loop() {
				buf = m.AppendPostcard(buf[:0])
			}
			b.SetBytes(int64(len(buf)))
		})
	}
}

func BenchmarkDecodeReused(b *testing.B) {
	for _, m := range benchMessages(b) {
		b.Run(nameOf(m), func(b *testing.B) {
			enc := m.AppendPostcard(nil)
			dst := infoOf(b, m).New()
			var d postcard.Decoder
			b.ReportAllocs()
			b.SetBytes(int64(len(enc)))
			for b.Loop() {
				d.Reset(enc)
				dst.DecodePostcard(&d)
			}
			if d.Err() != nil {
				b.Fatal(d.Err())
			}
		})
	}
}
