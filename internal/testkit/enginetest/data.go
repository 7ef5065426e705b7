package enginetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/cas"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/logs"
	"forgeyard.dev/transport/semantics/telemetry"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// DataBackends runs f on memory and on every network backend (the data
// plane's §300 items hold on each).
func DataBackends(t *testing.T, f func(t *testing.T, b Backend)) {
	for _, mk := range []func() Backend{MemoryBackend, QuicBackend, YamuxBackend, WebtransportBackend} {
		b := mk()
		t.Run(b.Name, func(t *testing.T) { f(t, b) })
	}
}

// DataWorld is a world whose daemon keeps logs in a MemorySink and objects
// in an FSStore.
func DataWorld(t *testing.T, b Backend, opts ...WorldOpt) (*World, *logs.MemorySink, *cas.FSStore) {
	t.Helper()
	sink := &logs.MemorySink{}
	store, err := cas.NewFSStore(cas.FSStoreConfig{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	w := NewWorld(t, b, append([]WorldOpt{func(c *daemon.Config) { c.LogSink, c.ContentStore = sink, store }}, opts...)...)
	return w, sink, store
}

func SpoolIn(dir string) AgentOpt {
	return func(c *agent.Config) { c.SpoolDir = dir }
}

// Stdout concatenates an attempt's durable stdout records, checking the
// sequence numbers are 1, 2, 3, … (no gap, no duplicate).
func Stdout(t *testing.T, sink *logs.MemorySink, a wire.JobAttemptId) string {
	t.Helper()
	var sb strings.Builder
	for i, r := range sink.Records(a) {
		if r.Seq != uint64(i+1) {
			t.Fatalf("record %d has seq %d", i, r.Seq)
		}
		if r.Kind == wlogs.LogStdout {
			sb.Write(r.Data)
		}
	}
	return sb.String()
}

// PutObject stores data in s and returns its reference.
func PutObject(t *testing.T, s cas.ContentStore, data []byte) wire.CasObjectRef {
	t.Helper()
	ref := wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(data), Size: uint64(len(data))}
	p, err := s.Create(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Append(data); err != nil {
		t.Fatal(err)
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	return ref
}

// ScrapeFamilies GETs /metrics from m's handler and parses the text
// exposition.
func ScrapeFamilies(t *testing.T, m *telemetry.Metrics) (string, map[string]*dto.MetricFamily) {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/metrics", nil)
	req.Header.Set("Accept", "text/plain; version=0.0.4")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, b)
	}
	return string(b), fams
}

// FamilyValue sums a family's counter/gauge values (histograms: sample
// count) over the series whose labels include want (name=value pairs).
func FamilyValue(fams map[string]*dto.MetricFamily, name string, want ...string) float64 {
	f := fams[name]
	if f == nil {
		return -1
	}
	var sum float64
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(want); i += 2 {
			ok := false
			for _, l := range m.GetLabel() {
				if l.GetName() == want[i] && l.GetValue() == want[i+1] {
					ok = true
				}
			}
			if !ok {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Histogram != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return sum
}

// HalfwayLog is an executor that writes Lines log lines (Line(i)), closes
// Half after the first half and waits for Cont (or cancellation: then it
// returns Cancelled) before writing the rest; Runs counts executions. The
// cut and move-back tests use it to change the path mid-attempt.
type HalfwayLog struct {
	Lines      int
	Line       func(i int) string
	Half, Cont chan struct{}
	Runs       atomic.Int64
}

// NewHalfwayLog returns a HalfwayLog of lines lines.
func NewHalfwayLog(lines int, line func(i int) string) *HalfwayLog {
	return &HalfwayLog{Lines: lines, Line: line, Half: make(chan struct{}), Cont: make(chan struct{})}
}

// Execute implements agent.Executor.
func (h *HalfwayLog) Execute(ctx context.Context, _ agent.Job, out agent.Output) agent.Result {
	h.Runs.Add(1)
	for i := 0; i < h.Lines; i++ {
		if i == h.Lines/2 {
			close(h.Half)
			select {
			case <-h.Cont:
			case <-ctx.Done():
				return agent.Result{Kind: agentwire.ResultCancelled}
			}
		}
		if err := out.Log(wlogs.LogStdout, []byte(h.Line(i))); err != nil {
			return agent.Result{Kind: agentwire.ResultInfraError, Message: err.Error()}
		}
	}
	return agent.Result{Kind: agentwire.ResultSucceeded}
}
