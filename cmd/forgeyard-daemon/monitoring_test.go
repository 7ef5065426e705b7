package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/binaries"
	"forgeyard.dev/transport/internal/testkit/metricstest"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"forgeyard.dev/transport/semantics/trust"
)

// The operator's monitoring kit (docs/monitoring): Prometheus rules, their
// promtool unit tests and a Grafana dashboard.
var monitoringDir = filepath.Join("..", "..", "docs", "monitoring")

const (
	rulesFile     = "forgeyard-alerts.yml"
	rulesTestFile = "forgeyard-alerts_test.yml"
	dashboardFile = "forgeyard-dashboard.json"
)

func promtoolBin(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/bin/promtool"); err == nil {
		return "/usr/bin/promtool"
	}
	t.Fatal("promtool not found: run `apt-get install prometheus` (make deps installs it)")
	return ""
}

func runPromtool(t *testing.T, dir string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, promtoolBin(t), args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String()
}

// TestMonitoringRulesPromtool: `promtool check rules` accepts the rules and
// `promtool test rules` passes their unit tests (every alert: expired and
// expiring certificates, registration failures, fencing, authority errors,
// fallback share, queue growth).
func TestMonitoringRulesPromtool(t *testing.T) {
	out := runPromtool(t, monitoringDir, "check", "rules", rulesFile)
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool check rules: %s", out)
	}
	out = runPromtool(t, monitoringDir, "test", "rules", rulesTestFile)
	if !strings.Contains(out, "SUCCESS") {
		t.Errorf("promtool test rules: %s", out)
	}
	// Every alert of the rules file has a unit test.
	rules, err := os.ReadFile(filepath.Join(monitoringDir, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join(monitoringDir, rulesTestFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`(?m)^\s*- alert: (\S+)$`).FindAllStringSubmatch(string(rules), -1) {
		if !regexp.MustCompile(`(?m)^\s*alertname: ` + m[1] + `$`).Match(tests) {
			t.Errorf("alert %s has no test in %s", m[1], rulesTestFile)
		}
	}
}

// scrapedFamilies parses an exposition into its families.
func scrapedFamilies(t *testing.T, text string) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("parsing a scrape: %v", err)
	}
	return fams
}

// metricRef is a metric name as written in a rule or a panel, and the
// label names its selector uses.
type metricRef struct {
	name   string
	labels []string
	where  string
}

var (
	metricName   = regexp.MustCompile(`\b((?:forgeyard|go|process)_[a-z0-9_]*[a-z0-9])(\{[^}]*\})?`)
	matcherLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
)

// refs returns the metric references of a PromQL expression (or any text
// naming metrics).
func refs(text, where string) []metricRef {
	var out []metricRef
	for _, m := range metricName.FindAllStringSubmatch(text, -1) {
		r := metricRef{name: m[1], where: where}
		for _, l := range matcherLabel.FindAllStringSubmatch(m[2], -1) {
			r.labels = append(r.labels, l[1])
		}
		out = append(out, r)
	}
	return out
}

