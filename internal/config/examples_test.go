package config_test

// The operator examples docs/examples/{daemon,agent,relay}.toml list every
// key of the configuration types with its default; these tests keep them
// complete and true, and docs/operations.md quoting them verbatim.

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"forgeyard.dev/transport/internal/config"
	"forgeyard.dev/transport/internal/setup/serversetup"
	"forgeyard.dev/transport/semantics/agent"
	"forgeyard.dev/transport/semantics/daemon"
	"forgeyard.dev/transport/semantics/trust"
	"forgeyard.dev/transport/wire"
)

// example describes one example file.
type example struct {
	file string
	typ  reflect.Type
	// parse parses, defaults and validates a configuration.
	parse func(data []byte) (any, error)
	// effective holds the defaults that the code resolves outside the
	// config package's ApplyDefaults (engines, setup packages), by dotted
	// key; every other key's default is what ApplyDefaults leaves in a
	// configuration of only the required keys.
	effective map[string]any
}

func examples() []example {
	lim := daemon.DefaultLimits()
	logDefaults := map[string]any{"log.level": "info", "log.format": "text"}
	with := func(m map[string]any) map[string]any {
		for k, v := range logDefaults {
			m[k] = v
		}
		return m
	}
	return []example{
		{
			file: "daemon.toml", typ: reflect.TypeFor[config.Daemon](),
			parse: func(b []byte) (any, error) { return config.ParseDaemon("daemon.toml", b) },
			effective: with(map[string]any{
				"tls.reload_interval":              serversetup.DefaultCertReloadInterval,
				"enrollment.certificate_validity":  trust.DefaultIssuedValidity,
				"enrollment.revocation_poll":       daemon.DefaultRevocationPoll,
				"data.log_rate_bytes":              lim.Data.LogRateBytes,
				"data.log_burst_bytes":             lim.Data.LogBurstBytes,
				"data.max_attempt_log_bytes":       lim.Data.MaxAttemptLogBytes,
				"data.cas_max_concurrent":          lim.Data.CASMaxConcurrent,
				"data.cas_max_per_conn":            lim.Data.CASMaxPerConn,
				"admission.max_handshakes":         lim.Admission.MaxHandshakes,
				"admission.registration_rate":      lim.Admission.RegistrationRate.PerSecond,
				"admission.registration_burst":     lim.Admission.RegistrationRate.Burst,
				"admission.max_conns_per_ip":       lim.Admission.MaxConnsPerIP,
				"admission.max_connections":        lim.Admission.MaxConnections,
				"admission.fd_headroom":            lim.Admission.FDHeadroom,
				"timing.max_heartbeats_per_second": daemon.DefaultMaxHeartbeatsPerSecond,
				"timing.max_heartbeat_interval":    daemon.DefaultMaxHeartbeatInterval,
				"limits.max_streams":               lim.Conn.MaxStreams,
				"limits.control_rate":              lim.Conn.ControlRate.PerSecond,
				"limits.control_burst":             lim.Conn.ControlRate.Burst,
				"limits.heartbeat_rate":            lim.Conn.HeartbeatRate.PerSecond,
				"limits.heartbeat_burst":           lim.Conn.HeartbeatRate.Burst,
				"limits.health_rate":               lim.Conn.HealthRate.PerSecond,
				"limits.health_burst":              lim.Conn.HealthRate.Burst,
				"limits.cas_rate":                  lim.Conn.CasRate.PerSecond,
				"limits.cas_burst":                 lim.Conn.CasRate.Burst,
				"limits.certificate_rate_per_min":  lim.Conn.IdentityRate.PerSecond * 60,
				"limits.certificate_burst":         lim.Conn.IdentityRate.Burst,
				"limits.max_rate_strikes":          lim.Conn.MaxRateStrikes,
			}),
		},
		{
			file: "agent.toml", typ: reflect.TypeFor[config.Agent](),
			parse: func(b []byte) (any, error) { return config.ParseAgent("agent.toml", b) },
			effective: with(map[string]any{
				"heartbeat_misses":         agent.DefaultHeartbeatMisses,
				"capabilities.os":          "", // ApplyDefaults: this machine's
				"capabilities.arch":        "",
				"fallback.class_stagger":   agent.DefaultClassStagger,
				"fallback.memory_ttl":      agent.DefaultMemoryTTL,
				"fallback.probe_interval":  agent.DefaultProbeInterval,
				"fallback.probe_successes": agent.DefaultProbeSuccesses,
			}),
		},
		{
			file: "relay.toml", typ: reflect.TypeFor[config.Relay](),
			parse: func(b []byte) (any, error) { return config.ParseRelay("relay.toml", b) },
			effective: with(map[string]any{
				"tls.reload_interval": serversetup.DefaultCertReloadInterval,
			}),
		},
	}
}

