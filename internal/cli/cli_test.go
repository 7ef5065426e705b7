package cli

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"forgeyard.dev/transport/internal/config"
)

func newFS(stderr io.Writer) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(stderr)
	v := fs.String("v", "", "a value")
	fs.Usage = func() { io.WriteString(fs.Output(), "usage of x\n") }
	return fs, v
}

func TestParseNoArgs(t *testing.T) {
	for _, c := range []struct {
		args           []string
		code           int
		ok             bool
		stdout, stderr string
	}{
		{[]string{"-v", "1"}, ExitOK, true, "", ""},
		// --help prints the usage once, on stdout.
		{[]string{"--help"}, ExitOK, false, "usage of x\n", ""},
		{[]string{"-h"}, ExitOK, false, "usage of x\n", ""},
		{[]string{"-nope"}, ExitUsage, false, "", "flag provided but not defined: -nope\nusage of x\n"},
		{[]string{"extra"}, ExitUsage, false, "", "prog: unexpected argument \"extra\"\n"},
	} {
		var o, e bytes.Buffer
		fs, _ := newFS(&e)
		code, ok := ParseNoArgs(fs, c.args, &o, &e, "prog")
		if code != c.code || ok != c.ok || o.String() != c.stdout || e.String() != c.stderr {
			t.Errorf("%q: code %d ok %v stdout %q stderr %q; want %d %v %q %q", c.args, code, ok, o.String(), e.String(), c.code, c.ok, c.stdout, c.stderr)
		}
	}
	var o, e bytes.Buffer
	fs, _ := newFS(&e)
	if code, ok := Parse(fs, []string{"extra"}, &o); code != ExitOK || !ok {
		t.Errorf("Parse with an argument: %d %v", code, ok)
	}
}

// testConfig is a Configuration: Level defaults to "info" and must not
// be "loud".
type testConfig struct {
	Level, Endpoint string
}

func (c *testConfig) ApplyDefaults() {
	if c.Level == "" {
		c.Level = "info"
	}
}

func (c *testConfig) Validate() error {
	if c.Level == "loud" {
		return &config.Error{Key: "log.level", Msg: "loud"}
	}
	return nil
}

func TestLoadConfig(t *testing.T) {
	files := map[string]*testConfig{"a.toml": {Level: "warn", Endpoint: "e"}, "loud.toml": {Level: "loud"}}
	read := func(path string) (*testConfig, error) {
		c, ok := files[path]
		if !ok {
			return nil, os.ErrNotExist
		}
		cp := *c
		return &cp, nil
	}
	fs, v := newFS(io.Discard)
	if err := fs.Parse([]string{"-v", "debug"}); err != nil {
		t.Fatal(err)
	}
	override := func(c *testConfig, set config.SetFlags) error {
		set.String("v", &c.Level, *v)
		return nil
	}
	if cfg, err := LoadConfig(fs, "a.toml", read, override); err != nil || *cfg != (testConfig{Level: "debug", Endpoint: "e"}) {
		t.Errorf("flag over file: %+v, %v", cfg, err)
	}
	unset, _ := newFS(io.Discard)
	unset.Parse(nil)
	if cfg, err := LoadConfig(unset, "a.toml", read, override); err != nil || *cfg != (testConfig{Level: "warn", Endpoint: "e"}) {
		t.Errorf("an unset flag overrides nothing: %+v, %v", cfg, err)
	}
	if cfg, err := LoadConfig(unset, "", read, override); err != nil || *cfg != (testConfig{Level: "info"}) {
		t.Errorf("no file: zero configuration plus defaults: %+v, %v", cfg, err)
	}
	if _, err := LoadConfig(unset, "missing.toml", read, override); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("read error: %v", err)
	}
	boom := errors.New("boom")
	if _, err := LoadConfig(fs, "a.toml", read, func(*testConfig, config.SetFlags) error { return boom }); !errors.Is(err, boom) {
		t.Errorf("override error: %v", err)
	}
	if _, err := LoadConfig(unset, "loud.toml", read, override); err == nil || !strings.Contains(err.Error(), "loud.toml") || !strings.Contains(err.Error(), "log.level") {
		t.Errorf("validation error does not name the file and key: %v", err)
	}
}

func TestAdminServer(t *testing.T) {
	a, err := ListenAdmin("127.0.0.1:0", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + a.Addr() + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "ok" {
		t.Errorf("body %q", b)
	}
	a.Stop(time.Second)
	if c, err := net.DialTimeout("tcp", a.Addr(), time.Second); err == nil {
		c.Close()
		t.Error("still listening after Stop")
	}
}
