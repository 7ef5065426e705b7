//go:build unix

package atomicfile

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestWriteFile: the content is replaced, the mode is exactly perm whatever
// the umask and the old file's mode, and no temporary file is left.
func TestWriteFile(t *testing.T) {
	old := syscall.Umask(0o077)
	t.Cleanup(func() { syscall.Umask(old) })
	dir := t.TempDir()
	path := filepath.Join(dir, "cert.pem")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "key.pem")
	if err := os.WriteFile(key, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(key, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]struct {
		body string
		mode os.FileMode
	}{path: {"new", 0o644}, key: {"secret", 0o600}} {
		b, err := os.ReadFile(p)
		st, serr := os.Stat(p)
		if err != nil || serr != nil || string(b) != want.body || st.Mode().Perm() != want.mode {
			t.Fatalf("%s: %q %v (%v, %v); want %q %v", p, b, st.Mode().Perm(), err, serr, want.body, want.mode)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Fatalf("directory holds %d entries, want 2 (no temporary file left)", len(ents))
	}
	src := filepath.Join(dir, "partial")
	if err := os.WriteFile(src, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Rename(src, filepath.Join(sub, "obj")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(sub, "obj")); err != nil {
		t.Fatal(err)
	}
}
