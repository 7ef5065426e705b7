package authority

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"forgeyard.dev/transport/wire"
)

// Bounds of inventory records (they mirror the wire bounds of
// RunnerCapabilitiesV1 and HealthSummaryV1, §51: summaries, never object
// lists).
const (
	MaxInventoryText   = 256  // OS, arch, daemon id, backend, protocol, agent version, drain reason, one check message
	MaxInventoryLabels = 64   // Capabilities.Labels and Capabilities.Tools entries each
	MaxInventoryLabel  = 64   // one label or tool
	MaxHealthChecks    = 32   // Health.Checks entries
	MaxInventoryList   = 4096 // Inventory.Runners answers at most this many
)

// Capabilities is the authority's record of what a runner reported at
// registration or in its last CapabilityUpdateV1 (§94): platform, labels,
// capacity and tools. A domain type: the daemon converts the validated
// wire value.
type Capabilities struct {
	OS          string
	Arch        string
	Labels      []string
	MaxParallel uint16
	CPUMillis   uint32
	MemBytes    uint64
	DiskBytes   uint64
	Tools       []string
	Digest      wire.Digest // the agent's capability digest (§236)
}

// Presence is where and how a runner is connected: written by the daemon
// that registered its current session, so any daemon of an HA set can
// answer an inventory query.
type Presence struct {
	Runner       wire.RunnerId
	Session      wire.AgentSessionId
	Daemon       string // Config.ID of the daemon holding the session
	Backend      string // quic, webtransport, yamux, memory
	Protocol     string // negotiated protocol version, e.g. "1.4"
	AgentVersion string
	Role         uint32 // wire PeerRole
	ConnectedAt  time.Time
	// LastHeartbeat is the last heartbeat the daemon recorded (it writes
	// at a bounded rate, so this may lag the live value by that period).
	LastHeartbeat time.Time
	// Connected is false once the daemon saw the transport end.
	Connected bool
}

// HealthCheck is one named check of a health report.
type HealthCheck struct {
	Name    string
	Status  string // Healthy, Degraded, Unhealthy
	Message string
}

// Health is a runner's last health report (§96): a summary it sent, or the
// result of a probe an operator requested.
type Health struct {
	Status     string // Healthy, Degraded, Unhealthy; empty: never reported
	Checks     []HealthCheck
	UptimeMs   uint64
	Probe      string // the probe kind when the report is a probe's result, else empty
	ReportedAt time.Time
}

// Drain is a runner's drain state (§97), shared by every daemon.
type Drain struct {
	Drained bool
	Reason  string
	Changed time.Time
}

// RunnerRecord is everything the inventory knows of one runner.
type RunnerRecord struct {
	Runner       wire.RunnerId
	Capabilities Capabilities
	CapsUpdated  time.Time // zero: never reported
	Presence     Presence  // zero Daemon: never registered
	Health       Health
	Drain        Drain
}

// Inventory is the runner-inventory part of the authority: capabilities,
// presence, health and drain state per runner (issue 16 items 3–5). Both
// SQL stores implement it; obtain it with InventoryOf. Safe for concurrent
// use by several daemons sharing one database.
type Inventory interface {
	// PutCapabilities replaces the runner's capability record.
	PutCapabilities(ctx context.Context, runner wire.RunnerId, c Capabilities, now time.Time) error
	// PutPresence records where the runner is connected (or, with
	// Connected false, that its transport on p.Daemon ended: a
	// disconnect never overwrites a newer registration of another
	// session).
	PutPresence(ctx context.Context, p Presence) error
	// TouchHeartbeat records a heartbeat of the runner's session.
	TouchHeartbeat(ctx context.Context, runner wire.RunnerId, session wire.AgentSessionId, at time.Time) error
	// PutHealth replaces the runner's health record.
	PutHealth(ctx context.Context, runner wire.RunnerId, h Health) error
	// SetDrain drains (drained true) or resumes a runner; idempotent.
	SetDrain(ctx context.Context, runner wire.RunnerId, drained bool, reason string, now time.Time) error
	// DrainState returns the runner's drain state (an unknown runner is
	// not drained).
	DrainState(ctx context.Context, runner wire.RunnerId) (Drain, error)
	// Runner returns one runner's record; ErrNotFound if the inventory has
	// nothing of it.
	Runner(ctx context.Context, runner wire.RunnerId) (RunnerRecord, error)
	// Runners lists the runners the inventory knows, by runner id, at most
	// min(limit, MaxInventoryList) of them (limit ≤ 0: MaxInventoryList).
	Runners(ctx context.Context, limit int) ([]RunnerRecord, error)
}

