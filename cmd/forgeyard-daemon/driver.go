package main

// The matrix driver (--matrix-driver) is the process-level test surface the
// cross-version compatibility matrix (matrix/, docs/compatibility.md) uses
// to drive a daemon of any release from v0.1.0 on. It is served on the
// admin endpoint (loopback) under /v1/matrix/ and is a stable interface:
// later releases must keep every path, field and meaning below (they may
// add fields). Requests and answers are JSON; ids are the ULID strings the
// answers carry. Errors are {"error": "..."} with a 4xx/5xx status.
//
//	GET  /v1/matrix/info      {"driver":1,"protocol":"1.0–1.0","features":["LogResumeV1",…]}
//	GET  /v1/matrix/sessions  [{"runner","session","transport","epoch","backend","protocol",
//	                            "features":[…],"agent_version","state"}]
//	POST /v1/matrix/offer     {"runner","cut_on"?} → {"job","lease","attempt"} once the agent
//	                          accepted (blocks; 409 with the reason when rejected). cut_on arms a
//	                          one-shot cut of the runner's connections for this attempt:
//	                          "accept" (when its answer arrives), "running" or "uploading"
//	                          (when that phase is reported), "log" (when the daemon stored the
//	                          attempt's 2nd log frame), "upload" (when a CAS object has received
//	                          1 MiB), "completion" (after the authority
//	                          recorded the first completion and before its ack is sent).
//	POST /v1/matrix/cancel    {"attempt"} → {} once the agent acknowledged the cancel
//	POST /v1/matrix/cut       {"runner"} → {"closed":N}: closes the runner's connections
//	GET  /v1/matrix/attempt?id=ATTEMPT → {"phases":[…],"completions":[{"ack","result","exit_code"}],
//	                          "log":"…stored log text…","log_frames":N,"outputs":[{"digest","size","stored","received"}],
//	                          "outputs_finalized":bool,"log_encoding":"Raw"|"Flate"|""}
//
// "log_encoding" (added with protocol 1.1, v0.2.0) is the encoding of the
// attempt's last log stream.
//
// "stored" is true when the daemon's content store holds the output
// complete and verified; "received" counts the bytes the store received
// for it across all transfers (a resumed upload sends fewer than
// size + what arrived before the cut). Offers use the JobSpecId whose digest starts with
// the attempt id's 16 bytes (zeros after), so a synthetic executor's log
// lines and output are determined by the attempt id.
//
// With the driver the daemon keeps logs in memory and CAS objects in a
// temporary directory removed at exit, so read-back needs no other flags.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"

	"forgeyard.dev/transport/internal/demoscheduler"
	"forgeyard.dev/transport/semantics"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

// driverVersion is GET /v1/matrix/info's "driver"; bumped only when a
// field is added.
const driverVersion = 1

// maxDriverAttempts bounds the attempts the driver remembers.
const maxDriverAttempts = 4096

type matrixDriver struct {
	d       *daemon.Daemon
	sink    *logs.MemorySink
	casDir  string
	store   *cas.FSStore
	proto   wire.ProtocolRange
	feats   wire.FeatureSet
	mu      sync.Mutex
	conns   map[string]semantics.BackendConn // remote address → conn
	runners map[string]wire.RunnerId
	atts    map[string]*driverAttempt // attempt id → record
	byID    map[string]wire.JobAttemptId
	// received counts the bytes appended per CAS object, across resumed
	// transfers.
	received map[wire.CasObjectRef]uint64
}

type driverAttempt struct {
	runner      wire.RunnerId
	cutOn       string
	logEncoding string // of the last log stream (protocol 1.1 drivers)
	phases      []string
	completions []driverCompletion
}

type driverCompletion struct {
	Ack      string `json:"ack"`
	Result   string `json:"result"`
	ExitCode int32  `json:"exit_code"`
}

func newMatrixDriver(proto wire.ProtocolRange, feats wire.FeatureSet) (*matrixDriver, error) {
	dir, err := os.MkdirTemp("", "forgeyard-matrix-cas-")
	if err != nil {
		return nil, err
	}
	return &matrixDriver{sink: &logs.MemorySink{}, casDir: dir, proto: proto, feats: feats,
		conns: map[string]semantics.BackendConn{}, runners: map[string]wire.RunnerId{},
		atts: map[string]*driverAttempt{}, byID: map[string]wire.JobAttemptId{}, received: map[wire.CasObjectRef]uint64{}}, nil
}