// fieldByKey returns the field of v (a struct) at a dotted key.
func fieldByKey(v reflect.Value, key string) reflect.Value {
	for _, part := range strings.Split(key, ".") {
		t := v.Type()
		found := false
		for i := range t.NumField() {
			tag, _, _ := strings.Cut(t.Field(i).Tag.Get("toml"), ",")
			if tag == part {
				v, found = v.Field(i), true
				break
			}
		}
		if !found {
			panic("no field for " + key)
		}
	}
	return v
}

// flatten turns decoded TOML tables into dotted keys.
func flatten(m map[string]any, prefix string, out map[string]any) {
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			flatten(sub, prefix+k+".", out)
			continue
		}
		out[prefix+k] = v
	}
}

// unflatten is flatten's inverse.
func unflatten(flat map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range flat {
		parts := strings.Split(k, ".")
		m := out
		for _, p := range parts[:len(parts)-1] {
			sub, ok := m[p].(map[string]any)
			if !ok {
				sub = map[string]any{}
				m[p] = sub
			}
			m = sub
		}
		m[parts[len(parts)-1]] = v
	}
	return out
}

func encode(t *testing.T, m map[string]any) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := toml.NewEncoder(&b).Encode(m); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

var (
	tableLine     = regexp.MustCompile(`^\[([a-z0-9_.]+)\]`)
	commentedKey  = regexp.MustCompile(`^#\s?([a-z_]+) = `)
	activeKeyLine = regexp.MustCompile(`^([a-z_]+) = `)
)

// lines returns, per dotted key, the example's line (active or commented
// out) and which keys are commented out.
func lines(t *testing.T, data []byte) (byKey map[string]string, commented map[string]bool) {
	byKey, commented = map[string]string{}, map[string]bool{}
	table := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		l := sc.Text()
		if m := tableLine.FindStringSubmatch(l); m != nil {
			table = m[1] + "."
			continue
		}
		key := ""
		if m := activeKeyLine.FindStringSubmatch(l); m != nil {
			key = table + m[1]
		} else if m := commentedKey.FindStringSubmatch(l); m != nil {
			key = table + m[1]
			commented[key] = true
		} else {
			continue
		}
		if _, dup := byKey[key]; dup {
			t.Errorf("%s appears twice", key)
		}
		byKey[key] = l
	}
	return byKey, commented
}

// sameValue compares a decoded TOML value with a Go default.
func sameValue(got, want any) bool {
	switch w := want.(type) {
	case config.Duration:
		return sameValue(got, w.Duration)
	case config.Version:
		return sameValue(got, w.String())
	case time.Duration:
		s, ok := got.(string)
		d, err := time.ParseDuration(s)
		return ok && err == nil && d == w
	case []config.Duration:
		ds := make([]time.Duration, len(w))
		for i := range w {
			ds[i] = w[i].Duration
		}
		return sameValue(got, ds)
	case []time.Duration:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if !sameValue(g[i], w[i]) {
				return false
			}
		}
		return true
	case []string:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if g[i] != w[i] {
				return false
			}
		}
		return true
	case string, bool:
		return got == want
	}
	// Numbers: TOML decodes integers as int64 and floats as float64.
	wv := reflect.ValueOf(want)
	var wf float64
	switch {
	case wv.CanInt():
		wf = float64(wv.Int())
	case wv.CanUint():
		wf = float64(wv.Uint())
	case wv.CanFloat():
		wf = wv.Float()
	default:
		return false
	}
	switch g := got.(type) {
	case int64:
		return float64(g) == wf
	case float64:
		return g == wf
	}
	return false
}

