package authority

import (
	"context"
	"database/sql"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"forgeyard.dev/transport/wire"
)

// The PostgreSQL notification channel of the authority's events (Watcher).
// The payload is "origin kind lease attempt session reason runner" (the
// runner field since EventRunner; a payload of six fields from an older
// build has none); origin is the random id of the store handle that
// committed the change, so a handle does not report its own changes back
// to its daemon, which delivered them itself — except the EventRunner
// re-checks (RunnerEventCheck, RunnerEventDisabled), which every daemon
// runs on its own transports.
const eventChannel = "fy_events"

// notify sends ev when t commits (PostgreSQL NOTIFY is transactional); a
// no-op on SQLite.
func (s *store) notify(ctx context.Context, t *sql.Tx, ev Event) error {
	if s.dsn == "" {
		return nil
	}
	payload := fmt.Sprintf("%s %d %x %x %x %d %x", s.origin, ev.Kind, ev.Lease.ULID[:], ev.Attempt.ULID[:], ev.Session.ULID[:], ev.Reason, ev.Runner.ULID[:])
	_, err := t.ExecContext(ctx, `SELECT pg_notify($1, $2)`, eventChannel, payload)
	return err
}

func parseEvent(p string) (origin string, ev Event, ok bool) {
	f := strings.Fields(p)
	if len(f) != 6 && len(f) != 7 {
		return "", ev, false
	}
	if len(f) == 7 {
		b, err := hex.DecodeString(f[6])
		if err != nil || len(b) != 16 {
			return "", ev, false
		}
		copy(ev.Runner.ULID[:], b)
	}
	kind, err1 := strconv.ParseUint(f[1], 10, 8)
	reason, err2 := strconv.ParseUint(f[5], 10, 32)
	if err1 != nil || err2 != nil {
		return "", ev, false
	}
	ev.Kind, ev.Reason = EventKind(kind), uint32(reason)
	for i, dst := range [][]byte{ev.Lease.ULID[:], ev.Attempt.ULID[:], ev.Session.ULID[:]} {
		b, err := hex.DecodeString(f[i+2])
		if err != nil || len(b) != 16 {
			return "", ev, false
		}
		copy(dst, b)
	}
	return f[0], ev, true
}

func (s *store) listen(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.Connect(ctx, s.dsn)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+eventChannel); err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// Watch backoff: full jitter (a random wait in [0, d)) with d doubling
// from watchBackoffBase to watchBackoffMax, so the daemons sharing a
// PostgreSQL server that went away do not reconnect in step.
const (
	watchBackoffBase = 100 * time.Millisecond
	watchBackoffMax  = 5 * time.Second
	// watchFirstConnect bounds Watch's own connection attempt.
	watchFirstConnect = 5 * time.Second
)

// watchBackoff returns the wait before reconnect attempt n (0 first).
func watchBackoff(n int) time.Duration {
	d := watchBackoffMax
	if n < 16 {
		d = min(watchBackoffBase<<n, watchBackoffMax)
	}
	return rand.N(d) + time.Millisecond
}

// Watch implements Watcher: one LISTEN connection per call, reconnected
// with backoff (full jitter, up to watchBackoffMax) whenever it fails —
// also when PostgreSQL is down when Watch is called: Watch then returns
// the channel without an error, and it delivers events once the server is
// back. It closes when ctx ends or the store is
// closed. Events committed while the connection is down are not
// delivered (the Watcher contract: best effort).
func (s *store) Watch(ctx context.Context) (<-chan Event, error) {
	if s.dsn == "" {
		return nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("authority: listen for events: %w", err)
	}
	// The first attempt is made here, so that with the server up the
	// watch listens when Watch returns (events committed after it are
	// delivered); bounded, so that an unreachable server does not hold up
	// the daemon's start.
	fctx, fcancel := context.WithTimeout(ctx, watchFirstConnect)
	conn, err := s.listen(fctx)
	fcancel()
	failures := 0
	if err != nil {
		conn, failures = nil, 1
	}
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	ch := make(chan Event, 1024)
	go func() {
		defer close(ch)
		defer cancel()
		for {
			if conn == nil {
				if failures > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(watchBackoff(failures - 1)):
					}
				}
				if conn, err = s.listen(ctx); err != nil {
					conn = nil
					if ctx.Err() != nil {
						return
					}
					failures++
					continue
				}
				failures = 0
			}
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				_ = conn.Close(context.Background())
				conn = nil
				if ctx.Err() != nil {
					return
				}
				failures = 1 // the server went away: wait before the next attempt
				continue
			}
			origin, ev, ok := parseEvent(n.Payload)
			if !ok || origin == s.origin && !(ev.Kind == EventRunner && (ev.Reason == RunnerEventCheck || ev.Reason == RunnerEventDisabled)) {
				continue
			}
			select {
			case ch <- ev:
			default: // full: the agent learns at its next renewal
			}
		}
	}()
	return ch, nil
}

var _ Watcher = (*store)(nil)

func newOrigin() string { id := wire.NewMessageId(); return hex.EncodeToString(id.ULID[:]) }