// configure makes the daemon keep logs and CAS objects for read-back.
func (m *matrixDriver) configure(c *daemon.Config) error {
	st, err := cas.NewFSStore(cas.FSStoreConfig{Dir: m.casDir})
	if err != nil {
		return err
	}
	m.store = st
	c.LogSink, c.ContentStore = &driverSink{m.sink, m}, &driverStore{st, m}
	return nil
}

// cutAfterLogFrames and cutAfterUploadBytes are where the "log" and
// "upload" cuts fire.
const (
	cutAfterLogFrames   = 2
	cutAfterUploadBytes = 1 << 20
)

// driverSink fires an attempt's "log" cut once the sink holds
// cutAfterLogFrames of its frames.
type driverSink struct {
	*logs.MemorySink
	m *matrixDriver
}

func (s *driverSink) Append(a wire.JobAttemptId, seq uint64, kind wlogs.LogStreamKind, ts uint64, data []byte) error {
	err := s.MemorySink.Append(a, seq, kind, ts, data)
	if err == nil && seq >= cutAfterLogFrames {
		s.m.trigger(a, "log")
	}
	return err
}

// driverStore counts the bytes received per object and fires every armed
// "upload" cut once an object has received cutAfterUploadBytes.
type driverStore struct {
	*cas.FSStore
	m *matrixDriver
}

func (s *driverStore) Create(ref wire.CasObjectRef) (cas.PartialObject, error) {
	p, err := s.FSStore.Create(ref)
	if err != nil {
		return nil, err
	}
	return &driverPartial{PartialObject: p, ref: ref, m: s.m}, nil
}

type driverPartial struct {
	cas.PartialObject
	ref wire.CasObjectRef
	m   *matrixDriver
}

func (p *driverPartial) Append(b []byte) error {
	err := p.PartialObject.Append(b)
	p.m.mu.Lock()
	p.m.received[p.ref] += uint64(len(b))
	n := p.m.received[p.ref]
	var fire []wire.JobAttemptId
	if n >= cutAfterUploadBytes {
		for k, at := range p.m.atts {
			if at.cutOn == "upload" {
				fire = append(fire, p.m.byID[k])
			}
		}
	}
	p.m.mu.Unlock()
	for _, a := range fire {
		p.m.trigger(a, "upload")
	}
	return err
}

func (m *matrixDriver) close() { _ = os.RemoveAll(m.casDir) }

// track remembers an accepted connection for cuts; the returned func
// forgets it.
func (m *matrixDriver) track(bc semantics.BackendConn) func() {
	k := bc.RemoteAddr().String()
	m.mu.Lock()
	m.conns[k] = bc
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		if m.conns[k] == bc {
			delete(m.conns, k)
		}
		m.mu.Unlock()
	}
}

// cutRunner closes every connection of runner's sessions.
func (m *matrixDriver) cutRunner(runner wire.RunnerId) int {
	n := 0
	for _, s := range m.d.Sessions() {
		if s.Runner != runner {
			continue
		}
		m.mu.Lock()
		bc := m.conns[s.Remote]
		m.mu.Unlock()
		if bc != nil {
			_ = bc.CloseWithCode(wire.CloseInternalError, "matrix driver: cut")
			n++
		}
	}
	return n
}

func (m *matrixDriver) attempt(a wire.JobAttemptId) *driverAttempt {
	k := a.String()
	at := m.atts[k]
	if at == nil {
		if len(m.atts) >= maxDriverAttempts {
			clear(m.atts)
			clear(m.byID)
		}
		at = &driverAttempt{}
		m.atts[k], m.byID[k] = at, a
	}
	return at
}

// trigger cuts the attempt's runner when its armed event happens.
func (m *matrixDriver) trigger(a wire.JobAttemptId, event string) {
	m.mu.Lock()
	at := m.atts[a.String()]
	fire := at != nil && at.cutOn == event
	if fire {
		at.cutOn = ""
	}
	m.mu.Unlock()
	if fire {
		m.cutRunner(at.runner)
	}
}