// InventoryOf returns a's runner inventory, or nil if a has none (an
// Authority implemented outside this package).
func InventoryOf(a Authority) Inventory {
	return optionalOr[Inventory](a)
}

var _ Inventory = (*store)(nil)

// The inventory tables are schema step 2 (migrate.go).
func init() {
	addMigration(2, "runner inventory: capabilities, presence, health, drain", func(d dialect) []string {
		return (&store{d: d}).inventorySchema()
	})
}

// InventorySchema is the DDL of the inventory tables, one statement per
// entry, for dialect "sqlite" or "postgres". Every statement is idempotent
// (IF NOT EXISTS); the store applies them as its schema step 2.
func InventorySchema(dialect string) []string {
	d := sqliteDialect
	if dialect == postgresDialect.name {
		d = postgresDialect
	}
	return (&store{d: d}).inventorySchema()
}

// inventorySchema is the inventory tables. Lists (labels, tools, checks)
// are JSON text: they are bounded summaries read whole, never queried.
// Like baseSchema's, its look-alike statements are each their own table's
// DDL, frozen with the migration step.
func (s *store) inventorySchema() []string {
	b := s.d.blob
	return []string{
		`CREATE TABLE IF NOT EXISTS fy_runner_caps (
			runner_id ` + b + ` PRIMARY KEY,
			os TEXT NOT NULL,
			arch TEXT NOT NULL,
			labels TEXT NOT NULL,
			max_parallel BIGINT NOT NULL,
			cpu_millis BIGINT NOT NULL,
			mem_bytes BIGINT NOT NULL,
			disk_bytes BIGINT NOT NULL,
			tools TEXT NOT NULL,
			digest ` + b + ` NOT NULL,
			updated_ms BIGINT NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS fy_runner_presence (
			runner_id ` + b + ` PRIMARY KEY,
			session_id ` + b + ` NOT NULL,
			daemon TEXT NOT NULL,
			backend TEXT NOT NULL,
			protocol TEXT NOT NULL,
			agent_version TEXT NOT NULL,
			role BIGINT NOT NULL,
			connected_ms BIGINT NOT NULL,
			heartbeat_ms BIGINT NOT NULL,
			connected BOOLEAN NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS fy_runner_health (
			runner_id ` + b + ` PRIMARY KEY,
			status TEXT NOT NULL,
			checks TEXT NOT NULL,
			uptime_ms BIGINT NOT NULL,
			probe TEXT NOT NULL,
			reported_ms BIGINT NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS fy_runner_drain (
			runner_id ` + b + ` PRIMARY KEY,
			drained BOOLEAN NOT NULL,
			reason TEXT NOT NULL,
			changed_ms BIGINT NOT NULL)`,
	}
}

func checkText(what, s string) error {
	if len(s) > MaxInventoryText || !utf8.ValidString(s) {
		return fmt.Errorf("authority: inventory %s: at most %d bytes of UTF-8", what, MaxInventoryText)
	}
	return nil
}

