// Package yamux is the TLS-over-TCP backend of Forgeyard Transport: TLS 1.3
// (ALPN "forgeyard/1") over one TCP connection, multiplexed with
// hashicorp/yamux v0.1.2 (ARCHITECTURE.md decision 8). It is the path for
// networks where UDP is blocked. This is the only package that imports
// github.com/hashicorp/yamux.
//
// yamux lacks three things the semantics layer needs, and this package adds
// them on a dedicated internal control stream that the dialer opens right
// after the session starts and the listener accepts before handing the
// connection out (it never reaches AcceptStream):
//
//   - Close codes. yamux's GoAway carries no application code, so
//     CloseWithCode writes a final close record (wire.CloseFrame) on the
//     control stream, waits a bounded time for the peer to drop the
//     connection, then closes the session. A peer that received the record
//     reports *semantics.ConnError{Code, Reason, Remote: true}. A session that
//     dies without a record is a network failure: CloseInternalError with
//     reason "connection lost" and Remote: true, or CloseIdleTimeout
//     (Remote: false) when nothing was received for Config.IdleTimeout or the
//     socket stopped accepting writes for Config.WriteTimeout.
//   - Stream reset codes. yamux v0.1.2 has no public stream reset (Close is a
//     half-close FIN; an RST is sent only internally), so CancelWrite and
//     CancelRead send a ResetStream / StopSending record naming the yamux
//     stream ID and the code. A reset's FIN is deferred until the peer
//     acknowledges the record, so the peer can never mistake it for a clean
//     end of stream.
//   - Unidirectional streams. Every stream starts with a one-byte marker
//     (bidirectional, unidirectional or control), written when it is opened.
//
// Wire format, after the TLS 1.3 handshake: the listener, once it has
// verified the client certificate, writes one byte 0x46 over TLS (in TLS
// 1.3 the client's handshake completes before the server has judged its
// certificate, so Dial waits for this byte and fails cleanly when the client
// is rejected); then yamux (dialer = yamux client). The first yamux stream,
// opened by the dialer, is the control stream. Every stream's first byte is
// its marker: 0x00 bidirectional, 0x01 unidirectional, 0x02 control. The
// control stream carries length-prefixed Postcard records (ControlRecordV1
// in conn.go: Close, ResetStream, StopSending, ResetAck), each at most 512
// bytes; an unknown or malformed record closes the connection with
// CloseProtocolError.
//
// HTTP/1.1 Upgrade form (upgrade.go), for TLS port 443 behind HTTP-aware
// middleboxes: the same listener also accepts clients that negotiated ALPN
// "http/1.1" (or none); they send "GET /.well-known/forgeyard/agent" with
// "Connection: Upgrade" and "Upgrade: forgeyard-yamux/1", the listener
// answers 101 and then the ready byte, and the rest is the raw form. The
// two forms are told apart by ALPN, never by sniffing. Dialer.Upgrade
// selects it; Dialer.DialContext makes the TCP connection (e.g. through an
// HTTP CONNECT proxy).
//
// Deadlines everywhere (hashicorp/yamux#142): every write to the socket has a
// deadline (Config.WriteTimeout), every read an idle deadline
// (Config.IdleTimeout, kept alive by pings every Config.KeepAliveInterval),
// the handshake a timeout, and the close record a bounded flush.
//
// Priorities survive TCP by bounding the kernel's unsent send queue with
// TCP_NOTSENT_LOWAT (Config.NotSentLowat) and by implementing
// semantics.BulkHinter: Conn.QueuedBytes reports bytes inside yamux's send
// path plus the socket's unsent bytes (SIOCOUTQNSD, tcpi_notsent_bytes; read
// about once per 64 KiB written, an upper bound in between: queue.go), so
// the semantics scheduler keeps bulk data from building a queue in front of
// control frames. docs/perf/backends-yamux.md has the measurements.
package yamux
