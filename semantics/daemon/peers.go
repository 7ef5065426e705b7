package daemon

import (
	"slices"
	"sync"

	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
)

// peerTable keeps, per transport of a signing worker or device agent, the
// capability labels it registered with (a signing worker advertises its
// keys there), and the device reservations (device.go). Entries of
// transports that ended are pruned at the next registration; lookups only
// consider live transports.
type peerTable struct {
	mu     sync.Mutex
	labels map[wire.TransportSessionId][]string
	res    reservations // device.go
}

// note records c's registration capabilities when c is a signing worker or
// a device agent.
func (p *peerTable) note(c *conn, caps agentwire.RunnerCapabilitiesV1) {
	_, _, _, role := c.ident()
	if role != agentwire.RoleSigningWorker && role != agentwire.RoleDeviceAgent {
		return
	}
	d := c.d
	d.mu.Lock()
	live := make(map[wire.TransportSessionId]bool, len(d.conns))
	for t := range d.conns {
		live[t] = true
	}
	d.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.labels == nil {
		p.labels = map[wire.TransportSessionId][]string{}
	}
	for t := range p.labels {
		if !live[t] {
			delete(p.labels, t)
		}
	}
	p.labels[c.transport] = slices.Clone(caps.Labels)
}

func (p *peerTable) labelsOf(t wire.TransportSessionId) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.labels[t]
}

// peerConns returns the active, unfenced transports of role, newest first;
// only runner's when runner is not zero.
func (d *Daemon) peerConns(role agentwire.PeerRole, runner wire.RunnerId) []*conn {
	d.mu.Lock()
	var out []*conn
	for _, c := range d.conns {
		r, _, _, ro := c.ident()
		if ro == role && (runner == (wire.RunnerId{}) || r == runner) {
			out = append(out, c)
		}
	}
	d.mu.Unlock()
	out = slices.DeleteFunc(out, func(c *conn) bool { return !c.active() || c.channel() == nil })
	slices.SortFunc(out, func(a, b *conn) int { return b.connectedAt.Compare(a.connectedAt) })
	return out
}
