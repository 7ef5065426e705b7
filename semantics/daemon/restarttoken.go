package daemon

import (
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// restartTokenBackends are the backends whose agents get a restart token:
// the UDP ones, whose connections a crash leaves without a word (a TCP
// agent reads EOF from its kernel at once).
var restartTokenBackends = map[string]bool{"quic": true, "webtransport": true}

// sendRestartToken gives the agent the restart token of this transport
// (agentwire.RestartTokenV1; docs/protocols/internal/restart-hint.md):
// with Config.RestartTokenKey set, on a QUIC or WebTransport connection,
// to an agent that negotiated wire.FeatureRestartTokenV1. The daemon keeps
// no token: after a crash it derives them again from the sessions and
// transports the authority lists (authority.Peers.HeldBy).
func (c *conn) sendRestartToken() {
	key := c.d.cfg.RestartTokenKey
	if len(key) < 32 || !c.features.Has(wire.FeatureRestartTokenV1) || !restartTokenBackends[c.bc.Backend()] {
		return
	}
	ch := c.channel()
	if ch == nil {
		return
	}
	_, sess, _, _ := c.ident()
	tok := semantics.DeriveRestartToken(key, sess, c.transport)
	if _, err := ch.SendMsg(&agentwire.RestartTokenV1{TransportSession: c.transport, KeyID: tok.KeyID, Token: tok.Token}); err == nil {
		c.d.st.restartTokens.Add(1)
	}
}
