package capacity

import (
	"fmt"
	"math"
)

// Workload is what the fleet does. Zero timing fields take the daemon's
// defaults (DefaultWorkload; TestDefaultsMatchCode keeps them equal to
// the code's constants).
type Workload struct {
	Agents  int    `json:"agents"`
	Backend string `json:"backend"` // whose ladder points give the per-agent costs

	LeasesPerAgentHour float64 `json:"leases_per_agent_hour"`
	AttemptSeconds     float64 `json:"attempt_seconds"` // mean attempt duration (live leases = rate × this)
	LogBytesPerAttempt float64 `json:"log_bytes_per_attempt"`
	// LogActiveSeconds: how long an attempt keeps writing log output. With
	// the shared (S3) sink every 250 ms tick with new frames is one segment
	// object (logs.BucketSink), so this drives the PUT rate.
	LogActiveSeconds  float64 `json:"log_active_seconds"`
	OutputsPerAttempt float64 `json:"outputs_per_attempt"`
	OutputBytes       float64 `json:"output_bytes"` // mean size of one output
	// ReconnectsPerAgentHour: registrations per agent per hour outside
	// restarts (network churn, agent restarts).
	ReconnectsPerAgentHour float64 `json:"reconnects_per_agent_hour"`
	// Row contents the schema does not fix.
	ResultBytes    float64 `json:"result_bytes"`
	RunnerRowBytes float64 `json:"runner_row_bytes"` // capabilities + presence + health per runner

	// Daemon timing (docs/examples/daemon.toml [timing]).
	HeartbeatIntervalS     float64 `json:"heartbeat_interval_s"`
	MaxHeartbeatsPerSecond float64 `json:"max_heartbeats_per_second"` // per daemon; < 0: no budget
	MaxHeartbeatIntervalS  float64 `json:"max_heartbeat_interval_s"`
	RenewIntervalS         float64 `json:"renew_interval_s"`
	DedupRetentionH        float64 `json:"dedup_retention_h"`
	// DataRetentionDays is [data.retention] max_age for logs and objects
	// (0: kept forever; the model then reports 30 days).
	DataRetentionDays float64 `json:"data_retention_days"`
}

// Deployment is what the fleet runs on.
type Deployment struct {
	DaemonCores       float64 `json:"daemon_cores"`
	DaemonMemoryBytes float64 `json:"daemon_memory_bytes"`
	DaemonNICBitsPerS float64 `json:"daemon_nic_bits_per_s"`
	FDLimit           int     `json:"fd_limit"`          // LimitNOFILE
	MaxConnections    int     `json:"max_connections"`   // admission.max_connections
	RegistrationRate  float64 `json:"registration_rate"` // admission.registration_rate, per daemon
	// RecoverTargetS: a restarted daemon's agents (or a failed daemon's,
	// spread over the others) must all be registered again within this.
	RecoverTargetS float64 `json:"recover_target_s"`
	// Spare daemons: per-daemon load is taken with the fleet spread over
	// k − Spare daemons (one daemon down and its agents moved).
	Spare int `json:"spare"`
	// TargetUtil is the headroom rule: no resource above this fraction.
	TargetUtil float64 `json:"target_util"`
	// Store and DBCallers select the authority ceilings (AuthorityPoint).
	Store     string `json:"store"`
	DBCallers int    `json:"db_callers"`
	// S3PutPerS is the object store's PUT budget (0: not a bound, only
	// reported).
	S3PutPerS float64 `json:"s3_put_per_s"`
	// Per-request and per-byte CPU of the daemon, % of one core·s.
	CPUPerRequestMs    float64 `json:"cpu_per_request_ms"`
	DataBytesPerCoreS  float64 `json:"data_bytes_per_core_s"`
	FDsPerAgent        float64 `json:"fds_per_agent"` // 0 for QUIC/WebTransport (shared UDP socket), 1 for TLS+yamux
	FDsFixed           float64 `json:"fds_fixed"`
	CASMaxConcurrent   float64 `json:"cas_max_concurrent"`
	MaxK               int     `json:"max_k"`
	HeartbeatWireBytes float64 `json:"heartbeat_wire_bytes"` // one heartbeat and its ack with framing and packet overhead
}

