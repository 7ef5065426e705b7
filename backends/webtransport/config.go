package webtransport

import (
	"time"

	fyquic "forgeyard.dev/transport/backends/quic"
)

// Path is the well-known HTTP path of the agent endpoint.
const Path = "/.well-known/forgeyard/agent"

// ApplicationProtocol is negotiated per session (WT-Available-Protocols).
const ApplicationProtocol = fyquic.ALPN

// Config is the QUIC configuration of backends/quic (zero value ready;
// validated and copied on entry; see its field docs).
type Config = fyquic.Config

// h3Streams is the stream credit HTTP/3 itself uses beyond WebTransport
// streams: the CONNECT request stream, the control and two QPACK
// unidirectional streams, plus slack.
const h3Streams = 8

// acceptQueue bounds sessions established but not yet Accepted; beyond it
// new sessions are closed with CloseOverloaded.
const acceptQueue = 64

// hintMaxRTT is cfg.DelayHintMaxRTT (≤ 0: no DelayHint).
func hintMaxRTT(cfg Config) time.Duration { return cfg.DelayHintMaxRTT }