// TestExamplesCompleteAndDefault: each example names every key of its
// configuration type exactly once (active, or commented out when it has no
// default and cannot be set beside another key); it parses and validates;
// a key whose removal makes the file invalid is "required" and says so in
// its comment; every other active key holds the code's default.
func TestExamplesCompleteAndDefault(t *testing.T) {
	for _, ex := range examples() {
		t.Run(ex.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("..", "..", "docs", "examples", ex.file))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ex.parse(data); err != nil {
				t.Fatalf("the example does not load: %v", err)
			}
			byKey, commented := lines(t, data)
			keys := config.Keys(ex.typ)
			for _, k := range keys {
				if _, ok := byKey[k]; !ok {
					t.Errorf("key %s is missing from docs/examples/%s", k, ex.file)
				}
			}
			for k := range byKey {
				if !slices.Contains(keys, k) {
					t.Errorf("docs/examples/%s names %s, which is not a key of %v", ex.file, k, ex.typ)
				}
			}
			var tree map[string]any
			if _, err := toml.Decode(string(data), &tree); err != nil {
				t.Fatal(err)
			}
			flat := map[string]any{}
			flatten(tree, "", flat)

			required := map[string]bool{}
			for k := range flat {
				without := map[string]any{}
				for k2, v := range flat {
					if k2 != k {
						without[k2] = v
					}
				}
				if _, err := ex.parse(encode(t, unflatten(without))); err != nil {
					required[k] = true
					if !strings.Contains(byKey[k], "# required") {
						t.Errorf("%s is required (without it: %v) but its comment does not say \"# required\": %q", k, err, byKey[k])
					}
				} else if strings.Contains(byKey[k], "# required") {
					t.Errorf("%s says required but the file loads without it", k)
				}
			}
			minimal := map[string]any{}
			for k := range required {
				minimal[k] = flat[k]
			}
			base, err := ex.parse(encode(t, unflatten(minimal)))
			if err != nil {
				t.Fatalf("the required keys alone do not load: %v", err)
			}
			bv := reflect.ValueOf(base).Elem()
			for _, k := range keys {
				if required[k] || commented[k] {
					continue
				}
				got, ok := flat[k]
				if !ok {
					continue // reported above
				}
				want, ok := ex.effective[k]
				if !ok {
					want = fieldByKey(bv, k).Interface()
				}
				if !sameValue(got, want) {
					t.Errorf("docs/examples/%s: %s = %v, but the default is %v", ex.file, k, got, want)
				}
			}
			for k := range ex.effective {
				if !slices.Contains(keys, k) {
					t.Errorf("the test's effective default %s is not a key", k)
				}
			}
		})
	}
}

// TestExampleCatchesDrift proves the default check is not vacuous: a value
// that is not the default, and a missing key, are reported.
func TestExampleCatchesDrift(t *testing.T) {
	if sameValue(int64(512), daemon.DefaultLimits().Admission.MaxHandshakes) {
		t.Error("512 compared equal to the default max_handshakes")
	}
	if !sameValue("1m0s", time.Minute) || !sameValue([]any{"250ms", "250ms", "500ms"}, agent.DefaultClassStagger) {
		t.Error("equal values compared different")
	}
	byKey, _ := lines(t, []byte("a = 1\n[t]\n# b = \"x\"\n"))
	if _, ok := byKey["t.b"]; !ok || len(byKey) != 2 {
		t.Errorf("lines = %v", byKey)
	}
	if keys := config.Keys(reflect.TypeFor[config.Daemon]()); !slices.Contains(keys, "admission.max_handshakes") || !slices.Contains(keys, "protocol_min") {
		t.Errorf("config.Keys = %v", keys)
	}
}

// TestExamplesQuotedInDocs: docs/operations.md quotes each example file
// verbatim in the fenced block after its marker line, so the documented
// defaults are the tested ones.
func TestExamplesQuotedInDocs(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, ex := range examples() {
		data, err := os.ReadFile(filepath.Join("..", "..", "docs", "examples", ex.file))
		if err != nil {
			t.Fatal(err)
		}
		marker := fmt.Sprintf("<!-- quoted from docs/examples/%s by TestExamplesQuotedInDocs -->\n```toml\n", ex.file)
		i := bytes.Index(doc, []byte(marker))
		if i < 0 {
			t.Errorf("docs/operations.md lacks the marker %q", strings.SplitN(marker, "\n", 2)[0])
			continue
		}
		rest := doc[i+len(marker):]
		j := bytes.Index(rest, []byte("```\n"))
		if j < 0 {
			t.Errorf("%s: unterminated block", ex.file)
			continue
		}
		if got := rest[:j]; !bytes.Equal(got, data) {
			t.Errorf("docs/operations.md's quote of docs/examples/%s differs from the file; paste the file between the marker and the fence", ex.file)
		}
	}
}

// TestOperationsDocProtocolRange: the upgrade section of docs/operations.md
// states this build's protocol range as the code has it.
func TestOperationsDocProtocolRange(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	want := "A daemon of this build (protocol " + wire.Supported.String() + ","
	if !bytes.Contains(doc, []byte(want)) {
		t.Errorf("docs/operations.md does not say %q (wire.Supported)", want)
	}
	if want := "server supports " + wire.Supported.String() + ", agent supports 2.0–2.0"; !bytes.Contains(doc, []byte(want)) {
		t.Errorf("docs/operations.md's version-mismatch example does not read %q", want)
	}
}
