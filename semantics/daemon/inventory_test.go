package daemon_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/enginetest"
	"forgeyard.dev/transport/internal/testkit/pgtest"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/authority"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/trust/trusttest"
	"forgeyard.dev/transport/wire"
	"forgeyard.dev/transport/wire/admin"
	agentwire "forgeyard.dev/transport/wire/agent"
	"forgeyard.dev/transport/wire/health"
)

// awaitRunner polls the daemon's inventory until ok accepts the runner's
// record (the inventory is written on the connection's work goroutine).
func awaitRunner(t *testing.T, d *daemon.Daemon, r wire.RunnerId, what string, ok func(daemon.RunnerInfo) bool) daemon.RunnerInfo {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last daemon.RunnerInfo
	var err error
	for time.Now().Before(deadline) {
		last, err = d.Runner(context.Background(), r)
		if err == nil && ok(last) {
			return last
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("runner %s: %s never seen; last %+v, %v", r, what, last, err)
	return last
}

func withCaps(labels ...string) enginetest.AgentOpt {
	return func(c *agent.Config) {
		c.Capabilities = agentwire.RunnerCapabilitiesV1{Labels: labels, CPUMillis: 4000, MemBytes: 8 << 30, DiskBytes: 100 << 30, Tools: []string{"go"}}
	}
}

// TestRunnerInventory (issue 16 items 3–4): a runner's registration
// capabilities, where it is connected (backend, protocol, agent version,
// daemon), its last heartbeat and its health summary are in the
// inventory, on every backend.
func TestRunnerInventory(t *testing.T) {
	enginetest.AllBackends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b, func(c *daemon.Config) { c.ID = "inv-daemon" })
		id := w.NewIdentity()
		w.StartAgent(id, enginetest.NewCountingExec(false), withCaps("linux-big", "gpu"), func(c *agent.Config) { c.Version = "agent-test 9.9" })
		w.AwaitActive(id.Runner)
		ri := awaitRunner(t, w.D, id.Runner, "capabilities, heartbeat and health", func(ri daemon.RunnerInfo) bool {
			return len(ri.Capabilities.Labels) == 2 && !ri.LastHeartbeat.IsZero() && ri.Health.Status != ""
		})
		c := ri.Capabilities
		if !slices.Equal(c.Labels, []string{"linux-big", "gpu"}) || c.OS == "" || c.Arch == "" || c.CPUMillis != 4000 ||
			c.MemBytes != 8<<30 || c.DiskBytes != 100<<30 || !slices.Equal(c.Tools, []string{"go"}) || c.MaxParallel != 64 || c.Digest == (wire.Digest{}) {
			t.Errorf("capabilities %+v", c)
		}
		if !ri.Connected || !ri.Local || ri.Daemon != "inv-daemon" || ri.Backend != b.Name || ri.Protocol != wire.Current.String() ||
			ri.AgentVersion != "agent-test 9.9" || ri.Role != agentwire.RoleAgent || ri.ConnectedAt.IsZero() {
			t.Errorf("presence %+v", ri)
		}
		names := map[string]string{}
		for _, ch := range ri.Health.Checks {
			names[ch.Name] = ch.Status
		}
		if names["connectivity"] != "Healthy" || names["disk"] != "Healthy" || names["clock"] == "" || ri.Health.Probe != "" {
			t.Errorf("health summary %+v", ri.Health)
		}
		all, err := w.D.Runners(context.Background())
		if err != nil || len(all) != 1 || all[0].Runner != id.Runner {
			t.Fatalf("Runners: %+v, %v", all, err)
		}
		// The authority holds the same (another daemon would read it).
		rec, err := authority.InventoryOf(w.Auth).Runner(context.Background(), id.Runner)
		if err != nil || !slices.Equal(rec.Capabilities.Labels, c.Labels) || rec.Presence.Daemon != "inv-daemon" || !rec.Presence.Connected {
			t.Fatalf("authority record %+v, %v", rec, err)
		}
		if _, err := w.D.Runner(context.Background(), wire.NewRunnerId()); !errors.Is(err, daemon.ErrUnknownRunner) {
			t.Errorf("unknown runner: %v", err)
		}
	})
}

