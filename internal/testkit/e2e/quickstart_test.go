//go:build linux

package e2e

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/netns"
)

// The quick start is read from the docs, so the test runs what a newcomer
// copies.
const (
	quickStartDoc     = "../../../docs/operations.md"
	quickStartHeading = "### Local quick start"
	// demoNotice is the one WARN the quick start is allowed: the daemon
	// says --demo-leases is a development feature.
	demoNotice = "--demo-leases is a development feature"
)

// quickStartCommands returns the shell lines of the first ```sh block
// under the quick-start heading, each split into words (the block uses no
// quoting), a trailing "&" removed.
func quickStartCommands(t *testing.T) [][]string {
	t.Helper()
	b, err := os.ReadFile(quickStartDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "\n"+quickStartHeading+"\n")
	if !ok {
		t.Fatalf("%s has no %q section", quickStartDoc, quickStartHeading)
	}
	_, rest, ok = strings.Cut(rest, "```sh\n")
	if !ok {
		t.Fatalf("%s: no ```sh block under %q", quickStartDoc, quickStartHeading)
	}
	block, _, ok := strings.Cut(rest, "```")
	if !ok {
		t.Fatalf("%s: the quick-start block is not closed", quickStartDoc)
	}
	var cmds [][]string
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		if strings.ContainsAny(line, `"'$|;\`) {
			t.Fatalf("quick-start line %q uses shell syntax this test does not run; keep the lines plain", line)
		}
		words := strings.Fields(line)
		if n := len(words); n > 0 && words[n-1] == "&" {
			words = words[:n-1]
		}
		if len(words) > 0 {
			cmds = append(cmds, words)
		}
	}
	return cmds
}

// quickStartBinary maps "go run ./cmd/<name>" to the binary TestMain built.
func quickStartBinary(t *testing.T, words []string) (bin string, args []string) {
	t.Helper()
	if len(words) < 3 || words[0] != "go" || words[1] != "run" {
		t.Fatalf("quick-start line %q is not `go run ./cmd/…`", strings.Join(words, " "))
	}
	switch words[2] {
	case "./cmd/forgeyard-daemon":
		return binDaemon, words[3:]
	case "./cmd/forgeyard-agent":
		return binAgent, words[3:]
	}
	t.Fatalf("quick-start line runs %s, which this test does not build", words[2])
	return "", nil
}

var (
	textLevel = regexp.MustCompile(`(?:^| )level=(\S+)`)
	textMsg   = regexp.MustCompile(`(?:^| )msg=("(?:[^"\\]|\\.)*"|\S+)`)
	textDir   = regexp.MustCompile(`(?:^| )dir=("(?:[^"\\]|\\.)*"|\S+)`)
	sha256Ref = regexp.MustCompile(`sha256:([0-9a-f]{64})`)
)

func textField(re *regexp.Regexp, line string) string {
	m := re.FindStringSubmatch(line)
	if m == nil {
		return ""
	}
	if v, err := strconv.Unquote(m[1]); err == nil {
		return v
	}
	return m[1]
}

