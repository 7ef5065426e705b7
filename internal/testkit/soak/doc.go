// Package soak is the fault-injection soak (issue 15 item 6): a seeded run
// of many lease lifecycles over the memory backend and real loopback
// backends (QUIC, TLS+yamux, WebTransport) against one daemon per backend
// with a durable SQLite authority, while it injects connection cuts,
// duplicated and reordered deliveries, authority errors and latency, daemon
// crash/restart and clock steps. After every lifecycle it checks that the
// attempt's completion is recorded exactly once, that it ran once, that its
// log is complete and in order in the daemon's log store and that its
// output is stored in the content store with the right digest.
//
// The package holds only tests: TestSoak runs it (a short run in `make
// test`, 10,000 lifecycles in `make soak`); its flags are -soak.seed,
// -soak.n, -soak.backends, -soak.faults and -soak.inflight. The fault
// schedule is a pure function of the seed (and n and the backend list):
// which lifecycle gets which faults, with which parameters, and after which
// lifecycles the daemon crashes or its clock steps. The wall-clock
// interleaving of goroutines, sockets and SQLite commits is not
// reproducible, so "reproducible" means the same seed gives the same fault
// schedule (the run prints a digest of it), not the same execution. See
// docs/perf.md, "Fault-injection soak".
package soak