// TestCapabilityUpdateAndRefresh (§94–95, §97): the agent sends a full
// CapabilityUpdateV1 when the host changes its capabilities; the daemon
// validates and records it and calls OnCapabilities; RefreshCapabilities
// is answered with the agent's current snapshot.
func TestCapabilityUpdateAndRefresh(t *testing.T) {
	enginetest.AllBackends(t, func(t *testing.T, b enginetest.Backend) {
		hooked := make(chan agentwire.RunnerCapabilitiesV1, 16)
		w := enginetest.NewWorld(t, b, func(c *daemon.Config) {
			c.Hooks.OnCapabilities = func(_ daemon.SessionInfo, rc agentwire.RunnerCapabilitiesV1) { hooked <- rc }
		})
		id := w.NewIdentity()
		a, _, _ := w.StartAgent(id, enginetest.NewCountingExec(false), withCaps("old"))
		w.AwaitActive(id.Runner)
		<-hooked // the registration's
		changed, err := a.SetCapabilities(agentwire.RunnerCapabilitiesV1{Labels: []string{"new", "arm"}, MaxParallel: 2})
		if err != nil || !changed {
			t.Fatalf("SetCapabilities: %v, %v", changed, err)
		}
		if changed, _ := a.SetCapabilities(a.Capabilities()); changed {
			t.Error("the same snapshot counted as a change")
		}
		if _, err := a.SetCapabilities(agentwire.RunnerCapabilitiesV1{Labels: []string{""}}); err == nil {
			t.Error("an invalid snapshot was accepted")
		}
		select {
		case rc := <-hooked:
			if !slices.Equal(rc.Labels, []string{"new", "arm"}) || rc.MaxParallel != 2 {
				t.Fatalf("hook got %+v", rc)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("CapabilityUpdateV1 never reached OnCapabilities")
		}
		awaitRunner(t, w.D, id.Runner, "the update", func(ri daemon.RunnerInfo) bool {
			return slices.Equal(ri.Capabilities.Labels, []string{"new", "arm"}) && ri.Capabilities.MaxParallel == 2
		})
		got, err := w.D.RefreshCapabilities(context.Background(), id.Runner)
		if err != nil || !slices.Equal(got.Labels, []string{"new", "arm"}) {
			t.Fatalf("RefreshCapabilities: %+v, %v", got, err)
		}
		// The agent counts its answer after writing it: wait for it.
		for deadline := time.Now().Add(5 * time.Second); a.Stats().CapabilityUpdates < 2 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		if n := a.Stats().CapabilityUpdates; n != 2 {
			t.Errorf("agent sent %d capability updates, want 2 (one change, one refresh)", n)
		}
		if _, err := w.D.RefreshCapabilities(context.Background(), wire.NewRunnerId()); !errors.Is(err, daemon.ErrNotConnected) {
			t.Errorf("refresh of an unconnected runner: %v", err)
		}
	})
}

// TestHealthProbe (§96–97): RunHealthProbe is answered with the probe's
// result, which becomes the runner's health in the inventory; a host
// check (Config.HealthChecks) is part of it.
func TestHealthProbe(t *testing.T) {
	enginetest.AllBackends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b)
		id := w.NewIdentity()
		a, _, _ := w.StartAgent(id, enginetest.NewCountingExec(false), func(c *agent.Config) {
			c.HealthChecks = func(_ context.Context, k health.ProbeKind) []health.HealthCheckV1 {
				if k != health.ProbeDisk {
					return nil
				}
				return []health.HealthCheckV1{{Name: "cache", Status: health.Degraded, Message: "cache 91% full"}}
			}
		})
		w.AwaitActive(id.Runner)
		// The summary the agent sends on connecting first, so that it
		// cannot land after (and replace) the probe result.
		awaitRunner(t, w.D, id.Runner, "the connect summary", func(ri daemon.RunnerInfo) bool { return ri.Health.Status != "" })
		ctx := context.Background()
		res, err := w.D.ProbeRunner(ctx, id.Runner, health.ProbeDisk)
		if err != nil {
			t.Fatal(err)
		}
		if res.Probe != health.ProbeDisk || res.Health.Status != "Degraded" || len(res.Health.Checks) != 2 ||
			res.Health.Checks[0].Name != "disk" || res.Health.Checks[1].Name != "cache" {
			t.Fatalf("disk probe %+v", res)
		}
		awaitRunner(t, w.D, id.Runner, "the probe result", func(ri daemon.RunnerInfo) bool {
			return ri.Health.Probe == "Disk" && ri.Health.Status == "Degraded"
		})
		res, err = w.D.ProbeRunner(ctx, id.Runner, health.ProbeClock)
		if err != nil || len(res.Health.Checks) != 1 || res.Health.Checks[0].Name != "clock" || res.Health.Checks[0].Status != "Healthy" {
			t.Fatalf("clock probe %+v, %v", res, err)
		}
		if _, err := w.D.ProbeRunner(ctx, id.Runner, health.ProbeKind(9)); err == nil {
			t.Error("an unknown probe kind was sent")
		}
		for deadline := time.Now().Add(5 * time.Second); a.Stats().HealthProbes < 2 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond) // counted after the answer is written
		}
		if n := a.Stats().HealthProbes; n != 2 {
			t.Errorf("agent ran %d probes, want 2", n)
		}
	})
}