// hooks wraps h with the driver's recording and armed cuts.
func (m *matrixDriver) hooks(h daemon.Hooks) daemon.Hooks {
	out := h
	out.OnLeaseAnswer = func(e daemon.LeaseAnswerEvent) {
		if h.OnLeaseAnswer != nil {
			h.OnLeaseAnswer(e)
		}
		if e.Accepted && !e.Duplicate {
			m.trigger(e.Attempt, "accept")
		}
	}
	out.OnLogStream = func(hdr wlogs.LogStreamHeaderV1) {
		if h.OnLogStream != nil {
			h.OnLogStream(hdr)
		}
		m.mu.Lock()
		m.attempt(hdr.Attempt).logEncoding = hdr.Encoding.String()
		m.mu.Unlock()
	}
	out.OnPhase = func(e daemon.PhaseEvent) {
		if h.OnPhase != nil {
			h.OnPhase(e)
		}
		m.mu.Lock()
		at := m.attempt(e.Attempt)
		at.phases = append(at.phases, e.Phase.String())
		m.mu.Unlock()
		switch e.Phase {
		case agentwire.PhaseRunning:
			m.trigger(e.Attempt, "running")
		case agentwire.PhaseUploadingOutputs:
			m.trigger(e.Attempt, "uploading")
		}
	}
	out.OnCompletion = func(e daemon.CompletionEvent) {
		if h.OnCompletion != nil {
			h.OnCompletion(e)
		}
		m.mu.Lock()
		at := m.attempt(e.Attempt)
		at.completions = append(at.completions, driverCompletion{Ack: e.Ack.String(), Result: e.Result.Kind.String(), ExitCode: e.Result.ExitCode})
		m.mu.Unlock()
		m.trigger(e.Attempt, "completion")
	}
	return out
}

func featureNames(s wire.FeatureSet) []string {
	out := []string{}
	for _, f := range s.List() {
		out = append(out, f.String())
	}
	return out
}

// handler is the matrix driver's admin API (/v1/matrix/), one method a route.
func (m *matrixDriver) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/matrix/info", m.serveInfo)
	mux.HandleFunc("GET /v1/matrix/sessions", m.serveSessions)
	mux.HandleFunc("POST /v1/matrix/offer", m.serveOffer)
	mux.HandleFunc("POST /v1/matrix/cancel", m.serveCancel)
	mux.HandleFunc("POST /v1/matrix/cut", m.serveCut)
	mux.HandleFunc("GET /v1/matrix/attempt", m.serveAttempt)
	return mux
}

// serveInfo is GET /v1/matrix/info: the driver's version, protocol and features.
func (m *matrixDriver) serveInfo(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"driver": driverVersion, "protocol": m.proto.String(), "features": featureNames(m.feats)})
}

// serveSessions is GET /v1/matrix/sessions: the registered sessions (remembering their runners).
func (m *matrixDriver) serveSessions(w http.ResponseWriter, _ *http.Request) {
	out := []map[string]any{}
	for _, s := range m.d.Sessions() {
		if s.Runner == (wire.RunnerId{}) {
			continue // not registered yet
		}
		m.mu.Lock()
		m.runners[s.Runner.String()] = s.Runner
		m.mu.Unlock()
		out = append(out, map[string]any{"runner": s.Runner.String(), "session": s.Session.String(),
			"transport": s.Transport.String(), "epoch": s.Epoch, "backend": s.Backend, "protocol": s.Protocol.String(),
			"features": featureNames(s.Features), "agent_version": s.AgentVersion, "state": s.State})
	}
	writeJSON(w, http.StatusOK, out)
}

