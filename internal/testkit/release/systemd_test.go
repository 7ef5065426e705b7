package release

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

const unitDir = "../../../packaging/systemd"

// units are the shipped units and the binary each runs.
var units = map[string]string{
	"forgeyard-daemon.service": "/usr/local/bin/forgeyard-daemon",
	"forgeyard-agent.service":  "/usr/local/bin/forgeyard-agent",
	"forgeyard-relay.service":  "/usr/local/bin/forgeyard-relay",
}

// keys parses a unit file into section.key → values (in order).
func keys(t *testing.T, file string) map[string][]string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]string{}
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#"):
		case strings.HasPrefix(l, "["):
			section = strings.Trim(l, "[]")
		default:
			k, v, _ := strings.Cut(l, "=")
			out[section+"."+k] = append(out[section+"."+k], v)
		}
	}
	return out
}

// verifiable copies the units into a temporary directory with ExecStart's
// binary replaced by an executable stand-in (systemd-analyze verify checks
// that the command exists; the binaries are not installed here).
func verifiable(t *testing.T, rewrite func(string) string) string {
	t.Helper()
	dir := t.TempDir()
	stand := filepath.Join(dir, "bin")
	os.WriteFile(stand, []byte("#!/bin/sh\n"), 0o755)
	for u, bin := range units {
		b, err := os.ReadFile(filepath.Join(unitDir, u))
		if err != nil {
			t.Fatal(err)
		}
		s := strings.ReplaceAll(string(b), "ExecStart="+bin, "ExecStart="+stand)
		if rewrite != nil {
			s = rewrite(s)
		}
		os.WriteFile(filepath.Join(dir, u), []byte(s), 0o644)
	}
	return dir
}

func analyze(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze is needed (Debian package systemd, installed by .ci/ensure-debs.sh): %v", err)
	}
	return p
}

// verify runs systemd-analyze verify on every unit of dir; any message
// (an unknown key, a value it cannot parse: verify still exits 0 for
// those) is a failure.
func verify(t *testing.T, dir string) (string, error) {
	t.Helper()
	args := []string{"verify", "--man=no"}
	for u := range units {
		args = append(args, filepath.Join(dir, u))
	}
	cmd := exec.Command(analyze(t), args...)
	cmd.Env = append(os.Environ(), "SYSTEMD_LOG_LEVEL=notice")
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// TestSystemdVerify: systemd-analyze verify accepts every unit without a
// message, and the check is not vacuous (a misspelt key, a bad value and a
// missing binary are reported).
func TestSystemdVerify(t *testing.T) {
	if out, err := verify(t, verifiable(t, nil)); err != nil || out != "" {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	bad := verifiable(t, func(s string) string {
		s = strings.Replace(s, "NoNewPrivileges=yes", "NoNewPrivilegs=yes", 1)
		return strings.Replace(s, "ProtectSystem=strict", "ProtectSystem=strictt", 1)
	})
	if out, _ := verify(t, bad); !strings.Contains(out, "NoNewPrivilegs") || !strings.Contains(out, "strictt") {
		t.Errorf("verify does not report a misspelt key and a bad value:\n%s", out)
	}
	missing := verifiable(t, func(s string) string {
		return regexp.MustCompile(`(?m)^ExecStart=\S+`).ReplaceAllString(s, "ExecStart=/nope/forgeyard")
	})
	if out, err := verify(t, missing); err == nil || !strings.Contains(out, "/nope/forgeyard") {
		t.Errorf("verify accepts a missing binary: %v\n%s", err, out)
	}
}

// TestSystemdSecurity: systemd-analyze security rates every unit "OK"
// (exposure at most 2.5 of 10) offline.
func TestSystemdSecurity(t *testing.T) {
	dir := verifiable(t, nil)
	re := regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`)
	for u := range units {
		out, err := exec.Command(analyze(t), "security", "--offline=yes", "--no-pager", filepath.Join(dir, u)).CombinedOutput()
		m := re.FindSubmatch(out)
		if err != nil || m == nil {
			t.Errorf("%s: systemd-analyze security: %v\n%s", u, err, out)
			continue
		}
		if v, _ := strconv.ParseFloat(string(m[1]), 64); v > 2.5 {
			t.Errorf("%s: exposure %.1f, want at most 2.5", u, v)
		} else {
			t.Logf("%s: exposure %.1f", u, v)
		}
	}
}

// TestSystemdHardening: the options the operations guide promises, per
// unit: an unprivileged user, no new privileges, a read-only system with
// a state directory, configuration exit codes not restarted, and only the
// relay may bind port 443.
func TestSystemdHardening(t *testing.T) {
	for u, bin := range units {
		k := keys(t, filepath.Join(unitDir, u))
		want := map[string]string{"Service.User": "forgeyard", "Service.NoNewPrivileges": "yes", "Service.ProtectSystem": "strict",
			"Service.ProtectHome": "yes", "Service.PrivateTmp": "yes", "Service.RestartPreventExitStatus": "2",
			"Service.SystemCallFilter": "@system-service", "Service.Type": "exec", "Install.WantedBy": "multi-user.target"}
		caps := ""
		if u == "forgeyard-relay.service" {
			caps = "CAP_NET_BIND_SERVICE"
		}
		want["Service.AmbientCapabilities"], want["Service.CapabilityBoundingSet"] = caps, caps
		for key, v := range want {
			if got := k[key]; len(got) != 1 || got[0] != v {
				t.Errorf("%s: %s = %q, want %q", u, key, got, v)
			}
		}
		if s := k["Service.StateDirectory"]; len(s) != 1 || !strings.HasPrefix(s[0], "forgeyard/") {
			t.Errorf("%s: StateDirectory %q", u, s)
		}
		if e := k["Service.ExecStart"]; len(e) != 1 || !strings.HasPrefix(e[0], bin+" --config /etc/forgeyard/") {
			t.Errorf("%s: ExecStart %q", u, e)
		}
	}
	if b, err := os.ReadFile(filepath.Join(unitDir, "forgeyard.sysusers.conf")); err != nil || !strings.Contains(string(b), "u forgeyard ") {
		t.Errorf("forgeyard.sysusers.conf: %v %q", err, b)
	}
}
