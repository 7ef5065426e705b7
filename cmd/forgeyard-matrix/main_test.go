package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestUsageErrors(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "m.json")
	if err := os.WriteFile(bad, []byte(`{"releases":[{"name":"a","tag":"HEAD","protocol":"1.x"}],"backends":[{"name":"quic"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--nope"}, "flag provided but not defined"},
		{[]string{"extra"}, "unexpected argument"},
		{[]string{"--root", "../..", "--pairs", "HEAD"}, "want DAEMON:AGENT"},
		{[]string{"--root", "../..", "--pairs", "HEAD:v9.9.9"}, "want DAEMON:AGENT"},
		{[]string{"--manifest", bad}, "release a: protocol version"},
		{[]string{"--manifest", filepath.Join(t.TempDir(), "missing.json")}, "no such file"},
	} {
		var o, e bytes.Buffer
		if code := run(context.Background(), c.args, &o, &e); code != 2 || !strings.Contains(e.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 with %q", c.args, code, e.String(), c.want)
		}
	}
}