// dashboardExprs returns every "expr" of the dashboard JSON and checks its
// structure (unique panel ids, the datasource variable, a grid position).
func dashboardExprs(t *testing.T, data []byte) []string {
	t.Helper()
	var dash struct {
		Title      string `json:"title"`
		UID        string `json:"uid"`
		Templating struct {
			List []struct {
				Name, Type, Query string
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID         int            `json:"id"`
			Type       string         `json:"type"`
			Title      string         `json:"title"`
			GridPos    map[string]int `json:"gridPos"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&dash); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if dash.Title == "" || dash.UID == "" {
		t.Errorf("dashboard without title or uid")
	}
	if len(dash.Templating.List) == 0 || dash.Templating.List[0].Type != "datasource" || dash.Templating.List[0].Query != "prometheus" {
		t.Errorf("the dashboard's first variable must be the Prometheus datasource: %+v", dash.Templating.List)
	}
	ids := map[int]bool{}
	var exprs []string
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos["w"] <= 0 || p.GridPos["h"] <= 0 || p.GridPos["x"]+p.GridPos["w"] > 24 {
			t.Errorf("panel %q: bad gridPos %v", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %q, want the ${datasource} variable (imports cleanly into any Grafana)", p.Title, p.Datasource.UID)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q target %s: empty expr", p.Title, tg.RefID)
			}
			exprs = append(exprs, tg.Expr)
		}
	}
	return exprs
}

// TestMonitoringAgainstRealScrapes runs forgeyard-daemon, forgeyard-relay
// and forgeyard-agent (through the relay) as processes, scrapes all three,
// lints each scrape with promtool, and checks that every metric the alert
// rules and the dashboard name — and every label their selectors match on —
// exists in those scrapes (no hand-kept list: a renamed metric fails here).
func TestMonitoringAgainstRealScrapes(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	daemonBin, agentBin := buildCommands(t, bin)
	relayBin := buildRelay(t, bin)
	pkiDir := filepath.Join(dir, "pki")
	if _, err := trust.GenerateDevPKI(pkiDir, trust.DevPKIOptions{Agents: []string{"1"}}); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(freeUDPPort(t))
	d := startProcess(t, daemonBin, filepath.Join(dir, "daemon.log"), "--dev-pki", pkiDir, "--sqlite", filepath.Join(dir, "authority.db"),
		"--listen", addr, "--demo-leases", "1", "--admin-listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "debug", "--shutdown-timeout", "5s")
	d.await(t, "the daemon's admin endpoint", func() bool { return d.logValue("admin endpoint listening", "addr") != "" })
	r := startProcess(t, relayBin, filepath.Join(dir, "relay.log"), "--dev-pki", pkiDir, "--listen-yamux", "127.0.0.1:0",
		"--upstream", "quic://"+addr, "--admin-listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "debug")
	r.await(t, "the relay's listener", func() bool {
		return r.logValue("listening", "addr") != "" && r.logValue("admin endpoint listening", "addr") != ""
	})
	a := startProcess(t, agentBin, filepath.Join(dir, "agent.log"), "--dev-pki", pkiDir, "--dev-agent", "1",
		"--endpoint", "relay+yamux://"+r.logValue("listening", "addr"), "--server-name", "localhost", "--metrics-listen", "127.0.0.1:0",
		"--log-format", "json", "--log-level", "debug")
	d.await(t, "the demo attempt completed", func() bool { return d.count("attempt completed") >= 1 })
	a.await(t, "the agent's metrics endpoint", func() bool { return a.logValue("metrics endpoint listening", "addr") != "" })

	scrapes := map[string]string{
		"daemon": getText(t, "http://"+d.logValue("admin endpoint listening", "addr")+"/metrics"),
		"relay":  getText(t, "http://"+r.logValue("admin endpoint listening", "addr")+"/metrics"),
		"agent":  getText(t, "http://"+a.logValue("metrics endpoint listening", "addr")+"/metrics"),
	}
	// series name (with _bucket/_sum/_count for histograms) → label names
	series := map[string]map[string]bool{}
	for who, text := range scrapes {
		metricstest.PromtoolCheck(t, text)
		for name, f := range scrapedFamilies(t, text) {
			names := []string{name}
			if f.GetType() == dto.MetricType_HISTOGRAM {
				names = []string{name + "_bucket", name + "_sum", name + "_count"}
			}
			for _, n := range names {
				if series[n] == nil {
					series[n] = map[string]bool{}
				}
				for _, m := range f.GetMetric() {
					for _, l := range m.GetLabel() {
						series[n][l.GetName()] = true
					}
				}
				if strings.HasSuffix(n, "_bucket") {
					series[n]["le"] = true
				}
			}
		}
		t.Logf("%s: %d families", who, len(scrapedFamilies(t, text)))
	}
	for _, want := range []string{`forgeyard_certificate_expiry_timestamp_seconds{certificate="server"}`, `forgeyard_certificate_expiry_timestamp_seconds{certificate="client_ca"}`} {
		if !strings.Contains(scrapes["daemon"], want) || !strings.Contains(scrapes["relay"], want) {
			t.Errorf("daemon or relay scrape lacks %s", want)
		}
	}
	if !strings.Contains(scrapes["agent"], `forgeyard_certificate_expiry_timestamp_seconds{certificate="client"}`) {
		t.Error("agent scrape lacks its client certificate's expiry")
	}
	for _, s := range []string{"go_goroutines", "process_resident_memory_bytes", "forgeyard_authority_operation_duration_seconds_count"} {
		if !strings.Contains(scrapes["daemon"], s) {
			t.Errorf("daemon scrape lacks %s", s)
		}
	}
	if !strings.Contains(scrapes["agent"], "go_goroutines") || !strings.Contains(scrapes["agent"], "process_resident_memory_bytes") {
		t.Error("agent scrape lacks the Go/process collectors")
	}
	if strings.Contains(scrapes["agent"], "forgeyard_authority_") {
		t.Error("the agent exports authority metrics")
	}

	var all []metricRef
	rules, err := os.ReadFile(filepath.Join(monitoringDir, rulesFile))
	if err != nil {
		t.Fatal(err)
	}
	all = append(all, refs(string(rules), rulesFile)...)
	dashboard, err := os.ReadFile(filepath.Join(monitoringDir, dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range dashboardExprs(t, dashboard) {
		all = append(all, refs(e, dashboardFile)...)
	}
	if len(all) < 20 {
		t.Fatalf("only %d metric references found; the extraction is broken", len(all))
	}
	targetLabels := []string{"job", "instance"} // added by Prometheus, not in a scrape
	missing := map[string]bool{}
	for _, ref := range all {
		labels, ok := series[ref.name]
		if !ok {
			missing[ref.where+": metric "+ref.name+" is in no scrape"] = true
			continue
		}
		for _, l := range ref.labels {
			if !labels[l] && !slices.Contains(targetLabels, l) {
				missing[ref.where+": "+ref.name+" has no label "+l] = true
			}
		}
	}
	var msgs []string
	for m := range missing {
		msgs = append(msgs, m)
	}
	sort.Strings(msgs)
	for _, m := range msgs {
		t.Error(m)
	}
	a.stop(t)
	r.stop(t)
	d.stop(t)
	for _, p := range []*process{d, r, a} {
		checkJSONLogNames(t, p)
	}
	if v := d.logValue("agent registered", "protocol"); !regexp.MustCompile(`^\d+\.\d+$`).MatchString(v) {
		t.Errorf("agent registered: protocol = %q, want a version name such as \"1.2\"", v)
	}
	if v := d.logValue("attempt completed", "ack"); v != "Accepted" {
		t.Errorf("attempt completed: ack = %q, want the name Accepted", v)
	}
}

// enumKeys are log attributes that carry an enum, a code or a version.
var enumKeys = []string{"protocol", "code", "ack", "role", "state", "family", "kind", "class", "decision", "outcome",
	"close_code", "backend", "version", "features", "phase", "result", "retry", "priority", "event", "reason"}

// checkJSONLogNames: in a process's JSON log (real output), enums and
// versions are names — no attribute is a JSON object or an array of
// anything but strings (a struct such as {"Major":1,"Minor":2}, a digest
// as bytes) and the enum attributes are strings.
func checkJSONLogNames(t *testing.T, p *process) {
	t.Helper()
	lines := 0
	for _, line := range strings.Split(p.log(), "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var rec map[string]json.RawMessage
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("%s: not a JSON record: %q", filepath.Base(p.cmd.Path), line)
			continue
		}
		lines++
		for k, raw := range rec {
			v := bytes.TrimSpace(raw)
			var names []string
			if len(v) > 0 && v[0] == '[' && json.Unmarshal(v, &names) == nil {
				continue // a list of names (endpoints, features)
			}
			if len(v) > 0 && (v[0] == '{' || v[0] == '[') {
				t.Errorf("%s: %s = %s is a JSON %s, want a name: %s", filepath.Base(p.cmd.Path), k, v, map[byte]string{'{': "object", '[': "array"}[v[0]], line)
			}
			if slices.Contains(enumKeys, k) && len(v) > 0 && v[0] != '"' {
				t.Errorf("%s: %s = %s is not a string (an enum logged as its number?): %s", filepath.Base(p.cmd.Path), k, v, line)
			}
		}
	}
	if lines < 3 {
		t.Errorf("%s: only %d JSON log records", filepath.Base(p.cmd.Path), lines)
	}
}

// TestMetricRefsExtraction proves the reference check is not vacuous.
func TestMetricRefsExtraction(t *testing.T) {
	got := refs(`sum by (reason) (rate(forgeyard_transport_registration_failures_total{job="forgeyard-daemon", reason!="overloaded"}[5m])) / go_goroutines`, "x")
	if len(got) != 2 || got[0].name != "forgeyard_transport_registration_failures_total" || strings.Join(got[0].labels, ",") != "job,reason" || got[1].name != "go_goroutines" {
		t.Errorf("refs = %+v", got)
	}
	if got := refs(`forgeyard:fallback_share:ratio > 0.5`, "x"); len(got) != 0 {
		t.Errorf("a recording rule's name counted as a metric: %+v", got)
	}
}

// buildRelay builds forgeyard-relay once per test binary.
func buildRelay(t *testing.T, _ string) string {
	t.Helper()
	return binaries.Build(t, "forgeyard-relay")[0]
}
