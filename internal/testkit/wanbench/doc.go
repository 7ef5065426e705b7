// Package wanbench is the WAN benchmark of issue 19 (`make bench-wan`); it
// has no non-test code. BenchmarkWAN builds one emulated path per cell of
// RTT {0, 10, 50, 100 ms} × random loss {0, 0.5 %} with internal/tools/netsim
// (bandwidth 50 Mbit/s each way, a drop-tail bottleneck queue of one BDP,
// at least 10 ms), and measures on it, per backend — quic, webtransport,
// yamux, relay+yamux, relay+webtransport — and, in the same run on the same
// path, per raw library — quic-go, TLS+yamux (backends/{quic,yamux}/wanraw)
// and TLS over plain TCP:
//
//   - connect: dial (handshakes) plus the first 64-byte stream round trip;
//   - idle: 64-byte control round trips, p50/p99;
//   - under bulk: the same round trips while one and then four bulk
//     streams (daemon → agent, CAS-download streams on our side, paced by
//     the semantics scheduler) saturate the path, p50/p99, and the bulk
//     goodput over the same interval;
//   - cas: one object uploaded with semantics/cas (SHA-256 verified by
//     the daemon side), MB/s, beside the raw single-stream goodput;
//   - register: a real semantics/agent registering with a real
//     semantics/daemon (SQLite in memory) over the path, beside the raw
//     connect time.
//
// Through the relay only the agent ↔ relay leg is impaired; relay ↔
// daemon is loopback QUIC. The raw baseline of a relay row is the raw
// library of its impaired leg.
//
// It prints the tables and writes them to $FY_WAN_OUT (the Makefile sets
// out/bench-wan.md). Knobs: FY_WAN_PATHS ("0/0,50/0.5": RTT ms / loss %),
// FY_WAN_BACKENDS (comma list), FY_WAN_MEASURE (per-phase measuring time,
// default 2s), FY_WAN_MBIT (path bandwidth, default 50), FY_WAN_VARIANTS
// (extra quic rows: "wan" — 4 MiB stream / 8 MiB connection receive
// windows; "hint" — the DelayHint on every path). docs/perf.md
// ("WAN paths") has the results, the emulation's limits and the command.
package wanbench
