package main

import (
	"bytes"
	"strings"
	"testing"

	"forgeyard.dev/transport/internal/buildinfo"
)

// TestExitCodes: the one exit-code table (cli.ExitCodes): 0 ok, 1 a decode
// failure, 2 a usage error; --version and version.
func TestExitCodes(t *testing.T) {
	for _, c := range []struct {
		args        []string
		code        int
		out, errOut string
	}{
		{[]string{"--version"}, 0, buildinfo.Get().String(prog) + "\n", ""},
		{[]string{"version"}, 0, prog + " " + buildinfo.Get().Version + "\n", ""},
		{[]string{"--no-such-flag"}, 2, "", "no-such-flag"},
		{[]string{"--hex", "ff ff ff"}, 1, "", prog + ":"},
		{[]string{"--file", "/nope/frames.bin"}, 1, "", "/nope/frames.bin"},
	} {
		var o, e bytes.Buffer
		code := run(c.args, strings.NewReader(""), &o, &e)
		if code != c.code || !strings.HasPrefix(o.String(), c.out) || !strings.Contains(e.String(), c.errOut) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want %d, %q, %q", c.args, code, o.String(), e.String(), c.code, c.out, c.errOut)
		}
	}
}
