package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"forgeyard.dev/transport/internal/buildinfo"
)

// TestExitCodes: --version, --help once on stdout, bad flags and values
// exit 2, a working directory that cannot be used exits 1 (cli.ExitCodes).
func TestExitCodes(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, []byte("x"), 0o600)
	for _, c := range []struct {
		args        []string
		code        int
		out, errOut string
	}{
		{[]string{"--version"}, 0, buildinfo.Get().String("forgeyard-demo") + "\n", ""},
		{[]string{"--help"}, 0, "Usage of forgeyard-demo", ""},
		{[]string{"--no-such-flag"}, 2, "", "no-such-flag"},
		{[]string{"--agents", "1"}, 2, "", "-agents must be"},
		{[]string{"--dir", filepath.Join(file, "sub")}, 1, "", "forgeyard-demo:"},
	} {
		var o, e bytes.Buffer
		code := run(context.Background(), c.args, &o, &e)
		if code != c.code || !strings.HasPrefix(o.String(), c.out) || !strings.Contains(e.String(), c.errOut) || (c.code == 0 && e.Len() > 0) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d, %q, %q", c.args, code, o.String(), e.String(), c.code, c.out, c.errOut)
		}
	}
}