// serveOffer is POST /v1/matrix/offer: offers a synthetic lease to a runner, cut at cut_on.
func (m *matrixDriver) serveOffer(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Runner string `json:"runner"`
		CutOn  string `json:"cut_on"`
	}
	runner, ok := m.decodeRunner(w, r, &req, &req.Runner)
	if !ok {
		return
	}
	switch req.CutOn {
	case "", "accept", "running", "uploading", "log", "upload", "completion":
	default:
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "cut_on must be accept, running, uploading, log, upload or completion"})
		return
	}
	o := daemon.LeaseOffer{Job: wire.NewJobId(), Attempt: wire.NewJobAttemptId()}
	copy(o.Spec.Digest[:], o.Attempt.ULID[:]) // distinct per attempt
	o.Payload = demoscheduler.SyntheticPayload(o.Spec)
	m.mu.Lock()
	at := m.attempt(o.Attempt)
	at.runner, at.cutOn = runner, req.CutOn
	m.mu.Unlock()
	ctx, cancel := context.WithTimeout(r.Context(), 25*time.Second)
	defer cancel()
	l, err := m.d.OfferLease(ctx, runner, o)
	if err != nil {
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"job": o.Job.String(), "lease": l.ID.String(), "attempt": o.Attempt.String()})
}

// serveCancel is POST /v1/matrix/cancel: cancels an attempt (user requested).
func (m *matrixDriver) serveCancel(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Attempt string `json:"attempt"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad request: " + err.Error()})
		return
	}
	m.mu.Lock()
	a, ok := m.byID[req.Attempt]
	m.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "unknown attempt " + req.Attempt})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 25*time.Second)
	defer cancel()
	if err := m.d.CancelAttempt(ctx, a, agentwire.CancelUserRequested); err != nil {
		writeJSON(w, http.StatusConflict, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{})
}

// serveCut is POST /v1/matrix/cut: cuts a runner's connections.
func (m *matrixDriver) serveCut(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Runner string `json:"runner"`
	}
	runner, ok := m.decodeRunner(w, r, &req, &req.Runner)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"closed": m.cutRunner(runner)})
}

// serveAttempt is GET /v1/matrix/attempt: an attempt's phases, completions, log and outputs.
func (m *matrixDriver) serveAttempt(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	m.mu.Lock()
	a, ok := m.byID[id]
	var phases []string
	var compl []driverCompletion
	var enc string
	if ok {
		at := m.atts[id]
		enc = at.logEncoding
		phases = append([]string{}, at.phases...)
		compl = append([]driverCompletion{}, at.completions...)
	}
	m.mu.Unlock()
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "unknown attempt " + id})
		return
	}
	var text strings.Builder
	recs := m.sink.Records(a)
	for _, rec := range recs {
		if text.Len() < 1<<20 {
			text.Write(rec.Data)
		}
	}
	outs, fin := m.d.FinalizedOutputs(a)
	jo := []map[string]any{}
	for _, o := range outs {
		st, err := m.store.Stat(o)
		m.mu.Lock()
		recv := m.received[o]
		m.mu.Unlock()
		jo = append(jo, map[string]any{"digest": o.Digest.String(), "size": o.Size, "stored": err == nil && st.Complete, "received": recv})
	}
	writeJSON(w, http.StatusOK, map[string]any{"phases": phases, "completions": compl, "log": text.String(),
		"log_frames": len(recs), "outputs": jo, "outputs_finalized": fin, "log_encoding": enc})
}

// decodeRunner decodes a JSON body into req and resolves *field (a runner
// id listed by /v1/matrix/sessions).
func (m *matrixDriver) decodeRunner(w http.ResponseWriter, r *http.Request, req any, field *string) (wire.RunnerId, bool) {
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad request: " + err.Error()})
		return wire.RunnerId{}, false
	}
	m.mu.Lock()
	id, ok := m.runners[*field]
	m.mu.Unlock()
	if !ok {
		// A runner ID is its ULID: parsed, not looked up in a snapshot of
		// every session (Daemon.Sessions is O(agents); the loadgen offers
		// leases to runners it never listed, and at 3,000 agents that scan
		// was 15 % of the daemon's CPU during the herd). OfferLease and
		// cutRunner report a runner that is not connected.
		if u, err := ulid.ParseStrict(*field); err == nil {
			id, ok = wire.RunnerId{ULID: u}, true
		}
	}
	if !ok {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("runner %q is not connected", *field)})
		return wire.RunnerId{}, false
	}
	return id, true
}