// Code constants the model mirrors (checked by TestDefaultsMatchCode).
const (
	presenceEveryS     = 30.0      // semantics/daemon presenceEvery
	logAckIntervalS    = 0.25      // logs.DefaultAckInterval
	logAckBytes        = 1 << 20   // logs.DefaultAckBytes
	casChunkBytes      = 4 << 20   // cas.DefaultChunkSize
	retainedFixedBytes = 1.6 * MiB // daemon retention windows (perf.md §9: ~0.6 MiB) + slack
	casRefBytes        = 37        // a wire.CasObjectRef in Postcard: algorithm 1, digest 32, size 4 (2^21 to 2^28 bytes)
)

// MiB is 2^20 bytes.
const MiB = 1 << 20

// DefaultWorkload is the reference workload of docs/capacity.md: 100,000
// agents, each running 2 attempts an hour of 10 minutes (a third of the
// fleet busy), 2 MiB of log written over the attempt, 4 outputs of 2 MiB.
func DefaultWorkload() Workload {
	return Workload{
		Agents: 100000, Backend: "quic",
		LeasesPerAgentHour: 2, AttemptSeconds: 600,
		LogBytesPerAttempt: 2 * MiB, LogActiveSeconds: 600,
		OutputsPerAttempt: 4, OutputBytes: 2 * MiB,
		ReconnectsPerAgentHour: 0.1,
		ResultBytes:            64, RunnerRowBytes: 1024,
		HeartbeatIntervalS: 10, MaxHeartbeatsPerSecond: 1000, MaxHeartbeatIntervalS: 60,
		RenewIntervalS: 10, DedupRetentionH: 24, DataRetentionDays: 30,
	}
}

// DefaultDeployment is a daemon host like the one the ladder measured
// (2 vCPU), with 8 GiB, the shipped admission defaults, one spare daemon,
// 70 % headroom, and the PostgreSQL (fsync on) ceilings at 512 callers.
func DefaultDeployment() Deployment {
	return Deployment{
		DaemonCores: 2, DaemonMemoryBytes: 8 << 30, DaemonNICBitsPerS: 10e9,
		FDLimit: 65536, MaxConnections: 20000, RegistrationRate: 200,
		RecoverTargetS: 300, Spare: 1, TargetUtil: 0.7,
		Store: "postgres-fsync", DBCallers: 512,
		CPUPerRequestMs: 0.35, DataBytesPerCoreS: 150e6,
		FDsPerAgent: 0, FDsFixed: 128, CASMaxConcurrent: 64, MaxK: 200,
		HeartbeatWireBytes: 2 * (228 + 60),
	}
}

// Resource is one load against its capacity.
type Resource struct {
	Name     string  `json:"name"`
	Shared   bool    `json:"shared"` // one for the whole fleet (database, object store), else per daemon
	Load     float64 `json:"load"`
	Capacity float64 `json:"capacity"` // 0: reported only
	Unit     string  `json:"unit"`
	Note     string  `json:"note,omitempty"`
}

// Util is Load/Capacity (0 when the resource has no capacity).
func (r Resource) Util() float64 {
	if r.Capacity <= 0 {
		return 0
	}
	return r.Load / r.Capacity
}

// DBOp is one authority operation's rate and ceiling.
type DBOp struct {
	Op          string  `json:"op"`
	PerS        float64 `json:"per_s"`
	CeilingOp   string  `json:"ceiling_op"` // the benchmark case that bounds it
	CeilingPerS float64 `json:"ceiling_per_s"`
	Batched     bool    `json:"batched"`    // group commit (batcher) or its own transaction
	Statements  float64 `json:"statements"` // SQL statements (round trips) per op, PostgreSQL, without BEGIN/COMMIT
	RowWrites   float64 `json:"row_writes"` // rows inserted or updated per op
}

