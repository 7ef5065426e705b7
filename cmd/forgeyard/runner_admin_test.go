package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/adminapi"
	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/wire"
)

// TestRunnerAdminCommands runs `forgeyard runner list|show|drain|resume|
// refresh-capabilities|probe` in-process against a real daemon process
// with one agent connected, over TCP with the token and over the unix
// socket, in table and JSON form; each command is audited by the daemon
// and an unauthenticated request is refused.
func TestRunnerAdminCommands(t *testing.T) {
	td := startDaemon(t)
	runner := connectAgent(t, td)
	r := runner.String()
	tcp := []string{"--admin", "http://" + td.admin, "--token-file", td.tokenFile}
	sock := []string{"--admin", "unix://" + td.socket}

	// list: the runner with its platform, backend, protocol, agent version.
	var rs []adminapi.Runner
	for deadline := time.Now().Add(10 * time.Second); ; {
		code, out, errOut := runCLI(t, append([]string{"runner", "list", "--json"}, sock...)...)
		if code != cli.ExitOK {
			t.Fatalf("list --json: exit %d: %s", code, errOut)
		}
		rs = nil
		if err := json.Unmarshal([]byte(out), &rs); err != nil {
			t.Fatalf("list --json: %v\n%s", err, out)
		}
		if len(rs) == 1 && rs[0].Health.Status != "" || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond) // the inventory is written after the registration
	}
	if len(rs) != 1 || rs[0].Runner != r || !rs[0].Connected || !rs[0].Local || rs[0].Daemon != "daemon-test" || rs[0].Backend != "quic" ||
		rs[0].Protocol != wire.Current.String() || rs[0].AgentVersion != "cli-test/1" || rs[0].Capabilities.OS == "" ||
		rs[0].Capabilities.MaxParallel != 1 || rs[0].Health.Status == "" || rs[0].Drained {
		t.Fatalf("list JSON %+v", rs)
	}
	code, out, errOut := runCLI(t, append([]string{"runner", "list"}, tcp...)...)
	if code != cli.ExitOK {
		t.Fatalf("list: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"RUNNER", "OS/ARCH", "LABELS", "SLOTS", "CONNECTION", "LAST HEARTBEAT", "HEALTH", "DRAINED", r, "connected here", "quic", "cli-test/1", "1 runners"} {
		if !strings.Contains(out, want) {
			t.Errorf("list lacks %q:\n%s", want, out)
		}
	}

	// drain (flag after the runner), then show says so.
	code, out, errOut = runCLI(t, append([]string{"runner", "drain", r, "--reason", "kernel update"}, tcp...)...)
	if code != cli.ExitOK || !strings.Contains(out, "drain "+r+": done") {
		t.Fatalf("drain: exit %d: %s%s", code, out, errOut)
	}
	code, out, _ = runCLI(t, append([]string{"runner", "show", r}, sock...)...)
	if code != cli.ExitOK || !strings.Contains(out, "drained               yes: kernel update") || !strings.Contains(out, "connected here") {
		t.Errorf("show after drain: exit %d\n%s", code, out)
	}
	code, out, errOut = runCLI(t, append([]string{"runner", "resume", r, "--json"}, sock...)...)
	var res adminapi.CommandResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != cli.ExitOK || !res.Delivered || res.Command != "resume" {
		t.Fatalf("resume --json: exit %d %v: %s%s", code, err, out, errOut)
	}
	code, out, _ = runCLI(t, append([]string{"runner", "show", r, "--json"}, tcp...)...)
	var one adminapi.Runner
	if err := json.Unmarshal([]byte(out), &one); err != nil || code != cli.ExitOK || one.Drained || one.Runner != r {
		t.Errorf("show --json after resume: %d %v %+v", code, err, one)
	}

	// refresh-capabilities and probe: the agent's answers.
	code, out, errOut = runCLI(t, append([]string{"runner", "refresh-capabilities", r}, tcp...)...)
	if code != cli.ExitOK || !strings.Contains(out, "refresh-capabilities "+r+": done") || !strings.Contains(out, "1 slots") {
		t.Fatalf("refresh-capabilities: exit %d: %s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, append([]string{"runner", "probe", r, "--probe", "clock", "--json"}, tcp...)...)
	res = adminapi.CommandResult{}
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != cli.ExitOK || res.Health == nil || res.Health.Probe != "Clock" ||
		len(res.Health.Checks) != 1 || res.Health.Checks[0].Name != "clock" {
		t.Fatalf("probe --json: exit %d %v: %s%s", code, err, out, errOut)
	}
	code, out, errOut = runCLI(t, append([]string{"runner", "probe", r}, sock...)...)
	if code != cli.ExitOK || !strings.Contains(out, "health: ") || !strings.Contains(out, "connectivity") || !strings.Contains(out, "disk") {
		t.Fatalf("probe: exit %d: %s%s", code, out, errOut)
	}

	// Refusals: bad probe kind, unknown runner, usage.
	if code, _, errOut := runCLI(t, append([]string{"runner", "probe", r, "--probe", "rm -rf"}, tcp...)...); code != cli.ExitFail || !strings.Contains(errOut, "unknown probe") {
		t.Errorf("bad probe kind: exit %d: %s", code, errOut)
	}
	other := wire.NewRunnerId().String()
	if code, _, errOut := runCLI(t, append([]string{"runner", "show", other}, tcp...)...); code != cli.ExitFail || !strings.Contains(errOut, "404: unknown runner "+other) {
		t.Errorf("unknown runner: exit %d: %s", code, errOut)
	}
	if code, _, errOut := runCLI(t, append([]string{"runner", "refresh-capabilities", other}, tcp...)...); code != cli.ExitFail || !strings.Contains(errOut, "not connected to this daemon") {
		t.Errorf("refresh of an unconnected runner: exit %d: %s", code, errOut)
	}
	if code, _, errOut := runCLI(t, append([]string{"runner", "drain"}, tcp...)...); code != cli.ExitUsage || !strings.Contains(errOut, "missing RUNNER") {
		t.Errorf("drain without runner: exit %d: %s", code, errOut)
	}

	// Without the token the TCP endpoint refuses the commands.
	resp, err := http.Post("http://"+td.admin+adminapi.PathRunners+"/"+r+"/drain", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("drain without token: %d, want 401", resp.StatusCode)
	}

	// Every command was audited, with the runner and the command.
	var reasons []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		reasons = reasons[:0]
		for _, line := range strings.Split(td.logs.String(), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["event"] == "runner.admin_command" && rec["runner"] == r {
				reasons = append(reasons, rec["reason"].(string))
			}
		}
		if len(reasons) >= 5 {
			break
		}
	}
	if strings.Join(reasons, ",") != "drain,resume,refresh_capabilities,health_probe,health_probe" {
		t.Errorf("audited %v", reasons)
	}
}
