// Command forgeyard-matrix runs the cross-version compatibility matrix
// (package matrix): it builds the daemon and agent of every release in
// matrix/manifest.json (old ones from their git tags, cached by commit),
// runs every (daemon, agent, backend) cell as separate processes, prints
// one line per cell, writes the results as JSON and renders them as
// markdown into docs/compatibility.md. It exits 1 when any cell's
// measured outcome differs from what the manifest implies.
//
//	forgeyard-matrix                         # full matrix (make matrix)
//	forgeyard-matrix --pairs HEAD:v0.1.0 --backends quic --scenarios lease,cancel
//
// Run it from the repository root (or pass --root).
//
// Exit status: 0 all cells as promised, 1 a cell differs or the run
// failed, 2 usage.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"forgeyard.dev/transport/internal/cli"
	"forgeyard.dev/transport/matrix"
)

func main() { cli.Main(run) }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if code, ok := cli.VersionOnly("forgeyard-matrix", args, stdout, stderr); ok {
		return code
	}
	fs := flag.NewFlagSet("forgeyard-matrix", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root := fs.String("root", ".", "repository `dir` (its git tags are the releases)")
	manifest := fs.String("manifest", "matrix/manifest.json", "manifest `file`, relative to --root")
	results := fs.String("results", "matrix/results.json", "write the results JSON to `file` (relative to --root; empty: don't)")
	doc := fs.String("doc", "docs/compatibility.md", "render the table into `file` between its markers (relative to --root; empty: don't)")
	cache := fs.String("cache", matrix.DefaultCacheDir(), "build cache `dir` of tagged releases (by commit)")
	pairs := fs.String("pairs", "", "comma-separated DAEMON:AGENT release pairs (default: all)")
	backends := fs.String("backends", "", "comma-separated backends (default: all in the manifest)")
	relay := fs.String("relay", "", "forgeyard-relay `binary` for relay cells (default: built from the current tree)")
	scenarios := fs.String("scenarios", "", "comma-separated scenarios (default: all: "+strings.Join(matrix.Scenarios, ",")+")")
	if code, ok := cli.ParseNoArgs(fs, args, stdout, stderr, "forgeyard-matrix"); !ok {
		return code
	}
	m, err := matrix.LoadManifest(under(*root, *manifest))
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard-matrix: %v\n", err)
		return 2
	}
	tmp, err := os.MkdirTemp("", "forgeyard-matrix-")
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard-matrix: %v\n", err)
		return 1
	}
	defer os.RemoveAll(tmp)
	logf := func(format string, a ...any) { fmt.Fprintf(stdout, format+"\n", a...) }
	o := matrix.Options{Manifest: m, Builder: &matrix.Builder{Root: *root, CacheDir: *cache, TempDir: tmp, Log: logf}, Log: logf}
	for _, p := range split(*pairs) {
		d, a, ok := strings.Cut(p, ":")
		_, okd := m.Release(d)
		_, oka := m.Release(a)
		if !ok || !okd || !oka {
			fmt.Fprintf(stderr, "forgeyard-matrix: --pairs %q: want DAEMON:AGENT release names from the manifest\n", p)
			return 2
		}
		o.Pairs = append(o.Pairs, [2]string{d, a})
	}
	o.Backends = split(*backends)
	o.Scenarios = split(*scenarios)
	o.Relay = *relay
	res, err := matrix.Run(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "forgeyard-matrix: %v\n", err)
		return 1
	}
	if !res.Full {
		fmt.Fprintln(stdout, "partial run: results and doc not written")
	} else {
		if *results != "" {
			if err := os.WriteFile(under(*root, *results), res.JSON(), 0o644); err != nil {
				fmt.Fprintf(stderr, "forgeyard-matrix: %v\n", err)
				return 1
			}
		}
		if *doc != "" {
			p := under(*root, *doc)
			old, err := os.ReadFile(p)
			if err == nil {
				var out []byte
				if out, err = matrix.ReplaceDoc(old, matrix.Markdown(m, res)); err == nil {
					err = os.WriteFile(p, out, 0o644)
				}
			}
			if err != nil {
				fmt.Fprintf(stderr, "forgeyard-matrix: %s: %v\n", *doc, err)
				return 1
			}
		}
		fmt.Fprint(stdout, "\n"+matrix.Markdown(m, res))
	}
	if f := res.Failed(); len(f) > 0 {
		fmt.Fprintf(stderr, "forgeyard-matrix: %d of %d cells differ from the manifest\n", len(f), len(res.Cells))
		return 1
	}
	fmt.Fprintf(stdout, "all %d cells as the manifest promises\n", len(res.Cells))
	return 0
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// under resolves p relative to root unless it is absolute.
func under(root, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(root, p)
}