// TestQuickStartAsWritten (issue 27): the two commands of docs/operations.md
// "Local quick start", run as written from an empty directory (in a
// namespace of their own, so the documented port is free): every demo
// lease completes and is accepted, every completed attempt's outputs are
// stored in the daemon's local content store, and neither process logs a
// WARN or ERROR beyond the daemon's development-feature notice.
func TestQuickStartAsWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs the daemon and agent processes")
	}
	cmds := quickStartCommands(t)
	if len(cmds) != 2 {
		t.Fatalf("the quick start has %d commands, want the daemon's and the agent's: %q", len(cmds), cmds)
	}
	daemonBin, daemonArgs := quickStartBinary(t, cmds[0])
	agentBin, agentArgs := quickStartBinary(t, cmds[1])
	if daemonBin != binDaemon || agentBin != binAgent {
		t.Fatalf("the quick start runs %s then %s, want the daemon then the agent", cmds[0][2], cmds[1][2])
	}
	leases := 0
	for i, a := range daemonArgs {
		if a == "--demo-leases" && i+1 < len(daemonArgs) {
			leases, _ = strconv.Atoi(daemonArgs[i+1])
		}
	}
	if leases < 2 {
		t.Fatalf("the quick start offers %d demo leases; the test needs at least 2 to show capacity pacing: %q", leases, daemonArgs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), scenarioTimeout)
	defer cancel()
	ns := netns.New(t, "quick")
	dir := t.TempDir()
	daemon := ns.StartIn(dir, "daemon", daemonBin, daemonArgs)
	if _, err := daemon.WaitLine(ctx, func(l string) bool { return textField(textMsg, l) == "listening" }); err != nil {
		t.Fatalf("daemon never listened: %v", err)
	}
	agent := ns.StartIn(dir, "agent", agentBin, agentArgs)
	completed, stored := 0, 0
	if _, err := daemon.WaitLine(ctx, func(l string) bool {
		switch textField(textMsg, l) {
		case "attempt completed":
			if strings.Contains(l, " ack=Accepted") {
				completed++
			}
		case "outputs stored":
			stored++
		}
		return completed == leases && stored == leases
	}); err != nil {
		t.Fatalf("%d of %d demo leases completed and accepted, %d with outputs stored: %v", completed, leases, stored, err)
	}
	if err := agent.Stop(10 * time.Second); err != nil {
		t.Fatalf("agent exit: %v", err)
	}
	if err := daemon.Stop(15 * time.Second); err != nil {
		t.Fatalf("daemon exit: %v", err)
	}

	// The outputs are in the content store the daemon said it uses.
	var casDir, logDir string
	for _, l := range daemon.Lines() {
		switch msg := textField(textMsg, l); {
		case strings.HasPrefix(msg, "content store: a local directory"):
			casDir = textField(textDir, l)
		case strings.HasPrefix(msg, "log store: a local directory"):
			logDir = textField(textDir, l)
		}
	}
	if logDir == "" {
		t.Error("the daemon did not say where it keeps the attempts' logs")
	}
	if casDir == "" {
		t.Fatal("the daemon did not say where it keeps blobs")
	}
	if !filepath.IsAbs(casDir) {
		casDir = filepath.Join(dir, casDir)
	}
	files := map[string]bool{}
	if err := filepath.WalkDir(casDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			files[d.Name()] = true
		}
		return err
	}); err != nil {
		t.Fatalf("content store %s: %v", casDir, err)
	}
	refs := 0
	for _, l := range daemon.Lines() {
		if textField(textMsg, l) != "outputs stored" {
			continue
		}
		for _, m := range sha256Ref.FindAllStringSubmatch(l, -1) {
			refs++
			if !files[m[1]] {
				t.Errorf("output sha256:%s claimed but not in the content store %s", m[1], casDir)
			}
		}
	}
	if refs < leases {
		t.Fatalf("%d outputs stored for %d attempts", refs, leases)
	}

	// Nothing to worry a newcomer.
	notices := 0
	for _, p := range []*netns.Proc{daemon, agent} {
		for _, l := range p.Lines() {
			switch lvl := textField(textLevel, l); {
			case lvl == "WARN" && strings.HasPrefix(textField(textMsg, l), demoNotice) && p == daemon:
				notices++
			case lvl == "WARN" || lvl == "ERROR" || (lvl == "" && strings.TrimSpace(l) != ""):
				t.Errorf("%s logged: %s", p.Name, l)
			}
		}
	}
	if notices != 1 {
		t.Errorf("the daemon logged the development-feature notice %d times, want once", notices)
	}
	t.Logf("quick start as written: %d demo leases completed with %d outputs stored in %s; no warnings", leases, refs, casDir)
}
