package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"

	"forgeyard.dev/transport/internal/adminapi"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/health"
)

// The runner inventory and admin commands on the admin endpoint (see
// internal/adminapi/runners.go): GET /runners, GET /runners/{runner},
// POST /runners/{runner}/{drain|resume|refresh-capabilities|probe}.

// maxCommandBody bounds a runner command's JSON body.
const maxCommandBody = 4 << 10

// commandTimeout bounds one runner command (the agent's answer).
const commandTimeout = 10 * time.Second

func (t *daemonTelemetry) daemonRef() *daemon.Daemon {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.d
}

// runnersHandler serves /runners and everything below it.
func (t *daemonTelemetry) runnersHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d := t.daemonRef()
		if d == nil {
			writeError(w, http.StatusServiceUnavailable, "the daemon is starting")
			return
		}
		rest := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, adminapi.PathRunners), "/")
		parts := strings.Split(rest, "/")
		switch {
		case rest == "":
			if !method(w, r, http.MethodGet) {
				return
			}
			ris, err := d.Runners(r.Context())
			if err != nil {
				writeError(w, http.StatusServiceUnavailable, "authority unavailable: "+err.Error())
				return
			}
			out := make([]adminapi.Runner, 0, len(ris))
			for _, ri := range ris {
				out = append(out, runnerJSON(ri))
			}
			writeJSON(w, http.StatusOK, out)
		case len(parts) == 1:
			id, ok := runnerRequest(w, r, http.MethodGet, parts[0])
			if !ok {
				return
			}
			ri, err := d.Runner(r.Context(), id)
			switch {
			case errors.Is(err, daemon.ErrUnknownRunner):
				writeError(w, http.StatusNotFound, "unknown runner "+parts[0]+": it never registered with a daemon sharing this authority")
			case err != nil:
				writeError(w, http.StatusServiceUnavailable, "authority unavailable: "+err.Error())
			default:
				writeJSON(w, http.StatusOK, runnerJSON(ri))
			}
		case len(parts) == 2:
			id, ok := runnerRequest(w, r, http.MethodPost, parts[0])
			if !ok {
				return
			}
			var cmd adminapi.RunnerCommand
			body, err := io.ReadAll(io.LimitReader(r.Body, maxCommandBody+1))
			if err != nil || len(body) > maxCommandBody {
				writeError(w, http.StatusBadRequest, "the command body must be JSON of at most 4 KiB")
				return
			}
			if len(strings.TrimSpace(string(body))) > 0 {
				if err := json.Unmarshal(body, &cmd); err != nil {
					writeError(w, http.StatusBadRequest, "the command body is not a JSON RunnerCommand: "+err.Error())
					return
				}
			}
			t.runnerCommand(w, r, d, id, parts[0], parts[1], cmd)
		default:
			writeError(w, http.StatusNotFound, "no such admin path; try /runners, /runners/RUNNER or POST /runners/RUNNER/{drain,resume,refresh-capabilities,probe}")
		}
	})
}

func method(w http.ResponseWriter, r *http.Request, m string) bool {
	if r.Method == m || (m == http.MethodGet && r.Method == http.MethodHead) {
		return true
	}
	w.Header().Set("Allow", m)
	writeError(w, http.StatusMethodNotAllowed, "method not allowed: use "+m)
	return false
}

// runnerRequest checks a request for one runner (/runners/ID...): its
// method is m and s is a runner id; otherwise it answers the error.
func runnerRequest(w http.ResponseWriter, r *http.Request, m, s string) (wire.RunnerId, bool) {
	if !method(w, r, m) {
		return wire.RunnerId{}, false
	}
	return runnerID(w, s)
}

func runnerID(w http.ResponseWriter, s string) (wire.RunnerId, bool) {
	u, err := ulid.ParseStrict(s)
	if err != nil {
		writeError(w, http.StatusBadRequest, "runner id "+s+" is not a ULID (see forgeyard runner list)")
		return wire.RunnerId{}, false
	}
	return wire.RunnerId{ULID: u}, true
}