// Result is the model evaluated for one k.
type Result struct {
	K              int        `json:"k"`
	AgentsPerDmn   float64    `json:"agents_per_daemon"` // with the spare daemons down
	HeartbeatS     float64    `json:"heartbeat_interval_s"`
	AttemptsPerS   float64    `json:"attempts_per_s"`
	LiveLeases     float64    `json:"live_leases"`
	DBOps          []DBOp     `json:"db_ops"`
	DBUtil         float64    `json:"db_util"`
	DBStatementsS  float64    `json:"db_statements_per_s"`
	DBRowWritesS   float64    `json:"db_row_writes_per_s"`
	DBTxUpperS     float64    `json:"db_transactions_per_s_max"` // if no two operations shared a commit
	DB             DBSize     `json:"db_size"`
	Object         ObjectLoad `json:"object_store"`
	Resources      []Resource `json:"resources"`
	ColdExtrapol   bool       `json:"cold_start_extrapolated"`
	DaemonRSSBytes float64    `json:"daemon_rss_bytes"`
}

// Bound returns the resource with the highest utilization.
func (r Result) Bound() Resource {
	var best Resource
	for _, x := range r.Resources {
		if x.Util() > best.Util() {
			best = x
		}
	}
	return best
}

// Model is the capacity model over measured inputs.
type Model struct {
	In  *Inputs
	W   Workload
	D   Deployment
	Fit Fit
}

// New fits the workload's backend on every ladder point of it (failed
// steps included: their memory and CPU were measured; docs/capacity.md).
func New(in *Inputs, w Workload, d Deployment) (*Model, error) {
	if err := w.validate(); err != nil {
		return nil, err
	}
	if err := d.validate(); err != nil {
		return nil, err
	}
	f, err := FitBackend(in, w.Backend, nil)
	if err != nil {
		return nil, err
	}
	for _, op := range []string{"create", "renew", "complete", "baseline-insert"} {
		if _, ok := in.AuthorityCeiling(d.Store, op, d.DBCallers); !ok {
			return nil, fmt.Errorf("capacity: no authority benchmark %s/%s in the inputs", d.Store, op)
		}
	}
	return &Model{In: in, W: w, D: d, Fit: f}, nil
}

func (w Workload) validate() error {
	switch {
	case w.Agents <= 0:
		return fmt.Errorf("capacity: agents must be > 0 (--agents)")
	case w.HeartbeatIntervalS <= 0:
		return fmt.Errorf("capacity: the heartbeat interval must be > 0 (--heartbeat, timing.heartbeat_interval)")
	case w.LeasesPerAgentHour < 0 || w.AttemptSeconds < 0 || w.LogBytesPerAttempt < 0 || w.LogActiveSeconds < 0 ||
		w.OutputsPerAttempt < 0 || w.OutputBytes < 0 || w.ReconnectsPerAgentHour < 0 || w.RenewIntervalS < 0 || w.DedupRetentionH < 0:
		return fmt.Errorf("capacity: workload figures must not be negative")
	}
	return nil
}

func (d Deployment) validate() error {
	switch {
	case d.DaemonCores <= 0 || d.DaemonMemoryBytes <= 0:
		return fmt.Errorf("capacity: daemon cores and memory must be > 0 (--daemon-cores, --daemon-memory)")
	case d.TargetUtil <= 0 || d.TargetUtil > 1:
		return fmt.Errorf("capacity: the target utilization must be in (0, 1] (--target-util)")
	case d.Spare < 0:
		return fmt.Errorf("capacity: spare daemons must not be negative (--spare)")
	case d.RegistrationRate <= 0:
		return fmt.Errorf("capacity: the registration rate must be > 0 (admission.registration_rate)")
	case d.DataBytesPerCoreS <= 0:
		return fmt.Errorf("capacity: data bytes per core-second must be > 0")
	}
	return nil
}