func checkList(what string, l []string) error {
	if len(l) > MaxInventoryLabels {
		return fmt.Errorf("authority: inventory %s: at most %d entries", what, MaxInventoryLabels)
	}
	for _, v := range l {
		if v == "" || len(v) > MaxInventoryLabel || !utf8.ValidString(v) {
			return fmt.Errorf("authority: inventory %s entry: 1..%d bytes of UTF-8", what, MaxInventoryLabel)
		}
	}
	return nil
}

func jsonList[T any](l []T) string {
	if l == nil {
		l = []T{}
	}
	b, _ := json.Marshal(l) // strings and plain structs: cannot fail
	return string(b)
}

func (s *store) PutCapabilities(ctx context.Context, runner wire.RunnerId, c Capabilities, now time.Time) error {
	for _, e := range []error{checkText("os", c.OS), checkText("arch", c.Arch), checkList("labels", c.Labels), checkList("tools", c.Tools)} {
		if e != nil {
			return e
		}
	}
	return s.batch(ctx, func(ctx context.Context, t *sql.Tx) error {
		_, err := s.exec(ctx, t, `INSERT INTO fy_runner_caps (runner_id, os, arch, labels, max_parallel, cpu_millis, mem_bytes, disk_bytes, tools, digest, updated_ms)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (runner_id) DO UPDATE SET os = excluded.os, arch = excluded.arch, labels = excluded.labels,
				max_parallel = excluded.max_parallel, cpu_millis = excluded.cpu_millis, mem_bytes = excluded.mem_bytes,
				disk_bytes = excluded.disk_bytes, tools = excluded.tools, digest = excluded.digest, updated_ms = excluded.updated_ms`,
			idb(runner.ULID), c.OS, c.Arch, jsonList(c.Labels), int64(c.MaxParallel), int64(c.CPUMillis),
			int64(c.MemBytes), int64(c.DiskBytes), jsonList(c.Tools), c.Digest[:], ms(now))
		return err
	})
}

func (s *store) PutPresence(ctx context.Context, p Presence) error {
	for _, e := range []error{checkText("daemon", p.Daemon), checkText("backend", p.Backend), checkText("protocol", p.Protocol), checkText("agent version", p.AgentVersion)} {
		if e != nil {
			return e
		}
	}
	return s.batch(ctx, func(ctx context.Context, t *sql.Tx) error {
		if !p.Connected {
			// Only the transport that wrote the presence may mark it gone.
			_, err := s.exec(ctx, t, `UPDATE fy_runner_presence SET connected = ?, heartbeat_ms = CASE WHEN heartbeat_ms < ? THEN ? ELSE heartbeat_ms END
				WHERE runner_id = ? AND session_id = ? AND daemon = ?`,
				false, ms(p.LastHeartbeat), ms(p.LastHeartbeat), idb(p.Runner.ULID), idb(p.Session.ULID), p.Daemon)
			return err
		}
		_, err := s.exec(ctx, t, `INSERT INTO fy_runner_presence (runner_id, session_id, daemon, backend, protocol, agent_version, role, connected_ms, heartbeat_ms, connected)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT (runner_id) DO UPDATE SET session_id = excluded.session_id, daemon = excluded.daemon, backend = excluded.backend,
				protocol = excluded.protocol, agent_version = excluded.agent_version, role = excluded.role,
				connected_ms = excluded.connected_ms, heartbeat_ms = excluded.heartbeat_ms, connected = excluded.connected`,
			idb(p.Runner.ULID), idb(p.Session.ULID), p.Daemon, p.Backend, p.Protocol, p.AgentVersion, int64(p.Role),
			ms(p.ConnectedAt), ms(p.LastHeartbeat), true)
		return err
	})
}

func (s *store) TouchHeartbeat(ctx context.Context, runner wire.RunnerId, session wire.AgentSessionId, at time.Time) error {
	return s.batchLazy(ctx, func(ctx context.Context, t *sql.Tx) error {
		_, err := s.exec(ctx, t, `UPDATE fy_runner_presence SET heartbeat_ms = ? WHERE runner_id = ? AND session_id = ? AND heartbeat_ms < ?`,
			ms(at), idb(runner.ULID), idb(session.ULID), ms(at))
		return err
	})
}

