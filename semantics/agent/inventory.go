package agent

import (
	"crypto/sha256"
	"slices"

	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// Capabilities (§94–95, §236): the agent registers with its capability
// snapshot and digest, sends a full CapabilityUpdateV1 whenever the host
// changes them (SetCapabilities, e.g. after a configuration reload), and
// answers the daemon's RefreshCapabilitiesV1 with its current snapshot.

// capabilities returns the current snapshot and its digest.
func (a *Agent) capabilities() (agentwire.RunnerCapabilitiesV1, wire.CapabilityDigest) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.caps, a.digest
}

func (a *Agent) capabilityDigest() wire.CapabilityDigest {
	_, d := a.capabilities()
	return d
}

// Capabilities returns the capability snapshot the agent reports.
func (a *Agent) Capabilities() agentwire.RunnerCapabilitiesV1 {
	c, _ := a.capabilities()
	c.Labels, c.Tools = slices.Clone(c.Labels), slices.Clone(c.Tools)
	return c
}

// SetCapabilities replaces the capability snapshot (zero OS, Arch and
// MaxParallel keep the current values). When it differs from the current
// one the new snapshot is sent to the daemon as CapabilityUpdateV1 on the
// current link (and registers with it on every later link). It reports
// whether the snapshot changed; an invalid snapshot is an error and
// changes nothing.
func (a *Agent) SetCapabilities(c agentwire.RunnerCapabilitiesV1) (bool, error) {
	c.Labels, c.Tools = slices.Clone(c.Labels), slices.Clone(c.Tools)
	a.mu.Lock()
	if c.OS == "" {
		c.OS = a.caps.OS
	}
	if c.Arch == "" {
		c.Arch = a.caps.Arch
	}
	if c.MaxParallel == 0 {
		c.MaxParallel = a.caps.MaxParallel
	}
	a.mu.Unlock()
	if err := c.Validate(); err != nil {
		return false, err
	}
	digest := wire.CapabilityDigest{Digest: sha256.Sum256(c.AppendPostcard(nil))}
	a.mu.Lock()
	if digest == a.digest {
		a.mu.Unlock()
		return false, nil
	}
	a.caps, a.digest = c, digest
	l := a.link
	a.mu.Unlock()
	a.log.Info("capabilities changed", "labels", c.Labels, "max_parallel", c.MaxParallel)
	if l != nil {
		a.syncCapabilities(l)
	} // else: the link being set up sends it (serve), a later one registers with it
	return true, nil
}

// syncCapabilities sends CapabilityUpdateV1 on l when the daemon behind it
// has not seen the current snapshot (l.capDigest: what l registered with
// or last sent). Called when the snapshot changes and when l starts being
// served, so a change racing a reconnect is never lost.
func (a *Agent) syncCapabilities(l *link) {
	a.mu.Lock()
	if l.capDigest == a.digest {
		a.mu.Unlock()
		return
	}
	c, d := a.caps, a.digest
	l.capDigest = d
	a.mu.Unlock()
	if _, err := l.ch.SendMsg(&agentwire.CapabilityUpdateV1{Digest: d, Full: c}); err == nil {
		a.st.capUpdates.Add(1)
	}
}

// answerRefresh answers RefreshCapabilitiesV1 with the current snapshot,
// correlated to the command.
func (a *Agent) answerRefresh(l *link, env *wire.Envelope) {
	c, d := a.capabilities()
	if err := l.ch.Reply(env, &agentwire.CapabilityUpdateV1{Digest: d, Full: c}); err == nil {
		a.st.capUpdates.Add(1)
	}
}