// HeartbeatInterval is the interval the daemon's budget gives the n-th
// session (semantics/daemon Timing.MaxHeartbeatsPerSecond).
func (w Workload) HeartbeatInterval(n float64) float64 {
	if w.MaxHeartbeatsPerSecond <= 0 {
		return w.HeartbeatIntervalS
	}
	return math.Min(math.Max(n/w.MaxHeartbeatsPerSecond, w.HeartbeatIntervalS), math.Max(w.MaxHeartbeatIntervalS, w.HeartbeatIntervalS))
}

// PresencePeriod is how often an agent's heartbeat time is written to the
// inventory: at the first heartbeat at least 30 s after the last write.
func PresencePeriod(hb float64) float64 { return math.Ceil(presenceEveryS/hb-1e-9) * hb }

// LogSegmentsPerAttempt is the shared sink's segment objects per attempt:
// one per 1 MiB and one per 250 ms tick with new frames (an upper bound
// for an attempt that logs all along).
func (w Workload) LogSegmentsPerAttempt() float64 {
	if w.LogBytesPerAttempt <= 0 {
		return 0
	}
	return math.Ceil(w.LogBytesPerAttempt/logAckBytes) + math.Max(1, w.LogActiveSeconds/logAckIntervalS)
}

// Evaluate computes every resource's load with the fleet on k daemons.
func (m *Model) Evaluate(k int) Result {
	w, d := m.W, m.D
	r := Result{K: k}
	up := k - d.Spare
	if up < 1 {
		up = 1
	}
	N := float64(w.Agents)
	n := math.Ceil(N / float64(up))
	r.AgentsPerDmn = n
	hb := w.HeartbeatInterval(n)
	r.HeartbeatS = hb
	// The fleet's heartbeat interval with all k daemons up (steady state).
	hbAll := w.HeartbeatInterval(math.Ceil(N / float64(k)))

	lambda := N * w.LeasesPerAgentHour / 3600
	r.AttemptsPerS = lambda
	r.LiveLeases = lambda * w.AttemptSeconds
	renew := 0.0
	if w.RenewIntervalS > 0 {
		renew = r.LiveLeases / w.RenewIntervalS
	}
	regs := N * w.ReconnectsPerAgentHour / 3600
	touch := N / PresencePeriod(hbAll)

	ceil := func(op string) float64 {
		a, _ := m.In.AuthorityCeiling(d.Store, op, d.DBCallers)
		return a.OpsPerS
	}
	// Statements and row writes per operation, counted from
	// semantics/authority/sqlstore.go and inventory.go (PostgreSQL dialect).
	r.DBOps = []DBOp{
		{Op: "create lease", PerS: lambda, CeilingOp: "create", Batched: true, Statements: 2, RowWrites: 1},
		{Op: "accept lease", PerS: lambda, CeilingOp: "renew", Batched: true, Statements: 2, RowWrites: 1},
		{Op: "renew lease", PerS: renew, CeilingOp: "renew", Batched: true, Statements: 3, RowWrites: 2},
		{Op: "complete attempt", PerS: lambda, CeilingOp: "complete", Batched: true, Statements: 2, RowWrites: 3},
		{Op: "register (+resync)", PerS: regs, CeilingOp: "create", Batched: true, Statements: 5, RowWrites: 3},
		{Op: "presence heartbeat touch", PerS: touch, CeilingOp: "baseline-insert", Statements: 1, RowWrites: 1},
		{Op: "presence + capabilities at registration, presence at disconnect", PerS: 3 * regs, CeilingOp: "baseline-insert", Statements: 1, RowWrites: 1},
	}
	for i := range r.DBOps {
		o := &r.DBOps[i]
		o.CeilingPerS = ceil(o.CeilingOp)
		r.DBUtil += o.PerS / o.CeilingPerS
		r.DBStatementsS += o.PerS * o.Statements
		r.DBRowWritesS += o.PerS * o.RowWrites
		r.DBTxUpperS += o.PerS
	}
	r.DB = m.dbSize(lambda, renew, regs)
	r.Object = m.objectLoad(lambda)

	// Per daemon.
	perD := 1 / float64(up)
	rss := retainedFixedBytes + m.Fit.RSS(n) + d.CASMaxConcurrent*casChunkBytes +
		r.LiveLeases*perD*math.Min(logAckBytes, w.LogBytesPerAttempt/math.Max(w.LogActiveSeconds, 1)*logAckIntervalS)
	r.DaemonRSSBytes = rss
	// CPU: the fitted fixed part less the ladder's own leases, the per-agent
	// part scaled to this heartbeat rate, requests and data bytes.
	reqPerLadderLease := 3.0 // offer, accept, completion (ladder attempts end before a renewal)
	fixed := math.Max(0, m.Fit.CPUFixed-m.Fit.LeaseRate*reqPerLadderLease*d.CPUPerRequestMs/10)
	reqs := (3*lambda + renew + regs) * perD
	dataBytes := lambda * perD * (w.LogBytesPerAttempt + w.OutputsPerAttempt*w.OutputBytes)
	cpu := fixed + m.Fit.CPUPerAgent*n*m.Fit.HeartbeatS/hb + reqs*d.CPUPerRequestMs/10 +
		2*dataBytes/d.DataBytesPerCoreS*100 // received from agents and written to the store
	fds := d.FDsFixed + n*d.FDsPerAgent + d.CASMaxConcurrent
	cold, ex := m.Fit.ColdStart(n)
	r.ColdExtrapol = ex
	recoverS := math.Max(cold, n/d.RegistrationRate)
	netBits := 8 * (n/hb*d.HeartbeatWireBytes + 2*dataBytes)

	r.Resources = []Resource{
		{Name: "daemon memory (RSS)", Load: rss, Capacity: d.DaemonMemoryBytes, Unit: "bytes"},
		{Name: "daemon CPU", Load: cpu, Capacity: d.DaemonCores * 100, Unit: "% of a core"},
		{Name: "daemon connections (admission.max_connections)", Load: n, Capacity: float64(d.MaxConnections), Unit: "agents"},
		{Name: "daemon file descriptors", Load: fds, Capacity: float64(d.FDLimit), Unit: "fds"},
		{Name: "daemon heartbeats/s", Load: n / hb, Unit: "heartbeats/s",
			Note: fmt.Sprintf("the budget timing.max_heartbeats_per_second holds it at or below %.0f/s by lengthening the interval, here %.0f s: a dead link is noticed after %.0f s", w.MaxHeartbeatsPerSecond, hb, 3*hb)},
		{Name: "daemon re-registration after a restart", Load: recoverS, Capacity: d.RecoverTargetS, Unit: "s",
			Note: "cold start of n agents at once (ladder), at least n / admission.registration_rate"},
		{Name: "daemon network", Load: netBits, Capacity: d.DaemonNICBitsPerS, Unit: "bit/s"},
		{Name: "authority database (group-commit ceilings)", Shared: true, Load: r.DBUtil * 100, Capacity: 100, Unit: "% of measured ceiling",
			Note: "sum over operations of rate / measured ceiling"},
		{Name: "object store PUTs", Shared: true, Load: r.Object.PutPerS, Capacity: d.S3PutPerS, Unit: "PUT/s"},
	}
	return r
}