// runnerCommand runs one command and answers its CommandResult.
func (t *daemonTelemetry) runnerCommand(w http.ResponseWriter, r *http.Request, d *daemon.Daemon, id wire.RunnerId, idStr, name string, cmd adminapi.RunnerCommand) {
	ctx, cancel := context.WithTimeout(r.Context(), commandTimeout)
	defer cancel()
	res := adminapi.CommandResult{Runner: idStr, Command: name}
	var err error
	switch name {
	case adminapi.CommandDrain:
		err = d.DrainRunner(ctx, id, cmd.Reason)
	case adminapi.CommandResume:
		err = d.ResumeRunner(ctx, id)
	case adminapi.CommandRefresh:
		var c authority.Capabilities
		if c, err = d.RefreshCapabilities(ctx, id); err == nil {
			cj := capsJSON(c, time.Now())
			res.Capabilities = &cj
		}
	case adminapi.CommandProbe:
		k, ok := probeKind(cmd.Probe)
		if !ok {
			writeError(w, http.StatusBadRequest, "unknown probe "+cmd.Probe+": one of "+strings.Join(adminapi.ProbeKinds, ", "))
			return
		}
		var pr daemon.ProbeResult
		if pr, err = d.ProbeRunner(ctx, id, k); err == nil {
			hj := healthJSON(pr.Health)
			res.Health, res.DurationMs = &hj, pr.Duration.Milliseconds()
		}
	default:
		writeError(w, http.StatusNotFound, "unknown runner command "+name+"; one of drain, resume, refresh-capabilities, probe")
		return
	}
	switch {
	case err == nil:
		res.Delivered = true
	case errors.Is(err, daemon.ErrNotConnected) && (name == adminapi.CommandDrain || name == adminapi.CommandResume):
		res.Message = "recorded in the authority; the runner is not connected to this daemon (the daemon holding it refuses offers now and tells the agent when it reconnects)"
	case errors.Is(err, daemon.ErrNotConnected):
		writeError(w, http.StatusConflict, "runner "+idStr+" is not connected to this daemon; run the command against the daemon named in `forgeyard runner show`")
		return
	case errors.Is(err, daemon.ErrNotSupported):
		writeError(w, http.StatusNotImplemented, "the runner's agent does not support "+name+" (an older agent); upgrade it")
		return
	default:
		writeError(w, http.StatusBadGateway, name+" failed: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func probeKind(s string) (health.ProbeKind, bool) {
	switch strings.ToLower(s) {
	case "", "full":
		return health.ProbeFull, true
	case "connectivity":
		return health.ProbeConnectivity, true
	case "disk":
		return health.ProbeDisk, true
	case "clock":
		return health.ProbeClock, true
	}
	return 0, false
}

func utc(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}

func capsJSON(c authority.Capabilities, updated time.Time) adminapi.Capabilities {
	out := adminapi.Capabilities{OS: c.OS, Arch: c.Arch, Labels: c.Labels, MaxParallel: c.MaxParallel, CPUMillis: c.CPUMillis,
		MemBytes: c.MemBytes, DiskBytes: c.DiskBytes, Tools: c.Tools, Updated: utc(updated)}
	if c.Digest != (wire.Digest{}) {
		out.Digest = hex.EncodeToString(c.Digest[:])
	}
	if out.Labels == nil {
		out.Labels = []string{}
	}
	if out.Tools == nil {
		out.Tools = []string{}
	}
	return out
}

func healthJSON(h authority.Health) adminapi.Health {
	out := adminapi.Health{Status: h.Status, Probe: h.Probe, UptimeMs: h.UptimeMs, ReportedAt: utc(h.ReportedAt), Checks: []adminapi.HealthCheck{}}
	for _, c := range h.Checks {
		out.Checks = append(out.Checks, adminapi.HealthCheck{Name: c.Name, Status: c.Status, Message: c.Message})
	}
	return out
}

func runnerJSON(ri daemon.RunnerInfo) adminapi.Runner {
	out := adminapi.Runner{Runner: ri.Runner.String(), Capabilities: capsJSON(ri.Capabilities, ri.CapabilitiesUpdated),
		Connected: ri.Connected, Local: ri.Local, Daemon: ri.Daemon, Backend: ri.Backend, Protocol: ri.Protocol,
		AgentVersion: ri.AgentVersion, ConnectedAt: utc(ri.ConnectedAt), LastHeartbeat: utc(ri.LastHeartbeat),
		Health: healthJSON(ri.Health), Drained: ri.Drained, DrainReason: ri.DrainReason, DrainChanged: utc(ri.DrainChanged)}
	if ri.Session != (wire.AgentSessionId{}) {
		out.Session, out.Role = ri.Session.String(), ri.Role.String()
	}
	return out
}
