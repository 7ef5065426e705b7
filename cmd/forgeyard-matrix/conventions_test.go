package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"forgeyard.dev/transport/internal/buildinfo"
)

// TestExitCodes: --version, --help once on stdout, a bad flag and a bad
// manifest exit 2 (cli.ExitCodes).
func TestExitCodes(t *testing.T) {
	for _, c := range []struct {
		args        []string
		code        int
		out, errOut string
	}{
		{[]string{"--version"}, 0, buildinfo.Get().String("forgeyard-matrix") + "\n", ""},
		{[]string{"--help"}, 0, "Usage of forgeyard-matrix", ""},
		{[]string{"--no-such-flag"}, 2, "", "no-such-flag"},
		{[]string{"extra"}, 2, "", "unexpected argument"},
		{[]string{"--root", t.TempDir(), "--manifest", filepath.Join("nope", "manifest.json")}, 2, "", "manifest.json"},
	} {
		var o, e bytes.Buffer
		code := run(context.Background(), c.args, &o, &e)
		if code != c.code || !strings.HasPrefix(o.String(), c.out) || !strings.Contains(e.String(), c.errOut) || (c.code == 0 && e.Len() > 0) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d, %q, %q", c.args, code, o.String(), e.String(), c.code, c.out, c.errOut)
		}
	}
}