// DBSize is the authority's size: what stays and what grows.
type DBSize struct {
	LeaseBytes      float64 `json:"lease_row_bytes"`      // fy_leases row + its 4 index entries
	CompletionBytes float64 `json:"completion_row_bytes"` // fy_completions row + index entry
	DedupBytes      float64 `json:"dedup_row_bytes"`      // fy_dedup row + 2 index entries
	SessionBytes    float64 `json:"session_row_bytes"`
	SteadyBytes     float64 `json:"steady_bytes"`   // runners, sessions, dedup within its retention
	GrowthPerDay    float64 `json:"growth_per_day"` // leases + completions: never deleted
	After30Days     float64 `json:"after_30_days"`  // steady + 30 days of growth
	After365Days    float64 `json:"after_365_days"` //
	DedupRows       float64 `json:"dedup_rows"`     // live within DedupRetention
	RowsPerDay      float64 `json:"lease_rows_per_day"`
}

func (m *Model) dbSize(lambda, renew, regs float64) DBSize {
	w := m.W
	var s DBSize
	s.LeaseBytes, s.CompletionBytes, s.DedupBytes, s.SessionBytes = RowBytes(w.OutputsPerAttempt, w.ResultBytes)
	s.DedupRows = (renew + lambda) * w.DedupRetentionH * 3600
	N := float64(w.Agents)
	s.SteadyBytes = N*(w.RunnerRowBytes+s.SessionBytes) + s.DedupRows*s.DedupBytes
	s.RowsPerDay = lambda * 86400
	// New agent sessions (a process start) add a session row each, never
	// deleted; count every registration as one (an upper bound).
	s.GrowthPerDay = s.RowsPerDay*(s.LeaseBytes+s.CompletionBytes) + regs*86400*s.SessionBytes
	s.After30Days = s.SteadyBytes + 30*s.GrowthPerDay
	s.After365Days = s.SteadyBytes + 365*s.GrowthPerDay
	return s
}