func (s *store) PutHealth(ctx context.Context, runner wire.RunnerId, h Health) error {
	if len(h.Checks) > MaxHealthChecks {
		return fmt.Errorf("authority: inventory health: at most %d checks", MaxHealthChecks)
	}
	for _, c := range h.Checks {
		for _, e := range []error{checkText("check name", c.Name), checkText("check status", c.Status), checkText("check message", c.Message)} {
			if e != nil {
				return e
			}
		}
	}
	if err := checkText("health status", h.Status); err != nil {
		return err
	}
	if err := checkText("probe", h.Probe); err != nil {
		return err
	}
	return s.batch(ctx, func(ctx context.Context, t *sql.Tx) error {
		_, err := s.exec(ctx, t, `INSERT INTO fy_runner_health (runner_id, status, checks, uptime_ms, probe, reported_ms) VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (runner_id) DO UPDATE SET status = excluded.status, checks = excluded.checks, uptime_ms = excluded.uptime_ms,
				probe = excluded.probe, reported_ms = excluded.reported_ms`,
			idb(runner.ULID), h.Status, jsonList(h.Checks), int64(h.UptimeMs), h.Probe, ms(h.ReportedAt))
		return err
	})
}

// SetDrain records the flag as SetRunnerEnabled does (setRunnerFlag), but
// draining is not disabling: it revokes no lease and ends no session.
func (s *store) SetDrain(ctx context.Context, runner wire.RunnerId, drained bool, reason string, now time.Time) error {
	if err := checkText("drain reason", reason); err != nil {
		return err
	}
	return s.tx(ctx, func(t *sql.Tx) error {
		return s.setRunnerFlag(ctx, t, "fy_runner_drain", "drained", runner, drained, reason, now, RunnerEventDrained, RunnerEventResumed)
	})
}

