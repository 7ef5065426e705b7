package authority

import (
	"context"
	"database/sql"

	"forgeyard.dev/transport/wire"
)

// MaxPeers bounds Peers.HeldBy's answer.
const MaxPeers = 1 << 20

// Peer is where one session a daemon held was connected: the backend
// ("" when the inventory has no presence record of it), the remote
// address the daemon saw (Registration.Remote), and the session and the
// transport of its last registration (a restarted daemon derives the
// session's restart token from them, semantics.DeriveRestartToken).
type Peer struct {
	Backend   string
	Remote    string
	Session   wire.AgentSessionId
	Transport wire.TransportSessionId
}

// Peers lists the live sessions a daemon holds according to the
// authority. A daemon that restarts after a crash reads them before it
// serves, to tell those agents at once that their connections are gone
// (restart hints, docs/protocols/internal/restart-hint.md) instead of
// letting each find out at its next heartbeat. Both SQL stores implement
// it; obtain it with PeersOf.
type Peers interface {
	// HeldBy returns the sessions not ended whose last registration was
	// with daemon (Config.ID) and whose transport the inventory does not
	// record as ended, at most min(limit, MaxPeers) (limit ≤ 0: MaxPeers).
	HeldBy(ctx context.Context, daemon string, limit int) ([]Peer, error)
}

// PeersOf returns a's Peers, or nil if a has none (an Authority
// implemented outside this package).
func PeersOf(a Authority) Peers {
	return optionalOr[Peers](a)
}

var _ Peers = (*store)(nil)

func (s *store) HeldBy(ctx context.Context, daemon string, limit int) ([]Peer, error) {
	if limit <= 0 || limit > MaxPeers {
		limit = MaxPeers
	}
	var out []Peer
	err := s.tx(ctx, func(t *sql.Tx) error {
		out = out[:0]
		rows, err := t.QueryContext(ctx, s.rebind(`SELECT s.remote, COALESCE(p.backend, ''), s.session_id, s.transport_id FROM fy_sessions s
			LEFT JOIN fy_runner_presence p ON p.session_id = s.session_id
			WHERE s.daemon = ? AND s.ended = ? AND (p.session_id IS NULL OR (p.connected = ? AND p.daemon = ?))
			LIMIT ?`), daemon, false, true, daemon, limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var p Peer
			var session, transport []byte
			if err := rows.Scan(&p.Remote, &p.Backend, &session, &transport); err != nil {
				return err
			}
			copy(p.Session.ULID[:], session)
			copy(p.Transport.ULID[:], transport)
			out = append(out, p)
		}
		return rows.Err()
	})
	return out, err
}
