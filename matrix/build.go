package matrix

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Binaries are the built commands of one release.
type Binaries struct {
	Daemon, Agent string
	// Relay is forgeyard-relay when the release has cmd/forgeyard-relay,
	// else empty.
	Relay  string
	Commit string // the commit built ("HEAD" tree: its commit, "+dirty" when modified)
}

// DefaultCacheDir is where builds of tagged releases are kept, by commit:
// $XDG_CACHE_HOME/forgeyard-matrix (or the user cache directory).
func DefaultCacheDir() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "forgeyard-matrix")
	}
	return filepath.Join(os.TempDir(), "forgeyard-matrix-cache")
}

// Builder builds the daemon and agent of releases.
type Builder struct {
	// Root is the repository root (the current tree).
	Root string
	// CacheDir keeps tagged builds by commit hash; HEAD builds go to
	// TempDir and are rebuilt every run (the Go build cache makes that
	// cheap).
	CacheDir string
	TempDir  string
	// Log receives progress lines; nil discards.
	Log func(format string, args ...any)
}

func (b *Builder) logf(format string, args ...any) {
	if b.Log != nil {
		b.Log(format, args...)
	}
}

// resolve finds the commit of release r: its tag when the clone has it
// (which must name the pinned commit), else the pinned commit itself, which
// any full clone of main's history has even when tags were not fetched.
func (b *Builder) resolve(ctx context.Context, r Release) (string, error) {
	tagged, err := b.git(ctx, "rev-parse", "--verify", "--quiet", "refs/tags/"+r.Tag+"^{commit}")
	if err == nil && tagged != "" {
		if r.Commit != "" && tagged != r.Commit {
			return "", fmt.Errorf("release %s: tag %s names %.12s but the manifest pins %.12s: a released tag was moved (restore it: git tag -f %s %s)", r.Name, r.Tag, tagged, r.Commit, r.Tag, r.Commit)
		}
		return tagged, nil
	}
	if r.Commit == "" {
		return "", fmt.Errorf("release %s: git tag %q not found in %s and the manifest pins no commit (fetch the tags: git fetch --tags)", r.Name, r.Tag, b.Root)
	}
	pinned, err := b.git(ctx, "rev-parse", "--verify", "--quiet", r.Commit+"^{commit}")
	if err != nil || pinned != r.Commit {
		return "", fmt.Errorf("release %s: neither tag %s nor its pinned commit %.12s is in %s (a shallow clone? fetch the history: git fetch --unshallow --tags)", r.Name, r.Tag, r.Commit, b.Root)
	}
	b.logf("release %s: tag %s not in this clone; building its pinned commit %.12s", r.Name, r.Tag, r.Commit)
	return pinned, nil
}

// Build returns the binaries of release r, building them if needed. A
// tagged release is exported with `git archive` into a temporary directory
// and built there; the result is cached under CacheDir/<commit>.
func (b *Builder) Build(ctx context.Context, r Release) (Binaries, error) {
	if r.Tag == HEAD {
		commit, _ := b.git(ctx, "rev-parse", "HEAD")
		out := filepath.Join(b.TempDir, "head")
		if err := b.goBuild(ctx, b.Root, out); err != nil {
			return Binaries{}, fmt.Errorf("build HEAD: %w", err)
		}
		bins := Binaries{Daemon: filepath.Join(out, "forgeyard-daemon"), Agent: filepath.Join(out, "forgeyard-agent"), Commit: commit}
		if fileExists(filepath.Join(out, "forgeyard-relay")) {
			bins.Relay = filepath.Join(out, "forgeyard-relay")
		}
		return bins, nil
	}
	commit, err := b.resolve(ctx, r)
	if err != nil {
		return Binaries{}, err
	}
	out := filepath.Join(b.CacheDir, commit)
	bins := Binaries{Daemon: filepath.Join(out, "forgeyard-daemon"), Agent: filepath.Join(out, "forgeyard-agent"), Commit: commit}
	if fileExists(bins.Daemon) && fileExists(bins.Agent) {
		b.logf("release %s: cached build of %.12s", r.Name, commit)
		if fileExists(filepath.Join(out, "forgeyard-relay")) {
			bins.Relay = filepath.Join(out, "forgeyard-relay")
		}
		return bins, nil
	}
	src, err := os.MkdirTemp(b.TempDir, "src-"+r.Name+"-")
	if err != nil {
		return Binaries{}, err
	}
	defer os.RemoveAll(src)
	b.logf("release %s: building %s (%.12s)", r.Name, r.Tag, commit)
	arch := exec.CommandContext(ctx, "git", "-C", b.Root, "archive", "--format=tar", commit)
	untar := exec.CommandContext(ctx, "tar", "-x", "-C", src)
	pipe, err := arch.StdoutPipe()
	if err != nil {
		return Binaries{}, err
	}
	untar.Stdin = pipe
	var aerr, terr bytes.Buffer
	arch.Stderr, untar.Stderr = &aerr, &terr
	if err := untar.Start(); err != nil {
		return Binaries{}, err
	}
	if err := arch.Run(); err != nil {
		_ = untar.Wait()
		return Binaries{}, fmt.Errorf("git archive %s: %v: %s", r.Tag, err, aerr.String())
	}
	if err := untar.Wait(); err != nil {
		return Binaries{}, fmt.Errorf("untar %s: %v: %s", r.Tag, err, terr.String())
	}
	tmpOut := out + ".tmp"
	_ = os.RemoveAll(tmpOut)
	if err := b.goBuild(ctx, src, tmpOut); err != nil {
		return Binaries{}, fmt.Errorf("build %s: %w", r.Name, err)
	}
	_ = os.RemoveAll(out)
	if err := os.Rename(tmpOut, out); err != nil {
		return Binaries{}, err
	}
	if fileExists(filepath.Join(out, "forgeyard-relay")) {
		bins.Relay = filepath.Join(out, "forgeyard-relay")
	}
	return bins, nil
}

func (b *Builder) goBuild(ctx context.Context, dir, out string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	pkgs := []string{"./cmd/forgeyard-daemon", "./cmd/forgeyard-agent"}
	if st, err := os.Stat(filepath.Join(dir, "cmd", "forgeyard-relay")); err == nil && st.IsDir() {
		pkgs = append(pkgs, "./cmd/forgeyard-relay")
	}
	cmd := exec.CommandContext(ctx, "go", append([]string{"build", "-o", out + string(filepath.Separator)}, pkgs...)...)
	cmd.Dir = dir
	if o, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%v\n%s", err, o)
	}
	return nil
}

func (b *Builder) git(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "git", append([]string{"-C", b.Root}, args...)...).Output()
	return strings.TrimSpace(string(out)), err
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}