func (s *store) DrainState(ctx context.Context, runner wire.RunnerId) (Drain, error) {
	var d Drain
	var changed int64
	err := s.read(func() error {
		return s.db.QueryRowContext(ctx, s.rebind(`SELECT drained, reason, changed_ms FROM fy_runner_drain WHERE runner_id = ?`), idb(runner.ULID)).
			Scan(&d.Drained, &d.Reason, &changed)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return Drain{}, nil
	}
	if err != nil {
		return Drain{}, err
	}
	d.Changed = fromMs(changed)
	return d, nil
}

func (s *store) Runner(ctx context.Context, runner wire.RunnerId) (RunnerRecord, error) {
	recs, err := s.runners(ctx, &runner, 1)
	if err != nil {
		return RunnerRecord{}, err
	}
	if len(recs) == 0 {
		return RunnerRecord{}, ErrNotFound
	}
	return recs[0], nil
}

func (s *store) Runners(ctx context.Context, limit int) ([]RunnerRecord, error) {
	if limit <= 0 || limit > MaxInventoryList {
		limit = MaxInventoryList
	}
	return s.runners(ctx, nil, limit)
}

// runners reads the records of one runner (only != nil) or of the first
// limit runners by id: the union of the four tables, read in one
// transaction.
func (s *store) runners(ctx context.Context, only *wire.RunnerId, limit int) ([]RunnerRecord, error) {
	var out []RunnerRecord
	err := s.tx(ctx, func(t *sql.Tx) error {
		out = out[:0]
		where, args := "", []any{}
		if only != nil {
			where, args = " WHERE runner_id = ?", append(args, idb(only.ULID))
		}
		q := `SELECT runner_id FROM (
			SELECT runner_id FROM fy_runner_caps UNION SELECT runner_id FROM fy_runner_presence
			UNION SELECT runner_id FROM fy_runner_health UNION SELECT runner_id FROM fy_runner_drain) ids` + where +
			` ORDER BY runner_id LIMIT ?`
		rows, err := t.QueryContext(ctx, s.rebind(q), append(args, limit)...)
		if err != nil {
			return err
		}
		var ids []wire.RunnerId
		for rows.Next() {
			var b []byte
			if err := rows.Scan(&b); err != nil {
				rows.Close()
				return err
			}
			var r wire.RunnerId
			copy(r.ULID[:], b)
			ids = append(ids, r)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, r := range ids {
			rec, err := s.readRecord(ctx, t, r)
			if err != nil {
				return err
			}
			out = append(out, rec)
		}
		return nil
	})
	return out, err
}

func (s *store) readRecord(ctx context.Context, t *sql.Tx, r wire.RunnerId) (RunnerRecord, error) {
	rec := RunnerRecord{Runner: r}
	key := idb(r.ULID)
	var (
		labels, tools, checks                     string
		maxPar, cpu, mem, disk, upd, role, uptime int64
		digest, sess                              []byte
		conn, hb, rep, changed                    int64
	)
	c := &rec.Capabilities
	err := s.row(ctx, t, `SELECT os, arch, labels, max_parallel, cpu_millis, mem_bytes, disk_bytes, tools, digest, updated_ms FROM fy_runner_caps WHERE runner_id = ?`, key).
		Scan(&c.OS, &c.Arch, &labels, &maxPar, &cpu, &mem, &disk, &tools, &digest, &upd)
	switch {
	case err == nil:
		c.MaxParallel, c.CPUMillis, c.MemBytes, c.DiskBytes = uint16(maxPar), uint32(cpu), uint64(mem), uint64(disk)
		copy(c.Digest[:], digest)
		rec.CapsUpdated = fromMs(upd)
		if err := json.Unmarshal([]byte(labels), &c.Labels); err != nil {
			return rec, fmt.Errorf("authority: inventory labels: %w", err)
		}
		if err := json.Unmarshal([]byte(tools), &c.Tools); err != nil {
			return rec, fmt.Errorf("authority: inventory tools: %w", err)
		}
	case !errors.Is(err, sql.ErrNoRows):
		return rec, err
	}
	p := &rec.Presence
	err = s.row(ctx, t, `SELECT session_id, daemon, backend, protocol, agent_version, role, connected_ms, heartbeat_ms, connected FROM fy_runner_presence WHERE runner_id = ?`, key).
		Scan(&sess, &p.Daemon, &p.Backend, &p.Protocol, &p.AgentVersion, &role, &conn, &hb, &p.Connected)
	switch {
	case err == nil:
		p.Runner = r
		copy(p.Session.ULID[:], sess)
		p.Role, p.ConnectedAt, p.LastHeartbeat = uint32(role), fromMs(conn), fromMs(hb)
	case !errors.Is(err, sql.ErrNoRows):
		return rec, err
	}
	h := &rec.Health
	err = s.row(ctx, t, `SELECT status, checks, uptime_ms, probe, reported_ms FROM fy_runner_health WHERE runner_id = ?`, key).
		Scan(&h.Status, &checks, &uptime, &h.Probe, &rep)
	switch {
	case err == nil:
		h.UptimeMs, h.ReportedAt = uint64(uptime), fromMs(rep)
		if err := json.Unmarshal([]byte(checks), &h.Checks); err != nil {
			return rec, fmt.Errorf("authority: inventory health checks: %w", err)
		}
	case !errors.Is(err, sql.ErrNoRows):
		return rec, err
	}
	dr := &rec.Drain
	err = s.row(ctx, t, `SELECT drained, reason, changed_ms FROM fy_runner_drain WHERE runner_id = ?`, key).
		Scan(&dr.Drained, &dr.Reason, &changed)
	switch {
	case err == nil:
		dr.Changed = fromMs(changed)
	case !errors.Is(err, sql.ErrNoRows):
		return rec, err
	}
	return rec, nil
}