// RowBytes is the PostgreSQL bytes (heap row and index entries, live rows
// only) of one lease (fy_leases, 4 indexes; its payload a CasObjectRef),
// one completion with the given outputs and result bytes (fy_completions),
// one renewal dedup record (fy_dedup, 2 indexes) and one agent session
// (fy_sessions, 2 indexes), from the schema in semantics/authority.
func RowBytes(outputs, resultBytes float64) (lease, completion, dedup, session float64) {
	out := 1 + outputs*casRefBytes // Postcard: the count, then each ref
	lease = pgRow(idCol, idCol, idCol, idCol, idCol, bytesCol(32), bytesCol(casRefBytes), i8, i8, textCol(9), boolCol, i8, textCol(0), i8) +
		pgIndex(0.9, idCol) + pgIndex(0.9, idCol) + pgIndex(0.7, idCol) + pgIndex(0.7, textCol(9), i8)
	completion = pgRow(idCol, idCol, idCol, idCol, bytesCol(resultBytes), bytesCol(out), i8) + pgIndex(0.9, idCol)
	dedup = pgRow(idCol, textCol(5), bytesCol(13), i8) + pgIndex(0.9, idCol) + pgIndex(0.9, i8)
	session = pgRow(idCol, idCol, i8, idCol, textCol(16), textCol(21), i8, boolCol) + pgIndex(0.9, idCol) + pgIndex(0.7, idCol)
	return lease, completion, dedup, session
}

// ObjectLoad is the shared object store's load.
type ObjectLoad struct {
	BytesPerS      float64 `json:"bytes_per_s"`
	StoredBytes    float64 `json:"stored_bytes"` // within DataRetentionDays (30 if 0)
	RetentionDays  float64 `json:"retention_days"`
	PutPerS        float64 `json:"put_per_s"`
	LogPutPerS     float64 `json:"log_put_per_s"`
	OtherReqPerS   float64 `json:"other_requests_per_s"` // HEAD/GET/LIST on upload
	SegmentsPerAtt float64 `json:"log_segments_per_attempt"`
}

