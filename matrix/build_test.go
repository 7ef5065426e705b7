package matrix

import (
	"context"
	"os/exec"
	"strings"
	"testing"
)

// gitRepo makes a repository with two commits and returns its root and
// the two hashes.
func gitRepo(t *testing.T) (root, first, second string) {
	t.Helper()
	root = t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", root, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	run("init", "-q")
	run("commit", "-q", "--allow-empty", "-m", "one")
	first = run("rev-parse", "HEAD")
	run("commit", "-q", "--allow-empty", "-m", "two")
	second = run("rev-parse", "HEAD")
	run("tag", "v1", first)
	return root, first, second
}

// TestResolveRelease: CI clones main without its tags, so a release is
// found by its pinned commit when the tag is missing; a tag that names
// another commit than the manifest pins is refused; a commit missing from
// the history (a shallow clone) is an actionable error.
func TestResolveRelease(t *testing.T) {
	root, first, second := gitRepo(t)
	var logged []string
	b := &Builder{Root: root, Log: func(f string, a ...any) { logged = append(logged, f) }}
	ctx := context.Background()

	got, err := b.resolve(ctx, Release{Name: "r1", Tag: "v1", Commit: first})
	if err != nil || got != first {
		t.Fatalf("tag present: got %q, %v; want %s", got, err, first)
	}
	got, err = b.resolve(ctx, Release{Name: "r2", Tag: "v2-not-fetched", Commit: second})
	if err != nil || got != second {
		t.Fatalf("tag missing, commit pinned: got %q, %v; want %s", got, err, second)
	}
	if len(logged) != 1 || !strings.Contains(logged[0], "pinned commit") {
		t.Errorf("building from the pinned commit is not reported: %q", logged)
	}
	_, err = b.resolve(ctx, Release{Name: "r1", Tag: "v1", Commit: second})
	if err == nil || !strings.Contains(err.Error(), "was moved") {
		t.Errorf("moved tag: err = %v, want 'was moved'", err)
	}
	absent := strings.Repeat("ab", 20)
	_, err = b.resolve(ctx, Release{Name: "r3", Tag: "v3", Commit: absent})
	if err == nil || !strings.Contains(err.Error(), "shallow") {
		t.Errorf("commit not in history: err = %v, want a hint about shallow clones", err)
	}
	_, err = b.resolve(ctx, Release{Name: "r4", Tag: "v4"})
	if err == nil || !strings.Contains(err.Error(), "pins no commit") {
		t.Errorf("no tag, no commit: err = %v", err)
	}
}

// TestManifestPinsTags: the manifest's pinned commits agree with the tags
// of this repository when it has them (a release tag never moves).
func TestManifestPinsTags(t *testing.T) {
	m, err := LoadManifest("manifest.json")
	if err != nil {
		t.Fatal(err)
	}
	b := &Builder{Root: ".."}
	checked := 0
	for _, r := range m.Releases {
		if r.Tag == HEAD {
			continue
		}
		if !isCommitHash(r.Commit) {
			t.Errorf("release %s pins no commit", r.Name)
			continue
		}
		got, err := b.resolve(context.Background(), r)
		if err != nil {
			t.Errorf("release %s: %v", r.Name, err)
			continue
		}
		if got != r.Commit {
			t.Errorf("release %s resolves to %s, pinned %s", r.Name, got, r.Commit)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("the manifest lists no tagged release")
	}
}
