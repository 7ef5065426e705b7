// Package enginetest is the test harness shared by the tests of the two
// engines, semantics/daemon and semantics/agent: a World is one daemon
// (with a PKI and an SQLite authority, or one given) served on one backend
// (memory, QUIC, yamux, WebTransport), StartAgent runs real agents against
// it, RawClient is a hand-driven agent for protocol-violation tests, and
// CountingExec, Offer and the Await helpers drive leases through them.
//
// It imports testing, both engines and the backends; only test files may
// import it, never a production package.
package enginetest