// TestAdminCommandsAudited (§97, §279): drain, resume, refresh
// capabilities and probe are each audited as runner.admin_command with the
// runner and the command as reason, and nothing else.
func TestAdminCommandsAudited(t *testing.T) {
	w := enginetest.NewWorld(t, enginetest.MemoryBackend())
	id := w.NewIdentity()
	w.StartAgent(id, enginetest.NewCountingExec(false))
	w.AwaitActive(id.Runner)
	ctx := context.Background()
	if err := w.D.DrainRunner(ctx, id.Runner, "kernel update"); err != nil {
		t.Fatal(err)
	}
	if err := w.D.ResumeRunner(ctx, id.Runner); err != nil {
		t.Fatal(err)
	}
	if _, err := w.D.RefreshCapabilities(ctx, id.Runner); err != nil {
		t.Fatal(err)
	}
	if _, err := w.D.ProbeRunner(ctx, id.Runner, health.ProbeFull); err != nil {
		t.Fatal(err)
	}
	recs := auditRecords(t, w, telemetry.EventAdminCommand)
	var reasons []string
	for _, r := range recs {
		checkAudit(t, r, map[string]string{"event": "runner.admin_command", "runner": id.Runner.String(), "reason": "*"})
		reasons = append(reasons, r["reason"].(string))
	}
	if want := []string{"drain", "resume", "refresh_capabilities", "health_probe"}; !slices.Equal(reasons, want) {
		t.Fatalf("audited %v, want %v", reasons, want)
	}
}

// TestDrainSharedAcrossDaemons (§97, §229): two daemons share one
// PostgreSQL authority. A drain issued on daemon A (the runner is
// connected to B) is honoured by B — no offers — and sent to the agent
// when it reconnects to B; A's inventory shows the runner connected on B;
// a resume on A lets B offer again.
func TestDrainSharedAcrossDaemons(t *testing.T) {
	enginetest.AllBackends(t, func(t *testing.T, b enginetest.Backend) {
		dsn := pgtest.Shared(t).NewDatabase(t)
		open := func() authority.Authority {
			a, err := authority.OpenPostgres(context.Background(), dsn)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = a.Close() })
			return a
		}
		pki := trusttest.NewPKI(t)
		wa := enginetest.NewWorldWith(t, b, pki, open(), sharedDB, func(c *daemon.Config) { c.ID = "daemon-a" })
		wb := enginetest.NewWorldWith(t, b, pki, open(), sharedDB, func(c *daemon.Config) { c.ID = "daemon-b" })
		id := wb.NewIdentity()
		exec := enginetest.NewCountingExec(false)
		a, rd, _ := wb.StartAgent(id, exec)
		wb.AwaitActive(id.Runner)
		ctx := context.Background()
		if err := wa.D.DrainRunner(ctx, id.Runner, "rack move"); !errors.Is(err, daemon.ErrNotConnected) {
			t.Fatalf("drain on the daemon the runner is not connected to: %v, want ErrNotConnected (recorded anyway)", err)
		}
		if _, err := wb.D.OfferLease(ctx, id.Runner, enginetest.Offer(50)); !errors.Is(err, daemon.ErrDraining) {
			t.Fatalf("daemon B offered to a runner drained on A: %v", err)
		}
		ri := awaitRunner(t, wa.D, id.Runner, "presence on daemon B", func(ri daemon.RunnerInfo) bool {
			return ri.Connected && ri.Daemon == "daemon-b"
		})
		if ri.Local || !ri.Drained || ri.DrainReason != "rack move" || ri.Backend != b.Name {
			t.Errorf("daemon A's view %+v", ri)
		}
		// Reconnect to B: B re-sends the drain.
		reconnects := a.Stats().Reconnects
		rd.Cut()
		deadline := time.Now().Add(10 * time.Second)
		// The agent's Draining outlives the cut: wait for the new
		// transport's registration too, so the resume below reaches it.
		for (!a.Status().Draining || a.Stats().Reconnects == reconnects) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if !a.Status().Draining {
			t.Fatal("the agent was not told of the drain after reconnecting to daemon B")
		}
		if err := wa.D.ResumeRunner(ctx, id.Runner); !errors.Is(err, daemon.ErrNotConnected) {
			t.Fatalf("resume on A: %v", err)
		}
		wb.AwaitActive(id.Runner)
		if err := wb.D.ResumeRunner(ctx, id.Runner); err != nil { // tell the agent too
			t.Fatal(err)
		}
		for a.Status().Draining && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		l, err := wb.D.OfferLease(ctx, id.Runner, enginetest.Offer(51))
		if err != nil || l.State != authority.LeaseAccepted {
			t.Fatalf("offer after resume: %+v, %v", l, err)
		}
		// Drained through B (the agent is told), resumed through A (it is
		// not): B's next offer is preceded by a resume, and accepted.
		if err := wb.D.DrainRunner(ctx, id.Runner, "again"); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); !a.Status().Draining && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		if _, err := wa.D.OfferLease(ctx, id.Runner, enginetest.Offer(52)); !errors.Is(err, daemon.ErrNotConnected) {
			t.Fatalf("offer through A: %v", err)
		}
		if err := wa.D.ResumeRunner(ctx, id.Runner); !errors.Is(err, daemon.ErrNotConnected) {
			t.Fatalf("resume on A: %v", err)
		}
		l, err = wb.D.OfferLease(ctx, id.Runner, enginetest.Offer(53))
		if err != nil || l.State != authority.LeaseAccepted {
			t.Fatalf("offer on B after a resume on A: %+v, %v (agent draining %v)", l, err, a.Status().Draining)
		}
	})
}

