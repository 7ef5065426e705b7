package agent_test

import (
	"errors"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
)

// TestNoCommonMajorRejected: the agent's Run returns the daemon's message
// naming both ranges, promptly and without spinning.
func TestNoCommonMajorRejected(t *testing.T) {
	enginetest.Backends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b, func(c *daemon.Config) { c.Protocol = wire.ProtocolRange{Min: wire.V(3, 0), Max: wire.V(4, 2)} })
		id := w.NewIdentity()
		_, _, runErr := w.StartAgent(id, enginetest.NewCountingExec(false), func(c *agent.Config) {
			c.Protocol = wire.ProtocolRange{Min: wire.V(1, 0), Max: wire.V(2, 1)}
		})
		var err error
		select {
		case err = <-runErr:
		case <-time.After(10 * time.Second):
			t.Fatal("Run kept retrying a version mismatch")
		}
		var ve *agent.VersionError
		if !errors.As(err, &ve) {
			t.Fatalf("Run returned %v, want *agent.VersionError", err)
		}
		const want = "no common protocol version: server supports 3.0–4.2, agent supports 1.0–2.1"
		if err.Error() != want {
			t.Fatalf("message %q, want %q", err, want)
		}
		if ve.ServerRange != (wire.ProtocolRange{Min: wire.V(3, 0), Max: wire.V(4, 2)}) {
			t.Fatalf("server range %s", ve.ServerRange)
		}
		if st := w.D.Stats(); st.Registrations != 0 || st.Rejections != 1 {
			t.Fatalf("daemon stats %+v: want one rejection, no registration", st)
		}
	})
}
