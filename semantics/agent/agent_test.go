package agent

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"reflect"
	"regexp"
	"testing"
	"time"

	"forgeyard.dev/transport/backends/memory"
	"forgeyard.dev/transport/wire"
	agentwire "forgeyard.dev/transport/wire/agent"
	wlogs "forgeyard.dev/transport/wire/logs"
)

func testConfig(t *testing.T) Config {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	return Config{Runner: wire.NewRunnerId(), Signer: key,
		Endpoints: []Endpoint{{Address: "nowhere", Dialer: &memory.Dialer{Network: memory.NewNetwork()}}},
		Executor:  NewSyntheticExecutor(1, SyntheticOptions{})}
}

func TestConfigValidation(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"no runner":    func(c *Config) { c.Runner = wire.RunnerId{} },
		"no signer":    func(c *Config) { c.Signer = nil },
		"no endpoints": func(c *Config) { c.Endpoints = nil },
		"bad role":     func(c *Config) { c.Role = 42 },
		"no executor":  func(c *Config) { c.Executor = nil },
		"no dialer":    func(c *Config) { c.Endpoints[0].Dialer = nil },
		"parallel":     func(c *Config) { c.MaxParallel = -1 },
	} {
		c := testConfig(t)
		mut(&c)
		if _, err := New(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	a, err := New(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := New(testConfig(t))
	if a.Session() == b.Session() || a.Session() == (wire.AgentSessionId{}) {
		t.Fatal("each Agent must be a new agent session")
	}
}

// TestBackoffFullJitter: waits are uniform in [0, min(Max, Base·2ⁿ)].
func TestBackoffFullJitter(t *testing.T) {
	c := testConfig(t)
	c.Backoff = Backoff{Base: 10 * time.Millisecond, Max: 80 * time.Millisecond}
	a, _ := New(c)
	for n, ceil := range []time.Duration{10, 20, 40, 80, 80, 80} {
		ceil *= time.Millisecond
		var maxSeen, minSeen time.Duration = 0, time.Hour
		for i := 0; i < 2000; i++ {
			d := a.backoff(n)
			if d < 0 || d > ceil {
				t.Fatalf("n=%d: %v outside [0, %v]", n, d, ceil)
			}
			maxSeen, minSeen = max(maxSeen, d), min(minSeen, d)
		}
		if maxSeen < ceil*8/10 || minSeen > ceil*2/10 {
			t.Fatalf("n=%d: samples in [%v, %v] do not spread over [0, %v]", n, minSeen, maxSeen, ceil)
		}
	}
}

// TestRunReturnsOnClose: Run with an unreachable daemon keeps retrying
// with backoff and returns nil after Close.
func TestRunReturnsOnClose(t *testing.T) {
	c := testConfig(t)
	c.Backoff = Backoff{Base: time.Millisecond, Max: 5 * time.Millisecond}
	a, _ := New(c)
	done := make(chan error, 1)
	go func() { done <- a.Run(context.Background()) }()
	deadline := time.Now().Add(5 * time.Second)
	for a.Stats().DialFailures < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if a.Stats().DialFailures < 3 {
		t.Fatal("no retries")
	}
	_ = a.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return")
	}
}

type recOut struct {
	phases []agentwire.AttemptPhase
	log    []string
	outs   [][]byte
}

func (r *recOut) Phase(p agentwire.AttemptPhase) { r.phases = append(r.phases, p) }
func (r *recOut) Log(kind wlogs.LogStreamKind, p []byte) error {
	r.log = append(r.log, kind.String()+":"+string(p))
	return nil
}
func (r *recOut) PutOutput(data []byte) (wire.CasObjectRef, error) {
	r.outs = append(r.outs, append([]byte(nil), data...))
	return wire.CasObjectRef{Algorithm: wire.DigestSHA256, Digest: sha256.Sum256(data), Size: uint64(len(data))}, nil
}

func TestSyntheticExecutorDeterministic(t *testing.T) {
	e := NewSyntheticExecutor(7, SyntheticOptions{MinDuration: time.Millisecond, MaxDuration: 3 * time.Millisecond, FailPercent: 50})
	fails := 0
	for i := 0; i < 40; i++ {
		spec := wire.JobSpecId{Digest: wire.Digest{byte(i), 1}}
		var o1, o2 recOut
		r1 := e.Execute(context.Background(), Job{Spec: spec}, &o1)
		r2 := e.Execute(context.Background(), Job{Spec: spec}, &o2)
		if !reflect.DeepEqual(r1, r2) || !reflect.DeepEqual(o1, o2) {
			t.Fatalf("spec %d: %v/%v then %v/%v", i, r1, o1, r2, o2)
		}
		if len(o1.phases) != 3 {
			t.Fatalf("phases %v", o1.phases)
		}
		if len(o1.log) != DefaultSyntheticLogLines || o1.log[0] != wlogs.LogStdout.String()+":"+SyntheticLogLine(spec, 0) {
			t.Fatalf("log %q", o1.log)
		}
		if r1.Kind == agentwire.ResultFailed {
			fails++
			if len(o1.outs) != 0 {
				t.Fatalf("failed attempt stored %d outputs", len(o1.outs))
			}
		} else if len(o1.outs) != 1 || !bytes.Equal(o1.outs[0], SyntheticOutput(spec, DefaultSyntheticOutputSize)) {
			t.Fatalf("outputs %d", len(o1.outs))
		} else if other := SyntheticOutput(wire.JobSpecId{Digest: wire.Digest{byte(i), 2}}, DefaultSyntheticOutputSize); bytes.Equal(other, o1.outs[0]) {
			t.Fatal("output does not depend on the spec")
		}
	}
	if fails == 0 || fails == 40 {
		t.Fatalf("FailPercent 50 gave %d/40 failures", fails)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r := e.Execute(ctx, Job{}, &recOut{}); r.Kind != agentwire.ResultCancelled {
		t.Fatalf("cancelled execution returned %v", r.Kind)
	}
}

// TestSyntheticExecutorHasNoCommand: neither the executor nor the Job it
// receives has a field that could carry a command (§98).
func TestSyntheticExecutorHasNoCommand(t *testing.T) {
	re := regexp.MustCompile(`(?i)command|cmd|shell|script|argv|args|env`)
	for _, ty := range []reflect.Type{reflect.TypeOf(synthetic{}), reflect.TypeOf(SyntheticOptions{}), reflect.TypeOf(Job{})} {
		for i := 0; i < ty.NumField(); i++ {
			if re.MatchString(ty.Field(i).Name) {
				t.Errorf("%s.%s", ty.Name(), ty.Field(i).Name)
			}
		}
	}
}