func (m *Model) objectLoad(lambda float64) ObjectLoad {
	w := m.W
	var o ObjectLoad
	o.BytesPerS = lambda * (w.LogBytesPerAttempt + w.OutputsPerAttempt*w.OutputBytes)
	o.RetentionDays = w.DataRetentionDays
	if o.RetentionDays <= 0 {
		o.RetentionDays = 30
	}
	o.StoredBytes = o.BytesPerS * o.RetentionDays * 86400
	o.SegmentsPerAtt = w.LogSegmentsPerAttempt()
	o.LogPutPerS = lambda * o.SegmentsPerAtt
	chunks := math.Max(1, math.Ceil(w.OutputBytes/casChunkBytes))
	o.PutPerS = o.LogPutPerS + lambda*w.OutputsPerAttempt*(chunks+1) // chunks + manifest
	o.OtherReqPerS = lambda * w.OutputsPerAttempt * 2                // manifest Stat + chunk List (cas.BucketStore.create)
	return o
}

// Sizing is the answer: the least k and what bounds first.
type Sizing struct {
	// MinK is the least k in 1..MaxK that keeps every per-daemon resource
	// at or below TargetUtil (0: none does).
	MinK int `json:"min_k"`
	// Bound is the per-daemon resource that needs the most daemons.
	Bound string `json:"bound"`
	// SharedOver names the shared resources (database, object store) above
	// TargetUtil at MinK: more daemons do not relieve them, so they bound
	// first when not empty.
	SharedOver []string `json:"shared_over,omitempty"`
	At         Result   `json:"at"` // the model at MinK (or at MaxK)
	// PerResourceK is, per per-daemon resource, the least k that keeps it
	// under TargetUtil (absent: none up to MaxK).
	PerResourceK map[string]int `json:"per_resource_k"`
}

// First is the resource that bounds first: a shared one above the target,
// else the per-daemon Bound.
func (s Sizing) First() string {
	if len(s.SharedOver) > 0 {
		return s.SharedOver[0]
	}
	return s.Bound
}

// Size finds the least k in 1..MaxK that keeps every per-daemon resource
// at or below TargetUtil, which resource decides it, and which shared
// resources are above the target there.
func (m *Model) Size() Sizing {
	s := Sizing{PerResourceK: map[string]int{}}
	maxK := max(m.D.MaxK, 1)
	for k := 1; k <= maxK; k++ {
		r := m.Evaluate(k)
		all := true
		for _, x := range r.Resources {
			if x.Shared || x.Capacity <= 0 {
				continue
			}
			if x.Util() <= m.D.TargetUtil {
				if _, ok := s.PerResourceK[x.Name]; !ok {
					s.PerResourceK[x.Name] = k
				}
				continue
			}
			all = false
		}
		if all && s.MinK == 0 {
			s.MinK, s.At = k, r
		}
	}
	if s.MinK == 0 {
		s.At = m.Evaluate(maxK)
	}
	worst := 0
	for name, k := range s.PerResourceK {
		if k > worst || (k == worst && name < s.Bound) {
			worst, s.Bound = k, name
		}
	}
	for _, x := range s.At.Resources {
		if x.Shared && x.Capacity > 0 && x.Util() > m.D.TargetUtil {
			s.SharedOver = append(s.SharedOver, x.Name)
		}
	}
	return s
}

// MaxAgents returns, for each resource, the largest fleet (agents) it
// allows at or below TargetUtil on k daemons, found by bisection; -1 when
// it does not bound (no capacity, or more than 100 million agents).
func (m *Model) MaxAgents(k int) map[string]float64 {
	out := map[string]float64{}
	base := m.Evaluate(k)
	for i, x := range base.Resources {
		if x.Capacity <= 0 {
			out[x.Name] = -1
			continue
		}
		ok := func(agents int) bool {
			mm := *m
			mm.W.Agents = agents
			return mm.Evaluate(k).Resources[i].Util() <= m.D.TargetUtil
		}
		lo, hi := 0, 100_000_000
		if ok(hi) {
			out[x.Name] = -1
			continue
		}
		for hi-lo > 1 {
			mid := (lo + hi) / 2
			if ok(mid) {
				lo = mid
			} else {
				hi = mid
			}
		}
		out[x.Name] = float64(lo)
	}
	return out
}
