package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/testkit/binaries"
	"forgeyard.dev/transport/internal/testkit/metricstest"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/semantics/trust"
)

// otlpSpan is one span an OTLP receiver got.
type otlpSpan struct {
	service, name     string
	trace, id, parent string
}

// otlpReceiver is a minimal OTLP/HTTP trace collector: it decodes each
// POST /v1/traces body (protobuf ExportTraceServiceRequest) and keeps the
// spans.
type otlpReceiver struct {
	mu    sync.Mutex
	spans []otlpSpan
	bad   []string
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body := io.Reader(req.Body)
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, err := io.ReadAll(io.LimitReader(body, 16<<20))
	var msg coltrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &msg)
	}
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" || err != nil {
		r.mu.Lock()
		r.bad = append(r.bad, req.Method+" "+req.URL.Path+" "+req.Header.Get("Content-Type")+" "+errString(err))
		r.mu.Unlock()
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range msg.GetResourceSpans() {
		svc := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				svc = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				r.spans = append(r.spans, otlpSpan{service: svc, name: s.GetName(), trace: hex.EncodeToString(s.GetTraceId()),
					id: hex.EncodeToString(s.GetSpanId()), parent: hex.EncodeToString(s.GetParentSpanId())})
			}
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (r *otlpReceiver) snapshot() ([]otlpSpan, []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]otlpSpan(nil), r.spans...), append([]string(nil), r.bad...)
}

// buildCommands builds forgeyard-daemon and forgeyard-agent once per test
// binary (dir is not used: the binaries are shared by the package's tests).
func buildCommands(t *testing.T, _ string) (daemonBin, agentBin string) {
	t.Helper()
	b := binaries.Build(t, "forgeyard-daemon", "forgeyard-agent")
	return b[0], b[1]
}

// freeUDPPort returns a loopback UDP port that was free a moment ago.
func freeUDPPort(t *testing.T) int {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// freeTCPPort returns a loopback TCP port that was free a moment ago.
func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// process is a started command whose stderr (JSON logs) goes to a file.
type process struct {
	cmd  *exec.Cmd
	logf string
	done chan error
}

func startProcess(t *testing.T, bin, logFile string, args ...string) *process {
	t.Helper()
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, logf: logFile, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait(); f.Close() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // no-op once it exited
		<-p.done
	})
	return p
}

// stop sends SIGTERM and waits for a clean exit.
func (p *process) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		if err != nil {
			t.Errorf("%s exited with %v; log:\n%s", filepath.Base(p.cmd.Path), err, p.log())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not stop", filepath.Base(p.cmd.Path))
	}
}

func (p *process) log() string {
	b, _ := os.ReadFile(p.logf)
	return string(b)
}

// logValue returns attr of the first JSON log record whose msg is msg.
func (p *process) logValue(msg, attr string) string {
	sc := bufio.NewScanner(strings.NewReader(p.log()))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == msg {
			s, _ := rec[attr].(string)
			return s
		}
	}
	return ""
}

func (p *process) count(msg string) int {
	return strings.Count(p.log(), `"msg":"`+msg+`"`)
}

// await polls the process log (no other event crosses the process
// boundary) until cond holds.
func (p *process) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		select {
		case err := <-p.done:
			p.done <- err
			t.Fatalf("%s exited (%v) waiting for %s; log:\n%s", filepath.Base(p.cmd.Path), err, what, p.log())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; log:\n%s", what, p.log())
		}
	}
}

func getText(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	return string(b)
}