// TestCapabilityRecoveryByDigest (§236): a heartbeat whose capability
// digest differs from the snapshot the daemon holds (an update that never
// arrived) makes the daemon ask for the agent's snapshot, once, and record
// it.
func TestCapabilityRecoveryByDigest(t *testing.T) {
	enginetest.AllBackends(t, func(t *testing.T, b enginetest.Backend) {
		w := enginetest.NewWorld(t, b, slowHeartbeat)
		id := w.NewIdentity()
		rc := w.DialRaw(id)
		rc.Join(wire.NewAgentSessionId()) // registers with digest {9}
		w.AwaitActive(id.Runner)
		awaitRunner(t, w.D, id.Runner, "the registration snapshot", func(ri daemon.RunnerInfo) bool { return ri.Capabilities.OS == "linux" })
		newer := wire.CapabilityDigest{Digest: wire.Digest{7}}
		for seq := uint64(1); seq <= 3; seq++ { // three heartbeats, one refresh
			if _, err := rc.Ch.SendMsg(&agentwire.HeartbeatV1{Runner: id.Runner, Session: rc.Sess, Seq: seq, CapabilityDigest: newer}); err != nil {
				t.Fatal(err)
			}
		}
		_, env := enginetest.Next[*admin.RefreshCapabilitiesV1](t, rc)
		if err := rc.Ch.Reply(env, &agentwire.CapabilityUpdateV1{Digest: newer,
			Full: agentwire.RunnerCapabilitiesV1{OS: "linux", Arch: "arm64", Labels: []string{"recovered"}, MaxParallel: 3}}); err != nil {
			t.Fatal(err)
		}
		awaitRunner(t, w.D, id.Runner, "the recovered snapshot", func(ri daemon.RunnerInfo) bool {
			return slices.Equal(ri.Capabilities.Labels, []string{"recovered"}) && ri.Capabilities.Digest == newer.Digest
		})
		if n := w.D.Stats().CapabilitiesRecovered; n != 1 {
			t.Errorf("CapabilitiesRecovered %d, want 1", n)
		}
		// The matching digest now: no further request. checkDigest decides
		// before the heartbeat is acknowledged, so a refresh it started
		// would be on its way before the marker sent after the ack.
		if _, err := rc.Ch.SendMsg(&agentwire.HeartbeatV1{Runner: id.Runner, Session: rc.Sess, Seq: 4, CapabilityDigest: newer}); err != nil {
			t.Fatal(err)
		}
		marker := false
		for {
			m, _ := enginetest.Next[wire.Message](t, rc)
			if _, ok := m.(*admin.RefreshCapabilitiesV1); ok {
				t.Fatal("a second refresh was requested")
			}
			if ack, ok := m.(*agentwire.HeartbeatAckV1); ok && ack.Seq == 4 && !marker {
				marker = true
				if err := daemon.SendToRunner(w.D, id.Runner, &admin.ResumeV1{}); err != nil {
					t.Fatal(err)
				}
			}
			if _, ok := m.(*admin.ResumeV1); ok {
				break
			}
		}
	})
}
