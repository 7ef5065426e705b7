// Package codecbench holds the codec benchmarks of the wire layer: encode and
// decode of four representative messages (a heartbeat with four active
// attempts, a lease offer, an attempt completion and a 64 KiB log frame) with
// our Postcard codec, and, in the same run, with google.golang.org/protobuf
// and github.com/vmihailenco/msgpack/v5 on equivalent messages.
//
// The heartbeat and lease-offer values are exactly the shared golden vectors
// heartbeat/bench_value and lease_offer/bench_value, the messages timed in
// the Rust postcard baseline; the benchmarks assert their bytes.
//
// The package has no non-test code besides this comment and the generated
// protobuf baseline in pb/. Run:
//
//	go test ./wire/internal/codecbench/ -run '^$' -bench . -benchmem -count 6
//
// Results are recorded in docs/perf/codec.md.
package codecbench