// TestProcessesOneTraceAndMetrics runs forgeyard-daemon and forgeyard-agent
// as processes over loopback QUIC, both exporting OTLP/HTTP to a receiver
// in the test (--otlp-endpoint). The daemon offers two demo leases; the
// receiver must see lease.dispatch (daemon) → lease.ack (agent) →
// lease.ack (daemon) and attempt.complete (agent → daemon) in one trace id
// spanning both services. Both /metrics endpoints are scraped: the
// engine-fed families are non-zero and promtool accepts them.
func TestProcessesOneTraceAndMetrics(t *testing.T) {
	dir := t.TempDir()
	daemonBin, agentBin := buildCommands(t, filepath.Join(dir, "bin"))
	pkiDir := filepath.Join(dir, "pki")
	if _, err := trust.GenerateDevPKI(pkiDir, trust.DevPKIOptions{Agents: []string{"1"}}); err != nil {
		t.Fatal(err)
	}
	recv := &otlpReceiver{}
	srv := httptest.NewServer(recv)
	defer srv.Close()

	addr := "127.0.0.1:" + strconv.Itoa(freeUDPPort(t))
	d := startProcess(t, daemonBin, filepath.Join(dir, "daemon.log"), "--dev-pki", pkiDir, "--sqlite", filepath.Join(dir, "authority.db"),
		"--listen", addr, "--demo-leases", "2", "--admin-listen", "127.0.0.1:0", "--otlp-endpoint", srv.URL,
		"--log-format", "json", "--log-level", "debug", "--shutdown-timeout", "5s")
	d.await(t, "the daemon's admin endpoint", func() bool { return d.logValue("admin endpoint listening", "addr") != "" })
	adminAddr := d.logValue("admin endpoint listening", "addr")
	a := startProcess(t, agentBin, filepath.Join(dir, "agent.log"), "--dev-pki", pkiDir, "--dev-agent", "1",
		"--endpoint", "quic://"+addr, "--server-name", "localhost", "--metrics-listen", "127.0.0.1:0", "--max-parallel", "2",
		"--otlp-endpoint", srv.URL, "--status-file", filepath.Join(dir, "agent-status.json"),
		"--log-format", "json", "--log-level", "debug")
	d.await(t, "two completed demo attempts", func() bool { return d.count("attempt completed") >= 2 })
	a.await(t, "the agent's metrics endpoint", func() bool { return a.logValue("metrics endpoint listening", "addr") != "" })

	// /metrics of both processes while connected.
	dm := getText(t, "http://"+adminAddr+"/metrics")
	am := getText(t, "http://"+a.logValue("metrics endpoint listening", "addr")+"/metrics")
	for _, c := range []struct{ text, series string }{
		{dm, `forgeyard_transport_received_bytes_total{kind="control"}`},
		{dm, `forgeyard_transport_sent_bytes_total{kind="control"}`},
		{dm, `forgeyard_transport_streams_active{kind="control"}`},
		{dm, `forgeyard_transport_messages_total{family="agent",outcome="ok"}`},
		{dm, `forgeyard_transport_connections_active{backend="quic"}`},
		{dm, `forgeyard_lease_offer_to_ack_seconds_count`},
		{dm, `forgeyard_completion_ack_seconds_count`},
		{am, `forgeyard_transport_sent_bytes_total{kind="control"}`},
		{am, `forgeyard_transport_messages_total{family="agent",outcome="ok"}`},
		{am, `forgeyard_transport_connections_active{backend="quic"}`},
		{am, `forgeyard_log_bytes_total{side="agent"}`},
	} {
		if v := metricValue(t, c.text, c.series); v <= 0 {
			t.Errorf("%s = %v, want > 0", c.series, v)
		}
	}
	metricstest.PromtoolCheck(t, dm)
	metricstest.PromtoolCheck(t, am)

	// Exporters flush at exit.
	a.stop(t)
	d.stop(t)
	spans, bad := recv.snapshot()
	if len(bad) > 0 {
		t.Fatalf("OTLP receiver refused requests: %v", bad)
	}
	byID := map[string]otlpSpan{}
	for _, s := range spans {
		byID[s.id] = s
	}
	// Follow each agent lease.ack span to its parent (the daemon's
	// lease.dispatch) and find the daemon's lease.ack and both
	// attempt.complete spans of the same trace.
	found := 0
	for _, ack := range spans {
		if ack.service != "forgeyard-agent" || ack.name != string(telemetry.SpanLeaseAck) {
			continue
		}
		dispatch, ok := byID[ack.parent]
		if !ok || dispatch.service != "forgeyard-daemon" || dispatch.name != string(telemetry.SpanDispatch) || dispatch.trace != ack.trace {
			t.Errorf("agent lease.ack %+v: parent %+v is not the daemon's lease.dispatch of the same trace", ack, dispatch)
			continue
		}
		var daemonAck, agentDone, daemonDone bool
		for _, s := range spans {
			switch {
			case s.trace != ack.trace:
			case s.service == "forgeyard-daemon" && s.name == string(telemetry.SpanLeaseAck) && s.parent == ack.id:
				daemonAck = true
			case s.service == "forgeyard-agent" && s.name == string(telemetry.SpanComplete) && s.parent == ack.id:
				for _, s2 := range spans {
					if s2.service == "forgeyard-daemon" && s2.name == string(telemetry.SpanComplete) && s2.parent == s.id && s2.trace == ack.trace {
						daemonDone = true
					}
				}
				agentDone = true
			}
		}
		if !daemonAck || !agentDone || !daemonDone {
			t.Errorf("trace %s: daemon lease.ack %v, agent attempt.complete %v, daemon attempt.complete %v", ack.trace, daemonAck, agentDone, daemonDone)
			continue
		}
		found++
	}
	if found != 2 {
		var names bytes.Buffer
		for _, s := range spans {
			names.WriteString(s.service + ":" + s.name + " trace=" + s.trace + " id=" + s.id + " parent=" + s.parent + "\n")
		}
		t.Fatalf("%d complete cross-process traces, want 2 (one per demo lease); spans:\n%s", found, names.String())
	}
}
